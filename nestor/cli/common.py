"""Helpers shared by the command modules: user errors, JSON output, task registry options."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from nestor.text import inert

console = Console(stderr=True)
if not console.is_terminal:  # a log file or CI: each message stays one whole line
    console.soft_wrap = True

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

RUNS_ROOT = Path("runs")  # every result-writing command's default home, under the cwd
PIPED_WIDTH = 400  # a table piped to a file or `less` is not cut to 80 columns


def default_out(kind: str) -> Path:
    """The one output-dir convention (docs/architecture.md#where-results-go): a command that
    writes results puts all of them in `--out DIR`, default runs/<kind>-<YYYYmmdd-HHMMSS>/."""
    return RUNS_ROOT / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"


def out_console(**kwargs: Any) -> Console:
    """The stdout console for results: the terminal's width on a terminal; piped (a file, a
    pager, a CI log), wide enough that rich never cuts a cell to `ope…` (COLUMNS still wins)."""
    con = Console(**kwargs)
    if not con.is_terminal and "width" not in kwargs and not os.environ.get("COLUMNS"):
        con.width = PIPED_WIDTH
    return con


def shown(text: Any) -> str:
    """Untrusted text (anything an agent or its job produced, or a message quoting it) made
    safe to print with rich markup on: `inert` (controls as pictures, bidi and zero-width
    characters named) and [markup] escaped. Every such string the CLI prints, table cells
    too, goes through it."""
    return escape(inert(text))


def fail(message: str, code: int = 2) -> NoReturn:
    """A user mistake: one line on stderr, no traceback, exit 2 (or `code`). The message may
    quote agent or job text: it is `shown`."""
    console.print(f"[red]error:[/red] {shown(message)}", highlight=False, soft_wrap=True)
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


def with_interval(score: float | None, n: int | None = None) -> str:
    """`0.120 [0.080, 0.173]`: a hidden-eval score with its Wilson 95% interval on n items
    (default: the inner job's hidden-eval size)."""
    from nestor.inner.evaluate import wilson
    from nestor.tasks.hidden import DEFAULT_N

    if score is None:
        return "–"
    n = n or DEFAULT_N
    lo, hi = wilson(round(score * n), n)
    return f"{score:.3f} [{lo:.3f}, {hi:.3f}]"


def pre_post(pre: float | None, post: float | None, n: int | None = None) -> str:
    """`pre 0.120 [0.080, 0.173] → post 0.150 [0.107, 0.206] (n = 200; +0.030, within noise)`:
    each score with its Wilson 95% interval, so a change of ±0.01 is not read as a result."""
    from nestor.inner.evaluate import wilson
    from nestor.tasks.hidden import DEFAULT_N

    n = n or DEFAULT_N
    text = f"pre {with_interval(pre, n)} → post {with_interval(post, n)} (n = {n}"
    if pre is not None and post is not None:
        (plo, phi), (qlo, qhi) = wilson(round(pre * n), n), wilson(round(post * n), n)
        text += f"; {post - pre:+.3f}, " + ("within noise" if qlo <= phi and plo <= qhi
                                             else "intervals apart")
    return text + ")"
