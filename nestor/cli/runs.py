"""`nestor runs list|show`: summaries of run directories."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
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
    from nestor.report.headline import headline

    con = Console()
    top = Table("question", "numbers", "verdict", title="The five questions", show_lines=True)
    colours = {True: "green", False: "red", None: "dim"}
    for row in headline(data):
        colour = colours[row["met"]]
        top.add_row(escape(row["question"]), escape(row["numbers"]),
                    f"[{colour}]{escape(row['mark'])}[/{colour}]"
                    + (f": {escape(row['verdict'])}" if row["verdict"] else ""))
    con.print(top)
    table = Table(title=f"{data.summary()['name']} · {run_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, value in data.summary_rows():
        table.add_row(label, value)
    con.print(table)


SPARK = "▁▂▃▄▅▆▇█"


def spark(values: list[float]) -> str:
    """A reward curve in one line of text."""
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return "".join(SPARK[int((v - lo) / ((hi - lo) or 1.0) * (len(SPARK) - 1))] for v in values)


@app.command("compare")
def compare(
    run_a: Path = typer.Argument(..., help="A run directory."),
    run_b: Path = typer.Argument(..., help="Another run directory."),
    plot: Path | None = typer.Option(None, "--plot", help="Where the overlaid reward curves go "
                                     "(default RUN_A/report/compare-with-<RUN_B name>.png)."),
    json_: bool = JsonOpt,
) -> None:
    """Two runs side by side: the summary of each, and their reward curves overlaid."""
    import matplotlib.pyplot as plt

    from nestor.report.data import RunData, RunDirError
    from nestor.report.figures import compare_rewards

    try:
        runs = [RunData.load(run_a), RunData.load(run_b)]
    except RunDirError as exc:
        fail(str(exc))
    names = [str(d.summary()["name"]) for d in runs]
    if names[0] == names[1]:
        names = [str(run_a), str(run_b)]
    plot = plot or run_a / "report" / f"compare-with-{run_b.resolve().name}.png"
    fig = compare_rewards(list(zip(names, runs, strict=True)))
    if fig is not None:
        try:
            plot.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(plot)
        except OSError as exc:
            fail(f"cannot write {plot}: {exc.strerror or exc}")
        plt.close(fig)
    curves = [[(r["step"], r["reward_mean"]) for r in d.steps if r.get("reward_mean") is not None]
              for d in runs]
    if json_:
        print_json({"runs": [d.summary() for d in runs],
                    "reward_curves": {n: c for n, c in zip(names, curves, strict=True)},
                    "plot": str(plot) if fig is not None else None})
        return
    table = Table("", *names, title="nestor runs compare")
    table.columns[0].style = "bold"
    rows = [dict(d.summary_rows()) for d in runs]
    labels = list(dict.fromkeys([k for r in rows for k in r]))
    for label in labels:
        table.add_row(label, *(r.get(label, "–") for r in rows))
    table.add_row("reward curve", *(spark([v for _, v in c]) for c in curves))
    Console().print(table)
    if fig is not None:
        Console(stderr=True).print(f"reward curves: {plot}", highlight=False, soft_wrap=True)


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="runs")
