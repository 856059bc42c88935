"""PRIVATE: the installation's hidden-eval secret. Imported only by `nestor.tasks.hidden` (and
the sandbox, for where the file lives, so that it can mask it).

The hidden items are drawn from the task's sampler under a seed that mixes this secret in, so a
reader of nestor's source (an agent included) cannot regenerate them. It is made on first use
with `secrets`, kept 0600 in a 0700 directory that no sandbox binds (`$NESTOR_HOME`, else
`~/.local/share/nestor`), never printed, never in a report or export; caches are keyed by
`secret_id()`, a hash of it. `NESTOR_HIDDEN_SEED` overrides it (reproducible research: anyone
with that value regenerates the items, so never give it to an agent's environment).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

ENV_SEED = "NESTOR_HIDDEN_SEED"
FILE_NAME = "hidden_seed"


class SecretError(RuntimeError):
    """The secret file exists but cannot be used (unreadable, empty, open to others)."""


def nestor_home() -> Path:
    """Where the installation's private state lives (never bound into a sandbox)."""
    home = os.environ.get("NESTOR_HOME")
    return Path(home) if home else Path.home() / ".local" / "share" / "nestor"


def secret_path() -> Path:
    return nestor_home() / FILE_NAME


def _read(path: Path) -> bytes:
    st = path.stat()
    if st.st_mode & 0o077:
        raise SecretError(f"{path} is readable by others (mode {st.st_mode & 0o777:o}); "
                          f"`chmod 600 {path}`, or delete it to make a new one")
    value = path.read_bytes().strip()
    if len(value) < 16:
        raise SecretError(f"{path} holds no usable secret; delete it to make a new one")
    return value


def _create(path: Path) -> bytes:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    value = secrets.token_hex(32).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another process made it first: theirs wins
        return _read(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(value + b"\n")
    return value


def hidden_secret() -> bytes:
    """The secret (from NESTOR_HIDDEN_SEED, else the file, made on first use)."""
    env = os.environ.get(ENV_SEED)
    if env:
        return env.encode()
    path = secret_path()
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    return _create(path)


def secret_id() -> str:
    """A public name of the secret (caches are keyed by it): a hash, never the secret."""
    return hashlib.sha256(b"nestor-hidden-id\0" + hidden_secret()).hexdigest()[:16]


def keyed_seed(text: str) -> str:
    """A seed for `random.Random` that only a holder of the secret can compute from `text`."""
    return hmac.new(hidden_secret(), text.encode(), hashlib.sha256).hexdigest()
