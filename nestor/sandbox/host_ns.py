"""A job's processes, as the host's zygote starts, relays to and ends them (bound next to
host.py, which loads it; STANDALONE: stdlib only).

The host (a zygote that never runs job code) serves many jobs, one at a time. For each it
makes a `JobProcess`: it forks C, which, in `enter()`:
- unshares a user, pid, mount, ipc and network namespace (the job's uid stays the sandbox's
  uid: one inner uid is mapped to it, nothing else is mapped);
- makes every mount private and mounts fresh tmpfs on /tmp and /dev/shm (so no job sees a
  file of another; the old ones are unreachable from the new mount namespace);
then forks G, the new pid namespace's init, which in `confine()` drops every capability and
stacks the full seccomp filter (no namespaces, mounts, ptrace...) on the sandbox's relaxed one.
When G exits the kernel kills every process of the namespace before C's waitpid returns, so
nothing of a job outlives it. `probe()` runs all of this once at start: where anything is
refused (no unprivileged user namespaces, no seccomp filter to stack), the host says so and the
trusted side goes back to one host per job. G forks J, the job's server, and reaps every
orphan until J exits; then it reports J's wait status to the zygote and exits. Also here: the
job's own rlimits (`lower_limits`), how an exit is explained (`exit_reason`), and the clean-up
of the one-job-per-host fallback (`reap_strays`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import shutil
import signal
import struct

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
FLAGS = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET
MS_REC, MS_PRIVATE, MS_NOSUID, MS_NODEV, MS_BIND = 0x4000, 1 << 18, 2, 4, 0x1000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 22, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
NR_CAPSET = 126  # x86-64; the filter (and so this path) is x86-64 only
CAP_VERSION_3 = 0x20080522
FILTER_PATH = "/opt/nestor/seccomp.bpf"  # the full filter, bound read-only by the trusted side
SETUP_FAILED = 99  # C's exit status when its set-up was refused
PRIVATE_UIDS = range(200_000, 265_000)  # the sandbox's per-child uids: kill(-1) is safe there

_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(OSError):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise NamespaceError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def load_filter(path: str = FILTER_PATH) -> bytes | None:
    """The full seccomp filter the job gets (an array of 8-byte sock_filter), or None."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 16)
    except OSError:
        return None
    return data if data and len(data) % 8 == 0 else None


def enter(tmp_bytes: int) -> None:
    """In C: new namespaces, the sandbox's uid mapped to itself, fresh /tmp and /dev/shm."""
    uid, gid = os.getuid(), os.getgid()
    os.chdir("/")  # never keep a handle on the old /tmp
    _check(_libc.unshare(FLAGS), "unshare")
    # uid_map is root's to write while we are not dumpable (the zygote is not): briefly dumpable,
    # while no job process exists anywhere in the sandbox.
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    finally:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    opts = f"size={tmp_bytes},mode=1777".encode()
    for where in ("/tmp", "/dev/shm"):
        kept = _mounts_under(where)
        old = os.open(where, os.O_PATH | os.O_DIRECTORY)  # the covered tree, still reachable
        try:
            _check(_libc.mount(b"tmpfs", where.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts),
                   f"mount tmpfs on {where}")
            _rebind(old, where, kept)
        finally:
            os.close(old)


def _mounts_under(where: str) -> list[tuple[str, bool]]:
    """The outermost mount points strictly below `where` (e.g. a virtualenv under /tmp that the
    sandbox binds read-only), each with whether it is a directory."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4]
            for esc, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"),
                              ("\\134", "\\")):
                point = point.replace(esc, char)
            if point.startswith(where + "/"):
                points.append(point)
    outer = [p for p in points if not any(p.startswith(q + "/") for q in points)]
    return [(p, os.path.isdir(p)) for p in sorted(set(outer))]


def _rebind(old: int, where: str, kept: list[tuple[str, bool]]) -> None:
    """Bind what was mounted below `where` again on top of its fresh tmpfs, from the covered
    tree (through the fd `old`), recursively, so locked read-only binds stay read-only."""
    for point, is_dir in kept:
        rel = point[len(where) + 1:]
        if is_dir:
            os.makedirs(point, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(point), exist_ok=True)
            os.close(os.open(point, os.O_CREAT | os.O_WRONLY, 0o644))
        _check(_libc.mount(f"/proc/self/fd/{old}/{rel}".encode(), point.encode(), None,
                           MS_BIND | MS_REC, None), f"bind {point} again")


def confine(prog: bytes) -> None:
    """In G (pid 1 of the job's namespace): no capabilities, and the full filter on top."""
    _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # SIGKILL if C goes
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = struct.pack("=Ii", CAP_VERSION_3, 0)
    data = bytes(24)  # two {effective, permitted, inheritable} u32 triples, all zero
    _check(_libc.syscall(NR_CAPSET, ctypes.c_char_p(header), ctypes.c_char_p(data)), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    filt = ctypes.create_string_buffer(prog, len(prog))
    fprog = struct.pack("=HxxxxxxQ", len(prog) // 8, ctypes.addressof(filt))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0),
           "seccomp")


def probe(prog: bytes | None, tmp_bytes: int) -> str | None:
    """Run the whole set-up once in a throwaway child; None if it works, else why not."""
    if prog is None:
        return f"no seccomp filter to stack at {FILTER_PATH}"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # C
        os.close(r)
        msg = b""
        try:
            shared_tmp = os.stat("/tmp").st_dev
            enter(tmp_bytes)
            g = os.fork()
            if g == 0:  # G: pid 1 of the new namespace
                try:
                    confine(prog)
                    ok = (os.getpid() == 1 and os.stat("/tmp").st_dev != shared_tmp
                          and _unshare_refused())
                    os._exit(0 if ok else 1)
                except BaseException:
                    os._exit(2)
            _, status = os.waitpid(g, 0)
            if status != 0:
                msg = f"the confined child failed its checks (status {status})".encode()
        except BaseException as exc:  # noqa: BLE001 - reported, never raised into the zygote
            msg = str(exc).encode()[:500]
        os.write(w, msg)
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 4096):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    msg = b"".join(chunks).decode(errors="replace")
    if msg or status != 0:
        return msg or f"the probe exited with status {status}"
    return None


def _unshare_refused() -> bool:
    return _libc.unshare(CLONE_NEWUSER) != 0


class JobProcess:
    """One job as the zygote sees it: C's pid, the request pipe into the job's server J, J's
    reply pipe, and G's status pipe (J's wait status, or why the set-up failed).

    The job never holds the zygote's own protocol pipes: J gets fresh ones at fds 0 and
    `proto_fd`, and the zygote relays one reply line per request. So nothing a job leaves
    behind can read a later job's requests or answer for it."""

    def __init__(self, run, *, fresh: bool, tmp_bytes: int, prog: bytes | None, proto_fd: int):
        req_r, self.req_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        self.st_r, st_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # C: never returns
            _c_main(run, fresh, tmp_bytes, prog, (req_r, rep_w, st_w, proto_fd),
                    (self.req_w, self.rep_r, self.st_r))
        for fd in (req_r, rep_w, st_w):
            os.close(fd)
        os.set_blocking(self.rep_r, False)
        self.buf = bytearray()  # what J wrote and was not relayed yet
        self.status_msg = bytearray()  # from G: b"S" + J's wait status, or b"E" + an error
        self.j_done = False  # J exited, or its reply pipe was closed
        self.st_eof = False

    def send(self, line: bytes) -> None:
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(self.req_w, view):]
        except OSError:  # J is gone: read_reply says so
            pass

    def read_reply(self, cap: int) -> bytes | None:
        """J's next reply line (with its newline); None if J ended first. OSError if the line
        grows past cap bytes."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line = bytes(self.buf[: nl + 1])
                del self.buf[: nl + 1]
                return line
            if len(self.buf) > cap:
                raise OSError(f"the job's reply is longer than {cap} bytes")
            if self.j_done:
                return None
            fds = [self.rep_r] + ([] if self.st_eof else [self.st_r])
            ready, _, _ = select.select(fds, [], [])
            if self.rep_r in ready and not self._drain(cap):
                self.j_done = True
            if self.st_r in ready:
                self._read_status()
                self._drain(cap)  # all J wrote before it exited is in the pipe by now
                self.j_done = True

    def _drain(self, cap: int) -> bool:
        """Read what J wrote; False at end of file."""
        while len(self.buf) <= cap:
            try:
                chunk = os.read(self.rep_r, 1 << 16)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            self.buf += chunk
        return True

    def _read_status(self, timeout_s: float | None = None) -> None:
        while not self.st_eof:
            if timeout_s is not None and not select.select([self.st_r], [], [], timeout_s)[0]:
                return
            chunk = os.read(self.st_r, 4096)
            if not chunk:
                self.st_eof = True
            self.status_msg += chunk
            if self.status_msg[:1] == b"S" and len(self.status_msg) >= 5:
                return

    def finish(self, grace_s: float) -> tuple[int | None, str | None]:
        """End the job: close its requests (an honest J exits), wait up to grace_s for J,
        then have C kill G (and with it the whole pid namespace); wait for C. Returns J's
        wait status (None if it was killed) and a set-up error, if any."""
        if self.req_w >= 0:
            os.close(self.req_w)
            self.req_w = -1
        if grace_s > 0 and not self.status_msg:
            self._read_status(grace_s)
        if os.waitpid(self.pid, os.WNOHANG)[0] == 0:
            if self.status_msg[:1] != b"S":
                os.kill(self.pid, signal.SIGUSR1)  # C: SIGKILL G
            os.waitpid(self.pid, 0)  # C waits for G, so the namespace is empty
        self._read_status()  # nothing else holds the pipe now: to its end
        os.close(self.rep_r)
        os.close(self.st_r)
        kind, body = self.status_msg[:1], bytes(self.status_msg[1:])
        if kind == b"S" and len(body) >= 4:
            return struct.unpack("=i", body[:4])[0], None
        if kind == b"E":
            return None, body.decode(errors="replace")
        return None, None


_G = [0]  # in C: G's pid, for the SIGUSR1 handler


def _kill_g(*_) -> None:
    if _G[0]:
        os.kill(_G[0], signal.SIGKILL)


def _c_main(run, fresh: bool, tmp_bytes: int, prog: bytes | None, fds: tuple, zygote_ends: tuple):
    req_r, rep_w, st_w, proto_fd = fds
    code = 0
    try:
        signal.signal(signal.SIGUSR1, _kill_g)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        for fd in zygote_ends:
            os.close(fd)
        os.dup2(req_r, 0)  # the job's requests, never the zygote's stream
        os.dup2(rep_w, proto_fd)
        keep = {0, 1, 2, proto_fd, st_w}
        for name in os.listdir("/proc/self/fd"):  # nothing else of the zygote's goes along
            if int(name) not in keep:
                with contextlib.suppress(OSError):
                    os.close(int(name))
        if fresh:
            enter(tmp_bytes)
        g = os.fork()
        if g == 0:
            _g_main(run, fresh, prog, st_w)
        _G[0] = g
        while True:
            try:
                os.waitpid(g, 0)
                break
            except InterruptedError:
                continue
    except ChildProcessError:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported to the zygote, never raised there
        with contextlib.suppress(OSError):
            os.write(st_w, b"E" + f"setting up the job's namespaces: {exc}".encode()[:500])
        code = SETUP_FAILED
    os._exit(code)


def _g_main(run, fresh: bool, prog: bytes | None, st_w: int):
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        if fresh:
            confine(prog)
        j = os.fork()
        if j == 0:  # J: the job's server
            os.close(st_w)
            code = 1
            try:
                code = run()
            finally:
                os._exit(code)
        while True:  # pid 1: reap orphans until J exits
            try:
                pid, status = os.waitpid(-1, 0)
            except InterruptedError:
                continue
            if pid == j:
                break
        os.write(st_w, b"S" + struct.pack("=i", status))
    except BaseException as exc:  # noqa: BLE001
        with contextlib.suppress(OSError):
            os.write(st_w, b"E" + f"confining the job: {exc}".encode()[:500])
        os._exit(SETUP_FAILED)
    os._exit(0)


def exit_reason(status: int | None) -> str:
    if status is None:
        return "the job's process stopped answering (it closed its reply pipe or blocked its end)"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
        if sig == signal.SIGALRM:
            return "timeout"
        hint = {signal.SIGXCPU: " (CPU time limit)", signal.SIGKILL: " (memory or CPU limit)",
                signal.SIGXFSZ: " (file size limit)", signal.SIGSEGV: " (crash)"}.get(sig, "")
        return f"the job's process was killed by {name}{hint}"
    return f"the job's process exited with code {os.WEXITSTATUS(status)} mid-request " \
        "(os._exit or a crash in the job's code)"


def _clear_tmp() -> None:
    """Remove what the job left in the sandbox's private tmp, so the next job starts clean
    (only files of our own private uid: nothing else's is touched)."""
    tmp = os.environ.get("TMPDIR") or "/tmp"
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def reap_strays() -> None:
    """Without fresh namespaces: kill what the job left behind, i.e. (under the sandbox's
    private uid, where nothing else of ours runs) every other process but this one."""
    if os.getuid() in PRIVATE_UIDS:
        try:
            os.kill(-1, signal.SIGKILL)  # Linux spares the caller
        except OSError:
            pass
        _clear_tmp()
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _cap(value: int, want: int) -> int:
    return want if value == resource.RLIM_INFINITY else min(value, want)


def lower_limits(req: dict) -> None:
    """This job's own CPU and memory caps (the zygote's are the most any job gets). CPU gets
    SIGXCPU at the soft limit and SIGKILL a second later, like the sandbox's own."""
    if req.get("cpu_s"):
        want = int(req["cpu_s"])
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (_cap(soft, want), _cap(hard, want + 1)))
    if req.get("memory_mb"):
        want = int(req["memory_mb"]) << 20
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (_cap(soft, want), _cap(hard, want)))


def not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid (the job's) cannot open our /proc/<pid>/mem,
    fds or environ, nor ptrace us (seccomp refuses that anyway)."""
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
