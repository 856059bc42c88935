"""The outer reward: presets, every term recorded, and no safe harbour for jobs that do not train."""

import pytest

from nestor.agent.reward import (
    PRESETS,
    RewardConfig,
    compute_reward,
    trained,
    validation_efficiency,
)
from nestor.inner.types import JobResult

MOVED = {"weight_change": 1e-2, "step_efficiency": 0.5, "grid_steps": 6.4}  # an honest job's


def ok(pre=0.1, post=0.3, wall=30.0, steps=3, groups=(2, 1, 2), change=MOVED):
    return JobResult(status="ok", pre_score=pre, post_score=post, improvement=post - pre,
                     wall_s=wall, steps=steps, metrics=[{"groups_trained": g} for g in groups],
                     **change)


def test_validation_efficiency_falls_per_attempt_and_is_zero_when_never_valid():
    assert validation_efficiency(1, 3) == 1.0
    assert validation_efficiency(2, 3) == pytest.approx(2 / 3)
    assert validation_efficiency(3, 3) == pytest.approx(1 / 3)
    assert validation_efficiency(None, 3) == 0.0


def test_seed_preset_is_the_write_ups_reward_with_every_term():
    reward, c = compute_reward(ok(), passed_on=1, max_attempts=3, timeout_s=120.0)
    assert c["preset"] == "seed" and c["weights"]["w_valid"] == 0.35
    assert c["weights"]["w_quality"] == 0.60 and c["weights"]["w_speed"] == 0.05
    quality = 0.25 * 0.3 + 0.75 * 0.2
    assert c["quality"] == pytest.approx(quality) and c["post"] == pytest.approx(0.3)
    assert c["improvement"] == pytest.approx(0.2) and c["speed"] == pytest.approx(0.75)
    assert reward == pytest.approx(0.35 * 1.0 + 0.60 * quality + 0.05 * 0.75)
    assert sum(v for k, v in c.items() if k.startswith("weighted_")) == pytest.approx(reward)
    assert c["reward"] == reward and c["trained"] == 1.0


def test_retries_pay_less_validation():
    r1, _ = compute_reward(ok(), passed_on=1, max_attempts=3, timeout_s=120.0)
    r2, c2 = compute_reward(ok(), passed_on=2, max_attempts=3, timeout_s=120.0)
    assert r1 - r2 == pytest.approx(0.35 / 3) and c2["validation_efficiency"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_no_safe_harbour_in_any_preset(preset):
    """A validated job that fails, times out, or never moves the model earns less than one that
    trained without improving the model at all."""
    cfg = RewardConfig(preset=preset)
    trained_flat, _ = compute_reward(ok(pre=0.2, post=0.2), passed_on=1, max_attempts=3,
                                     timeout_s=100.0, config=cfg)
    failed = JobResult(status="failed", pre_score=0.2, wall_s=1.0, steps=1)
    timeout = JobResult(status="timeout", pre_score=0.2, post_score=0.2, improvement=0.0,
                        wall_s=100.0, steps=5)
    noop = ok(pre=0.2, post=0.2, wall=1.0, groups=(0, 0, 0))  # every group skipped
    for bad in (failed, timeout, noop, None):
        r, c = compute_reward(bad, passed_on=1, max_attempts=3, timeout_s=100.0, config=cfg)
        assert r < trained_flat, (preset, bad)
        assert c["weighted_validation"] == 0.0 and c["weighted_speed"] == 0.0


def test_a_timeout_keeps_the_quality_of_the_weights_it_has():
    timeout = JobResult(status="timeout", pre_score=0.1, post_score=0.5, improvement=0.4,
                        wall_s=100.0, steps=5, **MOVED)
    r, c = compute_reward(timeout, passed_on=1, max_attempts=3, timeout_s=100.0)
    assert c["quality"] == pytest.approx(0.25 * 0.5 + 0.75 * 0.4)
    assert r == pytest.approx(0.6 * c["quality"]) and c["trained"] == 0.0


def test_trained_needs_steps_a_group_with_variance_and_measured_change():
    assert trained(ok()) and not trained(ok(groups=(0, 0, 0)))
    assert not trained(ok(steps=0, groups=()))
    assert trained(JobResult(status="ok", steps=2, **MOVED))  # no per-step groups reported
    # changed deliberately (issue 25): `ok` without a measured change is not training
    assert not trained(JobResult(status="ok", steps=2))
    assert not trained(JobResult(status="timeout", steps=5, **MOVED)) and not trained(None)


@pytest.mark.parametrize("change", [
    {"weight_change": 1.3e-12, "step_efficiency": 0.019, "grid_steps": 6e-10},  # lr = 1e-12
    {"weight_change": 7.0e-7, "step_efficiency": 3.4e-5, "grid_steps": 3e-4},  # grad_clip = 1e-9
    {"weight_change": 2.1e-5, "step_efficiency": 1.7e-4, "grid_steps": 1e-3},  # LoRA, the same
    {"weight_change": 5.1e-6, "step_efficiency": 1.0, "grid_steps": 3e-3},  # one step at 3e-7
    {}])  # a backend that measured nothing
def test_a_job_that_ran_but_did_not_move_the_model_earns_only_its_uplift(change):
    """Measured figures of tiny-m jobs that ran every step on groups with variance."""
    still = ok(pre=0.34, post=0.34, change=change)
    r, c = compute_reward(still, passed_on=1, max_attempts=3, timeout_s=120.0)
    assert c["trained"] == 0.0 and c["moved"] == 0.0
    assert c["weighted_validation"] == 0.0 and c["weighted_speed"] == 0.0
    assert c["quality"] == 0.0 and r == 0.0  # no post share for the base model's own score
    honest, _ = compute_reward(ok(pre=0.34, post=0.34), passed_on=1, max_attempts=3,
                               timeout_s=120.0)
    assert honest > 0.35


def test_uplift_preset_and_overrides():
    r, c = compute_reward(ok(), passed_on=1, max_attempts=3, timeout_s=120.0,
                          config=RewardConfig(preset="uplift"))
    assert r == pytest.approx(0.2 + 0.1 + 0.02 * 0.75) and c["weights"]["post_share"] == 0.0
    cfg = RewardConfig.model_validate({"w_improvement": 2.0, "w_valid": 0.0, "post_share": 0.0})
    r, c = compute_reward(ok(), passed_on=1, max_attempts=3, timeout_s=120.0, config=cfg)
    assert c["weights"]["w_quality"] == 2.0  # `w_improvement` is the old name of the weight
    assert r == pytest.approx(2.0 * 0.2 + 0.05 * 0.75)
    with pytest.raises(ValueError):
        RewardConfig(w_valid=-1)
    with pytest.raises(ValueError):
        RewardConfig.model_validate({"preset": "mystery"})


def test_shaping_terms_are_off_by_default_and_weighted_when_on():
    signals = {"wellformed_rate": 0.5, "files_score": 0.75, "probe_fraction": 0.8}
    r0, c0 = compute_reward(None, passed_on=None, max_attempts=3, timeout_s=100.0,
                            signals=signals)
    assert r0 == 0.0 and c0["wellformed_rate"] == 0.5 and c0["probe_fraction"] == 0.8
    cfg = RewardConfig(w_wellformed=0.1, w_files=0.2, w_probe=0.3)
    r, c = compute_reward(None, passed_on=None, max_attempts=3, timeout_s=100.0, config=cfg,
                          signals=signals)
    assert r == pytest.approx(0.1 * 0.5 + 0.2 * 0.75 + 0.3 * 0.8)
    assert c["weighted_probe"] == pytest.approx(0.24)
