"""The Policy protocol: every job writer (composer, HF LM, Tinker, an API model) speaks it.

A policy maps an observation (the conversation so far and the tool schemas) to the next
assistant turn. Trainable policies also return what the outer loss needs: the ids of the
actions they sampled (tokens for a language model, decision choices for the composer) and the
log-probabilities those actions had under the sampling policy. The outer loop multiplies
exp(logp_now - logp_sample) by the episode's advantage over exactly these actions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from nestor.tasks import TaskSpec


class PolicyClosed(RuntimeError):
    """The policy no longer acts (its training run ended): the episode stops, end reason
    `stopped` — not a policy error."""


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        calls = [ToolCall(**c) for c in d.get("tool_calls") or []]
        return cls(role=d["role"], content=d.get("content", ""), tool_calls=calls,
                   tool_call_id=d.get("tool_call_id"))


@dataclass
class Observation:
    messages: list[Message]
    tools: list[dict[str, Any]]  # OpenAI-style function schemas
    # The task's public spec, for structured policies (the composer) that cannot read prose.
    # Token policies read the same spec from the system prompt. Never the hidden eval.
    spec: TaskSpec | None = None
    # The episode's seed (the outer loop's per-episode seed): a policy that samples with it is
    # reproducible per episode whatever order concurrent episodes run in. None: its own RNG.
    seed: int | None = None


@dataclass
class Turn:
    """One assistant turn as sampled, with what the IS-GRPO loss needs to re-score it."""

    message: Message  # role "assistant": text and parsed tool calls
    action_ids: list[int] = field(default_factory=list)  # sampled token ids / decision choices
    sample_logprobs: list[float] = field(default_factory=list)  # same length as action_ids
    context_ids: list[int] = field(default_factory=list)  # token policies: the prompt tokens
    action_keys: list[str] = field(default_factory=list)  # composer: decision name per action
    parse_error: str | None = None  # a malformed tool call, reported back to the policy

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-able form (the message's fields plus the action fields): a ledger row."""
        d = self.message.to_dict()
        d.update(action_ids=self.action_ids, sample_logprobs=self.sample_logprobs,
                 context_ids=self.context_ids, action_keys=self.action_keys,
                 parse_error=self.parse_error)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        return cls(message=Message.from_dict(d), action_ids=list(d.get("action_ids") or []),
                   sample_logprobs=list(d.get("sample_logprobs") or []),
                   context_ids=list(d.get("context_ids") or []),
                   action_keys=list(d.get("action_keys") or []), parse_error=d.get("parse_error"))


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
