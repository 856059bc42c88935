"""Per-step metrics (RUN_DIR/metrics.jsonl) and the pool meter behind pool utilisation.

Episode facts come from `EpisodeSummary.info`, filled by the episode adapter
(nestor/outer/episodes.py): attempts, validated, first_try, job_status, improvement, base_model,
knobs_changed, cost_usd, end_reason, malformed_calls. Missing facts are simply not averaged.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from nestor.outer.groups import BatchStats, EpisodeSummary


class MeteredPool:
    """Wraps a Pool and records when each job ran, for busy worker-seconds.

    A job's busy interval is [finish − wall_s, finish]: the worker time it used, not the time it
    waited in the queue. Utilisation over a window = busy seconds in it / (capacity × window).
    """

    def __init__(self, pool, clock=time.monotonic):
        self.pool = pool
        self.clock = clock
        self._lock = threading.Lock()
        self.intervals: list[tuple[float, float]] = []
        self.submitted = 0
        self.in_flight = 0

    def submit(self, request) -> Future:
        future = self.pool.submit(request)
        with self._lock:
            self.submitted += 1
            self.in_flight += 1
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future) -> None:
        end = self.clock()
        wall = 0.0
        if not future.cancelled() and future.exception() is None:
            wall = float(getattr(future.result(), "wall_s", 0.0) or 0.0)
        with self._lock:
            self.in_flight -= 1
            if wall > 0:
                self.intervals.append((end - wall, end))

    def capacity(self) -> int:
        return self.pool.capacity()

    def shutdown(self) -> None:
        self.pool.shutdown()

    def __getattr__(self, name: str) -> Any:  # anything else the backend offers
        return getattr(self.pool, name)

    def busy_seconds(self, start: float, end: float) -> float:
        with self._lock:
            return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.intervals)

    def first_start(self) -> float | None:
        with self._lock:
            return min((a for a, _ in self.intervals), default=None)

    def utilisation(self, start: float, end: float) -> float | None:
        available = self.capacity() * (end - start)
        return None if available <= 0 else self.busy_seconds(start, end) / available


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def step_metrics(*, step: int, version: int, episodes: list[EpisodeSummary], batch: BatchStats,
                 train: dict[str, float], elapsed_s: float, extra: dict[str, Any]) -> dict[str, Any]:
    """One metrics.jsonl row from the episodes of the groups consumed by this step."""
    rewards = [ep.reward for ep in episodes]
    infos = [ep.info for ep in episodes]
    components: dict[str, list[float]] = {}
    for ep in episodes:
        for key, val in ep.components.items():
            components.setdefault(key, []).append(float(val))
    jobs = [i for i in infos if i.get("job_status")]
    improvements = [float(i["improvement"]) for i in jobs if i.get("improvement") is not None]
    models = Counter(i["base_model"] for i in jobs if i.get("base_model"))
    knobs = [i["knobs_changed"] for i in infos if i.get("knobs_changed") is not None]
    row: dict[str, Any] = {
        "step": step,
        "policy_version": version,
        "elapsed_s": round(elapsed_s, 2),
        "episodes": len(episodes),
        "reward_mean": _mean(rewards),
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_components": {k: _mean(v) for k, v in sorted(components.items())},
        "validation_pass_rate": _mean([float(bool(i.get("validated"))) for i in infos
                                       if "validated" in i]),
        # the first rung: a job valid on its first submit (what the validation term pays 1.0)
        "first_try_pass_rate": _mean([float(bool(i.get("first_try"))) for i in infos
                                      if "first_try" in i]),
        "mean_attempts": _mean([float(i["attempts"]) for i in infos if "attempts" in i]),
        "jobs": len(jobs),
        "job_failure_rate": _mean([float(i["job_status"] != "ok") for i in jobs]),
        "hidden_eval_improvement": _mean(improvements),
        "base_model_share": {m: n / sum(models.values()) for m, n in sorted(models.items())},
        "hyperparameter_surface_use": _mean([float(k >= 1) for k in knobs]),
        "end_reasons": dict(Counter(i.get("end_reason", "?") for i in infos)),
        "malformed_tool_calls": sum(int(i.get("malformed_calls", 0)) for i in infos),
        "groups": batch.groups,
        "groups_used": batch.used_groups,
        "zero_variance_groups": batch.zero_variance,
        "stale_groups_kept": batch.stale_kept,
        "stale_groups_dropped": batch.stale_dropped,
        "staleness_mean": _mean([float(s) for s in batch.staleness]),
        "staleness_max": max(batch.staleness, default=0),
        "cost_usd": sum(float(i.get("cost_usd", 0.0) or 0.0) for i in infos),
        "train": train,
    }
    row.update(extra)
    return row


def first_last(values: list[float], k: int = 2) -> tuple[float | None, float | None, int]:
    """(mean of the first k', mean of the last k', k') with k' = min(k, len // 2): the two ends
    never share a step, so a 2-step run compares step 1 with step 2, and a 1-step run compares
    nothing (None, None, 0)."""
    k = min(k, len(values) // 2)
    if k == 0:
        return None, None, 0
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:]), k


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, default=float) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line torn by a kill mid-write
                continue
    return rows
