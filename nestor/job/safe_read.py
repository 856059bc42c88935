"""Reading a job directory from the trusted side without following anything the job put there.

A job directory is written by an agent (or handed over by a user) and may hold symlinks out of
it, hard links to files elsewhere, FIFOs that block a reader, device nodes or sockets. The
trusted side reads only plain files, and only like this:

- every path is walked from the job directory's fd, one component at a time, with
  O_NOFOLLOW (a symlink anywhere on the way fails instead of being followed);
- the file is `lstat`ed before it is opened (a FIFO or device is never opened), opened with
  O_NONBLOCK (a FIFO swapped in after the check does not block), and `fstat`ed after: it must
  be the same regular file, with exactly one name (`st_nlink == 1`: a hard link's content
  belongs to some other file);
- size caps count the bytes actually read, never `st_size` (a /proc file says 0).

The job directory itself is opened as given (the caller chose it); only what is inside it is
distrusted. `scan` lists every entry that is not a plain file or directory, for the `files`
check; `copy_tree` makes the staged copy the sandbox sees from fresh files, so nothing
outside the job can become readable through it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

MAX_ENTRIES = 10_000  # files and directories in one job
MAX_DEPTH = 16
MAX_STAGE_BYTES = 64 << 20  # all files of a staged copy together
SKIP_DIRS = ("__pycache__",)  # bytecode a local run left behind: never staged, never read
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class UnsafeFileError(ValueError):
    """A job path is missing, not a plain file, a link, or too large; the message says which."""


def kind(mode: int) -> str:
    """What an entry is, in the words of an error message."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def problem(rel: str, st: os.stat_result) -> str | None:
    """Why the entry at `rel` may not be in a job, or None if it may (a file or a directory)."""
    if stat.S_ISDIR(st.st_mode):
        return None
    if stat.S_ISREG(st.st_mode):
        if st.st_nlink > 1:
            return (f"{rel} is a hard link ({st.st_nlink} names for one file); write a copy of "
                    "the content instead")
        return None
    what = kind(st.st_mode)
    fix = "replace it with a copy of the file" if stat.S_ISLNK(st.st_mode) else "remove it"
    return f"{rel} is {what}; a job holds only plain files and directories, so {fix}"


@contextlib.contextmanager
def _root(root: Path | str | int) -> Iterator[int]:
    if isinstance(root, int):
        yield root
        return
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafeFileError(f"{root}: cannot open the job directory ({exc.strerror})") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _parts(rel: str) -> list[str]:
    parts = [p for p in str(rel).split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise UnsafeFileError(f"{rel!r}: not a path inside the job")
    return parts


def _lstat(dfd: int, name: str, rel: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        raise UnsafeFileError(f"{rel} is missing") from None
    except OSError as exc:
        raise UnsafeFileError(f"{rel}: {exc.strerror}") from None


def _open_dir_in(dfd: int, name: str, rel: str) -> int:
    st = _lstat(dfd, name, rel)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFileError(problem(rel, st) or f"{rel} is a file, not a directory")
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dfd)
    except OSError as exc:  # swapped for a link since the lstat: ELOOP / ENOTDIR
        raise UnsafeFileError(f"{rel}: cannot open without following links ({exc.strerror})") \
            from None


@contextlib.contextmanager
def _parent(root: Path | str | int, parts: list[str]) -> Iterator[int]:
    """An fd of the directory holding `parts[-1]`, each directory on the way opened without
    following links."""
    with _root(root) as rfd:
        dfd = rfd
        try:
            for i, name in enumerate(parts[:-1]):
                nfd = _open_dir_in(dfd, name, "/".join(parts[: i + 1]))
                if dfd != rfd:
                    os.close(dfd)
                dfd = nfd
            yield dfd
        finally:
            if dfd != rfd:
                os.close(dfd)


def open_file(root: Path | str | int, rel: str) -> int:
    """A blocking, read-only fd of the plain file `rel` under `root`; UnsafeFileError if any
    component is a link or the file is not a regular file with one name."""
    parts = _parts(rel)
    with _parent(root, parts) as dfd:
        st = _lstat(dfd, parts[-1], rel)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise UnsafeFileError(problem(rel, st) or f"{rel} is {kind(st.st_mode)}, not a "
                                  "file")
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            raise UnsafeFileError(f"{rel}: cannot open without following links "
                                  f"({exc.strerror})") from None
    got = os.fstat(fd)
    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(got.st_mode) \
            or got.st_nlink != 1:
        os.close(fd)
        raise UnsafeFileError(f"{rel} changed while it was being opened; resubmit")
    os.set_blocking(fd, True)
    return fd


def read_fd(fd: int, max_bytes: int, rel: str) -> bytes:
    """All of fd's bytes, at most `max_bytes` of them: counted as read, whatever stat says."""
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise UnsafeFileError(f"{rel} is over {max_bytes:,} bytes; keep it smaller")


def read_bytes(root: Path | str | int, rel: str, max_bytes: int) -> bytes:
    fd = open_file(root, rel)
    try:
        return read_fd(fd, max_bytes, rel)
    finally:
        os.close(fd)


def read_text(root: Path | str | int, rel: str, max_bytes: int) -> str:
    """The file as UTF-8 text (UnsafeFileError if it is not)."""
    data = read_bytes(root, rel, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeFileError(f"{rel}: not UTF-8 text (byte {exc.start})") from None


def is_plain_file(root: Path | str, rel: str) -> bool:
    """Is `rel` a plain, single-named file reached without links? (Opens nothing.)"""
    try:
        parts = _parts(rel)
        with _parent(root, parts) as dfd:
            st = _lstat(dfd, parts[-1], rel)
    except UnsafeFileError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _entries(dfd: int, prefix: str, depth: int, seen: list[int]) -> Iterator[tuple[str, str,
                                                                                 os.stat_result,
                                                                                 int]]:
    """(rel, name, lstat, parent fd) of everything below the directory `dfd`, depth first.
    Directories are entered by fd with O_NOFOLLOW; nothing is followed."""
    try:
        names = sorted(os.listdir(dfd))
    except OSError as exc:
        raise UnsafeFileError(f"{prefix or '.'}: cannot list ({exc.strerror})") from None
    for name in names:
        seen[0] += 1
        if seen[0] > MAX_ENTRIES:
            raise UnsafeFileError(f"the job holds more than {MAX_ENTRIES:,} files and "
                                  "directories; keep it smaller")
        rel = f"{prefix}{name}"
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        yield rel, name, st, dfd
        if stat.S_ISDIR(st.st_mode) and name not in SKIP_DIRS:
            if depth >= MAX_DEPTH:
                raise UnsafeFileError(f"{rel}: nested deeper than {MAX_DEPTH} directories")
            sub = _open_dir_in(dfd, name, rel)
            try:
                yield from _entries(sub, rel + "/", depth + 1, seen)
            finally:
                os.close(sub)


def scan(root: Path | str) -> list[str]:
    """Every reason the job at `root` is not plain files and directories (symlinks, hard
    links, FIFOs, devices, sockets, anywhere in it); empty when it is."""
    problems: list[str] = []
    try:
        with _root(root) as rfd:
            for rel, _name, st, _dfd in _entries(rfd, "", 0, [0]):
                if (why := problem(rel, st)) is not None:
                    problems.append(why)
    except UnsafeFileError as exc:
        problems.append(str(exc))
    return problems


def copy_tree(src: Path | str, dst: Path | str, *, max_bytes: int = MAX_STAGE_BYTES) -> int:
    """Copy the job at `src` into the new directory `dst` as fresh files (0644, directories
    0755: the sandbox's unprivileged uid reads them), leaving out __pycache__. Any link or
    special file is an UnsafeFileError; nothing is followed. Returns the bytes copied."""
    dst = Path(dst)
    os.mkdir(dst, 0o755)
    os.chmod(dst, 0o755)  # mkdir obeys the umask
    total = 0
    with _root(src) as rfd:
        for rel, name, st, dfd in _entries(rfd, "", 0, [0]):
            if name in SKIP_DIRS or any(p in SKIP_DIRS for p in rel.split("/")[:-1]):
                continue
            if (why := problem(rel, st)) is not None:
                raise UnsafeFileError(why)
            target = dst / rel
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o755)
                os.chmod(target, 0o755)
                continue
            fd = open_file(dfd, name)
            try:
                data = read_fd(fd, max_bytes - total, rel)
            except UnsafeFileError:
                raise UnsafeFileError(f"the job is over {max_bytes:,} bytes (at {rel}); keep it "
                                      "smaller") from None
            finally:
                os.close(fd)
            total += len(data)
            out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o644)
            try:
                os.fchmod(out, 0o644)
                with open(out, "wb", closefd=False) as fh:
                    fh.write(data)
            finally:
                os.close(out)
    return total
