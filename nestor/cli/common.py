"""Helpers shared by the command modules: user errors, JSON output, task registry options."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)

def _absolute_files(refs: list[str] | None) -> list[str] | None:
    """A plugin named by its file travels (to pool workers, into job requests) as an absolute
    path: a worker's cwd is not the user's."""
    from nestor.tasks.registry import module_ref

    return None if refs is None else [module_ref(r) for r in refs]


TasksModuleOpt = typer.Option(
    None, "--tasks-module", callback=_absolute_files,
    help="Extra task-family module: a dotted name (installed or on PYTHONPATH) or a .py file; "
         "never searched in the current directory.")
JsonOpt = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


def fail(message: str, code: int = 2) -> NoReturn:
    """A user mistake: one line on stderr, no traceback, exit 2 (or `code`)."""
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def require_sandbox() -> str:
    """Stop with one line, before any work, where agent code would be refused (no bubblewrap
    and no opt-in to a weaker backend by name; see docs/sandbox.md)."""
    from nestor.sandbox import SandboxUnavailable
    from nestor.sandbox import require_sandbox as require

    try:
        return require()
    except (SandboxUnavailable, ValueError) as exc:
        fail(str(exc))


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def registry(tasks_module: list[str] | None = None):
    """The task registry with any extra modules, turning plugin problems into one-line errors."""
    from nestor.config import load_settings
    from nestor.tasks import TaskError, TaskRegistry

    modules = [*load_settings().task_modules, *(tasks_module or [])]
    try:
        return TaskRegistry(modules)
    except TaskError as exc:
        fail(str(exc))
