"""A training run end to end: run directory, policy, pool, ledger, the loop, and a summary."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nestor.outer.checkpoint import CheckpointError, latest_checkpoint
from nestor.outer.config import RunConfig, RunConfigError, load_run_config, save_run_config
from nestor.outer.loop import OuterLoop
from nestor.outer.metrics import MeteredPool, first_last, read_jsonl


def new_run_dir(name: str, root: Path = Path("runs")) -> Path:
    return root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def load_resumable(run_dir: Path) -> RunConfig:
    if not (run_dir / "config.toml").is_file():
        raise CheckpointError(f"{run_dir}: no config.toml; is this a run directory?")
    try:
        return load_run_config(run_dir / "config.toml")
    except RunConfigError as exc:
        raise CheckpointError(f"{run_dir}: {exc}") from None


def summarize_run(run_dir: Path) -> dict[str, Any]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    first, last, k = first_last(rewards)
    out: dict[str, Any] = {"run_dir": str(run_dir), "steps": len(rows)}
    if rows:
        out.update(
            compared_steps=k,  # first k → last k, never the same steps (0: too short)
            first2_reward=first, last2_reward=last,
            pool_utilisation=rows[-1].get("pool_utilisation_run"),
            elapsed_s=rows[-1].get("elapsed_s"), cost_usd=rows[-1].get("cost_usd_total"),
            validation_pass_rate_last=rows[-1].get("validation_pass_rate"))
        if k:
            out["reward_rose"] = last > first
        # both rungs' terms: validation (first rung) and job quality (second), first 2 → last 2
        for term in ("weighted_validation", "weighted_quality"):
            vals = [(r.get("reward_components") or {}).get(term) for r in rows]
            vals = [v for v in vals if v is not None]
            term_first, term_last, term_k = first_last(vals)
            if term_k:
                out[f"{term}_first2"], out[f"{term}_last2"] = term_first, term_last
    return out


def train(config: RunConfig, run_dir: Path, *, resume: bool = False, registry=None,
          progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train (or resume) a run in `run_dir`; returns summarize_run(run_dir)."""
    from nestor.ledger import Ledger
    from nestor.outer.episodes import ledger_episodes, make_episode_fn, make_policy
    from nestor.pool.base import make_pool
    from nestor.tasks import TaskRegistry

    registry = registry or TaskRegistry()
    config.check(registry)
    if not resume:
        if latest_checkpoint(run_dir) is not None or (run_dir / "metrics.jsonl").exists():
            raise CheckpointError(f"{run_dir} already holds a run; continue it with "
                                  f"`nestor train --resume {run_dir}` or pick another --run-dir")
        run_dir.mkdir(parents=True, exist_ok=True)
        save_run_config(config, run_dir / "config.toml")
    from nestor.outer.tracking import Tracker

    tracker = Tracker(config.logging, run_dir, name=run_dir.name, steps=config.steps,
                      run_config=config.model_dump(mode="json"))  # TrackingError before any work
    policy = make_policy(config, run_dir)
    ledger = Ledger(run_dir)
    pool = MeteredPool(make_pool(config.pool_config()))

    heldout = None
    if config.heldout_episodes > 0:
        from nestor.outer.heldout import HeldoutEval

        heldout = HeldoutEval(run_dir=run_dir, registry=registry, pool=pool, ledger=ledger,
                              episode_config=config.episode_config(),
                              difficulty=config.difficulty, every=config.heldout_every,
                              episodes=config.heldout_episodes,
                              make_untrained_policy=lambda: make_policy(config, run_dir),
                              progress=(lambda phase: progress({"phase": phase}))
                              if progress is not None else None)

    def on_step(row: dict[str, Any], ckpt: Path) -> None:
        ledger.add_policy_version(policy.name, row["policy_version"], path=str(ckpt),
                                  metrics={k: v for k, v in row.items() if k != "train"})
        tracker.log_step(row)
        if heldout is not None and heldout.due(row["step"], final=row["step"] == config.steps):
            # blocks training; episodes keep running
            tracker.log_heldout(heldout.run(loop.policy, row["step"]), row["step"])

    loop = OuterLoop(config, policy, make_episode_fn(config, registry, pool, ledger, run_dir),
                     run_dir, pool=pool, progress=progress, on_step=on_step)
    try:
        if resume:  # nothing of this process runs yet: every `running` episode was orphaned
            orphans = ledger.close_orphans("orphaned", "the run was killed while this episode "
                                           "ran; the resumed run runs it again")
            specs = {t: registry.get(t).spec(config.difficulty) for t in config.tasks}
            loop.resume(ledger_episodes(ledger, run_dir, specs,
                                        config.episode_config().token_budget))
            loop.counters["episodes_orphaned"] += len(orphans)
        loop.run()
    finally:
        loop.policy.closed = True
        pool.shutdown()  # jobs of episodes past the last step resolve as 'lost'
        loop.join(timeout_s=20.0)
        # episodes still running now are never used: close them, so the ledger of a run that
        # ended holds no `running` episode (one that finishes later still records its end)
        ledger.close_orphans("stopped", "still running when the run ended")
        tracker.close()
        ledger.close()  # checkpointed: the run dir keeps ledger.sqlite alone
    return summarize_run(run_dir)
