"""Canary replies in training's reward batches: a rubric cannot score well only when probed.

The validation probe scores a job's own reference answers and corrupted variants of them
(nestor.job.rubric_probe) and passes a rubric that ranks them sensibly and deterministically.
A hostile rubric could behave only while it is probed — keyed on call count, time, or any
difference it can see between probe and training. Two things close that:

1. the reward server runs under the very limits and timeouts the probe uses (one source:
   nestor.job.tasksource.TRAIN_LIMITS / Timeouts, which validate.py uses too);
2. `CanaryReward`, the trainer's reward function, opens training by scoring the probe's own
   batch of replies (the same tasks, replies and order as the probe's first request) and
   requires the probe's verdicts again (valid, reference beats corrupted); then it mixes a few
   of those reference and corrupted replies into every batch, at random positions, and
   requires each to score exactly what it scored then, and each such batch to take no longer
   per reply than `max_s_per_reply` of wall time as the trusted side waits for it (a rubric
   cannot be fast only while probed). A drift ends the job (`CanaryDrift`, a `failed` job
   whose log says so).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from nestor.job.rubric_probe import RubricProbe, probe_replies
from nestor.job.tasksource import JobTaskSource, TaskSourceError
from nestor.tasks import TaskSpec

RUBRIC_TASKS = 16  # as the probe (nestor.job.validate.RUBRIC_TASKS)


class CanaryConfig(BaseModel):
    """How often training re-checks the rubric against the probe's measurement."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: float = Field(0.05, ge=0.0, le=0.5, description="Canary replies per real completion "
                        "in each reward batch (at least one per batch when > 0; 0 turns the "
                        "canaries and the opening re-probe off).")
    tolerance: float = Field(1e-6, ge=0.0, le=1.0, description="Largest difference allowed "
                             "between a canary's reward in training and at the opening probe.")
    max_s_per_reply: float = Field(
        0.06, gt=0.0, le=10.0, description="Longest wall time per reply a reward batch may take "
        "in training, as the trusted side waits for it (3× the probe's 20 ms limit: room for a "
        "loaded machine, none for a rubric that is fast only while probed).")


class CanaryDrift(RuntimeError):
    """The rubric scored a canary reply differently in training than when probed."""

    stage = "canary"


class CanaryReward:
    """reward_fn for GRPOTrainer: (task indices, completions) -> rewards in [0, 1], scored by
    the job's sandboxed reward server with canaries mixed in and checked."""

    def __init__(self, source: JobTaskSource, spec: TaskSpec, config: CanaryConfig = CanaryConfig(),
                 *, seed: int = 0, log: Callable[[str], None] | None = None):
        self.source, self.config = source, config
        self.log = log or (lambda line: None)
        self.rng = random.Random(seed)
        self.batches = self.scored = 0
        self.canaries: list[tuple[int, str, str, float]] = []  # (task, kind, text, reward)
        if config.rate > 0:
            self._open(spec)

    def _open(self, spec: TaskSpec) -> None:
        """Score the probe's batch, as the probe did, and keep its references and corruptions."""
        tasks = self.source.load()
        picks = random.Random(0).sample(range(len(tasks)), min(RUBRIC_TASKS, len(tasks)))
        replies = probe_replies(tasks, picks, spec)
        batch = self.source.score_batch([r.task for r in replies], [r.text for r in replies])
        probe = RubricProbe(replies, batch)
        for ok, message in (probe.valid(), probe.beats_corrupted()):
            if not ok:
                raise CanaryDrift(f"canary: re-probed at the start of training, the rubric no "
                                  f"longer passes what it passed in validation: {message}")
        for reply, r in zip(replies, batch.rewards, strict=True):
            if r is not None and (reply.kind == "reference" or reply.kind.startswith("corrupt:")):
                self.canaries.append((reply.task, reply.kind, reply.text, r))
        self.log(f"canaries: {len(self.canaries)} probe replies, {self.config.rate:.0%} of each "
                 "batch")

    def __call__(self, task_indices: list[int], completions: list[str]) -> list[float]:
        self.batches += 1
        n_real = len(completions)
        n = max(1, round(self.config.rate * n_real)) if self.canaries else 0
        mixed: list[tuple[int, str, tuple | None]] = [(i, t, None) for i, t in
                                                      zip(task_indices, completions, strict=True)]
        for canary in self.rng.choices(self.canaries, k=n) if n else ():
            mixed.insert(self.rng.randint(0, len(mixed)), (canary[0], canary[2], canary))
        batch = self.source.score_batch([m[0] for m in mixed], [m[1] for m in mixed])
        if n:
            self._check_time(batch.elapsed_s, len(mixed))
        rewards = []
        for (task, text, canary), r, err in zip(mixed, batch.rewards, batch.errors, strict=True):
            if canary is not None:
                self._check(canary, r)
                continue
            if r is None or not math.isfinite(r) or not 0.0 <= r <= 1.0:
                raise TaskSourceError("score", f"task {task}, completion {text[:40]!r}: "
                                      f"{err or f'reward {r!r} is outside [0, 1]'}")
            rewards.append(float(r))
        self.scored += n
        return rewards

    def _check_time(self, elapsed_s: float, replies: int) -> None:
        """The batch's wall time as the trusted side waited for it (never the job's report)."""
        per = elapsed_s / max(1, replies)
        if per > self.config.max_s_per_reply:
            raise CanaryDrift(f"canary: reward batch {self.batches} of training took "
                              f"{per * 1000:.0f} ms per reply (limit "
                              f"{self.config.max_s_per_reply * 1000:.0f} ms; validation allows "
                              "20): the rubric is slower in training than when probed, so the "
                              "job is ended as failed")

    def _check(self, canary: tuple[int, str, str, float], got: float | None) -> None:
        task, kind, text, want = canary
        if got is not None and math.isfinite(got) and abs(got - want) <= self.config.tolerance:
            return
        what = "the reference answer" if kind == "reference" else \
            f"a corrupted answer ({kind.split(':', 1)[1].replace('_', ' ')})"
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise CanaryDrift(f"canary: in reward batch {self.batches} of training the rubric scored "
                          f"{what} {shown!r} of task {task} {got!r}, but {want:g} when probed; "
                          "the rubric scores differently in training than in validation (on "
                          "call count, time or batch), so the job is ended as failed")
