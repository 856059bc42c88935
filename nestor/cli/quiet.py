"""A quiet console for every command: no third-party deprecation warnings (here, and in the
pool's spawned worker processes, which inherit the environment), transformers' own logger at
errors only, and each distinct log warning printed once per process as one `warning:` line.

(The sandbox's weak-backend warning is made once per run by nestor.sandbox itself; this module
only filters and formats what reaches the console.)
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

NOISY = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)


class OncePerProcess(logging.Filter):
    """Drops a record whose logger and message were already shown."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = " ".join(record.getMessage().split())  # one line, even for a wrapped message
        if record.exc_info and record.levelno >= logging.ERROR:
            text += " (" + " ".join(self.formatException(record.exc_info).splitlines()[-1:]) + ")"
        return f"{record.levelname.lower()}: {text}"


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is now (a test's capture, a redirected console)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def quiet_console() -> None:
    """Idempotent; called once by the root command before any subcommand runs."""
    for category in NOISY:  # nestor's own stay visible
        warnings.filterwarnings("ignore", category=category, module=r"(?!nestor)")
    inherited = [p for p in os.environ.get("PYTHONWARNINGS", "").split(",") if p]
    wanted = [f"ignore::{c.__name__}" for c in NOISY if f"ignore::{c.__name__}" not in inherited]
    if wanted:  # spawned workers start a fresh interpreter: they read this at start-up
        os.environ["PYTHONWARNINGS"] = ",".join(inherited + wanted)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    root = logging.getLogger()
    if not any(isinstance(h.formatter, _OneLine) for h in root.handlers):
        handler = _Stderr()  # like the rest of the console
        handler.setLevel(logging.WARNING)
        handler.setFormatter(_OneLine())
        handler.addFilter(OncePerProcess())
        root.addHandler(handler)
