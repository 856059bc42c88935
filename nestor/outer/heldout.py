"""The held-out transfer eval: episodes on the held-out family, never trained on.

Every `heldout_every` steps and at the end, `heldout_episodes` episodes per held-out task run
with the current policy (arm "trained"), and once, cached, with the untrained policy (arm
"untrained"). Their jobs are real (same pool, probe and hidden eval) and their cost counts;
their episodes are recorded in the ledger under group ids "heldout:ARM:STEP", which the
training loop never reads back. Rows go to RUN_DIR/heldout.jsonl:
{step, arm, task, n, mean, ci95, values, cost_usd}; `values` holds every episode's reward, so
intervals pooled over held-out tasks (nestor/report/findings.py) come from episodes, not means.
"""

from __future__ import annotations

import json
import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from nestor.outer.metrics import append_jsonl

HELDOUT_FILE = "heldout.jsonl"
UNTRAINED_CACHE = "heldout_untrained.json"


def mean_ci95(values: list[float]) -> tuple[float, list[float]]:
    """Mean and a normal-approximation 95% interval (degenerate for n < 2)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, [mean, mean]
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


class HeldoutEval:
    def __init__(self, *, run_dir: Path, registry, pool, ledger, episode_config, difficulty: int,
                 every: int, episodes: int, make_untrained_policy, workers: int = 4):
        self.run_dir = Path(run_dir)
        self.specs = {r.id: r.spec(difficulty) for r in registry.heldout_tasks()}
        self.pool, self.ledger, self.episode_config = pool, ledger, episode_config
        self.every, self.n = every, episodes
        self.make_untrained_policy = make_untrained_policy
        self.workers = workers

    def due(self, step: int, final: bool) -> bool:
        if self.n == 0 or not self.specs:
            return False
        return final or (self.every > 0 and step % self.every == 0)

    def run(self, policy, step: int) -> list[dict[str, Any]]:
        """Both arms at this step; the untrained arm comes from its cache after the first time."""
        rows = [*self._untrained(step), *self._arm(policy, "trained", step)]
        for row in rows:
            append_jsonl(self.run_dir / HELDOUT_FILE, row)
        return rows

    def _untrained(self, step: int) -> list[dict[str, Any]]:
        cache = self.run_dir / UNTRAINED_CACHE
        if cache.is_file():
            rows = json.loads(cache.read_text())
            return [{**r, "step": step, "cached": True, "cost_usd": 0.0} for r in rows]
        rows = self._arm(self.make_untrained_policy(), "untrained", step)
        cache.write_text(json.dumps(rows))
        return rows

    def _arm(self, policy, arm: str, step: int) -> list[dict[str, Any]]:
        from nestor.agent.episode import run_episode

        def one(task_id: str, i: int):
            return run_episode(policy, self.specs[task_id], self.pool, self.ledger,
                               self.episode_config,
                               episode_id=f"heldout-{arm}-s{step:04d}-{task_id}-{i}",
                               group_id=f"heldout:{arm}:{step}")

        jobs = [(t, i) for t in self.specs for i in range(self.n)]
        with ThreadPoolExecutor(max_workers=self.workers) as ex:
            records = list(ex.map(lambda a: one(*a), jobs))
        rows = []
        for task_id in self.specs:
            recs = [r for r in records if r.task_id == task_id]
            mean, ci = mean_ci95([r.reward for r in recs])
            rows.append({"step": step, "arm": arm, "task": task_id, "n": len(recs),
                         "mean": mean, "ci95": ci, "values": [r.reward for r in recs],
                         "policy_version": policy.version,
                         "cost_usd": sum(r.result.cost_usd for r in recs if r.result)})
        return rows
