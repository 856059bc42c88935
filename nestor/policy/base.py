"""The Policy protocol: every job writer (composer, HF LM, Tinker, an API model) speaks it.

A policy maps an observation (the conversation so far and the tool schemas) to the next
assistant turn. Trainable policies also return what the outer loss needs: the ids of the
actions they sampled (tokens for a language model, decision choices for the composer) and the
log-probabilities those actions had under the sampling policy. The outer loop multiplies
exp(logp_now - logp_sample) by the episode's advantage over exactly these actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # for role == "tool": which call this answers


@dataclass
class Observation:
    messages: list[Message]
    tools: list[dict[str, Any]]  # OpenAI-style function schemas


@dataclass
class Turn:
    """One assistant turn as sampled, with what the IS-GRPO loss needs to re-score it."""

    message: Message  # role "assistant": text and parsed tool calls
    action_ids: list[int] = field(default_factory=list)  # sampled token ids / decision choices
    sample_logprobs: list[float] = field(default_factory=list)  # same length as action_ids
    context_ids: list[int] = field(default_factory=list)  # token policies: the prompt tokens
    action_keys: list[str] = field(default_factory=list)  # composer: decision name per action
    parse_error: str | None = None  # a malformed tool call, reported back to the policy


@dataclass
class TrainItem:
    """One episode's turns with its group-relative advantage."""

    turns: list[Turn]
    advantage: float
    policy_version: int


@runtime_checkable
class Policy(Protocol):
    name: str
    version: int  # bumped by every train_step

    def act(self, obs: Observation) -> Turn: ...

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...
