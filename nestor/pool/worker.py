"""What runs inside one warm worker (a local process or a Ray actor): load the job function and
the warm state once, then run jobs one at a time. Everything crosses the wire as JSON text."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from typing import Any

from nestor.inner.types import JobRequest, JobResult
from nestor.pool.base import load_callable
from nestor.pool.config import WorkerSpec


class WarmWorker:
    """A job function plus the warm state it keeps across jobs."""

    def __init__(self, spec: WorkerSpec) -> None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(spec.threads)
        sys.path[:0] = [p for p in spec.python_path if p not in sys.path]
        self.fn = load_callable(spec.job_fn)
        # A GPU worker type's device and dtype reach the warm state (hence the trainer).
        self.warm = (load_callable(spec.warm_state)(**dict(spec.warm_kwargs))
                     if spec.warm_state else None)
        if "torch" in sys.modules:  # imported by the job module: env vars came too late for it
            sys.modules["torch"].set_num_threads(spec.threads)
        # A worker is "ready" only once warm: the first job should not pay the start-up.
        if spec.preload and hasattr(self.warm, "warm_up"):
            self.warm.warm_up(spec.preload)
        self.jobs_done = 0

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def run(self, request_json: str) -> str:
        t0 = time.monotonic()
        try:
            request = JobRequest.model_validate_json(request_json)
            out = self.fn(request, warm=self.warm)
            result = out if isinstance(out, JobResult) else JobResult.model_validate(out)
        except Exception as exc:  # run_job should not raise; if it does, the worker survives it
            tail = traceback.format_exc()[-2000:]
            result = JobResult(status="failed", log_tail=f"job function raised {exc!r}\n{tail}")
        if not result.wall_s:
            result.wall_s = time.monotonic() - t0
        self.jobs_done += 1
        return result.model_dump_json()


def start_error(exc: BaseException) -> str:
    return f"worker could not load its job function: {type(exc).__name__}: {exc}"


def local_worker_main(conn, spec: WorkerSpec) -> None:
    """Entry point of a spawned local worker. Messages out: ('ready', info) | ('error', text) |
    ('result', json); in: a request's JSON, or None to stop."""
    # A worker is a daemon: its own session and process group, so the pool can kill it with
    # everything it started as one unit, and terminal signals (Ctrl-C) stay with the parent.
    # (Under the kernel's autogroup scheduling this also makes each worker its own CPU-share
    # group, as separate jobs on one machine would be.)
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker = WarmWorker(spec)
    except BaseException as exc:
        conn.send(("error", start_error(exc)))
        return
    conn.send(("ready", worker.info()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the pool is gone
            return
        if msg is None:
            return
        conn.send(("result", worker.run(msg)))
