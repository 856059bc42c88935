"""A validation probe's report: each check's name, whether it passed and what to do about it."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field


class Check(BaseModel):
    name: str
    ok: bool
    message: str


class ValidationReport(BaseModel):
    passed: bool
    checks: list[Check]
    elapsed_s: float = Field(description="Wall-clock seconds the probe took.")
    harness_failure: bool = Field(
        False, description="The probe could not run for a reason that is not the job's: its "
        "sandbox did not start (in time, on a loaded machine). Only that: an episode does not "
        "count the attempt against the agent. Anything a job's files or replies can cause "
        "(parse errors of any depth, numeric overflow, undecodable text, oversized or deep "
        "replies) is a failed check of the job, never a free retry.")

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def summary(self) -> str:
        """One line per failed check (what the agent reads back after a failed submit)."""
        if self.passed:
            return f"validation passed ({len(self.checks)} checks, {self.elapsed_s:.1f} s)"
        return "validation failed:\n" + "\n".join(f"- {c.name}: {c.message}" for c in self.failed())


class CheckLog:
    """The checks made so far, in order, each shown to `on_check` as it is added."""

    def __init__(self, on_check: Callable[[Check], None] | None = None):
        self.checks: list[Check] = []
        self.harness_failure = False  # a failure that is ours, not the job's
        self.on_check = on_check  # progress for a person watching (`nestor job validate`)

    def add(self, name: str, ok: bool, message: str) -> bool:
        check = Check(name=name, ok=ok, message=message)
        self.checks.append(check)
        if self.on_check is not None:
            self.on_check(check)
        return ok
