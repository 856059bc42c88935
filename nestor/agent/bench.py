"""Benchmark a job writer without training it: run episodes, append one leaderboard row.

Each episode is exactly a training episode (same tools, probe, pool and hidden eval); the
policy is never updated. The row aggregates validation pass rate, mean improvement, mean
reward, the jobs' cost and the policy's token usage.
"""

from __future__ import annotations

import csv
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nestor.agent.episode import EpisodeConfig, EpisodeRecord, run_episode

LEADERBOARD_FIELDS = ["time", "policy", "tasks", "episodes", "validation_pass_rate",
                      "mean_improvement", "mean_reward", "cost_usd", "prompt_tokens",
                      "completion_tokens", "end_reasons"]


def leaderboard_row(policy_name: str, tasks: list[str], records: list[EpisodeRecord],
                    usage: Any = None) -> dict[str, Any]:
    improvements = [r.result.improvement for r in records
                    if r.result is not None and r.result.improvement is not None]
    reasons: dict[str, int] = {}
    for r in records:
        reasons[r.end_reason] = reasons.get(r.end_reason, 0) + 1
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "policy": policy_name,
        "tasks": " ".join(tasks),
        "episodes": len(records),
        "validation_pass_rate": round(statistics.fmean(
            any(getattr(rep, "passed", False) for rep in r.reports) for r in records), 4),
        "mean_improvement": round(statistics.fmean(improvements), 4) if improvements else None,
        "mean_reward": round(statistics.fmean(r.reward for r in records), 4),
        "cost_usd": round(sum(r.result.cost_usd for r in records if r.result), 4),
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
        "end_reasons": " ".join(f"{k}={v}" for k, v in sorted(reasons.items())),
    }


def run_benchmark(policy, policy_name: str, specs: list, episodes: int, pool, ledger,
                  config: EpisodeConfig, *, concurrency: int = 2,
                  on_episode=None) -> list[EpisodeRecord]:
    """`episodes` episodes per spec, `concurrency` at a time (they mostly wait on the pool)."""
    work = [(spec, i) for spec in specs for i in range(episodes)]

    def one(item):
        spec, i = item
        rec = run_episode(policy, spec, pool, ledger, config,
                          episode_id=f"bench-{policy_name.replace(':', '-')}-{spec.id}-{i}-"
                                     f"{int(time.time() * 1000) % 10**8}",
                          group_id=f"bench:{policy_name}")
        if on_episode is not None:
            on_episode(rec)
        return rec

    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        return list(ex.map(one, work))


def append_row(path: Path, row: dict[str, Any]) -> None:
    new = not path.is_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=LEADERBOARD_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(row)
