"""The outer reward: improvement + w_valid × validation efficiency + w_speed × speed."""

import pytest

from nestor.agent.reward import RewardConfig, compute_reward, validation_efficiency
from nestor.inner.types import JobResult


def test_validation_efficiency_falls_per_attempt_and_is_zero_when_never_valid():
    assert validation_efficiency(1, 3) == 1.0
    assert validation_efficiency(2, 3) == pytest.approx(2 / 3)
    assert validation_efficiency(3, 3) == pytest.approx(1 / 3)
    assert validation_efficiency(None, 3) == 0.0


def test_improving_job_gets_every_term():
    res = JobResult(status="ok", pre_score=0.1, post_score=0.3, improvement=0.2, wall_s=30.0)
    reward, comps = compute_reward(res, passed_on=1, max_attempts=3, timeout_s=120.0)
    assert comps["improvement"] == pytest.approx(0.2)
    assert comps["speed"] == pytest.approx(0.75) and comps["speed_counted"] is True
    assert reward == pytest.approx(0.2 + 0.1 * 1.0 + 0.02 * 0.75)
    assert comps["reward"] == reward and comps["weights"]["w_valid"] == 0.1


def test_speed_only_counts_when_the_model_improved():
    res = JobResult(status="ok", pre_score=0.3, post_score=0.2, wall_s=1.0)
    reward, comps = compute_reward(res, passed_on=2, max_attempts=3, timeout_s=100.0)
    assert comps["improvement"] == pytest.approx(-0.1)  # computed from pre/post
    assert comps["speed_counted"] is False
    assert reward == pytest.approx(-0.1 + 0.1 * (2 / 3))
    assert comps["weighted_speed"] == 0.0 and comps["weighted_improvement"] == pytest.approx(-0.1)
    assert sum(v for k, v in comps.items() if k.startswith("weighted_")) == pytest.approx(reward)


def test_failed_job_and_no_job():
    failed = JobResult(status="failed", pre_score=0.1, post_score=0.9, wall_s=1.0)
    reward, comps = compute_reward(failed, passed_on=1, max_attempts=3, timeout_s=100.0)
    assert comps["improvement"] == 0.0 and reward == pytest.approx(0.1)
    reward, comps = compute_reward(None, passed_on=None, max_attempts=3, timeout_s=100.0)
    assert reward == 0.0 and comps["validation_efficiency"] == 0.0


def test_weights_are_config():
    res = JobResult(status="ok", improvement=0.5, wall_s=0.0)
    cfg = RewardConfig(w_improvement=2.0, w_valid=0.0, w_speed=1.0)
    reward, _ = compute_reward(res, passed_on=1, max_attempts=3, timeout_s=10.0, config=cfg)
    assert reward == pytest.approx(2.0 * 0.5 + 1.0)
    with pytest.raises(ValueError):
        RewardConfig(w_valid=-1)
