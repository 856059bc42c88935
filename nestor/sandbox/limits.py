"""Resource limits, results and the error type of the sandbox runner."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SandboxError(RuntimeError):
    """A sandboxed child misbehaved (timeout, crash, garbage output). The message is one
    paragraph meant for a person or an agent: what happened, then the tail of the child's stderr."""


class SandboxUnavailable(RuntimeError):
    """No sandbox strong enough for agent code here (bubblewrap cannot start and the user did not
    opt in to a weaker backend by name). Deliberately not a SandboxError: it is not the job's
    fault, so validation and training stop with this one line instead of failing a job."""


class Limits(BaseModel):
    """Resource limits applied to one sandboxed child (and everything it forks)."""

    model_config = ConfigDict(frozen=True)

    cpu_s: int = Field(30, ge=1, le=86_400, description="CPU seconds per process (RLIMIT_CPU).")
    memory_mb: int = Field(
        2048, ge=64, le=1_048_576,
        description="Address space per process in MiB (RLIMIT_AS).")
    nproc: int = Field(
        64, ge=1, le=65_536,
        description="Processes + threads the sandbox user may own (RLIMIT_NPROC).")
    fsize_mb: int = Field(16, ge=0, le=65_536, description="Largest file the child may write, MiB.")
    nofile: int = Field(256, ge=16, le=65_536, description="Open file descriptors (RLIMIT_NOFILE).")
    wall_s: float = Field(
        60.0, gt=0, le=86_400,
        description="Wall-clock limit of run_sandboxed; default per-request timeout of "
        "SandboxedProcess.")
    output_bytes: int = Field(
        1_000_000, ge=1024, le=1 << 30,
        description="Bytes kept of stdout and of stderr each; beyond 16x this the child is killed.")
    tmp_mb: int = Field(64, ge=1, le=65_536, description="Size of the private tmpfs at /tmp.")
    sandbox_cpu_s: float | None = Field(
        None, gt=0, le=1_000_000,
        description="CPU seconds of all the sandbox's processes together (None: 2 x cpu_s); "
        "past it the whole sandbox is killed.")
    sandbox_memory_mb: int | None = Field(
        None, ge=64, le=1_048_576,
        description="Memory (Pss) of all the sandbox's processes together, MiB (None: "
        "memory_mb); past it the whole sandbox is killed.")

    def total_cpu_s(self) -> float:
        return self.sandbox_cpu_s if self.sandbox_cpu_s is not None else 2.0 * self.cpu_s

    def total_memory_mb(self) -> int:
        return self.sandbox_memory_mb if self.sandbox_memory_mb is not None else self.memory_mb


class SandboxResult(BaseModel):
    """What a finished sandboxed command did. `reason` is None for a clean exit (code 0)."""

    returncode: int = Field(description="Exit code; negative = killed by that signal number.")
    stdout: str
    stderr: str
    timed_out: bool = False
    elapsed_s: float
    truncated: bool = Field(False, description="stdout or stderr was cut at output_bytes.")
    reason: str | None = Field(
        None, description="One line on why the command did not exit cleanly, for messages.")
    backend: str = "bubblewrap"

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def stderr_tail(self, n_chars: int = 2000) -> str:
        return tail_text(self.stderr, n_chars)


def tail_text(text: str, n_chars: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= n_chars else "..." + text[-n_chars:]
