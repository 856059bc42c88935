"""Run untrusted code in a sandboxed child: one-shot (`run_sandboxed`) or as a long-lived
JSON-lines server (`SandboxedProcess`, in process.py). See docs/sandbox.md for what the child
can and cannot see.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from nestor.sandbox.backend import Binds, detect_backend
from nestor.sandbox.launch import (
    CHUNK,
    OVERFLOW_FACTOR,
    cleanup,
    describe_exit,
    kill,
    nproc_enforced,
    prepare,
    require_backend,
    returncode,
    spawn,
)
from nestor.sandbox.limits import Limits, SandboxError, SandboxResult
from nestor.sandbox.process import SandboxedProcess

__all__ = ["Limits", "SandboxError", "SandboxResult", "SandboxedProcess", "nproc_enforced",
           "require_sandbox", "run_sandboxed", "sandbox_backend"]

# After the main child exits, how long leftover writers may keep the pipes open.
_DRAIN_GRACE_S = 0.5


def sandbox_backend() -> str:
    """The isolation in use here: "bubblewrap", "unshare" or "rlimits" (weaker, opted in to by
    name: logged once per run), or "none" where agent code will be refused."""
    return detect_backend()


def require_sandbox() -> str:
    """The backend in use; raises SandboxUnavailable (one actionable line) where agent code
    would be refused. Commands that will run agent code call this first, to stop early."""
    return require_backend()


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
    launch = prepare(argv, ro_binds, limits, env, cwd)
    start = time.monotonic()
    deadline = start + limits.wall_s
    try:
        proc = spawn(launch, stdin is not None)
    except OSError as e:
        cleanup(launch)
        return SandboxResult(returncode=-1, stdout="", stderr=str(e), elapsed_s=0.0,
                             reason=f"could not start the sandbox: {e}", backend=launch.backend)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    try:
        out, err, totals, timed_out, overflow = _collect(proc, limits, deadline)
        if timed_out or overflow:
            kill(proc, launch)
        else:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
            kill(proc, launch)  # also reaps anything the child left behind
    finally:
        if proc.poll() is None:
            kill(proc, launch)
        cleanup(launch)
    elapsed = time.monotonic() - start
    rc = returncode(proc.returncode, launch.backend)
    stdout, stderr = _decode(out, totals[0], limits), _decode(err, totals[1], limits)
    truncated = max(totals) > limits.output_bytes
    if launch.breach:
        reason = f"killed: it {launch.breach}"
    elif timed_out:
        reason = f"wall-clock timeout after {limits.wall_s:g} s (process group killed)"
    elif overflow:
        reason = (f"printed more than {OVERFLOW_FACTOR * limits.output_bytes} bytes "
                  "(killed; output truncated)")
    else:
        reason = describe_exit(rc, limits, stderr)
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
    cap, hard_cap = limits.output_bytes, OVERFLOW_FACTOR * limits.output_bytes
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
                data = os.read(key.fd, CHUNK)
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
