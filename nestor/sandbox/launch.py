"""Spawning and killing a sandboxed child: the wrapped command line for the backend in use,
the process group kill, and how an exit is explained."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nestor.sandbox.backend import (
    UNAVAILABLE,
    UNSHARE_ARGS,
    Binds,
    bwrap_args,
    detect_backend,
    normalize_binds,
    pick_uid,
    prlimit_args,
    sandbox_env,
    seccomp_fd,
    setpriv_args,
    share_read_only,
    unavailable_reason,
    world_accessible,
)
from nestor.sandbox.bounds import WATCHDOG, Watch
from nestor.sandbox.limits import Limits, SandboxUnavailable

CHUNK = 1 << 16
# Beyond this many times the output cap the child is killed rather than drained for ever.
OVERFLOW_FACTOR = 16
_TOKEN_VAR = "NESTOR_SANDBOX_ID"


@dataclass
class Launch:
    """Everything needed to start one child and clean up after it."""

    cmd: list[str]
    env: dict[str, str]
    host_cwd: str | None
    backend: str
    uid: int | None
    host_tmp: str | None  # private tmp dir of the fallback backends, removed afterwards
    pass_fds: tuple[int, ...] = ()  # the seccomp filter's and bwrap's options' memfds, closed once spawned
    killed: bool = False  # kill() ran: never signal the (possibly reused) pgid again
    limits: Limits | None = None
    watch: Watch | None = None  # the whole-sandbox CPU and memory bound (bounds.py)

    @property
    def breach(self) -> str | None:
        """Why the watchdog killed the sandbox, if it did."""
        return self.watch.breached if self.watch else None


def prepare(argv: Sequence[str], binds: Binds, limits: Limits, env: Mapping[str, str] | None,
            cwd: str | None, zygote: bool = False) -> Launch:
    """The wrapped command line for argv under the backend in use here (zygote: the job host,
    whose seccomp filter lets it unshare namespaces for its jobs; seccomp.py)."""
    if not argv:
        raise ValueError("run_sandboxed: empty argv")
    backend = require_backend()
    pairs = normalize_binds(binds)
    env = sandbox_env(env)
    root = os.geteuid() == 0
    if backend == "bubblewrap":
        uid = pick_uid() if root else None
        if uid is not None:
            for host, _ in pairs:
                share_read_only(host)
        fd = seccomp_fd(zygote)
        wrap = bwrap_args(pairs, limits, cwd or "/tmp", fd)
        # bwrap's options (host paths of every bind) reach it through a memfd, not its argv:
        # the sandbox's pid 1 is bwrap, and its /proc/1/cmdline is readable inside.
        opts = args_fd(wrap[1:-1])
        cmd = prlimit_args(limits, nproc_extra=own_process_count()) + [
            wrap[0], "--args", str(opts), "--"]
        if uid is not None:
            cmd += setpriv_args(uid)
        return Launch(cmd + [str(a) for a in argv], env, None, backend, uid, None,
                      (opts,) if fd is None else (fd, opts), limits=limits)

    # Fallbacks cannot remap paths: strings naming a sandbox path are rewritten to the host path.
    host_tmp = tempfile.mkdtemp(prefix="nestor-sandbox-")
    os.chmod(host_tmp, 0o1777)
    pairs = pairs + [(host_tmp, "/tmp")]
    # argv[0] and PATH name host executables (the venv may itself live under /tmp).
    argv = [str(argv[0])] + [translate(str(a), pairs) for a in argv[1:]]
    env = {k: v if k == "PATH" else translate(v, pairs) for k, v in env.items()}
    cmd = prlimit_args(limits)
    # A token in the environment finds descendants that escaped the group (see _kill).
    env[_TOKEN_VAR] = uuid.uuid4().hex
    if backend == "unshare":
        # unshare --fork mangles a child's death by signal; a shell reports it as 128 + N
        cmd += list(UNSHARE_ARGS) + ["/bin/sh", "-c", '"$@"; exit $?', "sh"]
    uid = None
    exe = shutil.which(argv[0], path=env["PATH"]) or argv[0]
    if root and all(world_accessible(p) for p in [exe] + [h for h, _ in pairs]):
        uid = pick_uid()
        cmd += setpriv_args(uid)
    host_cwd = translate(cwd, pairs) if cwd else host_tmp
    return Launch(cmd + argv, env, host_cwd, backend, uid, host_tmp, limits=limits)


def args_fd(options: list[str]) -> int:
    """A memfd holding bwrap's options, NUL-separated (`bwrap --args FD`); close-on-exec,
    handed on by Popen(pass_fds=...) and closed here once spawned."""
    fd = os.memfd_create("nestor-bwrap-args")
    data = b"".join(o.encode() + b"\0" for o in options)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def require_backend() -> str:
    """The backend agent code runs under here; SandboxUnavailable (one line: why, and how to fix
    it) where bubblewrap cannot start and no weaker backend was opted in to by name."""
    backend = detect_backend()
    if backend == UNAVAILABLE:
        raise SandboxUnavailable(unavailable_reason())
    return backend


def own_process_count() -> int:
    """Processes of this (non-root) user: RLIMIT_NPROC counts them all, so a limit of N for the
    child means N more than exist now. Root's children switch to a fresh uid: 0 extra."""
    if os.geteuid() == 0:
        return 0
    uid, n = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                n += os.stat(entry.path).st_uid == uid
    return n


def nproc_enforced() -> bool:
    """Whether RLIMIT_NPROC binds the child here (the kernel exempts uid 0)."""
    return os.geteuid() != 0 or detect_backend() == "bubblewrap" or world_accessible(sys.executable)


def translate(value: str, pairs: list[tuple[str, str]]) -> str:
    """A sandbox path as the host path it is bound to; a path below a bind point that exists
    on the host as it is (e.g. a checkout under /tmp) is already a host path."""
    for host, dst in sorted(pairs, key=lambda p: -len(p[1])):
        if value == dst:
            return host
        if value.startswith(dst + "/") and not os.path.exists(value):
            return host + value[len(dst):]
    return value


def spawn(launch: Launch, stdin_pipe: bool) -> subprocess.Popen:
    try:
        proc = subprocess.Popen(
            launch.cmd, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=launch.env,
            cwd=launch.host_cwd, start_new_session=True, close_fds=True, bufsize=0,
            pass_fds=launch.pass_fds)
    finally:
        for fd in launch.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    if launch.limits is not None:
        launch.watch = WATCHDOG.watch(proc.pid, launch.limits.total_cpu_s(),
                                      launch.limits.total_memory_mb(),
                                      lambda why: kill(proc, launch))
    return proc


def kill(proc: subprocess.Popen, launch: Launch) -> None:
    """SIGKILL the child's whole process group (with bubblewrap: its pid namespace dies with it),
    then, in the fallbacks, every process of the child's private uid (catches setsid escapees)."""
    if launch.killed:  # e.g. by the bounds watchdog: still reap, so returncode is set
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        return
    launch.killed = True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if launch.backend != "bubblewrap" and launch.uid is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(setpriv_args(launch.uid) + ["kill", "-9", "-1"],
                           capture_output=True, timeout=5)
    if _TOKEN_VAR in launch.env:
        kill_by_token(f"{_TOKEN_VAR}={launch.env[_TOKEN_VAR]}".encode())
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def kill_by_token(needle: bytes) -> None:
    """SIGKILL every process whose environment carries this child's token (fallbacks only:
    there, a grandchild that called setsid() is outside the process group)."""
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue


def cleanup(launch: Launch) -> None:
    if launch.watch is not None:
        WATCHDOG.unwatch(launch.watch)
    if launch.host_tmp:
        shutil.rmtree(launch.host_tmp, ignore_errors=True)


def returncode(rc: int, backend: str) -> int:
    # bwrap (and our shell under unshare) report a child killed by signal N as 128 + N.
    if backend in ("bubblewrap", "unshare") and 128 < rc < 128 + 65:
        return -(rc - 128)
    return rc


def describe_exit(rc: int, limits: Limits, stderr: str) -> str | None:
    if rc == 0:
        return None
    if rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU:
            return f"CPU time limit reached ({limits.cpu_s} s)"
        if sig == signal.SIGXFSZ:
            return f"file size limit exceeded ({limits.fsize_mb} MiB per file)"
        if sig == signal.SIGKILL:
            return ("killed by SIGKILL (CPU hard limit, memory exhaustion or an outside kill; "
                    f"limits: {limits.cpu_s} s CPU, {limits.memory_mb} MiB)")
        try:
            return f"killed by signal {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    if "MemoryError" in stderr[-4000:]:
        return f"ran out of memory (limit {limits.memory_mb} MiB), exit code {rc}"
    if "File too large" in stderr[-4000:]:
        return f"file size limit exceeded ({limits.fsize_mb} MiB per file), exit code {rc}"
    return f"exited with code {rc}"
