"""`nestor runs list|show`: summaries of run directories."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from nestor.cli.common import JsonOpt, fail, print_json

app = typer.Typer(no_args_is_help=True, help="Summaries of runs.")


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))


@app.command("list")
def list_(
    root: Path = typer.Argument(Path("runs"), help="Directory holding run directories."),
    json_: bool = JsonOpt,
) -> None:
    """One line per run under ROOT."""
    from nestor.report.data import RunData, RunDirError

    if not root.is_dir():
        fail(f"{root} is not a directory")
    rows = []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            rows.append(RunData.load(child).summary())
        except RunDirError:
            continue
    if json_:
        print_json(rows)
        return
    table = Table("run", "policy", "status", "steps", "episodes", "reward first→last", "cost $")
    for r in rows:
        # no outer steps (an `episode run` dir): the mean reward of its episodes instead
        reward = (f"{_fmt(r['reward_first_2_steps'])} → {_fmt(r['reward_last_2_steps'])}"
                  if r["steps"] else f"{_fmt(r['reward_mean'])} (episodes)")
        table.add_row(r["name"], _fmt(r["policy"]), r["status"], str(r["steps"]),
                      str(r["episodes"]), reward, _fmt(r["cost_usd"]))
    Console().print(table)


@app.command("show")
def show(run_dir: Path = typer.Argument(...), json_: bool = JsonOpt) -> None:
    """Summary of one run."""
    from nestor.report.data import RunData, RunDirError

    try:
        data = RunData.load(run_dir)
    except RunDirError as exc:
        fail(str(exc))
    if json_:
        print_json(data.summary())
        return
    table = Table(title=f"{data.summary()['name']} · {run_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, value in data.summary_rows():
        table.add_row(label, value)
    Console().print(table)


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="runs")
