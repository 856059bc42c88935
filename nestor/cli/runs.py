"""`nestor runs list|show`: summaries of run directories."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nestor.cli.common import JsonOpt, fail, out_console, print_json, shown

app = typer.Typer(no_args_is_help=True, help="Summaries of runs.")


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))


@app.command("list")
def list_(
    root: Path = typer.Argument(Path("runs"), help="Directory holding run directories."),
    json_: bool = JsonOpt,
) -> None:
    """One line per directory under ROOT: training runs, `episode run` and `bench agents`
    directories, and job checkpoints (`job train --out`)."""
    from nestor.report.data import RunData, RunDirError, job_checkpoint

    if not root.is_dir():
        fail(f"{root} is not a directory")
    rows = []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        meta = job_checkpoint(child)
        if meta is not None:
            rows.append({"run_dir": str(child), "name": child.name, "kind": "job",
                         "policy": None, "status": "checkpoint", "steps": meta.get("steps"),
                         "episodes": None, "task": meta.get("task_id"),
                         "checkpoint": meta["checkpoint"], "cost_usd": None})
            continue
        try:
            rows.append(RunData.load(child).summary())
        except RunDirError:
            continue
    if json_:
        print_json(rows)
        return
    table = Table("run", "kind", "policy", "status", "steps", "episodes", "reward", "cost $")
    table.columns[0].no_wrap = True  # the name is what `runs show` needs: never cut it
    for r in rows:
        # the directory's name, not the config's: two quickstart runs are both "quickstart"
        table.add_row(*(shown(c) for c in (
            Path(r["run_dir"]).name, r["kind"], _fmt(r["policy"]), r["status"], _fmt(r["steps"]),
            _fmt(r["episodes"]), _reward(r), _fmt(r["cost_usd"]))))
    out_console().print(table)


def _reward(r: dict) -> str:
    if r["kind"] == "job":
        return f"job on {r['task']}" if r.get("task") else ""
    if r["kind"] != "train":  # no outer steps: the mean reward of its episodes
        return f"{_fmt(r['reward_mean'])} (episodes)"
    if not r.get("reward_compared_steps"):
        return "– (too short to compare)"
    k = r["reward_compared_steps"]
    return f"{_fmt(r['reward_first_2_steps'])} → {_fmt(r['reward_last_2_steps'])} (first/last {k})"


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

    con = out_console()
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
    out_console().print(table)
    if fig is not None:
        Console(stderr=True).print(f"reward curves: {plot}", highlight=False, soft_wrap=True)


def register(main: typer.Typer) -> None:
    main.add_typer(app, name="runs")
