"""Groups of episodes, group-relative advantages and the staleness rule.

A group is G episodes on one task spec. Its advantage is reward minus the group mean (no std
scaling, as in prime-rl and tinker-cookbook): a group whose rewards are all equal carries no
signal and contributes nothing. A group sampled more than `max_steps_off_policy` policy versions
ago is stale: it is either kept (the importance ratio in the loss reweights it) or dropped.
For token policies a hard cap (`RunConfig.token_max_staleness`) drops groups older still.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nestor.policy.base import Message, ToolCall, TrainItem, Turn

ZERO_VARIANCE_EPS = 1e-8


@dataclass
class EpisodeSummary:
    """The loop's durable view of one finished episode (what training and metrics need)."""

    group_id: int
    slot: int
    task_id: str
    reward: float
    policy_version: int
    turns: list[Turn] = field(default_factory=list)
    components: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)  # attempts, job status, cost, ... (metrics)
    finished_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeSummary:
        data = dict(data)
        data["turns"] = [_turn_from_json(t) for t in data.get("turns", [])]
        return cls(**data)


def _turn_from_json(data: dict[str, Any]) -> Turn:
    data = dict(data)
    msg = dict(data.pop("message"))
    msg["tool_calls"] = [ToolCall(**tc) for tc in msg.get("tool_calls", [])]
    return Turn(message=Message(**msg), **data)


@dataclass
class Group:
    group_id: int
    task_id: str
    size: int
    episodes: dict[int, EpisodeSummary] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.episodes) >= self.size

    def oldest_version(self) -> int:
        return min(ep.policy_version for ep in self.episodes.values())

    def staleness(self, version: int) -> int:
        """How many policy updates happened since the group's oldest episode was sampled."""
        return version - self.oldest_version()

    def rewards(self) -> list[float]:
        return [self.episodes[s].reward for s in sorted(self.episodes)]


def group_advantages(rewards: list[float]) -> list[float] | None:
    """reward − group mean; None for a zero-variance group (no learning signal)."""
    mean = sum(rewards) / len(rewards)
    advantages = [r - mean for r in rewards]
    if max(abs(a) for a in advantages) < ZERO_VARIANCE_EPS:
        return None
    return advantages


@dataclass
class BatchStats:
    groups: int = 0
    used_groups: int = 0
    zero_variance: int = 0
    stale_kept: int = 0
    stale_dropped: int = 0
    staleness: list[int] = field(default_factory=list)  # per group, in policy versions


def stale_dropped(stale: int, *, max_steps_off_policy: int, stale_groups: str,
                  hard_max_staleness: int | None = None) -> bool:
    """The staleness rule: is a group `stale` policy versions old dropped from training? The
    hard cap applies whatever max_steps_off_policy is (even when it is larger)."""
    if hard_max_staleness is not None and stale > hard_max_staleness:
        return True
    return stale > max_steps_off_policy and stale_groups == "drop"


def build_batch(groups: list[Group], version: int, *, max_steps_off_policy: int,
                stale_groups: str, hard_max_staleness: int | None = None
                ) -> tuple[list[TrainItem], BatchStats]:
    """TrainItems for the groups that carry signal and pass the staleness rule, plus counts.

    `hard_max_staleness` (token policies): a group staler than this is dropped even when
    stale groups are otherwise reweighted, and even when `max_steps_off_policy` is larger —
    per-token ratios that far off policy are noise.
    """
    items: list[TrainItem] = []
    stats = BatchStats(groups=len(groups))
    for group in groups:
        stale = group.staleness(version)
        stats.staleness.append(stale)
        if stale_dropped(stale, max_steps_off_policy=max_steps_off_policy,
                         stale_groups=stale_groups, hard_max_staleness=hard_max_staleness):
            stats.stale_dropped += 1
            continue
        if stale > max_steps_off_policy:
            stats.stale_kept += 1
        advantages = group_advantages(group.rewards())
        if advantages is None:
            stats.zero_variance += 1
            continue
        stats.used_groups += 1
        for slot, adv in zip(sorted(group.episodes), advantages, strict=True):
            ep = group.episodes[slot]
            items.append(TrainItem(turns=ep.turns, advantage=adv, policy_version=ep.policy_version))
    return items, stats
