"""Sandboxed execution of untrusted job code, and the agent's confined workspace."""

from nestor.sandbox.limits import Limits, SandboxError, SandboxResult, SandboxUnavailable
from nestor.sandbox.process import SandboxedProcess
from nestor.sandbox.runner import nproc_enforced, require_sandbox, run_sandboxed, sandbox_backend
from nestor.sandbox.workspace import TOOL_SCHEMAS, Workspace, WorkspaceQuota

__all__ = ["TOOL_SCHEMAS", "Limits", "SandboxError", "SandboxResult", "SandboxedProcess",
           "SandboxUnavailable", "Workspace", "WorkspaceQuota", "nproc_enforced", "require_sandbox", "run_sandboxed", "sandbox_backend"]
