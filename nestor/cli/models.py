"""`nestor models list|pretrain`: the base-model registry and the tiny models' pretraining."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from nestor.cli.common import JsonOpt, console, fail, out_console, print_json

app = typer.Typer(no_args_is_help=True, help="Base models: list them, pretrain the tiny ones.")


@app.command("list")
def list_(json_: bool = JsonOpt) -> None:
    """List registered base models and whether their weights are available here."""
    from nestor.models.registry import MODELS, availability

    rows = []
    for entry in MODELS.values():
        ok, where = availability(entry.name)
        rows.append({"name": entry.name, "description": entry.description, "available": ok,
                     "path" if ok else "how": where})
    if json_:
        print_json(rows)
        return
    table = Table("name", "description", "available", "path / how to provide")
    for row in rows:
        table.add_row(row["name"], row["description"], "yes" if row["available"] else "no",
                      escape(row.get("path") or row.get("how")))
    out_console().print(table)


@app.command("pretrain")
def pretrain_cmd(
    model: str = typer.Option("tiny-m", "--model", help="tiny-s or tiny-m."),
    steps: int | None = typer.Option(
        None, "--steps", min=1,
        help="Optimizer steps (default: what made the bundled weights, 320 tiny-s, 1,100 tiny-m)."),
    schedule_steps: int | None = typer.Option(
        None, "--schedule-steps", min=1,
        help="Length of the lr schedule (default: --steps); larger stops part-way through it."),
    out: Path | None = typer.Option(None, "--out", help="Output directory (default: the "
                                                         "bundled directory of the model)."),
    seed: int = typer.Option(0, "--seed", help="Seed of corpus, init and data order."),
    threads: int = typer.Option(1, "--threads", min=1, help="torch CPU threads."),
    test_format_share: float | None = typer.Option(
        None, "--test-format-share", min=0, max=1, help="Corpus share in the exact test format."),
    list_share: float | None = typer.Option(None, "--list-share", min=0, max=1,
                                            help="Corpus share of short lists of one skill."),
    hard_share: float | None = typer.Option(None, "--hard-share", min=0, max=1,
                                            help="Share of inputs at difficulty 1."),
    emphasis: list[str] | None = typer.Option(
        None, "--emphasis", help="TASK=FACTOR on a skill's corpus share, repeatable; replaces "
        "the default emphasis (see docs/models.md)."),
    json_: bool = JsonOpt,
) -> None:
    """Pretrain a tiny model from scratch on the synthetic corpus (seeded, reproducible)."""
    from pydantic import ValidationError
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from nestor.config import validation_problems
    from nestor.models.pretrain import BUNDLED_STEPS, TINY_ARCH, PretrainConfig, pretrain
    from nestor.models.registry import BUNDLED_DIR

    if model not in TINY_ARCH:
        fail(f"cannot pretrain {model!r}: only {', '.join(TINY_ARCH)} are pretrained here")
    overrides = {"steps": steps or BUNDLED_STEPS[model], "schedule_steps": schedule_steps,
                 "test_format_share": test_format_share, "list_share": list_share,
                 "hard_share": hard_share, "emphasis": _emphasis(emphasis)}
    try:
        cfg = PretrainConfig(model=model, seed=seed, threads=threads,
                             **{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:  # e.g. a negative --emphasis factor
        fail(validation_problems(exc))
    out_dir = out or BUNDLED_DIR / model
    with Progress(TextColumn("pretrain {task.fields[model]}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total} loss {task.fields[loss]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        bar = progress.add_task("pretrain", total=cfg.steps, model=model, loss="-")

        def on_step(step: int, loss: float) -> None:
            progress.update(bar, completed=step + 1, loss=f"{loss:.3f}")
            if not console.is_terminal and (step + 1) % 50 == 0:  # logs get a line now and then
                console.print(f"step {step + 1}/{cfg.steps} loss {loss:.3f}", highlight=False)

        try:
            figures = pretrain(cfg, out_dir, on_step=on_step)
        except ValueError as exc:  # e.g. an emphasis on a task that does not exist
            fail(str(exc))
    figures["out"] = str(out_dir)
    if json_:
        print_json(figures)
        return
    console.print(f"saved {model} to {out_dir}: {figures['parameters']:,} parameters, "
                  f"final loss {figures['final_loss']}, {figures['wall_s']} s")


def _emphasis(pairs: list[str] | None) -> dict[str, float] | None:
    """['add=3', 'max=2'] -> {'add': 3.0, 'max': 2.0}; exits 2 on a malformed pair."""
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        task, _, factor = pair.partition("=")
        try:
            out[task.strip()] = float(factor)
        except ValueError:
            fail(f"--emphasis {pair!r}: expected TASK=FACTOR, e.g. add=3")
    return out


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="models")
