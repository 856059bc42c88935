"""Step 0 of the learning curve: N episodes of the untrained composer (the naive writer).

Runs real episodes (validation probe, local pool, GRPO, hidden eval) over the training tasks
in turn and prints the share of episodes whose job passed validation on the first submit and
on any, the share whose job improved
the base model, and the mean reward. Last line: one JSON object.

    .venv/bin/python benchmarks/composer_step0.py --episodes 20 --budget 20000 --timeout 150
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--budget", type=int, default=20_000, help="sampled tokens per job")
    ap.add_argument("--timeout", type=float, default=150.0, help="job wall cap, s")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", nargs="+", default=["tiny-s", "tiny-m"],
                    help="base models the composer chooses among")
    ap.add_argument("--no-train", action="store_true", help="validate only (no pool)")
    ap.add_argument("--run-dir", type=Path, default=Path("runs") / "composer-step0")
    args = ap.parse_args()

    import torch

    from nestor.agent.episode import EpisodeConfig, run_episode
    from nestor.ledger import Ledger
    from nestor.policy.composer import Composer, ComposerConfig
    from nestor.pool.base import make_pool
    from nestor.pool.config import PoolConfig
    from nestor.tasks import TaskRegistry

    torch.set_num_threads(1)
    tasks = [r.id for r in TaskRegistry().training_tasks()]
    reg = TaskRegistry()
    policy = Composer(ComposerConfig(seed=args.seed, token_budget=args.budget,
                                     base_models=args.models))
    cfg = EpisodeConfig(token_budget=args.budget, job_timeout_s=args.timeout, models=args.models)
    pool = None if args.no_train else make_pool(PoolConfig(workers=args.workers))
    rows = []
    t0 = time.perf_counter()
    try:
        with Ledger(args.run_dir) as ledger:
            for i in range(args.episodes):
                task = tasks[i % len(tasks)]
                rec = run_episode(policy, reg.get(task).spec(), pool, ledger, cfg)
                r = rec.result
                row = {"task": task, "end_reason": rec.end_reason, "attempts": rec.attempts,
                       "validated": rec.components["validation_efficiency"] > 0,
                       "first_try": bool(rec.reports) and rec.reports[0].passed,
                       "failed_checks": [c.name for rep in rec.reports for c in rep.checks
                                         if not c.ok],
                       "improvement": rec.components["improvement"], "reward": rec.reward,
                       "pre": r.pre_score if r else None, "post": r.post_score if r else None,
                       "job_s": round(r.wall_s, 1) if r else None}
                rows.append(row)
                print(f"[{i + 1}/{args.episodes}] {time.perf_counter() - t0:6.0f}s {task:9s} "
                      f"{rec.end_reason:10s} attempts={rec.attempts} pre={row['pre']} "
                      f"post={row['post']} reward={rec.reward:.4f}", flush=True)
    finally:
        if pool is not None:
            pool.shutdown()
    n = len(rows)
    out = {
        "episodes": n,
        "first_try_share": sum(r["first_try"] for r in rows) / n,
        "validated_share": sum(r["validated"] for r in rows) / n,
        "improved_share": sum(r["improvement"] > 0 for r in rows) / n,
        "mean_reward": statistics.fmean(r["reward"] for r in rows),
        "mean_improvement": statistics.fmean(r["improvement"] for r in rows),
        "mean_attempts": statistics.fmean(r["attempts"] for r in rows),
        "end_reasons": dict(Counter(r["end_reason"] for r in rows)),
        "failed_checks": dict(Counter(c for r in rows for c in r["failed_checks"])),
        "budget": args.budget,
        "models": args.models,
        "wall_s": round(time.perf_counter() - t0, 1),
        "run_dir": str(args.run_dir),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
