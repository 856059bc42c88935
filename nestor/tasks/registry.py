"""Finding tasks: the built-in families plus any plugin modules a user names.

A plugin is a module with a module-level `FAMILY` (a `Family`) or `FAMILIES` (a list of them),
named by its dotted name (importable from the environment: an installed package, PYTHONPATH)
or by its file (`./my_tasks.py`). The current directory is never searched. Loading never
imports `nestor.tasks.hidden`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nestor.tasks.base import Family, TaskDef, TaskSpec, render_spec
from nestor.tasks.families import BUILTIN_MODULES


class TaskError(ValueError):
    """A user-facing problem with tasks: an unknown id or a broken plugin module."""


@dataclass(frozen=True)
class TaskRef:
    """A task with its family, as the registry hands it out."""

    task: TaskDef
    family: Family

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def heldout(self) -> bool:
        return self.family.heldout

    def spec(self, difficulty: int = 0) -> TaskSpec:
        return render_spec(self.task, self.family, difficulty)


def _is_file_ref(name: str) -> bool:
    return name.endswith(".py") or "/" in name or "\\" in name


def module_ref(name: str) -> str:
    """A plugin reference as it should travel: a file as its absolute path, a dotted name as is."""
    return str(Path(name).expanduser().resolve()) if _is_file_ref(name) else name


def _import_file(name: str):
    """A plugin named by its file: loaded from exactly that file, under a private module name,
    with nothing added to sys.path (so nothing beside it can shadow a library)."""
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise TaskError(f"tasks module file {name!r} does not exist")
    module_name = f"nestor_plugin_{path.stem}_{abs(hash(str(path))):x}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _import_family_module(name: str) -> list[Family]:
    # Never from the current directory: nestor is often started inside a job's directory,
    # and a job's `torch.py` there must not import as the library (docs/sandbox.md). A plugin
    # is a module importable from the environment, or a file the user names.
    try:
        module = _import_file(name) if _is_file_ref(name) else importlib.import_module(name)
    except TaskError:
        raise
    except Exception as exc:  # any import-time failure of a user module is a user error
        raise TaskError(f"tasks module {name!r} failed to import: {type(exc).__name__}: {exc}") from None
    families = getattr(module, "FAMILIES", None)
    if families is None:
        family = getattr(module, "FAMILY", None)
        if family is None:
            raise TaskError(f"tasks module {name!r} declares neither FAMILY nor FAMILIES")
        families = [family]
    for fam in families:
        _check_family(name, fam)
    return list(families)


def _check_family(module: str, fam: object) -> None:
    def bad(problem: str) -> TaskError:
        return TaskError(f"tasks module {module!r}: malformed family: {problem}")

    if not isinstance(fam, Family):
        raise bad(f"expected nestor.tasks.Family, got {type(fam).__name__}")
    if not fam.name or not fam.tasks:
        raise bad(f"family {fam.name!r} needs a name and at least one task")
    for task in fam.tasks:
        if not isinstance(task, TaskDef):
            raise bad(f"family {fam.name!r} has a task of type {type(task).__name__}, not TaskDef")
        try:
            task.examples()
        except Exception as exc:
            raise bad(f"task {task.id!r} cannot make examples: {type(exc).__name__}: {exc}") from None
    if module not in BUILTIN_MODULES and fam.hidden_salt is None:
        raise bad(f"family {fam.name!r} needs a hidden_salt (the seed of its hidden eval)")


class TaskRegistry:
    """All known tasks, by id."""

    def __init__(self, extra_modules: Iterable[str] = ()):
        self.families: list[Family] = []
        for name in (*BUILTIN_MODULES, *extra_modules):
            self.families.extend(_import_family_module(name))
        self._tasks: dict[str, TaskRef] = {}
        for fam in self.families:
            for task in fam.tasks:
                if task.id in self._tasks:
                    raise TaskError(f"task id {task.id!r} is declared twice "
                                    f"(families {self._tasks[task.id].family.name!r} and {fam.name!r})")
                self._tasks[task.id] = TaskRef(task, fam)

    def get(self, task_id: str) -> TaskRef:
        try:
            return self._tasks[task_id]
        except KeyError:
            close = difflib.get_close_matches(task_id, list(self._tasks), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else \
                f"; known tasks: {', '.join(sorted(self._tasks))}"
            raise TaskError(f"unknown task {task_id!r}{hint}") from None

    def tasks(self, family: str | None = None, include_heldout: bool = False) -> list[TaskRef]:
        return [t for t in self._tasks.values()
                if (include_heldout or not t.heldout) and (family is None or t.family.name == family)]

    def training_tasks(self) -> list[TaskRef]:
        return self.tasks(include_heldout=False)

    def heldout_tasks(self) -> list[TaskRef]:
        return [t for t in self._tasks.values() if t.heldout]
