"""Small real job functions for the pool's protocol tests (imported by workers by path).

Each reads its behaviour from `behave.json` in the job dir, so one function serves many tests.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import time
from pathlib import Path

from nestor.inner.types import JobRequest, JobResult


class CountingWarm:
    """Warm state that proves it survives across jobs: it counts the jobs its worker ran."""

    def __init__(self, **options: str) -> None:
        self.jobs = 0
        self.preloaded: list[str] | None = None
        self.options = options  # device / dtype from the worker type

    def warm_up(self, models: tuple[str, ...]) -> None:
        self.preloaded = list(models)


def behave_job(request: JobRequest, *, warm: CountingWarm | None = None) -> JobResult:
    spec_path = request.job_dir / "behave.json"
    spec = json.loads(spec_path.read_text()) if spec_path.is_file() else {}
    if warm is not None:
        warm.jobs += 1
    (request.job_dir / f"pid-{request.request_id}").write_text(str(os.getpid()))
    if spec.get("atexit_marker"):  # written only if the worker exits cleanly
        atexit.register(Path(spec["atexit_marker"]).write_text, "clean exit")
    if spec.get("die_always"):
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.time()  # wall clock: comparable across worker processes
    time.sleep(float(spec.get("sleep", 0.0)))
    return JobResult(status="ok", steps=warm.jobs if warm else 0,
                     metrics=[{"pid": os.getpid(), "task": request.task_id, "t0": t0,
                               "t1": time.time(),
                               "preloaded": warm.preloaded if warm else None,
                               "warm_options": warm.options if warm else None}])


def noop_job(request: JobRequest, *, warm: object = None) -> JobResult:
    return JobResult(status="ok")


def raising_job(request: JobRequest, *, warm: object = None) -> JobResult:
    raise ValueError("bad things")
