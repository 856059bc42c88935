"""`nestor tasks list|show`: the public task suite."""

from __future__ import annotations

import typer
from rich.markdown import Markdown
from rich.table import Table

from nestor.cli.common import JsonOpt, TasksModuleOpt, fail, out_console, print_json, registry

app = typer.Typer(no_args_is_help=True, help="The task suite (public specs only).")


@app.command("list")
def list_(
    family: str | None = typer.Option(None, "--family", help="Only this family."),
    include_heldout: bool = typer.Option(False, "--include-heldout", help="Also the held-out family."),
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """List tasks."""
    reg = registry(tasks_module)
    refs = reg.tasks(family=family, include_heldout=include_heldout)
    if family and not refs:
        names = sorted({f.name for f in reg.families})
        fail(f"no tasks in family {family!r}; families: {', '.join(names)}")
    rows = [{"id": r.id, "family": r.family.name, "title": r.task.title, "heldout": r.heldout}
            for r in refs]
    if json_:
        print_json(rows)
        return
    table = Table("id", "family", "title", "heldout")
    for row in rows:
        table.add_row(row["id"], row["family"], row["title"], "yes" if row["heldout"] else "")
    out_console().print(table)


@app.command("show")
def show(
    task_id: str = typer.Argument(..., help="Task id, e.g. reverse."),
    difficulty: int = typer.Option(0, "--difficulty", min=0, max=3, help="Input size level."),
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Show a task's public spec (never its hidden eval)."""
    from nestor.tasks import TaskError

    reg = registry(tasks_module)
    try:
        spec = reg.get(task_id).spec(difficulty)
    except TaskError as exc:
        fail(str(exc))
    if json_:
        print_json(spec.model_dump())
        return
    out_console().print(Markdown(spec.instructions))

