"""Run untrusted code in a sandboxed child: one-shot (`run_sandboxed`) or as a long-lived
JSON-lines server (`SandboxedProcess`). See docs/sandbox.md for what the child can and cannot see.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nestor.sandbox import seccomp
from nestor.sandbox.backend import (
    Binds,
    detect_backend,
    normalize_binds,
    pick_uid,
    prlimit_args,
    sandbox_env,
    setpriv_args,
    share_read_only,
    world_accessible,
)
from nestor.sandbox.backend import (
    bwrap_args as _bwrap_args,
)
from nestor.sandbox.limits import Limits, SandboxError, SandboxResult, tail_text

__all__ = ["Limits", "SandboxError", "SandboxResult", "SandboxedProcess", "nproc_enforced",
           "run_sandboxed", "sandbox_backend"]

_CHUNK = 1 << 16
# Beyond this many times the output cap the child is killed rather than drained for ever.
_OVERFLOW_FACTOR = 16
# After the main child exits, how long leftover writers may keep the pipes open.
_DRAIN_GRACE_S = 0.5


def sandbox_backend() -> str:
    """The isolation in use here: "bubblewrap", "unshare" or "rlimits" (weaker: logged once)."""
    return detect_backend()


@dataclass
class _Launch:
    cmd: list[str]
    env: dict[str, str]
    host_cwd: str | None
    backend: str
    uid: int | None
    host_tmp: str | None  # private tmp dir of the fallback backends, removed afterwards
    pass_fds: tuple[int, ...] = ()  # the seccomp filter's memfd, closed once spawned


def _prepare(argv: Sequence[str], binds: Binds, limits: Limits, env: Mapping[str, str] | None,
             cwd: str | None) -> _Launch:
    if not argv:
        raise ValueError("run_sandboxed: empty argv")
    backend = detect_backend()
    pairs = normalize_binds(binds)
    env = sandbox_env(env)
    root = os.geteuid() == 0
    if backend == "bubblewrap":
        uid = pick_uid() if root else None
        if uid is not None:
            for host, _ in pairs:
                share_read_only(host)
        fd = seccomp.filter_fd()
        cmd = prlimit_args(limits, nproc_extra=_own_process_count()) + _bwrap_args(
            pairs, limits, cwd or "/tmp", fd)
        if uid is not None:
            cmd += setpriv_args(uid)
        return _Launch(cmd + [str(a) for a in argv], env, None, backend, uid, None,
                       () if fd is None else (fd,))

    # Fallbacks cannot remap paths: strings naming a sandbox path are rewritten to the host path.
    host_tmp = tempfile.mkdtemp(prefix="nestor-sandbox-")
    os.chmod(host_tmp, 0o1777)
    pairs = pairs + [(host_tmp, "/tmp")]
    argv = [_translate(str(a), pairs) for a in argv]
    env = {k: _translate(v, pairs) for k, v in env.items()}
    cmd = prlimit_args(limits)
    if backend == "unshare":
        cmd += ["unshare", "--net", "--"]
    uid = None
    exe = shutil.which(argv[0], path=env["PATH"]) or argv[0]
    if root and all(world_accessible(p) for p in [exe] + [h for h, _ in pairs]):
        uid = pick_uid()
        cmd += setpriv_args(uid)
    host_cwd = _translate(cwd, pairs) if cwd else host_tmp
    return _Launch(cmd + argv, env, host_cwd, backend, uid, host_tmp)


def _own_process_count() -> int:
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


def _translate(value: str, pairs: list[tuple[str, str]]) -> str:
    for host, dst in sorted(pairs, key=lambda p: -len(p[1])):
        if value == dst or value.startswith(dst + "/"):
            return host + value[len(dst):]
    return value


def _spawn(launch: _Launch, stdin_pipe: bool) -> subprocess.Popen:
    try:
        return subprocess.Popen(
            launch.cmd, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=launch.env,
            cwd=launch.host_cwd, start_new_session=True, close_fds=True, bufsize=0,
            pass_fds=launch.pass_fds)
    finally:
        for fd in launch.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _kill(proc: subprocess.Popen, launch: _Launch) -> None:
    """SIGKILL the child's whole process group (with bubblewrap: its pid namespace dies with it),
    then, in the fallbacks, every process of the child's private uid (catches setsid escapees)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    if launch.backend != "bubblewrap" and launch.uid is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(setpriv_args(launch.uid) + ["kill", "-9", "-1"],
                           capture_output=True, timeout=5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _cleanup(launch: _Launch) -> None:
    if launch.host_tmp:
        shutil.rmtree(launch.host_tmp, ignore_errors=True)


def _returncode(rc: int, backend: str) -> int:
    # bwrap reports a child killed by signal N as exit code 128 + N.
    if backend == "bubblewrap" and 128 < rc < 128 + 65:
        return -(rc - 128)
    return rc


def _describe_exit(rc: int, limits: Limits, stderr: str) -> str | None:
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


def run_sandboxed(
    argv: Sequence[str],
    *,
    ro_binds: Binds = None,
    limits: Limits | None = None,
    stdin: bytes | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> SandboxResult:
    """Run argv in the sandbox and wait for it (at most limits.wall_s).

    ro_binds: {host_path: sandbox_path} or a list of host paths (bound at the same path) or
    (host, sandbox) pairs; all read-only. `cwd` is a sandbox path (default /tmp). Never raises
    for anything the child does; raises ValueError/FileNotFoundError for a bad call."""
    limits = limits or Limits()
    launch = _prepare(argv, ro_binds, limits, env, cwd)
    start = time.monotonic()
    deadline = start + limits.wall_s
    try:
        proc = _spawn(launch, stdin is not None)
    except OSError as e:
        _cleanup(launch)
        return SandboxResult(returncode=-1, stdout="", stderr=str(e), elapsed_s=0.0,
                             reason=f"could not start the sandbox: {e}", backend=launch.backend)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    try:
        out, err, totals, timed_out, overflow = _collect(proc, limits, deadline)
        if timed_out or overflow:
            _kill(proc, launch)
        else:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill(proc, launch)  # also reaps anything the child left behind
    finally:
        if proc.poll() is None:
            _kill(proc, launch)
        _cleanup(launch)
    elapsed = time.monotonic() - start
    rc = _returncode(proc.returncode, launch.backend)
    stdout, stderr = _decode(out, totals[0], limits), _decode(err, totals[1], limits)
    truncated = max(totals) > limits.output_bytes
    if timed_out:
        reason = f"wall-clock timeout after {limits.wall_s:g} s (process group killed)"
    elif overflow:
        reason = (f"printed more than {_OVERFLOW_FACTOR * limits.output_bytes} bytes "
                  "(killed; output truncated)")
    else:
        reason = _describe_exit(rc, limits, stderr)
        if reason is None and truncated:
            reason = f"output truncated to {limits.output_bytes} bytes"
    return SandboxResult(returncode=rc, stdout=stdout, stderr=stderr, timed_out=timed_out,
                         elapsed_s=round(elapsed, 4), truncated=truncated, reason=reason,
                         backend=launch.backend)


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.write(data)
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()


def _collect(proc: subprocess.Popen, limits: Limits, deadline: float):
    """Read stdout/stderr until both close, keeping the first output_bytes of each."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    totals = dict.fromkeys(bufs, 0)
    cap, hard_cap = limits.output_bytes, _OVERFLOW_FACTOR * limits.output_bytes
    timed_out = overflow = False
    drain_until = None
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if drain_until is None and proc.poll() is not None:
                drain_until = now + _DRAIN_GRACE_S
            if drain_until is not None and now >= drain_until:
                break  # the child is gone; a leftover grandchild holds the pipe: stop here
            wait = min(deadline, drain_until or deadline) - now
            for key, _ in sel.select(timeout=min(wait, 0.25)):
                data = os.read(key.fd, _CHUNK)
                if not data:
                    sel.unregister(key.fd)
                    continue
                totals[key.fd] += len(data)
                buf = bufs[key.fd]
                if len(buf) < cap:
                    buf += data[: cap - len(buf)]
                if totals[key.fd] > hard_cap:
                    overflow = True
            if overflow:
                break
    fds = list(bufs)
    return bufs[fds[0]], bufs[fds[1]], (totals[fds[0]], totals[fds[1]]), timed_out, overflow


def _decode(buf: bytes, total: int, limits: Limits) -> str:
    text = bytes(buf).decode("utf-8", errors="replace")
    if total > limits.output_bytes:
        text += f"\n[nestor sandbox: output truncated, kept {len(buf)} of {total}+ bytes]"
    return text


class SandboxedProcess:
    """A long-lived sandboxed child speaking JSON lines: one request object per line on its
    stdin, one response object per line on its stdout; stderr is kept as a rolling tail.

    Any timeout, exit or non-JSON reply kills the process group and raises SandboxError; the
    process is then dead and every later request raises too. Thread-safe (one request at a time).
    """

    def __init__(self, argv: Sequence[str], *, ro_binds: Binds = None,
                 limits: Limits | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, name: str = "sandboxed process") -> None:
        self.limits = limits or Limits()
        self.name = name
        self._launch = _prepare(argv, ro_binds, self.limits, env, cwd)
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._stderr: deque[bytes] = deque()
        self._stderr_len = 0
        self._dead: str | None = None
        try:
            self._proc = _spawn(self._launch, stdin_pipe=True)
        except OSError as e:
            _cleanup(self._launch)
            raise SandboxError(f"{name}: could not start the sandbox: {e}") from e
        os.set_blocking(self._proc.stdout.fileno(), False)
        os.set_blocking(self._proc.stdin.fileno(), False)
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    @property
    def backend(self) -> str:
        return self._launch.backend

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.poll() is None

    def stderr_tail(self, n_chars: int = 2000) -> str:
        return tail_text(b"".join(self._stderr).decode("utf-8", errors="replace"), n_chars)

    def request(self, obj: Mapping, timeout_s: float | None = None) -> dict:
        """Send one JSON object, wait for one JSON object back (at most timeout_s)."""
        timeout_s = self.limits.wall_s if timeout_s is None else timeout_s
        with self._lock:
            if self._dead is not None:
                raise SandboxError(f"{self.name} is no longer running ({self._dead})")
            try:
                payload = (json.dumps(obj) + "\n").encode()
            except (TypeError, ValueError) as e:
                raise ValueError(f"request is not JSON-serialisable: {e}") from e
            deadline = time.monotonic() + timeout_s
            self._check_no_stray_output()
            self._write(payload, deadline, timeout_s)
            line = self._read_line(deadline, timeout_s)
            while not line.strip():  # a bare print() is not a reply
                line = self._read_line(deadline, timeout_s)
            try:
                reply = json.loads(line)
            except ValueError:
                self._fail(f"replied with something that is not JSON: {_preview(line)}")
            if not isinstance(reply, dict):
                self._fail(f"replied with JSON that is not an object: {_preview(line)}")
            return reply

    def close(self) -> None:
        """Ask the child to stop (close its stdin), then kill its process group."""
        if self._dead is None:
            self._dead = "closed"
        with contextlib.suppress(OSError, ValueError):
            self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1.0)
        _kill(self._proc, self._launch)
        self._stderr_thread.join(timeout=1.0)
        for stream in (self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        _cleanup(self._launch)

    def __enter__(self) -> SandboxedProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception):
                self.close()

    # -- internals -------------------------------------------------------------------------
    def _write(self, payload: bytes, deadline: float, timeout_s: float) -> None:
        fd = self._proc.stdin.fileno()
        view = memoryview(payload)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while view:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(f"did not read its request within {timeout_s:g} s")
                if not sel.select(timeout=min(left, 0.25)):
                    if self._proc.poll() is not None:
                        self._fail_exited()
                    continue
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    continue
                except (BrokenPipeError, OSError):
                    self._fail_exited()

    def _check_no_stray_output(self) -> None:
        """Replies must answer requests one to one; anything already waiting on stdout would
        be taken for the next reply, so it is an error."""
        fd = self._proc.stdout.fileno()
        with contextlib.suppress(BlockingIOError, OSError):
            while len(self._buf) <= _OVERFLOW_FACTOR * self.limits.output_bytes:
                data = os.read(fd, _CHUNK)
                if not data:
                    break
                self._buf += data
        if self._buf.strip():
            self._fail("wrote to stdout without being asked: "
                       f"{_preview(bytes(self._buf).strip().splitlines()[0])}")
        self._buf.clear()

    def _read_line(self, deadline: float, timeout_s: float) -> bytes:
        fd = self._proc.stdout.fileno()
        max_line = _OVERFLOW_FACTOR * self.limits.output_bytes
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                nl = self._buf.find(b"\n")
                if nl >= 0:
                    line = bytes(self._buf[:nl])
                    del self._buf[: nl + 1]
                    return line
                if len(self._buf) > max_line:
                    self._fail(f"sent a reply line longer than {max_line} bytes")
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(f"did not reply within {timeout_s:g} s")
                if not sel.select(timeout=min(left, 0.25)):
                    continue
                try:
                    data = os.read(fd, _CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    self._fail_exited()
                self._buf += data

    def _drain_stderr(self) -> None:
        cap = self.limits.output_bytes
        with contextlib.suppress(OSError, ValueError):
            fd = self._proc.stderr.fileno()
            while data := os.read(fd, _CHUNK):
                self._stderr.append(data)
                self._stderr_len += len(data)
                while self._stderr_len - len(self._stderr[0]) >= cap:
                    self._stderr_len -= len(self._stderr.popleft())

    def _fail_exited(self):
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=1.0)
        rc = self._proc.poll()
        if rc is None:
            self._fail("closed its stdout")
        rc = _returncode(rc, self._launch.backend)
        stderr = b"".join(self._stderr).decode("utf-8", errors="replace")
        self._fail(_describe_exit(rc, self.limits, stderr) or "exited (code 0)")

    def _fail(self, what: str):
        self._dead = what
        _kill(self._proc, self._launch)
        self._stderr_thread.join(timeout=1.0)
        _cleanup(self._launch)
        tail = self.stderr_tail()
        raise SandboxError(f"{self.name} {what}" + (f"; its stderr ends with:\n{tail}"
                                                     if tail else "; it wrote nothing to stderr"))


def _preview(line: bytes, n: int = 200) -> str:
    text = line.decode("utf-8", errors="replace")
    return repr(text if len(text) <= n else text[:n] + "...")
