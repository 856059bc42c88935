"""`nestor train CONFIG [--run-dir D]`, `nestor train --resume RUN_DIR`, `nestor quickstart`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from nestor.cli.common import JsonOpt, TasksModuleOpt, console, fail, print_json, registry

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("quickstart")(quickstart)


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


class LiveView:
    """The live panel: step, reward, validation pass rate, episodes/jobs in flight, pool, cost."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.history: list[float] = []
        self.live = Live(self._render({}), console=console, refresh_per_second=2, transient=False)

    def _render(self, s: dict[str, Any]) -> Table:
        table = Table(title=f"nestor train · {self.run_dir}", show_header=False, expand=False)
        table.add_column(style="bold")
        table.add_column()
        elapsed = s.get("elapsed_s") or 0.0
        table.add_row("step", f"{s.get('step', 0)}/{s.get('steps', '?')}  "
                              f"(policy v{s.get('version', 0)}, {elapsed:.0f}s)")
        trend = " ".join(f"{r:.2f}" for r in self.history[-8:])
        table.add_row("reward (last step)", f"{_fmt(s.get('reward'))}   [dim]{trend}[/dim]")
        table.add_row("validation pass rate", _fmt(s.get("validation_pass_rate"), ".0%"))
        table.add_row("episodes in flight", str(s.get("episodes_in_flight", 0)))
        table.add_row("jobs in flight", str(s.get("jobs_in_flight", "–")))
        table.add_row("pool utilisation", _fmt(s.get("pool_utilisation"), ".0%"))
        table.add_row("episodes done", str(s.get("episodes", 0)))
        table.add_row("cost", f"${s.get('cost_usd', 0.0):.4f}")
        return table

    def __call__(self, snapshot: dict[str, Any]) -> None:
        if snapshot.get("reward") is not None and snapshot["step"] > len(self.history):
            self.history.append(snapshot["reward"])
        self.live.update(self._render(snapshot))


def _run(config, run_dir: Path, resume: bool, tasks_module, json_: bool) -> None:
    from nestor.outer.checkpoint import CheckpointError
    from nestor.outer.config import RunConfigError
    from nestor.outer.loop import OuterLoopError
    from nestor.outer.run import train as train_run
    from nestor.pool.base import PoolError

    view = LiveView(run_dir)
    try:
        with view.live:
            summary = train_run(config, run_dir, resume=resume, registry=registry(tasks_module),
                                progress=view)
    except (RunConfigError, CheckpointError, OuterLoopError, PoolError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted; continue with `nestor train --resume {run_dir}`", code=130)
    if json_:
        print_json(summary)
    else:
        rose = summary.get("reward_rose")
        console.print(f"done: {summary['steps']} steps in {_fmt(summary.get('elapsed_s'), '.0f')}s;"
                      f" reward first 2 steps {_fmt(summary.get('first2_reward'))} → last 2 "
                      f"{_fmt(summary.get('last2_reward'))}"
                      f"{' (rose)' if rose else ''}; pool utilisation "
                      f"{_fmt(summary.get('pool_utilisation'), '.0%')}; metrics in "
                      f"{run_dir / 'metrics.jsonl'}")
        if summary.get("weighted_validation_first2") is not None:
            console.print(
                "both rungs: validation term "
                f"{_fmt(summary.get('weighted_validation_first2'))} → "
                f"{_fmt(summary.get('weighted_validation_last2'))}, job-quality term "
                f"{_fmt(summary.get('weighted_quality_first2'))} → "
                f"{_fmt(summary.get('weighted_quality_last2'))} (first 2 steps → last 2)")


def train(
    config: Path | None = typer.Argument(None, help="Run config TOML (see configs/)."),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Run directory; default "
                                        "runs/<name>-<timestamp>."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this "
                                       "directory from its latest checkpoint."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Override the config's seed."),
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Train the agent with the outer loop (async off-policy IS-GRPO)."""
    from nestor.outer.checkpoint import CheckpointError
    from nestor.outer.config import RunConfigError, load_run_config
    from nestor.outer.run import load_resumable, new_run_dir

    if resume is not None:
        if config is not None or run_dir is not None:
            fail("--resume RUN_DIR takes no CONFIG or --run-dir: the run's own config is used")
        try:
            cfg = load_resumable(resume)
        except CheckpointError as exc:
            fail(str(exc))
        _run(cfg, resume, True, tasks_module, json_)
        return
    if config is None:
        fail("give a run config (e.g. configs/quickstart.toml) or --resume RUN_DIR")
    try:
        cfg = load_run_config(config)
    except RunConfigError as exc:
        fail(str(exc))
    if seed is not None:
        cfg = cfg.model_copy(update={"seed": seed})
    _run(cfg, run_dir or new_run_dir(cfg.name), False, tasks_module, json_)


def quickstart(
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Default runs/quickstart-<ts>."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Override the config's seed."),
    json_: bool = JsonOpt,
) -> None:
    """Train the composer on tiny models with a local pool (configs/quickstart.toml)."""
    from nestor.outer.config import RunConfigError, load_run_config

    if not QUICKSTART.is_file():
        fail(f"{QUICKSTART} is missing; run from a source checkout of nestor")
    try:
        cfg = load_run_config(QUICKSTART)
    except RunConfigError as exc:
        fail(str(exc))
    if seed is not None:
        cfg = cfg.model_copy(update={"seed": seed})
    from nestor.report.html import write_report

    run_dir = run_dir or Path("runs") / f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}"
    _run(cfg, run_dir, False, None, json_)
    console.print(f"report: {write_report(run_dir)} (figures of this run; `nestor report` "
                  f"redraws them)")
