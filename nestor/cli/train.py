"""`nestor train CONFIG [--run-dir D]`, `nestor train --resume RUN_DIR`, `nestor quickstart`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from nestor.cli.common import (
    JsonOpt,
    TasksModuleOpt,
    console,
    fail,
    print_json,
    registry,
    require_sandbox,
)

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"


StepsOpt = typer.Option(None, "--steps", min=1, max=100000, help="Override the config's outer "
                        "steps (e.g. --steps 2 for a smoke run).")


def _override(cfg, *, seed: int | None, steps: int | None):
    """The config with command-line overrides, re-validated like the TOML it came from."""
    from pydantic import ValidationError

    from nestor.config import validation_problems

    update = {k: v for k, v in (("seed", seed), ("steps", steps)) if v is not None}
    if not update:
        return cfg
    try:
        return type(cfg).model_validate({**cfg.model_dump(), **update})
    except ValidationError as exc:
        fail(f"with {', '.join(f'--{k} {v}' for k, v in update.items())}: "
             f"{validation_problems(exc)}")


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("quickstart")(quickstart)


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


class LiveView:
    """The live panel: step, reward, validation pass rate, episodes/jobs in flight, pool, cost,
    and what the run is doing when it is not stepping (pre-scores, the held-out eval).

    On a terminal it redraws in place; elsewhere (CI logs, `| tee`) it prints one line per
    step or phase change, and a heartbeat line every `every_s` seconds of quiet."""

    def __init__(self, run_dir: Path, *, terminal: bool | None = None, every_s: float = 30.0,
                 clock=time.monotonic):
        self.run_dir = run_dir
        self.history: list[float] = []
        self.state: dict[str, Any] = {}
        self.terminal = console.is_terminal if terminal is None else terminal
        self.every_s, self.clock = every_s, clock
        self._last_key: tuple | None = None
        self._last_t = 0.0
        self.live = (Live(self._render(), console=console, refresh_per_second=2, transient=False)
                     if self.terminal else None)

    def __enter__(self) -> LiveView:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def _render(self) -> Table:
        s = self.state
        table = Table(title=f"nestor train · {self.run_dir}", show_header=False, expand=False)
        table.add_column(style="bold")
        table.add_column()
        elapsed = s.get("elapsed_s") or 0.0
        table.add_row("step", f"{s.get('step', 0)}/{s.get('steps', '?')}  "
                              f"(policy v{s.get('version', 0)}, {elapsed:.0f}s)")
        if s.get("phase"):
            table.add_row("now", f"[yellow]{escape(s['phase'])}[/yellow]")
        trend = " ".join(f"{r:.2f}" for r in self.history[-8:])
        table.add_row("reward (last step)", f"{_fmt(s.get('reward'))}   [dim]{trend}[/dim]")
        table.add_row("validation pass rate", _fmt(s.get("validation_pass_rate"), ".0%"))
        table.add_row("episodes in flight", str(s.get("episodes_in_flight", 0)))
        table.add_row("jobs in flight", str(s.get("jobs_in_flight", "–")))
        table.add_row("pool utilisation", _fmt(s.get("pool_utilisation"), ".0%"))
        table.add_row("episodes done", str(s.get("episodes", 0)))
        table.add_row("cost", f"${s.get('cost_usd', 0.0):.4f}")
        return table

    def line(self) -> str:
        s = self.state
        parts = [f"step {s.get('step', 0)}/{s.get('steps', '?')}",
                 f"reward {_fmt(s.get('reward'))}",
                 f"valid {_fmt(s.get('validation_pass_rate'), '.0%')}",
                 f"episodes {s.get('episodes', 0)} ({s.get('episodes_in_flight', 0)} running)",
                 f"jobs running {s.get('jobs_in_flight', '–')}",
                 f"pool {_fmt(s.get('pool_utilisation'), '.0%')}",
                 f"${s.get('cost_usd', 0.0):.4f}", f"{s.get('elapsed_s') or 0.0:.0f}s"]
        if s.get("phase"):
            parts.insert(1, s["phase"])
        return " · ".join(parts)

    def __call__(self, snapshot: dict[str, Any]) -> None:
        self.state.update(snapshot)
        if self.state.get("reward") is not None and self.state.get("step", 0) > len(self.history):
            self.history.append(self.state["reward"])
        if self.live is not None:
            self.live.update(self._render())
            return
        key = (self.state.get("step"), self.state.get("phase"))
        now = self.clock()
        if key != self._last_key or now - self._last_t >= self.every_s:
            console.print(self.line(), highlight=False, markup=False, soft_wrap=True)
            self._last_key, self._last_t = key, now


def _prescore(config, registry, view: LiveView) -> None:
    """Score each base model on each task's hidden eval before the run, with progress; the
    workers then read these from the shared cache instead of each computing them in silence.
    Only for a local pool (remote workers have their own cache), models present here, and in
    the device and dtype of each worker type that runs the model (the cache is keyed by them:
    a CPU float32 score is never read by a CUDA bf16 worker), where this machine has it."""
    from nestor.inner.evaluate import pre_score
    from nestor.models.registry import ModelNotFoundError, resolve_model_dir

    pool = config.pool_config()
    if pool.backend != "local":
        return
    models = []
    for name in config.episode_config().models:
        try:
            resolve_model_dir(name)
            models.append(name)
        except ModelNotFoundError:
            continue  # the job that picks it reports the missing weights
    tasks = list(config.tasks) or [r.id for r in registry.tasks()]
    if config.heldout_episodes > 0:
        tasks += [r.id for r in registry.heldout_tasks()]
    pairs = [(m, t, kw) for m in models for kw in _score_targets(pool, m) for t in tasks]
    for k, (model, task, kw) in enumerate(pairs):
        view({"phase": f"pre-scores {k + 1}/{len(pairs)}: {model} on {task} (cached after "
                       f"the first run)"})
        pre_score(model, task, config.difficulty, registry=registry, **kw)
    view({"phase": None})


def _score_targets(pool, model: str) -> list[dict]:
    """The distinct (device, dtype) keyword sets of the pool's worker types that run `model`
    and that this machine can score on ({} = the CPU float32 default)."""
    out: list[dict] = []
    for wt in pool.types():
        kw = dict(wt.warm_kwargs())
        if not wt.runs(model) or kw in out:
            continue
        if kw.get("device", "cpu").startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                continue  # those workers score on their GPU themselves
        out.append(kw)
    return out


def _run(config, run_dir: Path, resume: bool, tasks_module, json_: bool) -> None:
    from nestor.outer.checkpoint import CheckpointError
    from nestor.outer.config import RunConfigError
    from nestor.outer.loop import OuterLoopError
    from nestor.outer.run import train as train_run
    from nestor.outer.tracking import TrackingError
    from nestor.pool.base import PoolError

    require_sandbox()  # the pool runs agent code: stop now, in one line, if it would be refused
    view = LiveView(run_dir)
    reg = registry(tasks_module)
    try:
        with view:
            view({"steps": config.steps})
            _prescore(config, reg, view)
            summary = train_run(config, run_dir, resume=resume, registry=reg, progress=view)
    except (RunConfigError, CheckpointError, OuterLoopError, PoolError, TrackingError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        fail(f"interrupted; continue with `nestor train --resume {run_dir}`", code=130)
    if json_:
        print_json(summary)
    else:
        rose, k = summary.get("reward_rose"), summary.get("compared_steps", 0)
        reward = (f"reward first {k} step{'s' if k > 1 else ''} "
                  f"{_fmt(summary.get('first2_reward'))} → last {k} "
                  f"{_fmt(summary.get('last2_reward'))}{' (rose)' if rose else ''}" if k else
                  "too short to compare first and last steps")
        console.print(f"done: {summary['steps']} steps in {_fmt(summary.get('elapsed_s'), '.0f')}s;"
                      f" {reward}; pool utilisation "
                      f"{_fmt(summary.get('pool_utilisation'), '.0%')}; metrics in "
                      f"{run_dir / 'metrics.jsonl'}")
        if summary.get("weighted_validation_first2") is not None:
            console.print(
                "both rungs: validation term "
                f"{_fmt(summary.get('weighted_validation_first2'))} → "
                f"{_fmt(summary.get('weighted_validation_last2'))}, job-quality term "
                f"{_fmt(summary.get('weighted_quality_first2'))} → "
                f"{_fmt(summary.get('weighted_quality_last2'))} (first {k} → last {k})")


def train(
    config: Path | None = typer.Argument(None, help="Run config TOML (see configs/)."),
    run_dir: Path | None = typer.Option(None, "--out", "--run-dir", help="Run directory; "
                                        "default runs/<name>-<timestamp>."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in this "
                                       "directory from its latest checkpoint."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Override the config's seed."),
    steps: int | None = StepsOpt,
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Train the agent with the outer loop (async off-policy IS-GRPO)."""
    from nestor.outer.checkpoint import CheckpointError
    from nestor.outer.config import RunConfigError, load_run_config
    from nestor.outer.run import load_resumable, new_run_dir

    if resume is not None:
        if config is not None or run_dir is not None:
            fail("--resume RUN_DIR takes no CONFIG or --out: the run's own config is used")
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
    cfg = _override(cfg, seed=seed, steps=steps)
    _run(cfg, run_dir or new_run_dir(cfg.name), False, tasks_module, json_)


def quickstart(
    run_dir: Path | None = typer.Option(None, "--out", "--run-dir",
                                        help="Default runs/quickstart-<ts>."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Override the config's seed."),
    steps: int | None = StepsOpt,
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
    cfg = _override(cfg, seed=seed, steps=steps)
    from nestor.report.html import write_report

    run_dir = run_dir or Path("runs") / f"quickstart-{time.strftime('%Y%m%d-%H%M%S')}"
    _run(cfg, run_dir, False, None, json_)
    console.print(f"report: {write_report(run_dir)} (figures of this run; `nestor report` "
                  f"redraws them)")
