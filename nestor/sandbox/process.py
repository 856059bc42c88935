"""A long-lived sandboxed child speaking JSON lines (the job's taskset host, reward servers)."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence

from nestor.sandbox.backend import Binds
from nestor.sandbox.bounds import WATCHDOG
from nestor.sandbox.launch import (
    CHUNK,
    OVERFLOW_FACTOR,
    cleanup,
    describe_exit,
    kill,
    prepare,
    returncode,
    spawn,
)
from nestor.sandbox.limits import Limits, SandboxError, tail_text


class SandboxedProcess:
    """A long-lived sandboxed child speaking JSON lines: one request object per line on its
    stdin, one response object per line on its stdout; stderr is kept as a rolling tail.

    Any timeout, exit, or reply that is not one JSON object of at most `max_reply_bytes` and
    `max_depth` levels of nesting kills the process group and raises SandboxError; the process
    is then dead and every later request raises too. Thread-safe (one request at a time).
    `zygote=True` runs it under the job host's seccomp variant (it may unshare namespaces for
    the jobs it serves; seccomp.py).
    """

    def __init__(self, argv: Sequence[str], *, ro_binds: Binds = None,
                 limits: Limits | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, name: str = "sandboxed process",
                 max_reply_bytes: int | None = None, max_depth: int = 8,
                 zygote: bool = False) -> None:
        self.limits = limits or Limits()
        self.name = name
        self.max_reply_bytes = max_reply_bytes or OVERFLOW_FACTOR * self.limits.output_bytes
        self.max_depth = max_depth
        self._launch = prepare(argv, ro_binds, self.limits, env, cwd, zygote)
        self._lock = threading.Lock()
        self._buf = bytearray()
        self._stderr: deque[bytes] = deque()
        self._stderr_len = 0
        self._dead: str | None = None
        self._mark, self._mark_seen = b"", False  # see set_stderr_mark
        try:
            self._proc = spawn(self._launch, stdin_pipe=True)
        except OSError as e:
            cleanup(self._launch)
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

    def set_stderr_mark(self, mark: bytes) -> None:
        """A child that serves one client after another (the job host) writes `mark` to stderr
        before each: from now on the tail holds what came after it, never an earlier client's
        output (nothing at all until the mark arrives)."""
        self._mark, self._mark_seen = mark, False

    def restart_cpu_bound(self) -> None:
        """Count the whole-sandbox CPU bound from now on (a host about to serve its next job)."""
        if self._launch.watch is not None:
            WATCHDOG.rebase(self._launch.watch)

    def stderr_tail(self, n_chars: int = 2000) -> str:
        """The end of its stderr: only what came after the last `stderr_mark`, if one is set."""
        data, mark = b"".join(self._stderr), self._mark
        if mark:
            if mark in data:
                data = data[data.rfind(mark) + len(mark):]
            elif not self._mark_seen:  # not written yet: all there is came before it
                data = b""
            # else: it was there, and newer output pushed it out of the rolling tail
        return tail_text(data.decode("utf-8", errors="replace"), n_chars)

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
            except RecursionError:  # deep nesting must not surface as a bug of ours
                self._fail(f"replied with JSON nested more than {self.max_depth} levels deep")
            except ValueError:  # UnicodeDecodeError and huge integers included
                self._fail(f"replied with something that is not JSON: {_preview(line)}")
            if not isinstance(reply, dict):
                self._fail(f"replied with JSON that is not an object: {_preview(line)}")
            if _depth_over(reply, self.max_depth):
                self._fail(f"replied with JSON nested more than {self.max_depth} levels deep")
            return reply

    def close(self, grace_s: float = 1.0) -> None:
        """Ask the child to stop (close its stdin), wait up to grace_s, then kill its process
        group (with bubblewrap: its whole pid namespace)."""
        if self._dead is None:
            self._dead = "closed"
        with contextlib.suppress(OSError, ValueError):
            self._proc.stdin.close()
        if grace_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=grace_s)
        kill(self._proc, self._launch)
        self._stderr_thread.join(timeout=1.0)
        for stream in (self._proc.stdout, self._proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        cleanup(self._launch)

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
            while len(self._buf) <= OVERFLOW_FACTOR * self.limits.output_bytes:
                data = os.read(fd, CHUNK)
                if not data:
                    break
                self._buf += data
        if self._buf.strip():
            self._fail("wrote to stdout without being asked: "
                       f"{_preview(bytes(self._buf).strip().splitlines()[0])}")
        self._buf.clear()

    def _read_line(self, deadline: float, timeout_s: float) -> bytes:
        fd = self._proc.stdout.fileno()
        max_line = self.max_reply_bytes
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                nl = self._buf.find(b"\n")
                if nl >= 0:
                    line = bytes(self._buf[:nl])
                    del self._buf[: nl + 1]
                    return line
                if len(self._buf) > max_line:
                    self._fail(f"sent a reply line longer than {max_line:,} bytes")
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fail(f"did not reply within {timeout_s:g} s")
                if not sel.select(timeout=min(left, 0.25)):
                    continue
                try:
                    data = os.read(fd, CHUNK)
                except BlockingIOError:
                    continue
                if not data:
                    self._fail_exited()
                self._buf += data

    def _drain_stderr(self) -> None:
        cap = self.limits.output_bytes
        with contextlib.suppress(OSError, ValueError):
            fd = self._proc.stderr.fileno()
            while data := os.read(fd, CHUNK):
                if self._mark and self._mark in data:  # one short write: never split
                    self._mark_seen = True
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
        if self._launch.breach:
            self._fail(f"was killed: it {self._launch.breach}")
        rc = returncode(rc, self._launch.backend)
        stderr = b"".join(self._stderr).decode("utf-8", errors="replace")
        self._fail(describe_exit(rc, self.limits, stderr) or "exited (code 0)")

    def _fail(self, what: str):
        self._dead = what
        kill(self._proc, self._launch)
        self._stderr_thread.join(timeout=1.0)
        cleanup(self._launch)
        tail = self.stderr_tail()
        raise SandboxError(f"{self.name} {what}" + (f"; its stderr ends with:\n{tail}"
                                                     if tail else "; it wrote nothing to stderr"))


def _depth_over(obj, limit: int) -> bool:
    """Whether obj nests containers more than `limit` deep (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in item if isinstance(child, dict | list))
    return False


def _preview(line: bytes, n: int = 200) -> str:
    text = line.decode("utf-8", errors="replace")
    return repr(text if len(text) <= n else text[:n] + "...")
