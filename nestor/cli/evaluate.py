"""`nestor eval`: score a base model or checkpoint on hidden evals (trusted; prints only scores)."""

from __future__ import annotations

import typer
from rich.table import Table

from nestor.cli.common import (
    JsonOpt,
    TasksModuleOpt,
    console,
    fail,
    out_console,
    print_json,
    registry,
)


def eval_cmd(
    model: str = typer.Option(..., "--model", help="Registry name (tiny-m, ...) or a directory."),
    task: list[str] = typer.Option(..., "--tasks", "--task", help="Task ids, comma-separated "
                                   "or repeated, or 'all' (as `bench agents --tasks`)."),
    difficulty: int = typer.Option(0, "--difficulty", min=0, max=3, help="Input size level."),
    n: int = typer.Option(200, "--n", min=1, max=10_000, help="Hidden-eval items per task."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Ignore cached pre-scores."),
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Hidden-eval accuracy (greedy, chat template) with a Wilson 95% interval per task."""
    from nestor.inner.evaluate import evaluate
    from nestor.models.registry import ModelNotFoundError, resolve_model_dir
    from nestor.tasks import TaskError

    reg = registry(tasks_module)
    task = [t.strip() for item in task for t in item.split(",") if t.strip()]
    task_ids = [r.id for r in reg.tasks(include_heldout=True)] if "all" in task else task
    try:
        resolve_model_dir(model)
        for task_id in task_ids:
            reg.get(task_id)
    except (ModelNotFoundError, TaskError) as exc:
        fail(str(exc))

    with console.status(f"scoring {model} on {len(task_ids)} task(s)") as status:
        def show(result) -> None:  # progress only: the table below prints each result once
            status.update(f"scored {result.task}: {result.accuracy:.3f}; scoring the rest…")

        try:
            results = evaluate(model, task_ids, difficulty=difficulty, n=n,
                               use_cache=not no_cache, registry=reg, on_result=show)
        except ModelNotFoundError as exc:  # e.g. a corrupt weights file
            fail(str(exc))
    if json_:
        print_json({"model": model, "difficulty": difficulty,
                    "results": [r.model_dump() for r in results]})
        return
    table = Table("task", "accuracy", "95% interval", "n")
    for r in results:
        table.add_row(r.task, f"{r.accuracy:.3f}", f"{r.ci95[0]:.3f}–{r.ci95[1]:.3f}", str(r.n))
    mean = sum(r.accuracy for r in results) / len(results)
    table.add_row("mean", f"{mean:.3f}", "", "")
    out_console().print(table)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
