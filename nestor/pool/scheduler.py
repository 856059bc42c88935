"""The backend-independent half of a pool: a queue of jobs, a set of worker slots, and one
supervisor thread that places jobs by cost, enforces timeouts, and retries jobs whose worker died.

A backend (local processes, Ray actors) supplies five hooks: start a worker, send it a job, kill
it, poll for events, and wake the poll. Only the supervisor thread touches slots, so the hooks
need no locking; `submit` only appends to the queue under a lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from nestor.inner.types import JobRequest, JobResult
from nestor.pool import dispatch
from nestor.pool.config import PoolConfig, WorkerType
from nestor.pool.cost import CostMatrix, job_cost

log = logging.getLogger("nestor.pool")

START_FAILURES_BEFORE_BROKEN = 3  # a type whose workers keep failing to start stops respawning


@dataclass
class _Job:
    request: JobRequest
    future: Future
    base_model: str | None
    ranked: list[WorkerType]
    pinned: str | None = None
    attempts: int = 0
    cost_usd: float = 0.0
    notes: list[str] = field(default_factory=list)
    submitted: float = field(default_factory=time.monotonic)


@dataclass
class Slot:
    """One worker as the supervisor sees it; `handle` is the backend's object."""

    name: str
    wtype: WorkerType
    handle: Any = None
    ready: bool = False
    info: dict = field(default_factory=dict)
    job: _Job | None = None
    started: float = 0.0
    deadline: float = float("inf")
    jobs_done: int = 0


Event = tuple[Slot, Literal["ready", "error", "result", "died"], Any]


def job_base_model(request: JobRequest) -> str | None:
    """The job's base model from its config.toml; None if unreadable (the worker will then
    report the job invalid, with the reason, so no need to say it twice here)."""
    from nestor.job.config import JobConfigError, load_job_config

    try:
        return load_job_config(request.job_dir / "config.toml").base_model
    except (JobConfigError, OSError):
        return None


class ScheduledPool:
    backend = "base"

    def __init__(self, config: PoolConfig, types: list[WorkerType]) -> None:
        self.config = config
        self.types = types
        self.matrix = CostMatrix.load(config.matrix_path())
        self._lock = threading.Lock()
        self._pending: deque[_Job] = deque()
        self._slots: list[Slot] = []
        self._counters = {t.name: itertools.count() for t in types}
        self._start_failures = {t.name: 0 for t in types}
        self._broken: dict[str, str] = {}  # type name -> why its workers cannot start
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)

    # --- public API -------------------------------------------------------------------------

    def start(self) -> None:
        for t in self.types:
            for _ in range(self.target(t)):
                self._add_slot(t)
        self._thread = threading.Thread(target=self._supervise, name=f"{self.backend}-pool",
                                        daemon=True)
        self._thread.start()

    def submit(self, request: JobRequest, *, worker_type: str | None = None) -> Future[JobResult]:
        """Queue a job; `worker_type` pins it to one type (used to measure the cost matrix)."""
        future: Future[JobResult] = Future()
        if self._stopping.is_set():
            future.set_result(JobResult(status="lost", log_tail="pool is shut down"))
            return future
        if not request.request_id:
            request = request.model_copy(update={"request_id": f"job-{next(self._ids)}"})
        base_model = job_base_model(request)
        job = _Job(request, future, base_model,
                   dispatch.rank_types(base_model, self.types, self.matrix), worker_type)
        with self._lock:
            self._pending.append(job)
        self._wake()
        return future

    def capacity(self) -> int:
        return sum(self.target(t) for t in self.types if t.name not in self._broken)

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        """Block until every worker has loaded its job function (False on timeout)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            slots = list(self._slots)
            if slots and all(s.ready for s in slots):
                return True
            time.sleep(0.02)
        return False

    def workers(self) -> list[dict]:
        """A snapshot of the workers: name, type, ready, busy, jobs done, pid/host."""
        return [{"name": s.name, "type": s.wtype.name, "ready": s.ready, "busy": s.job is not None,
                 "jobs_done": s.jobs_done, **s.info} for s in list(self._slots)]

    def shutdown(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # --- backend hooks ----------------------------------------------------------------------

    def target(self, wtype: WorkerType) -> int:
        """How many workers of this type the pool keeps."""
        return wtype.max_workers

    def _spawn(self, slot: Slot) -> None:
        raise NotImplementedError

    def _send(self, slot: Slot, request_json: str) -> None:
        raise NotImplementedError

    def _stop(self, slot: Slot) -> None:
        """End a worker at shutdown (a backend may first ask it to exit cleanly)."""
        self._kill(slot)

    def _kill(self, slot: Slot) -> None:
        raise NotImplementedError

    def _poll(self, timeout: float) -> Iterable[Event]:
        raise NotImplementedError

    def _wake(self) -> None:
        """Make a blocked _poll return early (a new job or shutdown)."""

    def _close(self) -> None:
        """Release backend resources after every slot was killed."""

    def _refresh(self) -> None:
        """Called about once a second: a backend whose capacity can grow adds slots here."""

    # --- supervisor ---------------------------------------------------------------------------

    def _add_slot(self, wtype: WorkerType) -> None:
        slot = Slot(name=f"{wtype.name}/{next(self._counters[wtype.name])}", wtype=wtype)
        self._spawn(slot)
        self._slots.append(slot)

    def _supervise(self) -> None:
        last_refresh = time.monotonic()
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                deadline = min((s.deadline for s in self._slots if s.job), default=now + 0.5)
                for slot, kind, payload in self._poll(max(0.0, min(0.5, deadline - now))):
                    self._on_event(slot, kind, payload)
                self._expire()
                if time.monotonic() - last_refresh > 1.0:
                    self._refresh()
                    last_refresh = time.monotonic()
                self._dispatch()
        except Exception:  # a bug here must not leave callers waiting on futures forever
            log.exception("pool supervisor crashed")
        finally:
            self._stopping.set()
            for slot in list(self._slots):
                self._stop(slot)
                if slot.job is not None:
                    self._finish(slot.job, JobResult(status="lost", worker=slot.name),
                                 "pool shut down while the job ran")
            self._slots.clear()
            with self._lock:
                pending, self._pending = list(self._pending), deque()
            for job in pending:
                self._finish(job, JobResult(status="lost"), "pool shut down before the job ran")

    def _on_event(self, slot: Slot, kind: str, payload: Any) -> None:
        if slot not in self._slots:
            return
        if kind == "ready":
            slot.ready, slot.info = True, dict(payload or {})
            self._start_failures[slot.wtype.name] = 0
        elif kind == "result":
            job, slot.job = slot.job, None
            slot.jobs_done += 1
            if job is None:
                return
            job.cost_usd += job_cost(slot.wtype, time.monotonic() - slot.started)
            try:
                result = JobResult.model_validate_json(payload)
            except ValueError as exc:
                result = JobResult(status="failed",
                                   log_tail=f"worker sent an unreadable result: {exc}")
            result.worker = slot.name
            self._finish(job, result)
        elif kind in ("died", "error"):
            self._lose_slot(slot, str(payload))

    def _lose_slot(self, slot: Slot, why: str) -> None:
        """A worker died (or failed to start): retry its job elsewhere, replace it."""
        self._kill(slot)
        self._slots.remove(slot)
        job = slot.job
        if job is not None:
            job.cost_usd += job_cost(slot.wtype, time.monotonic() - slot.started)
            job.notes.append(f"attempt {job.attempts}: worker {slot.name} died ({why})")
            if job.attempts > self.config.max_retries:
                self._finish(job, JobResult(status="lost", worker=slot.name),
                             f"retries exhausted ({self.config.max_retries})")
            else:
                with self._lock:
                    self._pending.appendleft(job)  # first in line: it has waited longest
        if not slot.ready:
            name = slot.wtype.name
            self._start_failures[name] += 1
            if self._start_failures[name] >= START_FAILURES_BEFORE_BROKEN:
                self._broken[name] = why
                log.error("worker type %s is broken: %s", name, why)
        if slot.wtype.name not in self._broken and not self._stopping.is_set():
            self._add_slot(slot.wtype)

    def _expire(self) -> None:
        now = time.monotonic()
        for slot in [s for s in self._slots if s.job and now >= s.deadline]:
            job = slot.job
            job.cost_usd += job_cost(slot.wtype, now - slot.started)
            self._kill(slot)
            self._slots.remove(slot)
            self._finish(job, JobResult(status="timeout", wall_s=now - slot.started,
                                        worker=slot.name),
                         f"killed after {now - slot.started:.1f}s (timeout_s="
                         f"{job.request.timeout_s:g} + grace {self.config.timeout_grace_s:g}); "
                         "worker recycled")
            self._add_slot(slot.wtype)

    def _dispatch(self) -> None:
        free: dict[str, list[Slot]] = {}
        for s in self._slots:
            if s.ready and s.job is None:
                free.setdefault(s.wtype.name, []).append(s)
        with self._lock:
            pending = list(self._pending)
        for job in pending:
            ranked = [t for t in job.ranked if t.name not in self._broken]
            if job.pinned is not None:
                ranked = [t for t in ranked if t.name == job.pinned]
            if not ranked:
                self._take(job)
                self._finish(job, JobResult(status="failed"), self._unplaceable(job))
                continue
            wtype = dispatch.choose(ranked, {k: len(v) for k, v in free.items()})
            if wtype is None:  # every type that can run it is busy (wait) or absent (wait a while)
                waited = time.monotonic() - job.submitted
                if (waited > self.config.placement_timeout_s
                        and not any(self.target(t) for t in ranked)):
                    self._take(job)
                    self._finish(job, JobResult(status="failed"),
                                 f"no worker of type {', '.join(t.name for t in ranked)} joined "
                                 f"the cluster in {waited:.0f}s")
                continue
            slot = free[wtype.name].pop()
            self._take(job)
            job.attempts += 1
            slot.job, slot.started = job, time.monotonic()
            slot.deadline = slot.started + job.request.timeout_s + self.config.timeout_grace_s
            self._send(slot, job.request.model_dump_json())

    def _take(self, job: _Job) -> None:
        with self._lock:
            self._pending.remove(job)

    def _unplaceable(self, job: _Job) -> str:
        able = [t.name for t in self.types if t.runs(job.base_model)]
        if job.pinned is not None and job.pinned not in able:
            return f"worker type {job.pinned!r} does not run base model {job.base_model!r}"
        if not able:
            return (f"no worker type runs base model {job.base_model!r} "
                    f"(types: {', '.join(f'{t.name}: {t.models}' for t in self.types)})")
        return "; ".join(f"worker type {n} cannot start: {self._broken[n]}"
                         for n in able if n in self._broken)

    def _finish(self, job: _Job, result: JobResult, note: str = "") -> None:
        notes = [*job.notes, note] if note else job.notes
        result.cost_usd = round(job.cost_usd, 6)
        if result.base_model is None:
            result.base_model = job.base_model
        if notes:
            result.log_tail = "\n".join(["[pool] " + n for n in notes] +
                                        ([result.log_tail] if result.log_tail else []))
        if not job.future.done():
            job.future.set_result(result)
