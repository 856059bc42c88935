"""The outer reward: what one episode earned.

    reward = w_improvement × improvement
           + w_valid       × validation_efficiency
           + w_speed       × speed            (only when improvement > 0)

improvement = post − pre hidden-eval accuracy of the job's base model (0 without a result).
validation_efficiency = 1 for a first-try pass, 1 − (k−1)/max_attempts for a pass on try k,
0 when the job never validated. speed = 1 − wall_s / timeout_s clipped to [0, 1]: a
tie-breaker between jobs that improve the model, never a reason to train nothing quickly.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from nestor.inner.types import JobResult


class RewardConfig(BaseModel):
    w_improvement: float = Field(1.0, ge=0.0, description="Weight of post − pre hidden-eval "
                                 "accuracy.")
    w_valid: float = Field(0.1, ge=0.0, description="Weight of validation efficiency (1 on a "
                           "first-try pass, lower per extra attempt, 0 if never valid).")
    w_speed: float = Field(0.02, ge=0.0, description="Weight of the speed tie-breaker "
                           "(1 − wall/timeout), counted only when improvement > 0.")


def validation_efficiency(passed_on: int | None, max_attempts: int) -> float:
    """1.0 for a pass on the first attempt, linearly less per extra attempt, 0 if never."""
    if passed_on is None:
        return 0.0
    return max(0.0, 1.0 - (passed_on - 1) / max_attempts)


def speed_score(result: JobResult | None, timeout_s: float) -> float:
    if result is None or result.status != "ok" or timeout_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - result.wall_s / timeout_s))


def improvement_of(result: JobResult | None) -> float:
    if result is None or result.status != "ok":
        return 0.0
    if result.improvement is not None:
        return float(result.improvement)
    if result.pre_score is None or result.post_score is None:
        return 0.0
    return float(result.post_score - result.pre_score)


def compute_reward(result: JobResult | None, *, passed_on: int | None, max_attempts: int,
                   timeout_s: float, config: RewardConfig | None = None) -> tuple[float, dict]:
    """(reward, components): every term, its weight and whether speed counted."""
    cfg = config or RewardConfig()
    improvement = improvement_of(result)
    efficiency = validation_efficiency(passed_on, max_attempts)
    speed = speed_score(result, timeout_s)
    speed_counted = improvement > 0
    # The weighted terms sum to the reward; reports stack them.
    terms = {"weighted_improvement": cfg.w_improvement * improvement,
             "weighted_validation": cfg.w_valid * efficiency,
             "weighted_speed": cfg.w_speed * speed if speed_counted else 0.0}
    reward = sum(terms.values())
    components = {
        "improvement": improvement,
        "validation_efficiency": efficiency,
        "speed": speed,
        "speed_counted": speed_counted,
        "weights": cfg.model_dump(),
        **terms,
        "reward": reward,
    }
    return reward, components
