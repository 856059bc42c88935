"""The agent's workspace: file tools confined to one directory, with quotas.

Every path is relative, made of plain names (no `..`, no absolute paths, no NUL or control
characters), and walked one component at a time with O_NOFOLLOW, so a symlink anywhere on the
path is refused even if it appears between a check and the open. Every misuse comes back as an
"error: ..." string the agent can act on; nothing here raises into the caller.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_FILE_MODE, _DIR_MODE = 0o644, 0o755  # readable by the sandbox's unprivileged uid


class WorkspaceQuota(BaseModel):
    model_config = ConfigDict(frozen=True)

    max_files: int = Field(64, ge=1, le=100_000, description="Files in the workspace.")
    max_file_bytes: int = Field(200_000, ge=1, description="Bytes in one file (UTF-8).")
    max_total_bytes: int = Field(2_000_000, ge=1, description="Bytes in all files together.")
    max_path_chars: int = Field(200, ge=8, le=4096, description="Characters in one path.")
    max_name_chars: int = Field(80, ge=1, le=255, description="Characters in one path component.")
    max_depth: int = Field(8, ge=1, le=64, description="Directory levels below the root.")


class WorkspaceError(Exception):
    """A tool misuse; its message becomes the tool's "error: ..." reply."""


def _tool(fn: Callable[..., str]) -> Callable[..., str]:
    """Turn every failure of a tool into an "error: ..." string."""

    @functools.wraps(fn)
    def wrapper(self: Workspace, *args, **kwargs) -> str:
        try:
            return fn(self, *args, **kwargs)
        except WorkspaceError as e:
            return f"error: {e}"
        except OSError as e:
            return f"error: {e.strerror or e} ({_describe_oserror(e)})"
        except Exception as e:  # noqa: BLE001 - a tool must never raise into the episode
            return f"error: {type(e).__name__}: {e}"

    return wrapper


def _describe_oserror(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "symlinks are not allowed"
    return errno.errorcode.get(e.errno or 0, "OSError")


def _param(description: str) -> dict:
    return {"type": "string", "description": description}


def _schema(name: str, description: str, params: dict[str, dict]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": params, "required": list(params),
                       "additionalProperties": False}}}


_PATH = _param("Path relative to the job directory, e.g. 'env/my_env.py'. No '..', no leading '/'.")

TOOL_SCHEMAS: list[dict] = [
    _schema("list_files", "List every file in the job directory with its size, and the quota "
            "left.", {}),
    _schema("read_file", "Return the full text of one file.", {"path": _PATH}),
    _schema("write_file", "Create or overwrite a text file (parent directories are created).",
            {"path": _PATH, "content": _param("The complete new text of the file.")}),
    _schema("edit_file", "Replace one exact occurrence of old_string with new_string in a file. "
            "old_string must match the file's text exactly (whitespace included) and occur "
            "exactly once; include surrounding lines to make it unique.",
            {"path": _PATH, "old_string": _param("Exact text to replace (must occur once)."),
             "new_string": _param("Replacement text (may be empty to delete).")}),
    _schema("delete_file", "Delete one file.", {"path": _PATH}),
    _schema("submit", "Submit the job directory as it is now: it is validated and, if it "
            "passes, trained and scored. Call it when the job is complete.", {}),
]
TOOL_NAMES = tuple(s["function"]["name"] for s in TOOL_SCHEMAS)
FILE_TOOLS = tuple(n for n in TOOL_NAMES if n != "submit")


class Workspace:
    """File tools over the directory `root` (created if missing)."""

    def __init__(self, root: str | os.PathLike, quota: WorkspaceQuota | None = None) -> None:
        os.makedirs(root, mode=_DIR_MODE, exist_ok=True)
        self.root = Path(os.path.realpath(root))
        self.quota = quota or WorkspaceQuota()

    # -- the tools -------------------------------------------------------------------------
    def call(self, name: str, arguments: dict | str | None = None) -> str:
        """Dispatch one tool call by name; never raises. `submit` belongs to the episode."""
        if name == "submit":
            return "error: submit is handled by the episode, not by the workspace"
        if name not in FILE_TOOLS:
            return f"error: unknown tool {name!r}; the tools are: {', '.join(TOOL_NAMES)}"
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as e:
                return f"error: arguments are not valid JSON ({e.msg} at char {e.pos})"
        if not isinstance(arguments, dict):
            return "error: arguments must be a JSON object"
        props = next(s for s in TOOL_SCHEMAS if s["function"]["name"] == name)[
            "function"]["parameters"]["properties"]
        missing = [p for p in props if p not in arguments]
        extra = [a for a in arguments if a not in props]
        if missing or extra:
            expected = ", ".join(props) or "no arguments"
            return (f"error: {name} takes {expected}"
                    + (f"; missing: {', '.join(missing)}" if missing else "")
                    + (f"; unexpected: {', '.join(map(str, extra))}" if extra else ""))
        bad = [p for p in props if not isinstance(arguments[p], str)]
        if bad:
            return f"error: {', '.join(bad)} must be a string"
        return getattr(self, name)(**arguments)

    @_tool
    def list_files(self) -> str:
        files = sorted(self._walk())
        total = sum(size for _, size, _ in files)
        q = self.quota
        lines = [f"{rel} ({size} bytes)" if kind == "file" else f"{rel} ({kind}: not allowed, "
                 "delete it)" for rel, size, kind in files] or ["(no files yet)"]
        lines.append(f"-- {len(files)}/{q.max_files} files, {total}/{q.max_total_bytes} bytes")
        return "\n".join(lines)

    @_tool
    def read_file(self, path: str) -> str:
        parts = self._parts(path)
        with self._dir(parts[:-1]) as dfd:
            fd = self._open_file(dfd, parts[-1], os.O_RDONLY, path)
            with os.fdopen(fd, "rb") as fh:
                data = fh.read(self.quota.max_file_bytes + 1)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WorkspaceError(f"{path} is not UTF-8 text (byte {e.start})") from None

    @_tool
    def write_file(self, path: str, content: str) -> str:
        parts = self._parts(path)
        data = content.encode("utf-8", errors="strict")
        self._check_existing(parts, path)
        self._check_quota(parts, len(data), path)
        with self._dir(parts[:-1], create=True) as dfd:
            fd = self._open_file(dfd, parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, path)
            os.fchmod(fd, _FILE_MODE)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        return f"ok: wrote {len(data)} bytes to {'/'.join(parts)}"

    @_tool
    def edit_file(self, path: str, old_string: str, new_string: str) -> str:
        if old_string == "":
            raise WorkspaceError("old_string is empty; give the exact text to replace")
        if new_string == old_string:  # warm-started clones 'repair' by copying a line
            raise WorkspaceError("new_string is the same as old_string: the edit would change "
                                 "nothing; write the corrected text in new_string")
        text = self.read_file(path)
        if text.startswith("error: "):
            return text
        count = text.count(old_string)
        if count == 0:
            raise WorkspaceError(
                f"old_string was not found in {path}; it must match the file exactly, "
                "whitespace and indentation included (read_file shows the current text)")
        if count > 1:
            raise WorkspaceError(
                f"old_string occurs {count} times in {path}; include more surrounding text "
                "so that it matches exactly once")
        result = self.write_file(path, text.replace(old_string, new_string, 1))
        if result.startswith("error: "):
            return result
        line = text[: text.index(old_string)].count("\n") + 1
        return f"ok: replaced 1 occurrence at line {line} of {'/'.join(self._parts(path))}"

    @_tool
    def delete_file(self, path: str) -> str:
        parts = self._parts(path)
        with self._dir(parts[:-1]) as dfd:
            try:
                st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise WorkspaceError(f"{path} does not exist (list_files shows what exists)") \
                    from None
            if stat.S_ISDIR(st.st_mode):
                raise WorkspaceError(f"{path} is a directory; delete the files in it instead")
            os.unlink(parts[-1], dir_fd=dfd)  # a symlink itself is removed, never its target
        self._prune_empty_dirs(parts[:-1])
        return f"ok: deleted {'/'.join(parts)}"

    # -- path handling ---------------------------------------------------------------------
    def _parts(self, path: object) -> list[str]:
        q = self.quota
        if not isinstance(path, str):
            raise WorkspaceError("path must be a string")
        if path.strip() == "":
            raise WorkspaceError("path is empty")
        if "\x00" in path:
            raise WorkspaceError("path contains a NUL byte")
        if len(path) > q.max_path_chars:
            raise WorkspaceError(f"path is longer than {q.max_path_chars} characters")
        if path.startswith(("/", "~")) or re.match(r"^[A-Za-z]:[\\/]", path):
            raise WorkspaceError(f"absolute paths are not allowed ({path!r}); use a path "
                                 "relative to the job directory, e.g. 'env/my_env.py'")
        if "\\" in path:
            raise WorkspaceError("use '/' to separate directories, not '\\'")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if not parts:
            raise WorkspaceError(f"{path!r} names the job directory itself, not a file")
        for part in parts:
            if part == "..":
                raise WorkspaceError(f"'..' is not allowed in paths ({path!r}); paths stay "
                                     "inside the job directory")
            if len(part) > q.max_name_chars:
                raise WorkspaceError(f"name {part[:20]!r}... is longer than "
                                     f"{q.max_name_chars} characters")
            if not _NAME_RE.match(part) or set(part) == {"."}:
                raise WorkspaceError(
                    f"name {part!r} has characters outside letters, digits and '_.+-'")
        if len(parts) > q.max_depth + 1:
            raise WorkspaceError(f"path is nested deeper than {q.max_depth} directories")
        return parts

    @contextlib.contextmanager
    def _dir(self, parts: list[str], *, create: bool = False) -> Iterator[int]:
        """Open the directory root/parts without following any symlink; yield its fd."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
        fd = os.open(self.root, flags)
        try:
            for i, name in enumerate(parts):
                where = "/".join(parts[: i + 1])
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    if not create:
                        raise WorkspaceError(f"directory {where} does not exist") from None
                    os.mkdir(name, _DIR_MODE, dir_fd=fd)
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    # mkdir is subject to the umask; the sandbox uid must be able to enter it
                    os.chmod(name, _DIR_MODE, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    raise WorkspaceError(f"{where} is a symlink; symlinks are not allowed")
                if not stat.S_ISDIR(st.st_mode):
                    raise WorkspaceError(f"{where} is a file, not a directory")
                nfd = os.open(name, flags, dir_fd=fd)
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            os.close(fd)

    def _check_existing(self, parts: list[str], path: str) -> None:
        """Refuse a symlink, file-as-directory or special file on the existing part of the path
        (before quotas, so the agent hears about the real problem first)."""
        here = self.root
        for i, name in enumerate(parts):
            here = here / name
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                return
            where = "/".join(parts[: i + 1])
            if stat.S_ISLNK(st.st_mode):
                raise WorkspaceError(f"{where} is a symlink; symlinks are not allowed")
            last = i == len(parts) - 1
            if not last and not stat.S_ISDIR(st.st_mode):
                raise WorkspaceError(f"{where} is a file, not a directory")
            if last and stat.S_ISDIR(st.st_mode):
                raise WorkspaceError(f"{path} is a directory, not a file")
            if last and not stat.S_ISREG(st.st_mode):
                raise WorkspaceError(f"{path} is a special file; only regular files are allowed")

    def _lstat_regular(self, dfd: int, name: str, path: str) -> os.stat_result:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise WorkspaceError(f"{path} does not exist (list_files shows what exists)") from None
        if stat.S_ISLNK(st.st_mode):
            raise WorkspaceError(f"{path} is a symlink; symlinks are not allowed")
        if stat.S_ISDIR(st.st_mode):
            raise WorkspaceError(f"{path} is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise WorkspaceError(f"{path} is a special file; only regular files are allowed")
        return st

    def _open_file(self, dfd: int, name: str, flags: int, path: str) -> int:
        if flags & os.O_CREAT:
            with contextlib.suppress(FileNotFoundError):
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
                self._lstat_regular(dfd, name, path)  # exists: must be a regular file
        else:
            st = self._lstat_regular(dfd, name, path)
            if st.st_size > self.quota.max_file_bytes:
                raise WorkspaceError(f"{path} is larger than {self.quota.max_file_bytes} bytes")
        # O_NOFOLLOW + O_NONBLOCK: a symlink or FIFO swapped in after the check still fails
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, _FILE_MODE,
                     dir_fd=dfd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise WorkspaceError(f"{path} is a special file; only regular files are allowed")
        os.set_blocking(fd, True)
        return fd

    def _walk(self) -> list[tuple[str, int, str]]:
        """(relative path, size, kind) of every non-directory entry; symlinks not followed."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames + [d for d in dirnames
                                     if os.path.islink(os.path.join(dirpath, d))]:
                st = os.lstat(os.path.join(dirpath, name))
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                kind = ("file" if stat.S_ISREG(st.st_mode) else
                        "symlink" if stat.S_ISLNK(st.st_mode) else "special file")
                out.append((rel, st.st_size if kind == "file" else 0, kind))
        return out

    def _check_quota(self, parts: list[str], new_size: int, path: str) -> None:
        q = self.quota
        if new_size > q.max_file_bytes:
            raise WorkspaceError(f"{path} would be {new_size} bytes; the limit per file is "
                                 f"{q.max_file_bytes} bytes")
        rel = "/".join(parts)
        files = {rel: size for rel, size, _ in self._walk()}
        old = files.pop(rel, None)
        if old is None and len(files) + 1 > q.max_files:
            raise WorkspaceError(f"the workspace already holds {len(files)} files (limit "
                                 f"{q.max_files}); delete one first")
        total = sum(files.values()) + new_size
        if total > q.max_total_bytes:
            raise WorkspaceError(f"the workspace would hold {total} bytes (limit "
                                 f"{q.max_total_bytes}); shorten or delete files first")

    def _prune_empty_dirs(self, parts: list[str]) -> None:
        for i in range(len(parts), 0, -1):
            with contextlib.suppress(OSError, WorkspaceError), self._dir(parts[: i - 1]) as dfd:
                os.rmdir(parts[i - 1], dir_fd=dfd)
