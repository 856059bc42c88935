"""The trusted side of a job's taskset: a sandboxed host process that loads and scores it.

`JobTaskSource(job_dir)` copies the job into a staging directory that a sandboxed `host.py`
sees read-only, and gives the trusted process plain data: the tasks' prompts and answers, and
rewards for completions. The validation probe and the GRPO trainer's reward server both use
it. Every failure of the job's code, or of the child, comes back as a `TaskSourceError` whose
`stage` says which part of the job to fix.

The hosts themselves (start, idle list, retirement) are `nestor.sandbox.hosts`; the zygote is
`nestor/sandbox/host.py`, and what it serves for a job (import, load, score) is
`nestor/job/protocol.py`. A warm host serves one job after another: it pays the seconds of `import
verifiers` once, and never runs job code in its own process. Each job runs in processes forked
for it in fresh user, pid, mount, ipc and network namespaces, with a fresh /tmp and /dev/shm,
no capabilities, the full seccomp filter and pipes of its own (host_ns.py); when it ends, its
whole pid namespace is gone before the host says so. Nothing that ran a job's code — process,
memory, /tmp, protocol pipes — serves another job; what later jobs share with it is the
sandbox's uid, one at a time. A host whose job ended cleanly goes back to the idle list; one
whose job broke the protocol, died or timed out is killed with everything in its sandbox, and
a warm `JobTaskSource` then starts its successor on close. Where the host cannot make fresh
namespaces (its `hello` says `fresh_ns: false`; or `fresh_ns=False` here) each job gets its own
host, as a fallback: speed then comes from starting hosts early (`prewarm()`). A host that
never opened its job goes back to the idle list; one is retired after MAX_JOBS_PER_HOST jobs.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from nestor.job.layout import read_layout
from nestor.job.safe_read import UnsafeFileError, copy_tree
from nestor.sandbox import Limits, SandboxError
from nestor.sandbox.hosts import (  # noqa: F401  (re-exported: the host pool)
    FILTER_IN,
    GRACE_S,
    HOST_FILES,
    HOST_IN,
    HOST_NAME,
    HOST_NS_IN,
    HOST_SCRIPT,
    JOBS_IN,
    TRAIN_LIMITS,
    _acquire,
    _idle,
    _release,
    _replenish,
    prewarm,
    shutdown_hosts,
)
from nestor.text import no_surrogates

MAX_TASKS = 20_000
MAX_TEXT = 16_384  # protocol.py's cap on a task's text, re-checked here: job code can patch it
MAX_NAME = 200  # chars of a name from a reply (a class, a reward) that reports show
MAX_MESSAGE = 2_000  # chars of an error message from a reply
MAX_REWARDS = 32  # reward names shown; a real Task has a few


@dataclass(frozen=True)
class Timeouts:
    """Wall-clock seconds per request to the host."""

    start_s: float = 60.0  # interpreter + `import verifiers.v1` (the host's own cost, not the job's)
    import_s: float = 10.0  # the job's package import
    load_s: float = 15.0  # the whole of load()
    score_s: float = 30.0  # one batch of completions
    end_s: float = 5.0  # closing the job's child


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
    elapsed_s: float  # wall time of the request, measured here: never the job's own word
    reported_s: float | None = None  # what the job's server said it took (informative only)


def _copy_job(src: Path, dst: Path) -> None:
    """Copy the job into the staging dir as fresh, world-readable files, following no link
    (safe_read.copy_tree: a link or special file in the job is refused, never copied)."""
    copy_tree(src, dst)


class JobTaskSource:
    """A job's tasks and rubric, served from a sandboxed child. Use as a context manager.

    The constructor only stages the job; the child starts on first use (`start`, or any of the
    data methods), so a caller can do other work while the host gets ready."""

    def __init__(self, job_dir: Path | str, *, limits: Limits = TRAIN_LIMITS,
                 timeouts: Timeouts = Timeouts(), warm: bool = True,
                 max_tasks: int = MAX_TASKS, package: str | None = None,
                 fresh_ns: bool = True):
        self.job_dir = Path(job_dir).resolve()
        self.package = package or read_layout(self.job_dir).package
        self.limits, self.timeouts, self.max_tasks = limits, timeouts, max_tasks
        self.timings: dict[str, float] = {}
        self.info: dict = {}
        self._tasks: list[dict] | None = None
        self._imported = self._opened = self._broken = self._used = self._died = False
        self._warm, self._fresh_ns = warm, fresh_ns
        self._zygote = _acquire(limits, warm, fresh_ns)
        self._staged = self._zygote.stage / uuid.uuid4().hex
        try:
            _copy_job(self.job_dir, self._staged)
        except (OSError, UnsafeFileError) as exc:
            z, self._zygote = self._zygote, None  # released once: close() and __del__ skip it
            shutil.rmtree(self._staged, ignore_errors=True)
            _release(z, keep=True)
            raise TaskSourceError("host", f"could not stage the job: {exc}") from None

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        z, self._zygote = self._zygote, None
        if z is None:
            return
        # A host that never opened the job goes back to the idle list; so does one that ended
        # it cleanly in fresh namespaces (nothing of the job runs any more, and the next job
        # gets new ones). Any other is killed with its sandbox, and a successor started.
        reuse = not self._broken and (not self._used or (
            z.reusable and not self._died and self._opened
            and z.end_job(self.timeouts.end_s + GRACE_S)))
        shutil.rmtree(self._staged, ignore_errors=True)  # before any next job is staged
        _release(z, keep=reuse)
        if not reuse and self._used and self._warm:
            _replenish(self.limits, self._fresh_ns)

    def __enter__(self) -> JobTaskSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _malformed(self, stage: str, message: str):
        """A reply of the wrong shape: the host's stream is not ours any more; end it."""
        self._broken = True
        if self._zygote is not None:
            self._zygote.process.close(grace_s=0.0)
        raise TaskSourceError(stage, message)

    def stderr_tail(self, n_chars: int = 1500) -> str:
        return self._zygote.process.stderr_tail(n_chars) if self._zygote else ""

    def _request(self, stage: str, obj: dict, timeout_s: float) -> dict:
        """One request to the job's child. The child enforces `timeout_s` itself (it dies of
        SIGALRM and the zygote says so); the sandbox's own timeout, a little later, is the
        backstop for a job that blocks the alarm, and costs the zygote."""
        if self._zygote is None:
            raise TaskSourceError(stage, "the task source is closed")
        t0 = time.perf_counter()
        try:
            reply = self._zygote.process.request({**obj, "timeout_s": timeout_s},
                                                 timeout_s=timeout_s + GRACE_S)
        except SandboxError as exc:
            self._broken = True
            raise TaskSourceError(stage, _explain(stage, str(exc), timeout_s)) from None
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - t0
        if not reply.get("ok"):
            got, error = str(reply.get("stage", stage)), str(reply.get("error", reply))
            if got == "protocol":  # the job wrote replies of its own: not reused
                self._broken, got = True, stage
            if got == "died":  # the zygote reaped the child and is ready for another job
                self._opened, self._died, got = False, True, stage
                if error == "timeout":
                    raise TaskSourceError(stage, _explain(stage, "did not reply within", timeout_s))
            raise TaskSourceError(got, _limit_hint(clean_text(error, MAX_MESSAGE), self.limits))
        return reply

    # -- the job -----------------------------------------------------------------------------
    def start(self) -> dict:
        """Wait for the host to be up and open this job in a fresh child."""
        if not self._opened:
            t0 = time.perf_counter()
            try:
                hello = self._zygote.wait_ready(self.timeouts.start_s)
            except SandboxError as exc:
                self._broken = True
                raise TaskSourceError("host", _explain("host", str(exc),
                                                       self.timeouts.start_s)) from None
            finally:
                self.timings["host"] = time.perf_counter() - t0
            self._used = True  # from here on the host may run job code
            self._zygote.process.restart_cpu_bound()  # the whole-sandbox CPU bound is per job
            # stderr tails show this job's output only, never an earlier job's (host.py)
            self._zygote.process.set_stderr_mark(
                f"[nestor host: job {self._zygote.jobs + 1} starts]".encode())
            opened = self._request("host", {
                "cmd": "job", "dir": self._zygote.path_inside(self._staged),
                "cpu_s": self.limits.cpu_s, "memory_mb": self.limits.memory_mb},
                self.timeouts.start_s)
            self._opened = True
            self._zygote.jobs = int(opened.get("jobs") or 1)
            self.info["host"], self.info["job"] = hello, opened
        return self.info["host"]

    def import_env(self) -> dict:
        """Import the env package; returns its Taskset/Task class names and reward names."""
        if not self._imported:
            self.start()
            reply = self._request("import", {"cmd": "import", "package": self.package},
                                  self.timeouts.import_s)
            rewards = reply.get("rewards") if isinstance(reply.get("rewards"), list) else []
            # names the job chose: cleaned and bounded before any report or database sees them
            self.info.update(package=self.package,
                             taskset=clean_text(reply.get("taskset"), MAX_NAME),
                             task=clean_text(reply.get("task"), MAX_NAME),
                             rewards=[clean_text(r, MAX_NAME) for r in rewards[:MAX_REWARDS]],
                             import_s=_seconds(reply.get("import_s")))
            self._imported = True
        return self.info

    def load(self) -> list[dict]:
        """The tasks load() yields (at most max_tasks): [{"prompt", "answer", "system_prompt"}]."""
        if self._tasks is None:
            self.import_env()
            reply = self._request("load", {"cmd": "load", "max_tasks": self.max_tasks},
                                  self.timeouts.load_s)
            tasks = reply.get("tasks")
            if not isinstance(tasks, list) or not all(
                    isinstance(t, dict) and isinstance(t.get("prompt"), str)
                    and all(isinstance(t.get(k), str | None) for k in ("answer", "system_prompt"))
                    for t in tasks):
                self._malformed("load", "the host sent a malformed task list (did the job "
                                "write to the protocol fd?)")
            if len(tasks) > self.max_tasks:  # the sandbox's own cap is the job's to patch
                raise TaskSourceError("load", f"load() sent {len(tasks):,} tasks, over the cap "
                                      f"of {self.max_tasks:,}; yield fewer")
            if (err := _undecodable(tasks) or _too_long(tasks)) is not None:
                raise TaskSourceError("load", err)
            self._tasks = tasks
            self.info["truncated"] = bool(reply.get("truncated"))
        return self._tasks

    def prompts(self) -> list[str]:
        return [t["prompt"] for t in self.load()]

    def answers(self) -> list[str | None]:
        return [t.get("answer") for t in self.load()]

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
        t0 = time.perf_counter()  # the speed of a rubric is what the trusted side waited
        reply = self._request("score", {"cmd": "score", "items": items},
                              timeout_s or self.timeouts.score_s)
        waited = time.perf_counter() - t0
        if not all(isinstance(reply.get(k), list) and len(reply[k]) == len(items)
                   for k in ("rewards", "errors", "components")):
            self._malformed("score", f"the host answered {len(items)} items with a reply of "
                            "another shape (did the job write to the protocol fd?)")
        try:
            errors = [None if e is None else clean_text(e, MAX_MESSAGE) for e in reply["errors"]]
            rewards: list[float | None] = []
            for i, r in enumerate(reply["rewards"]):
                value, why = _reward_float(r)
                rewards.append(value)
                errors[i] = errors[i] or why
            components = [{clean_text(k, MAX_NAME): v for k, v in dict(c).items()}
                          for c in reply["components"]]
            return ScoreBatch(rewards, errors, components, waited, _seconds(reply.get("elapsed_s")))
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            self._malformed("score", f"the host sent a malformed reply: {exc}")

    def score(self, task_indices: list[int], completions: list[str]) -> list[float]:
        """Rewards in [0, 1], one per completion; TaskSourceError("score") if any is not."""
        batch = self.score_batch(task_indices, completions)
        for i, (r, err) in enumerate(zip(batch.rewards, batch.errors, strict=True)):
            if r is None or not math.isfinite(r) or not 0.0 <= r <= 1.0:
                what = err or f"reward {r!r} is outside [0, 1]"
                raise TaskSourceError("score", f"task {task_indices[i]}, completion "
                                      f"{completions[i][:40]!r}: {what}")
        return [float(r) for r in batch.rewards]


def clean_text(text, limit: int | None = None) -> str:
    """Text a job wrote, storable (a lone surrogate becomes U+FFFD: nestor/text.py), cut to
    `limit` characters."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"… ({len(text):,} characters)"
    return no_surrogates(text)


def _reward_float(r) -> tuple[float | None, str | None]:
    """A reward as a float, or (None, why): 10**400 is valid JSON and no float."""
    if r is None:
        return None, None
    if isinstance(r, bool) or not isinstance(r, int | float):
        raise TypeError(f"reward {r!r:.40} is not a number")
    try:
        value = float(r)
    except OverflowError:
        return None, f"reward {str(r)[:12]}… ({len(str(r))} digits) is too large for a float"
    if not math.isfinite(value):
        return None, f"reward {value} is not finite"
    return value, None


def _undecodable(tasks: list[dict]) -> str | None:
    """Why a task's text cannot be tokenized (a lone surrogate is a str no tokenizer takes),
    or None."""
    for i, task in enumerate(tasks):
        for key in ("prompt", "answer", "system_prompt"):
            value = task.get(key)
            if value is None:
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (f"task {i}'s {key} is not valid Unicode ({exc.reason} at character "
                        f"{exc.start}: {value[max(0, exc.start - 10):exc.start]!r}…); write "
                        "valid UTF-8 text")
    return None


def _too_long(tasks: list[dict]) -> str | None:
    """Which task's text is over MAX_TEXT characters, or None."""
    for i, task in enumerate(tasks):
        for key in ("prompt", "answer", "system_prompt"):
            if len(task.get(key) or "") > MAX_TEXT:
                return (f"task {i}'s {key} is {len(task[key]):,} characters, over the cap of "
                        f"{MAX_TEXT:,}; shorten it (no context fits it)")
    return None


def _seconds(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _limit_hint(message: str, limits: Limits) -> str:
    if "CPU time limit" in message:
        return f"{message}: over {limits.cpu_s} s of CPU"
    if "memory or CPU limit" in message:
        return f"{message}: at most {limits.memory_mb} MiB of memory, {limits.cpu_s} s of CPU"
    if "MemoryError" in message:
        return f"{message} (the sandbox allows {limits.memory_mb} MiB)"
    return message


def _explain(stage: str, sandbox_message: str, timeout_s: float) -> str:
    what = {"host": "starting the sandboxed host", "import": "importing the env package",
            "load": "load()", "score": "scoring"}.get(stage, stage)
    first, _, rest = sandbox_message.partition("\n")
    if stage == "load" and "reply line longer than" in first:  # all rows travel as one line
        cap, unit, after = first.partition(" bytes")
        first = (cap + unit + " (all the rows load() yields come back as that one line of "
                 "JSON: about 50 bytes a row besides its text, 6 a non-ASCII character; yield "
                 "fewer or shorter rows)" + after)
    if "did not reply within" in first or "did not read its request" in first:
        return (f"{what} did not finish within {timeout_s:g} s (killed); look for an endless "
                f"loop or slow work there" + (f"\n{rest}" if rest else ""))
    return f"{what}: the sandboxed process {first.removeprefix(HOST_NAME + ' ')}" + (
        f"\n{rest}" if rest else "")
