"""The trusted side of a job's taskset: a sandboxed host process that loads and scores it.

`JobTaskSource(job_dir)` runs `host.py` (a standalone script) in the sandbox with the job
directory bound read-only at /job, and gives the trusted process plain data: the tasks'
prompts and answers, and rewards for completions. The validation probe and the GRPO trainer's
reward server both use it. Every failure of the job's code, or of the child, comes back as a
`TaskSourceError` whose `stage` says which part of the job to fix.

Importing verifiers in the child costs seconds, so `prewarm()` starts a spare host on an empty
staging directory ahead of time; a source created with `warm=True` takes it, copies the job in
(the bind sees files added later) and skips the wait.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from nestor.job.layout import read_layout
from nestor.sandbox import Limits, SandboxedProcess, SandboxError

HOST_SCRIPT = Path(__file__).with_name("host.py")
HOST_IN = "/opt/nestor/host.py"
JOB_IN = "/job"
MAX_TASKS = 20_000
HOST_NAME = "the taskset host"

# The trainer's reward server lives as long as the job, so its CPU allowance is generous; each
# request still has its own wall-clock timeout, which is what stops a reward that loops.
TRAIN_LIMITS = Limits(cpu_s=7200, memory_mb=2048, nproc=64, fsize_mb=16, nofile=256,
                      wall_s=60, output_bytes=200_000, tmp_mb=64)


@dataclass(frozen=True)
class Timeouts:
    """Wall-clock seconds per request to the host."""

    start_s: float = 60.0  # interpreter + `import verifiers.v1` (the host's own cost, not the job's)
    import_s: float = 10.0  # the job's package import
    load_s: float = 15.0  # the whole of load()
    score_s: float = 30.0  # one batch of completions


class TaskSourceError(RuntimeError):
    """The job's code failed (or the sandboxed child died) at `stage`: import, taskset, load,
    score or host. The message is meant for the job's author."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


@dataclass
class ScoreBatch:
    rewards: list[float | None]  # None where the job's rubric failed for that item
    errors: list[str | None]
    components: list[dict[str, float]]
    elapsed_s: float  # time spent in the rubric, inside the child


@dataclass
class _Host:
    process: SandboxedProcess
    stage: Path | None = None  # a staging dir we own (warm hosts); removed on close
    hello: dict = field(default_factory=dict)

    def close(self) -> None:
        self.process.close()
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)


def _spawn(bind: Path, limits: Limits, stage: Path | None = None) -> _Host:
    process = SandboxedProcess(
        [sys.executable, "-I", HOST_IN, JOB_IN],
        ro_binds={str(HOST_SCRIPT): HOST_IN, str(bind): JOB_IN},
        limits=limits, cwd=JOB_IN, name=HOST_NAME)
    return _Host(process, stage)


_spares: list[tuple[Limits, _Host]] = []
_spares_lock = threading.Lock()


def prewarm(limits: Limits = TRAIN_LIMITS, *, wait: bool = False,
            timeout_s: float = Timeouts.start_s) -> bool:
    """Start a spare host (unless one with these limits is waiting) so that the next
    `JobTaskSource(..., warm=True)` skips the child's start-up; `wait` blocks until the spare
    is ready. Returns whether a spare is there."""
    with _spares_lock:
        spare = next((h for lim, h in _spares if lim == limits and h.process.alive), None)
    if spare is None:
        stage = Path(tempfile.mkdtemp(prefix="nestor-job-"))
        os.chmod(stage, 0o755)  # the sandbox runs as an unprivileged uid
        try:
            spare = _spawn(stage, limits, stage)
        except SandboxError:
            shutil.rmtree(stage, ignore_errors=True)
            return False
        with _spares_lock:
            _spares.append((limits, spare))
    if wait and not spare.hello:
        try:
            spare.hello = spare.process.request({"cmd": "hello"}, timeout_s=timeout_s)
        except SandboxError:
            return False
    return True


def _take_spare(limits: Limits) -> _Host | None:
    with _spares_lock:
        for i, (lim, host) in enumerate(_spares):
            if lim == limits:
                del _spares[i]
                if host.process.alive:
                    return host
                host.close()
    return None


@atexit.register
def _close_spares() -> None:
    with _spares_lock:
        while _spares:
            _spares.pop()[1].close()


def _copy_job(src: Path, dst: Path) -> None:
    """Copy the job into a staging dir, world-readable (symlinks are copied as links: inside
    the sandbox they resolve against its own, nearly empty, filesystem)."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for base, dirs, files in os.walk(dst):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(base, name), 0o755)
        for name in files:
            path = os.path.join(base, name)
            if not os.path.islink(path):
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o644)


class JobTaskSource:
    """A job's tasks and rubric, served from a sandboxed child. Use as a context manager."""

    def __init__(self, job_dir: Path | str, *, limits: Limits = TRAIN_LIMITS,
                 timeouts: Timeouts = Timeouts(), warm: bool = False,
                 max_tasks: int = MAX_TASKS, package: str | None = None):
        self.job_dir = Path(job_dir).resolve()
        self.package = package or read_layout(self.job_dir).package
        self.limits, self.timeouts, self.max_tasks = limits, timeouts, max_tasks
        self.timings: dict[str, float] = {}
        self.info: dict = {}
        self._tasks: list[dict] | None = None
        self._imported = False
        host = _take_spare(limits) if warm else None
        if host is not None:
            _copy_job(self.job_dir, host.stage)
        else:
            host = _spawn(self.job_dir, limits)
        self._host = host

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        self._host.close()

    def __enter__(self) -> JobTaskSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stderr_tail(self, n_chars: int = 1500) -> str:
        return self._host.process.stderr_tail(n_chars)

    def _request(self, stage: str, obj: dict, timeout_s: float) -> dict:
        t0 = time.perf_counter()
        try:
            reply = self._host.process.request(obj, timeout_s=timeout_s)
        except SandboxError as exc:
            raise TaskSourceError(stage, _explain(stage, str(exc), timeout_s)) from None
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - t0
        if not reply.get("ok"):
            raise TaskSourceError(str(reply.get("stage", stage)), str(reply.get("error", reply)))
        return reply

    # -- the job -----------------------------------------------------------------------------
    def start(self) -> dict:
        """Wait for the child to be up (the interpreter and verifiers imported)."""
        if not self._host.hello:
            self._host.hello = self._request("host", {"cmd": "hello"}, self.timeouts.start_s)
        return self._host.hello

    def import_env(self) -> dict:
        """Import the env package; returns its Taskset/Task class names and reward names."""
        if not self._imported:
            self.start()
            self.info = self._request("import", {"cmd": "import", "package": self.package},
                                      self.timeouts.import_s)
            self._imported = True
        return self.info

    def load(self) -> list[dict]:
        """The tasks load() yields (at most max_tasks): [{"prompt", "answer", "system_prompt"}]."""
        if self._tasks is None:
            self.import_env()
            reply = self._request("load", {"cmd": "load", "max_tasks": self.max_tasks},
                                  self.timeouts.load_s)
            self._tasks = list(reply["tasks"])
            self.info["truncated"] = bool(reply.get("truncated"))
        return self._tasks

    def prompts(self) -> list[str]:
        return [t["prompt"] for t in self.load()]

    def answers(self) -> list[str | None]:
        return [t["answer"] for t in self.load()]

    def score_batch(self, task_indices: list[int], completions: list[str],
                    timeout_s: float | None = None) -> ScoreBatch:
        """Score completions of the given tasks; per-item rubric failures come back as None."""
        if len(task_indices) != len(completions):
            raise ValueError("task_indices and completions differ in length")
        n = len(self.load())
        items = []
        for i, text in zip(task_indices, completions, strict=True):
            if not 0 <= int(i) < n:
                raise ValueError(f"task index {i} out of range (the job has {n} tasks)")
            items.append({"task": int(i), "completion": str(text)})
        reply = self._request("score", {"cmd": "score", "items": items},
                              timeout_s or self.timeouts.score_s)
        if not all(len(reply.get(k, ())) == len(items) for k in ("rewards", "errors", "components")):
            raise TaskSourceError("score", f"the host answered {len(items)} items with a reply "
                                  "of another length (did the job write to the protocol fd?)")
        try:
            rewards = [None if r is None else float(r) for r in reply["rewards"]]
            return ScoreBatch(rewards, [None if e is None else str(e) for e in reply["errors"]],
                              [dict(c) for c in reply["components"]], float(reply["elapsed_s"]))
        except (TypeError, ValueError, KeyError) as exc:
            raise TaskSourceError("score", f"the host sent a malformed reply: {exc}") from None

    def score(self, task_indices: list[int], completions: list[str]) -> list[float]:
        """Rewards in [0, 1], one per completion; TaskSourceError("score") if any is not."""
        batch = self.score_batch(task_indices, completions)
        for i, (r, err) in enumerate(zip(batch.rewards, batch.errors, strict=True)):
            if r is None or not math.isfinite(r) or not 0.0 <= r <= 1.0:
                what = err or f"reward {r!r} is outside [0, 1]"
                raise TaskSourceError("score", f"task {task_indices[i]}, completion "
                                      f"{completions[i][:40]!r}: {what}")
        return [float(r) for r in batch.rewards]


def _explain(stage: str, sandbox_message: str, timeout_s: float) -> str:
    what = {"host": "starting the sandboxed host", "import": "importing the env package",
            "load": "load()", "score": "scoring"}.get(stage, stage)
    first, _, rest = sandbox_message.partition("\n")
    if "did not reply within" in first:
        return (f"{what} did not finish within {timeout_s:g} s (killed); look for an endless "
                f"loop or slow work there" + (f"\n{rest}" if rest else ""))
    return f"{what}: the sandboxed process {first.removeprefix(HOST_NAME + ' ')}" + (
        f"\n{rest}" if rest else "")
