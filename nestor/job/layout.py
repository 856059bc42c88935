"""Where things live in a job directory, and reading its layout without running any of it.

    job/
      config.toml            JobConfig
      data/train.jsonl       dataset rows ({"prompt": str, "answer": str}, one JSON object a line);
                             optional: a short-form job's load() makes its rows in code instead
      env/pyproject.toml     the taskset package's metadata; [project] name = the taskset id
      env/<name>/__init__.py exports exactly one vf.Taskset subclass in __all__

Everything here reads files as data, through `safe_read` (no link is followed; symlinks,
hard links and special files anywhere in the job are a layout error); the env package is only
ever imported in the sandbox.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import sys
from dataclasses import dataclass
from pathlib import Path

from nestor.job import safe_read
from nestor.job.config import JobConfigError, read_toml

CONFIG = "config.toml"
DATA = "data/train.jsonl"
ENV = "env"
PYPROJECT = "env/pyproject.toml"
REQUIRED = (CONFIG, PYPROJECT)  # data/train.jsonl is optional (the short form)
MAX_DATA_BYTES = 32 << 20

_PYPROJECT_TEMPLATE = '''\
[project]
name = "{dist}"
version = "0.1.0"
description = "{description}"
requires-python = ">=3.11"
dependencies = ["verifiers"]

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["{package}"]
'''


def env_pyproject(package: str, description: str) -> str:
    """env/pyproject.toml of a job whose taskset lives in env/<package>/."""
    return _PYPROJECT_TEMPLATE.format(dist=package.replace("_", "-"), package=package,
                                      description=description)


class LayoutError(ValueError):
    """The job directory is not laid out as the format asks; the message says what to fix."""


@dataclass(frozen=True)
class JobLayout:
    root: Path
    package: str  # the importable env package: env/<package>/__init__.py

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def data(self) -> Path:
        return self.root / DATA

    @property
    def has_data(self) -> bool:
        """Long form: rows in data/train.jsonl. Short form (False): load() makes them in code,
        inside the sandbox, like everything else of the job."""
        return safe_read.is_plain_file(self.root, DATA)

    @property
    def env(self) -> Path:
        return self.root / ENV

    @property
    def taskset_id(self) -> str:
        """What prime-rl's `[...env.taskset] id` names (it imports `id` with '-' -> '_')."""
        return self.package


def env_packages(root: Path) -> list[str]:
    env = root / ENV
    if not env.is_dir():
        return []
    return sorted(p.name for p in env.iterdir()
                  if p.is_dir() and not p.is_symlink() and (p / "__init__.py").is_file()
                  and not p.name.startswith((".", "_")) and not p.name.endswith(".egg-info"))


def read_layout(job_dir: Path | str) -> JobLayout:
    """The job's layout, or LayoutError naming every missing or misplaced piece."""
    root = Path(job_dir)
    if not root.is_dir():
        raise LayoutError(f"{root}: not a directory")
    unsafe = safe_read.scan(root)
    if unsafe:
        more = f" (and {len(unsafe) - 3} more)" if len(unsafe) > 3 else ""
        raise LayoutError("; ".join(unsafe[:3]) + more)
    problems = [f"{name} is missing" for name in REQUIRED
                if not safe_read.is_plain_file(root, name)]
    packages = env_packages(root)
    if not packages:
        problems.append("no taskset package: add env/<name>/__init__.py (name = a Python "
                        "identifier, e.g. env/my_job/__init__.py)")
    elif len(packages) > 1:
        problems.append(f"env/ holds {len(packages)} packages ({', '.join(packages)}); keep "
                        "exactly one taskset package")
    if problems:
        raise LayoutError("; ".join(problems))
    package = packages[0]
    if not package.isidentifier():
        raise LayoutError(f"env/{package}: not an importable name; use letters, digits and "
                          "underscores (e.g. env/my_job)")
    if package != package.lower():  # verifiers lower-cases a taskset id before importing it
        raise LayoutError(f"env/{package}: use a lower-case name (e.g. env/{package.lower()}"
                          "_job): verifiers imports a taskset by its lower-cased id")
    if package in builtin_tasksets():
        raise LayoutError(f"env/{package} is the name of a taskset built into verifiers: "
                          f"prime-rl would train that one instead; rename it "
                          f"(e.g. env/{package}_job)")
    if package in sys.stdlib_module_names or package in ("verifiers", "nestor") or \
            _installed(package, root):
        raise LayoutError(f"env/{package} would shadow the installed module {package!r}; "
                          f"rename it (e.g. env/{package}_job)")
    _check_pyproject(root, package)
    data = root / DATA
    size = os.stat(data, follow_symlinks=False).st_size if os.path.lexists(data) else 0  # a first look
    if size > MAX_DATA_BYTES:
        raise LayoutError(f"{DATA} is {size:,} bytes; keep it under {MAX_DATA_BYTES:,}")
    return JobLayout(root=root, package=package)


# verifiers resolves a taskset id to `verifiers.v1.tasksets.<id>` before a package of that name,
# so a job package named like a built-in silently trains the built-in. These ship with the
# verifiers prime-rl pins (PrimeIntellect-ai/verifiers a60a606, prime-rl 559b447); the installed
# verifiers' own are added at run time.
VERIFIERS_BUILTIN_TASKSETS = frozenset({"harbor", "lean", "nemo_gym", "openenv", "textarena"})


def builtin_tasksets() -> frozenset[str]:
    """Taskset ids that verifiers (the pinned one, and the one installed here) resolves to its
    own `verifiers.v1.tasksets` subpackages."""
    try:  # located, not imported: importing verifiers takes seconds
        spec = importlib.util.find_spec("verifiers")
        roots = [str(Path(p) / "v1" / "tasksets") for p in spec.submodule_search_locations or []]
    except (ImportError, ValueError, AttributeError):  # no verifiers here: the pinned list holds
        return VERIFIERS_BUILTIN_TASKSETS
    return VERIFIERS_BUILTIN_TASKSETS | {m.name for m in pkgutil.iter_modules(roots)}


def _installed(name: str, root: Path) -> bool:
    """Is `name` importable here from somewhere other than this job (site-packages, the cwd)?"""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    origin = Path(spec.origin or next(iter(spec.submodule_search_locations or []), ""))
    return not origin.resolve().is_relative_to(root.resolve())


def _check_pyproject(root: Path, package: str) -> None:
    try:
        meta = read_toml(root, PYPROJECT)
    except JobConfigError as exc:
        raise LayoutError(str(exc)) from None
    name = meta.get("project", {}).get("name") if isinstance(meta.get("project"), dict) else None
    if not isinstance(name, str) or not name:
        raise LayoutError(f"{PYPROJECT}: needs [project] name = \"{package.replace('_', '-')}\"")
    if name.replace("-", "_").lower() != package:
        raise LayoutError(f"{PYPROJECT}: [project] name {name!r} must match the package "
                          f"env/{package} (prime-rl imports the taskset id with '-' read as '_'); "
                          f"use name = \"{package.replace('_', '-')}\"")
