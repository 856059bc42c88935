"""The sandboxed taskset hosts: a pool of warm zygotes (host.py) in their sandboxes.

A host is a sandboxed `host.py` (with `host_ns.py`, the job protocol `nestor/job/protocol.py`
and the full seccomp filter bound next to it) that pays the seconds of `import verifiers` once
and serves one job after another, each in fresh namespaces (or, where it cannot make them, one
job only). This module starts hosts
(from one long-lived thread), keeps up to MAX_IDLE idle ones per process, hands one out per
job, takes it back when its job ended cleanly, kills it otherwise, and closes them all at exit.
What a job's data looks like on the way through is `nestor.job.tasksource`'s business.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from nestor.sandbox.backend import seccomp_in_use
from nestor.sandbox.limits import Limits, SandboxError
from nestor.sandbox.process import SandboxedProcess
from nestor.sandbox.seccomp import filter_program

START_S = 60.0  # interpreter + `import verifiers.v1` (the host's own cost, not the job's)
HOST_SCRIPT = Path(__file__).with_name("host.py")
HOST_IN = "/opt/nestor/host.py"
HOST_NS_IN = "/opt/nestor/host_ns.py"  # next to host.py, which loads it from its own directory
# What host.py serves for a job (the verifiers protocol: import, load, score) lives with the
# job's side of the wall; it is bound next to host.py as a file, never imported here.
PROTOCOL_SCRIPT = Path(__file__).parents[1] / "job" / "protocol.py"
PROTOCOL_IN = "/opt/nestor/protocol.py"
# The files a host runs, each bound read-only where host.py looks for it.
HOST_FILES = {str(HOST_SCRIPT): HOST_IN, str(HOST_SCRIPT.with_name("host_ns.py")): HOST_NS_IN,
              str(PROTOCOL_SCRIPT): PROTOCOL_IN}
FILTER_IN = "/opt/nestor/seccomp.bpf"  # the full filter, stacked on each job by host_ns.py
JOBS_IN = "/jobs"
MAX_IDLE = 2  # idle hosts kept per process
MAX_JOBS_PER_HOST = 200  # then a host is retired, so that nothing accumulates for ever
# The host's replies: one small JSON object, at most this deep ({"tasks": [{"prompt": ...}]}).
MAX_REPLY_DEPTH = 4
HOST_NAME = "the taskset host"
GRACE_S = 3.0  # the sandbox's timeout past a request's own: time for the zygote to report

# The trainer's reward server lives as long as the job, so its CPU allowance is generous (the
# limit is per process, and each job is a fresh child); each request still has its own
# wall-clock timeout, which is what stops a reward that loops.
TRAIN_LIMITS = Limits(cpu_s=7200, memory_mb=2048, nproc=64, fsize_mb=16, nofile=256,
                      wall_s=60, output_bytes=200_000, tmp_mb=64)




@dataclass
class _Zygote:
    process: SandboxedProcess
    stage: Path  # host dir bound read-only at JOBS_IN; jobs are copied into it
    limits: Limits
    fresh_ns: bool  # asked for: jobs in fresh namespaces (the host's hello says if it can)
    hello: dict = field(default_factory=dict)
    jobs: int = 0  # jobs opened in it (the host's own count)

    @classmethod
    def spawn(cls, limits: Limits, fresh_ns: bool = True) -> _Zygote:
        root = Path(tempfile.mkdtemp(prefix="nestor-host-"))  # stage and filter: ours only
        stage = root / "jobs"
        stage.mkdir(mode=0o755)
        os.chmod(stage, 0o755)  # the sandbox runs as an unprivileged uid
        binds = {**HOST_FILES, str(stage): JOBS_IN}
        argv = [sys.executable, "-I", HOST_IN, "--protocol", PROTOCOL_IN,
                "--tmp-mb", str(limits.tmp_mb)]
        try:
            # Fresh namespaces need the full filter to stack on every job: without seccomp
            # the host is told not to try, and serves one job.
            fresh_ns = fresh_ns and seccomp_in_use()
            if fresh_ns:
                bpf = root / "seccomp.bpf"
                bpf.write_bytes(filter_program())
                binds[str(bpf)] = FILTER_IN
            else:
                argv.append("--no-fresh-ns")
            process = SandboxedProcess(argv, ro_binds=binds, limits=limits, cwd="/tmp",
                                       name=HOST_NAME, max_depth=MAX_REPLY_DEPTH, zygote=fresh_ns)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cls(process, stage, limits, fresh_ns)

    @property
    def alive(self) -> bool:
        return self.process.alive

    @property
    def reusable(self) -> bool:
        """Serves one job after another: each in fresh namespaces (the host checked it can)."""
        return self.alive and self.hello.get("fresh_ns") is True and \
            self.jobs < MAX_JOBS_PER_HOST

    def path_inside(self, host_path: Path) -> str:
        """Where the sandbox sees a staged job (fallback backends cannot remap paths)."""
        if self.process.backend == "bubblewrap":
            return f"{JOBS_IN}/{host_path.relative_to(self.stage)}"
        return str(host_path)

    def wait_ready(self, timeout_s: float) -> dict:
        if not self.hello:
            self.hello = self.process.request({"cmd": "hello"}, timeout_s=timeout_s)
        return self.hello

    def end_job(self, timeout_s: float) -> bool:
        """Ask the host to end its open job; whether it did so cleanly. The host itself kills
        the job's pid namespace and answers once nothing of the job runs any more."""
        try:
            reply = self.process.request({"cmd": "end"}, timeout_s=timeout_s)
        except SandboxError:
            return False
        return reply.get("ok") is True and reply.get("ended") is True and reply.get("clean") is True

    def close(self) -> None:
        # No grace: SIGKILL its group (and so its pid namespace).
        self.process.close(grace_s=0.0)
        shutil.rmtree(self.stage.parent, ignore_errors=True)


_idle: list[_Zygote] = []
_idle_lock = threading.Lock()


# CPU the host spends before its job arrives (interpreter, `import verifiers`, warm-up), on top
# of the job's own whole-sandbox CPU bound.
HOST_START_CPU_S = 30.0


def host_limits(limits: Limits) -> Limits:
    """The host's own limits: per-process CPU and memory as generous as any job's (the job's
    child lowers them to its own); the sandbox as a whole (every process of the job together)
    is bound by the job's figures, plus the host's start-up CPU."""
    return limits.model_copy(update={
        "cpu_s": max(limits.cpu_s, TRAIN_LIMITS.cpu_s),
        "memory_mb": max(limits.memory_mb, TRAIN_LIMITS.memory_mb),
        "wall_s": TRAIN_LIMITS.wall_s,
        "sandbox_cpu_s": limits.total_cpu_s() + HOST_START_CPU_S,
        "sandbox_memory_mb": limits.total_memory_mb()})


def _acquire(limits: Limits, warm: bool, fresh_ns: bool) -> _Zygote:
    limits = host_limits(limits)
    if warm:
        with _idle_lock:
            while True:
                z = next((z for z in reversed(_idle)
                          if z.limits == limits and z.fresh_ns == fresh_ns), None)
                if z is None:
                    break
                _idle.remove(z)
                if z.alive:
                    return z
                z.close()
    return _spawn(limits, fresh_ns)


_spawner = ThreadPoolExecutor(1, thread_name_prefix="nestor-host-spawner")


def _spawn(limits: Limits, fresh_ns: bool) -> _Zygote:
    """Start a host from one long-lived thread: bwrap's --die-with-parent is a parent-death
    signal tied to the spawning *thread*, and a host now outlives the job (and the thread,
    e.g. a validation run in a worker thread) it was started for."""
    try:
        future = _spawner.submit(_Zygote.spawn, limits, fresh_ns)
    except RuntimeError:  # interpreter shutdown: no new threads; this one will do
        return _Zygote.spawn(limits, fresh_ns)
    return future.result()


def _release(z: _Zygote, keep: bool) -> None:
    """keep: the host may serve another job (it never opened one, or it ended its last one
    cleanly and gives each job fresh namespaces)."""
    evicted = None
    if keep and z.alive:
        with _idle_lock:
            _idle.append(z)  # the most recent last: `_acquire` takes it first (it is ready)
            if len(_idle) <= MAX_IDLE:
                return
            evicted = _idle.pop(0)
    (evicted or z).close()


def _replenish(limits: Limits, fresh_ns: bool) -> None:
    """Start the successor of a host that was killed, unless an idle one is there (a Popen,
    milliseconds; on the spawner thread, see `_spawn`)."""
    if sys.is_finalizing():
        return
    with contextlib.suppress(Exception):  # only a head start: a real start reports trouble
        prewarm(limits, fresh_ns=fresh_ns)


def prewarm(limits: Limits = TRAIN_LIMITS, *, wait: bool = False,
            timeout_s: float = START_S, fresh_ns: bool = True) -> bool:
    """Make sure an idle host for these limits exists (start one if not), so that the next
    `JobTaskSource(..., warm=True)` skips the start-up; `wait` blocks until it is ready.
    Returns whether a ready-or-starting host is there."""
    limits = host_limits(limits)
    with _idle_lock:
        z = next((z for z in _idle if z.limits == limits and z.fresh_ns == fresh_ns and z.alive),
                 None)
    if z is None:
        try:
            z = _spawn(limits, fresh_ns)
        except SandboxError:
            return False
        with _idle_lock:
            _idle.append(z)
    if wait:
        try:
            z.wait_ready(timeout_s)
        except SandboxError:
            return False
    return True


@atexit.register
def shutdown_hosts() -> None:
    """Close every idle host (also run at interpreter exit)."""
    with _idle_lock:
        while _idle:
            _idle.pop().close()
