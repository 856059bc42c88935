"""The asynchronous off-policy outer loop.

Up to `max_in_flight` episodes run at once in threads (they mostly wait on the pool). Episodes
come in groups of G on one task spec. Whenever B groups have completed, the loop trains one step
on them and the policy version goes up; episodes started under older versions keep running and
are trained on later with the sampling logprobs they recorded, so one slow job never stalls a
batch. Every finished episode is journaled (RUN_DIR/outer/episodes.jsonl) before it is used, and
every step is checkpointed, so `resume()` continues a killed run without losing or recounting
finished episodes.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nestor.outer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from nestor.outer.config import RunConfig
from nestor.outer.groups import EpisodeSummary, Group, build_batch, stale_dropped
from nestor.outer.metrics import MeteredPool, append_jsonl, read_jsonl, step_metrics
from nestor.policy.base import Observation, PolicyClosed, TrainItem, Turn
from nestor.policy.batching import SharedExclusiveLock

MAX_CONSECUTIVE_ERRORS = 10


class OuterLoopError(RuntimeError):
    """The loop cannot go on (e.g. every episode crashes); the message says why."""


@dataclass(frozen=True)
class EpisodeTicket:
    group_id: int
    slot: int
    task_id: str
    seed: int


EpisodeFn = Callable[[Any, EpisodeTicket], EpisodeSummary]  # (policy, ticket) -> summary


def task_for_group(tasks: list[str], seed: int, group_id: int) -> str:
    """Every round of len(tasks) groups visits each task once, in a seeded order.

    A pure function of the group id, so a resumed run gives a group the same task again.
    """
    rnd, pos = divmod(group_id, len(tasks))
    order = list(tasks)
    random.Random(f"{seed}:{rnd}").shuffle(order)
    return order[pos]


class SerializedPolicy:
    """The policy as episode threads see it: `act` and `train_step` never overlap. A policy with
    `concurrent_act` (the LM, which batches concurrent turns) acts for many episodes at once."""

    def __init__(self, policy):
        self._policy = policy
        self._rw = SharedExclusiveLock()
        self._lock = self._rw.exclusive()
        self._act_lock = self._rw.shared() if getattr(policy, "concurrent_act", False) \
            else self._lock
        self.closed = False  # set when the run ends: episodes still running stop at their next turn

    @property
    def name(self) -> str:
        return self._policy.name

    @property
    def version(self) -> int:
        return self._policy.version

    def act(self, obs: Observation) -> Turn:
        if self.closed:
            raise PolicyClosed("the training run has ended")
        with self._act_lock:
            return self._policy.act(obs)

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        with self._lock:
            return self._policy.train_step(batch)

    def save(self, path: Path) -> None:
        with self._lock:
            self._policy.save(path)

    def load(self, path: Path) -> None:
        with self._lock:
            self._policy.load(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


class OuterLoop:
    def __init__(self, config: RunConfig, policy, episode_fn: EpisodeFn, run_dir: Path, *,
                 pool: MeteredPool | None = None,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 on_step: Callable[[dict[str, Any], Path], None] | None = None):
        self.config = config
        self.policy = policy if isinstance(policy, SerializedPolicy) else SerializedPolicy(policy)
        self.episode_fn = episode_fn
        self.run_dir = run_dir
        self.pool = pool
        self.progress = progress
        self.on_step = on_step  # (metrics row, checkpoint dir): e.g. the ledger's version table
        (run_dir / "outer").mkdir(parents=True, exist_ok=True)
        self.journal = run_dir / "outer" / "episodes.jsonl"
        self.metrics_path = run_dir / "metrics.jsonl"
        # Bookkeeping: open groups (incomplete or awaiting training) and consumed group ids.
        self.step = 0
        self.next_group_id = 0
        self.groups: dict[int, Group] = {}
        self.consumed: set[int] = set()
        self.counters: Counter[str] = Counter()
        self.cost_total = 0.0
        self.elapsed_before = 0.0  # run time spent before a resume
        self.rows: list[dict[str, Any]] = []
        self._running: dict[tuple[int, int], float] = {}
        self._results: queue.Queue = queue.Queue()
        self._consecutive_errors = 0
        self._dropped_since_step = 0  # stale groups dropped before they filled a step

    # ---- resume -------------------------------------------------------------------------

    def resume(self, recorded: list[EpisodeSummary] = ()) -> bool:
        """Restore the latest checkpoint and reuse finished episodes: the journal's, then any
        in `recorded` (e.g. from the ledger) that the journal missed. False if nothing."""
        ckpt = latest_checkpoint(self.run_dir)
        state: dict[str, Any] = {}
        if ckpt is not None:
            state = load_checkpoint(ckpt, self.policy)
            self.step = state["step"]
            self.next_group_id = state["next_group_id"]
            self.consumed = set(state["consumed"])
            self.counters = Counter(state["counters"])
            self.elapsed_before = state["elapsed_s"]
            for gid, task_id in state["open_groups"].items():
                self.groups[int(gid)] = Group(int(gid), task_id, self.config.group_size)
        # Metrics rows of steps the checkpoint does not include were trained again after resume.
        rows = [r for r in read_jsonl(self.metrics_path) if r.get("step", 0) <= self.step]
        self.metrics_path.write_text("".join(_dumps(r) + "\n" for r in rows), encoding="utf-8")
        self.rows = rows
        reused = 0
        journaled = [EpisodeSummary.from_json(rec) for rec in read_jsonl(self.journal)]
        seen = {(ep.group_id, ep.slot) for ep in journaled}
        missed = [ep for ep in recorded if (ep.group_id, ep.slot) not in seen]
        for ep in missed:  # journal them now, so the journal stays the complete record
            append_jsonl(self.journal, ep.to_json())
        for ep in [*journaled, *missed]:
            self.cost_total += float(ep.info.get("cost_usd", 0.0) or 0.0)
            if ep.group_id in self.consumed:
                continue
            group = self.groups.setdefault(
                ep.group_id, Group(ep.group_id, ep.task_id, self.config.group_size))
            if ep.slot not in group.episodes:
                group.episodes[ep.slot] = ep
                reused += 1
        if self.groups:
            self.next_group_id = max(self.next_group_id, max(self.groups) + 1)
        self.counters["episodes_reused"] += reused
        return ckpt is not None or reused > 0

    def _state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "version": self.policy.version,
            "next_group_id": self.next_group_id,
            "consumed": sorted(self.consumed),
            "open_groups": {str(g.group_id): g.task_id for g in self.groups.values()},
            "in_flight": [list(k) for k in self._running],
            "counters": dict(self.counters),
            "elapsed_s": self._elapsed(),
        }

    # ---- scheduling ---------------------------------------------------------------------

    def _elapsed(self) -> float:
        return self.elapsed_before + (time.monotonic() - self._t0)

    def _ready(self) -> list[Group]:
        """Completed groups, in the order they completed."""
        done = [g for g in self.groups.values() if g.complete]
        return sorted(done, key=lambda g: max(ep.finished_at for ep in g.episodes.values()))

    def _groups_wanted(self) -> int:
        """Groups still to start: exactly those the remaining steps will train on, so no
        episode is wasted at the end of a run (the price: the pool drains over the last
        steps instead of running episodes that would be thrown away). Stale-dropped groups
        have left `self.groups` (`_drop_untrainable`), so each is replaced."""
        cfg = self.config
        return (cfg.steps - self.step) * cfg.groups_per_step - len(self.groups)

    def _next_ticket(self) -> EpisodeTicket | None:
        for group in sorted(self.groups.values(), key=lambda g: g.group_id):
            for slot in range(group.size):
                if slot not in group.episodes and (group.group_id, slot) not in self._running:
                    return self._ticket(group, slot)
        if self._groups_wanted() <= 0:
            return None
        gid = self.next_group_id
        self.next_group_id += 1
        group = Group(gid, task_for_group(self.config.tasks, self.config.seed, gid),
                      self.config.group_size)
        self.groups[gid] = group
        return self._ticket(group, 0)

    def _staleness_rule(self) -> dict[str, Any]:
        token_level = getattr(self.policy, "token_level", False)
        return {"max_steps_off_policy": self.config.max_steps_off_policy,
                "stale_groups": self.config.stale_groups,
                "hard_max_staleness": self.config.token_max_staleness if token_level else None}

    def _drop_untrainable(self) -> None:
        """Drop the groups the staleness rule already condemns: one finished episode sampled
        too many versions ago is enough, as staleness only grows. Such a group must neither
        fill a training step (a step with no update) nor count among the groups the remaining
        steps need: with the version stuck, a straggler's group could hold the last slot while
        nothing left could train the policy. Its episodes still running are journaled, unused."""
        version, rule = self.policy.version, self._staleness_rule()
        for group in [g for g in self.groups.values() if g.episodes]:
            if stale_dropped(group.staleness(version), **rule):
                del self.groups[group.group_id]
                self.consumed.add(group.group_id)
                self._dropped_since_step += 1

    def _ticket(self, group: Group, slot: int) -> EpisodeTicket:
        seed = (self.config.seed * 1_000_003 + group.group_id * 1009 + slot) % 2**31
        return EpisodeTicket(group.group_id, slot, group.task_id, seed)

    def _fill(self) -> None:
        while len(self._running) < self.config.max_in_flight:
            ticket = self._next_ticket()
            if ticket is None:
                return
            self._running[(ticket.group_id, ticket.slot)] = time.monotonic()
            threading.Thread(target=self._run_episode, args=(ticket,), daemon=True,
                             name=f"episode-{ticket.group_id}-{ticket.slot}").start()

    def _run_episode(self, ticket: EpisodeTicket) -> None:
        try:
            self._results.put((ticket, self.episode_fn(self.policy, ticket), None))
        except BaseException as exc:  # reported to the main thread, which decides
            self._results.put((ticket, None, exc))

    def _collect(self, ticket: EpisodeTicket, ep: EpisodeSummary | None,
                 exc: BaseException | None) -> None:
        self._running.pop((ticket.group_id, ticket.slot), None)
        if exc is not None:
            self.counters["episode_errors"] += 1
            self._consecutive_errors += 1
            if self._consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
                raise OuterLoopError(f"{self._consecutive_errors} episodes in a row crashed; "
                                     f"last: {type(exc).__name__}: {exc}") from exc
            return  # the slot is free again and will be relaunched
        ep.group_id, ep.slot, ep.task_id = ticket.group_id, ticket.slot, ticket.task_id
        ep.finished_at = ep.finished_at or time.time()
        append_jsonl(self.journal, ep.to_json())  # durable before it is used
        self.counters["episodes"] += 1
        self.cost_total += float(ep.info.get("cost_usd", 0.0) or 0.0)
        if (group := self.groups.get(ticket.group_id)) is not None:  # else dropped as stale
            group.episodes[ticket.slot] = ep
        # An episode whose policy raised (e.g. sampling on the wrong device) returns normally
        # with reward 0; it is recorded, but it counts toward the same stop rule as a crash.
        if ep.info.get("end_reason") != "policy_error":
            self._consecutive_errors = 0
            return
        self.counters["policy_errors"] += 1
        self._consecutive_errors += 1
        if self._consecutive_errors >= MAX_CONSECUTIVE_ERRORS:
            raise OuterLoopError(f"{self._consecutive_errors} episodes in a row ended with "
                                 f"policy_error; last policy error: {ep.info.get('error', '?')}")

    # ---- training -----------------------------------------------------------------------

    def _train_step(self) -> dict[str, Any]:
        cfg = self.config
        groups = self._ready()[: cfg.groups_per_step]
        for g in groups:
            del self.groups[g.group_id]
        items, stats = build_batch(groups, self.policy.version, **self._staleness_rule())
        stats.stale_dropped += self._dropped_since_step  # dropped since the last step
        self._dropped_since_step = 0
        train = self.policy.train_step(items) if items else {}
        self.step += 1
        self.consumed.update(g.group_id for g in groups)
        for key in ("zero_variance", "stale_kept", "stale_dropped"):
            self.counters[f"groups_{key}"] += getattr(stats, key)
        now = time.monotonic()
        extra: dict[str, Any] = {
            "group_ids": [g.group_id for g in groups],
            "task_ids": [g.task_id for g in groups],
            "episodes_in_flight": len(self._running),
            "cost_usd_total": self.cost_total,
            "counters": dict(self.counters),
        }
        if self.pool is not None:
            extra["pool_utilisation"] = self.pool.utilisation(self._last_step_t, now)
            first = self.pool.first_start()
            extra["pool_utilisation_run"] = (None if first is None
                                             else self.pool.utilisation(first, now))
        episodes = [ep for g in groups for ep in g.episodes.values()]
        row = step_metrics(step=self.step, version=self.policy.version, episodes=episodes,
                           batch=stats, train=train, elapsed_s=self._elapsed(), extra=extra)
        self._last_step_t = now
        append_jsonl(self.metrics_path, row)  # then the checkpoint: a resume drops rows past it
        ckpt = save_checkpoint(self.run_dir, self.step, self.policy, self._state())
        self.rows.append(row)
        if self.on_step is not None:
            self.on_step(row, ckpt)
        return row

    # ---- main loop ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        last = self.rows[-1] if self.rows else {}
        return {
            "step": self.step, "steps": self.config.steps, "version": self.policy.version,
            "episodes_in_flight": len(self._running),
            "jobs_in_flight": self.pool.in_flight if self.pool is not None else None,
            "episodes": self.counters["episodes"], "reward": last.get("reward_mean"),
            "validation_pass_rate": last.get("validation_pass_rate"),
            "pool_utilisation": last.get("pool_utilisation_run"),
            "cost_usd": self.cost_total, "elapsed_s": self._elapsed(),
        }

    def run(self) -> list[dict[str, Any]]:
        self._t0 = self._last_step_t = time.monotonic()
        while self.step < self.config.steps:
            self._drop_untrainable()
            while (len(self._ready()) >= self.config.groups_per_step
                   and self.step < self.config.steps):
                self._train_step()
                self._drop_untrainable()
            if self.step >= self.config.steps:
                break
            self._fill()
            if not self._running:
                raise OuterLoopError("nothing in flight and not enough groups to train on")
            try:
                self._collect(*self._results.get(timeout=0.5))
            except queue.Empty:
                pass
            if self.progress is not None:
                self.progress(self.snapshot())
        if self.progress is not None:
            self.progress(self.snapshot())
        self.policy.closed = True
        return self.rows

    def join(self, timeout_s: float = 30.0) -> int:
        """Wait (bounded) for episodes still running after the last step; they stop at their
        next policy turn, or when the pool's shutdown resolves their job. Returns how many are
        still running (their results are not used)."""
        self.policy.closed = True
        deadline = time.monotonic() + timeout_s
        while self._running and time.monotonic() < deadline:
            try:
                ticket, _, _ = self._results.get(timeout=0.2)
            except queue.Empty:
                continue
            self._running.pop((ticket.group_id, ticket.slot), None)
        return len(self._running)


def _dumps(row: dict[str, Any]) -> str:
    import json

    return json.dumps(row, default=float)
