"""What prime-rl's processes print, followed within bounds: the job's code runs in them
(nestor/inner/prime_rl.py), so every line is the job's to write — step numbers, values and line
lengths are capped, the log file rotates, and nothing it prints can raise here.
"""

from __future__ import annotations

import math
import os
import queue
import re
import signal
import subprocess
import threading
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# prime-rl's orchestrator and trainer both log "Step N | 1.23s | Reward 0.41 | ..." style lines.
# The log is the job's to write: step numbers have at most 9 digits, values at most 64 chars.
_STEP = re.compile(r"\bStep (\d{1,9}) \|")
_FIELD = re.compile(r"\b(Reward|Loss|Entropy|Throughput) (-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
MAX_LINE = 4096  # characters of a log line kept (the rest of a longer line is dropped)
MAX_STEPS_KEPT = 100_000  # distinct steps a StepLog keeps metrics for


class StepLog:
    """Progress parsed from prime-rl's log: the highest step seen and per-step metrics. The
    log is the job's to write: steps past `max_step` (the job's max_steps), over-long numbers
    and non-finite values are ignored, and a line is read up to MAX_LINE characters."""

    def __init__(self, max_step: int | None = None) -> None:
        self.step = 0
        self.max_step = max_step
        self.by_step: dict[int, dict[str, float]] = {}

    def feed(self, line: str) -> bool:
        """Parse one line; True when it advanced the step count. Never raises."""
        line = line[:MAX_LINE]
        m = _STEP.search(line)
        if not m:
            return False
        step = int(m.group(1))
        if self.max_step is not None and step > self.max_step:
            return False
        if step not in self.by_step and len(self.by_step) >= MAX_STEPS_KEPT:
            return False
        row = self.by_step.setdefault(step, {"step": step})
        for name, text in _FIELD.findall(line):
            value = float(text) if len(text) <= 64 else math.inf
            if math.isfinite(value):  # inf/nan would make --json output non-standard
                row[name.lower()] = value
        advanced = step > self.step
        self.step = max(self.step, step)
        return advanced

    def rewards(self) -> list[float]:
        return [r["reward"] for _, r in sorted(self.by_step.items()) if "reward" in r]

    def metrics(self) -> list[dict]:
        return [r for _, r in sorted(self.by_step.items())]


class LoggedProcess:
    """A child in its own process group whose merged output is read by a thread: lines cut at
    MAX_LINE characters, at most 10,000 waiting, the log file rotated past `max_log_bytes`
    (rl.log → rl.log.1), so a job that floods its output costs bounded memory and disk."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
                 max_log_bytes: int = 64 * 2**20):
        self.lines: queue.Queue[str | None] = queue.Queue(maxsize=10_000)
        self.log_path, self.max_log_bytes = log_path, max_log_bytes
        self.log = log_path.open("a", encoding="utf-8")
        self.log_size = self.log.tell()
        self.closed = threading.Event()
        self._log_lock = threading.Lock()
        self.p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                  errors="replace", bufsize=1, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        out = self.p.stdout
        while line := out.readline(MAX_LINE):
            if len(line) >= MAX_LINE and not line.endswith("\n"):
                rest = line  # an over-long line: the rest of it is read and dropped
                while rest and not rest.endswith("\n"):
                    rest = out.readline(MAX_LINE)
                line += " [line cut]\n"
            self._write(line)
            self._put(_ANSI.sub("", line.rstrip("\n")))
        self._put(None)

    def _write(self, line: str) -> None:
        with self._log_lock:
            if not self.closed.is_set():
                self._write_locked(line)

    def _write_locked(self, line: str) -> None:
        if self.log_size + len(line) > self.max_log_bytes:
            self.log.close()
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
            self.log = self.log_path.open("w", encoding="utf-8")
            self.log_size = 0
        self.log.write(line)
        self.log.flush()
        self.log_size += len(line.encode("utf-8", "replace"))

    def _put(self, item: str | None) -> None:
        while not self.closed.is_set():
            try:
                self.lines.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()
        with self._log_lock:
            self.closed.set()
            self.log.close()


def run_install(argv: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> str | None:
    """None on success, else an error line with the installer's last output (it runs the job
    package's build hooks: its output goes to `log`, and only its last 64 KiB is read back)."""
    try:
        with log.open("wb") as fh:
            done = subprocess.run(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout,
                                  start_new_session=True)
    except FileNotFoundError:
        return f"installer not found: {argv[0]!r} (set install_command)"
    except subprocess.TimeoutExpired:
        return f"installing the taskset package took over {timeout:.0f}s"
    if done.returncode != 0:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 65536))
            text = fh.read().decode("utf-8", "replace")
        tail = "\n".join(line[:MAX_LINE] for line in text.strip().splitlines()[-15:])
        return f"installing the taskset package failed (exit {done.returncode}):\n{tail}"
    return None
