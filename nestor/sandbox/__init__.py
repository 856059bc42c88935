"""Sandboxed execution of untrusted job code, and the agent's confined workspace."""

from nestor.sandbox.limits import Limits, SandboxError, SandboxResult
from nestor.sandbox.runner import SandboxedProcess, run_sandboxed, sandbox_backend

__all__ = ["Limits", "SandboxError", "SandboxResult", "SandboxedProcess", "run_sandboxed",
           "sandbox_backend"]
