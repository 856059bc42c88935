"""The embedded default backend: warm worker processes on this machine.

Each worker is a long-lived `spawn`ed process (a clean interpreter: no forked torch state) that
loads the job function and its warm state once and then runs jobs one at a time, talking to the
supervisor over a pipe. The supervisor waits on every pipe and every process sentinel at once, so
a result and a worker's death are both seen within milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from nestor.pool.config import PoolConfig, usable_cpus
from nestor.pool.scheduler import Event, ScheduledPool, Slot
from nestor.pool.worker import local_worker_main

_CTX = mp.get_context("spawn")
STOP_GRACE_S = 5.0


@dataclass
class _Proc:
    process: mp.process.BaseProcess
    conn: Connection


class LocalPool(ScheduledPool):
    backend = "local"

    def __init__(self, config: PoolConfig | None = None) -> None:
        config = config or PoolConfig()
        types = config.types()
        super().__init__(config, types)
        total = sum(t.max_workers for t in types)
        self.threads = config.threads_per_worker or max(1, usable_cpus() // total)
        self._wake_r, self._wake_w = _CTX.Pipe(duplex=False)
        self.start()
        # Workers are not daemonic (a job may start processes of its own), so make sure an
        # interpreter that exits without shutdown() does not leave them running.
        atexit.register(_shutdown_ref, weakref.ref(self))

    def _spawn(self, slot: Slot) -> None:
        parent, child = _CTX.Pipe()
        process = _CTX.Process(
            target=local_worker_main, name=f"nestor-worker-{slot.name}",
            args=(child, self.config.worker_spec(slot.wtype, self.threads)))
        process.start()
        child.close()
        slot.handle = _Proc(process, parent)

    def _send(self, slot: Slot, request_json: str) -> None:
        try:
            slot.handle.conn.send(request_json)
        except OSError:
            pass  # it died just now: its sentinel fires on the next poll and the job is retried

    def _stop(self, slot: Slot) -> None:
        """Ask an idle worker to exit, so that its exit handlers run (they close its sandboxed
        reward hosts); kill it if it is busy or does not exit within STOP_GRACE_S."""
        if slot.job is None and slot.handle.process.is_alive():
            with contextlib.suppress(OSError):
                slot.handle.conn.send(None)  # the worker's loop ends on None
                slot.handle.process.join(timeout=STOP_GRACE_S)
        self._kill(slot)

    def _kill(self, slot: Slot) -> None:
        proc: _Proc = slot.handle
        if proc.process.is_alive():
            try:  # the worker's process group: it and whatever it started that stayed there
                os.killpg(proc.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # not yet its own group (killed while starting): the pid alone is enough
            proc.process.kill()
        proc.process.join(timeout=5)
        proc.conn.close()

    def _poll(self, timeout: float) -> Iterable[Event]:
        by_conn = {s.handle.conn: s for s in self._slots}
        by_sentinel = {s.handle.process.sentinel: s for s in self._slots}
        ready = wait([self._wake_r, *by_conn, *by_sentinel], timeout)
        events: list[Event] = []
        gone: set[str] = set()
        if self._wake_r in ready:
            while self._wake_r.poll():
                self._wake_r.recv_bytes()
        for obj in ready:
            slot = by_conn.get(obj)
            if slot is not None:
                events.extend(self._drain(slot, gone))
        for obj in ready:
            slot = by_sentinel.get(obj)
            if slot is not None and slot.name not in gone:
                events.extend(self._drain(slot, gone))  # a last message may precede the exit
                if slot.name not in gone:
                    gone.add(slot.name)
                    code = slot.handle.process.exitcode
                    events.append((slot, "died", f"exit code {code}"))
        return events

    def _drain(self, slot: Slot, gone: set[str]) -> list[Event]:
        events: list[Event] = []
        conn = slot.handle.conn
        try:
            while conn.poll():
                kind, payload = conn.recv()
                events.append((slot, kind, payload))
        except (EOFError, OSError):
            gone.add(slot.name)
            code = slot.handle.process.exitcode
            events.append((slot, "died", f"pipe closed, exit code {code}"))
        return events

    def _wake(self) -> None:
        try:
            self._wake_w.send_bytes(b"x")
        except OSError:
            pass

    def _close(self) -> None:
        self._wake_r.close()
        self._wake_w.close()


def _shutdown_ref(ref: weakref.ref) -> None:
    pool = ref()
    if pool is not None:
        pool.shutdown()
