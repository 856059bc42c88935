"""The five findings from synthetic metrics/heldout rows: each verdict flips with the data."""

from __future__ import annotations

import json
import statistics

import pytest

from nestor.report.findings import NOT_ENOUGH, compute_findings, mean_ci95, pool_findings, t95


def rows(reward, valid=None, imp=None, strong=None, hp=None, first_try=None):
    n = len(reward)
    out = []
    for i in range(n):
        r = {"step": i + 1, "reward_mean": reward[i]}
        if valid is not None:
            r["validation_pass_rate"] = valid[i]
        if first_try is not None:
            r["first_try_pass_rate"] = first_try[i]
        if imp is not None:
            r["hidden_eval_improvement"] = imp[i]
        if strong is not None:
            r["base_model_share"] = {"tiny-m": strong[i], "tiny-s": 1 - strong[i]}
        if hp is not None:
            r["hyperparameter_surface_use"] = hp[i]
        out.append(r)
    return out


def arm(step, arm_name, task, values):
    m, ci = mean_ci95(values)
    return {"step": step, "arm": arm_name, "task": task, "n": len(values), "mean": m, "ci95": ci,
            "values": values}


RISING = [0.05, 0.1, 0.1, 0.2, 0.3, 0.3, 0.4, 0.5, 0.5]


def test_reward_first_peak_last_and_thirds():
    f = compute_findings(rows([0.1, 0.0, 0.2, 0.5, 0.7, 0.4]), [])
    assert f.reward["first"] == 0.1 and f.reward["peak"] == 0.7 and f.reward["peak_step"] == 5
    assert f.reward["last"] == 0.4
    assert f.reward["first_third"] == pytest.approx(0.05)
    assert f.reward["last_third"] == pytest.approx(0.55)
    assert f.targets["reward"] is True and "at least doubles" in f.verdicts["reward"]


def test_reward_verdict_flips_when_it_does_not_double():
    f = compute_findings(rows([0.3, 0.3, 0.4, 0.4, 0.5, 0.5]), [])
    assert f.targets["reward"] is False and "does not double" in f.verdicts["reward"]


def test_reward_from_a_nonpositive_start():
    assert compute_findings(rows([-0.1, 0.0, 0.1]), []).targets["reward"] is True
    assert compute_findings(rows([0.0, -0.1, -0.1]), []).targets["reward"] is False


def test_too_few_steps_is_not_enough_data():
    f = compute_findings(rows([0.1, 0.5], valid=[0, 1], imp=[0, 1], strong=[0, 1], hp=[0, 1]),
                         [])
    for key in ("reward", "rungs", "strong_model", "hp_use", "transfer"):
        assert f.verdicts[key] == NOT_ENOUGH
        assert f.targets[key] is None
    json.dumps(f.to_json())  # plain JSON


def test_rungs_saturation_then_climb():
    valid = [0.25, 0.5, 0.75, 1.0, 0.875, 1.0, 1.0, 1.0, 1.0]
    imp = [0.0, 0.01, 0.0, 0.01, 0.05, 0.08, 0.1, 0.12, 0.15]
    f = compute_findings(rows(RISING, valid=valid, imp=imp), [])
    assert f.validation["metric"] == "validation_pass_rate"  # an old run: no first-try series
    assert f.validation_saturation_step == 3  # rolling mean of 3 from step 3 on ≥ 0.8
    assert f.improvement_climb_step == 4  # rolling mean from step 4 on > 0.0033 + 0.02
    assert f.improvement["last_third"] > f.improvement["first_third"]
    assert f.rungs_shown == {"validation": True, "improvement": True}
    assert f.targets["rungs"] is True and f.verdicts["rungs"].startswith("two rungs")
    assert "saturated (≥80%) from step 3" in f.verdicts["rungs"]
    assert "climbed from step 4" in f.verdicts["rungs"]


def test_rungs_use_the_first_try_pass_rate_when_recorded():
    every = [1.0] * 9  # every job validated in the end: saturated from step 1
    first = [0.25, 0.375, 0.5, 0.5, 0.75, 0.875, 0.875, 1.0, 0.875]
    imp = [0.0, 0.01, 0.0, 0.01, 0.05, 0.08, 0.1, 0.12, 0.15]
    f = compute_findings(rows(RISING, valid=every, first_try=first, imp=imp), [])
    assert f.validation["metric"] == "first_try_pass_rate"
    assert f.validation_saturation_step == 5  # (0.75 + 0.875 + 0.875) / 3 ≥ 0.8 from step 5
    assert f.validation["first_third"] == pytest.approx(0.375)
    assert f.targets["rungs"] is True and "first-try validation 0.375" in f.verdicts["rungs"]


def test_saturated_from_the_first_step_is_no_first_rung_and_the_verdict_agrees():
    imp = [0.0, 0.01, 0.0, 0.01, 0.05, 0.08, 0.1, 0.12, 0.15]  # rung 2 shows
    f = compute_findings(rows(RISING, first_try=[0.9] * 9, imp=imp), [])
    assert f.validation_saturation_step == 1
    assert f.rungs_shown == {"validation": False, "improvement": True}
    assert f.targets["rungs"] is False
    assert f.verdicts["rungs"].startswith("rungs not both shown: rung 1 not shown")
    assert "(the first step: nothing to learn)" in f.verdicts["rungs"]
    assert "rung 2 shown" in f.verdicts["rungs"]


def test_rungs_flip_without_saturation_or_climb():
    valid = [0.25, 0.5, 0.5, 0.5, 0.6, 0.5, 0.5, 0.6, 0.5]
    imp = [0.1, 0.12, 0.11, 0.05, 0.0, 0.02, 0.0, 0.01, 0.0]
    f = compute_findings(rows(RISING, valid=valid, imp=imp), [])
    assert f.validation_saturation_step is None and f.improvement_climb_step is None
    assert f.targets["rungs"] is False
    assert "never saturated" in f.verdicts["rungs"] and "never climbed" in f.verdicts["rungs"]


@pytest.mark.parametrize("first,imp", [
    ([0.2, 0.4, 0.6, 0.9, 0.9, 0.9], [0.0, 0.0, 0.1, 0.1, 0.2, 0.2]),
    ([0.2, 0.4, 0.6, 0.9, 0.9, 0.9], [0.2, 0.2, 0.1, 0.1, 0.0, 0.0]),
    ([0.9, 0.9, 0.9, 0.9, 0.9, 0.9], [0.0, 0.0, 0.1, 0.1, 0.2, 0.2]),
    ([0.2, 0.2, 0.2, 0.2, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1, 0.0, 0.0]),
])
def test_the_rungs_target_and_verdict_always_agree(first, imp):
    f = compute_findings(rows(RISING[:6], first_try=first, imp=imp), [])
    both = f.rungs_shown["validation"] and f.rungs_shown["improvement"]
    assert f.targets["rungs"] is both
    assert f.verdicts["rungs"].startswith("two rungs") is both
    js = f.to_json()  # the JSON carries the same numbers the text quotes
    assert js["validation_saturation_step"] == f.validation_saturation_step
    assert f"{js['validation']['first_third']:.3f}" in f.verdicts["rungs"]
    assert f"{js['improvement']['last_third']:.3f}" in f.verdicts["rungs"]


def test_a_late_dip_moves_the_saturation_step():
    valid = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    f = compute_findings(rows(RISING, valid=valid), [])
    assert f.validation_saturation_step == 7  # the dip at 6 pulls windows 4..6 below 0.8


def test_strong_model_share_rises_or_falls():
    up = compute_findings(rows(RISING, strong=[0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 1.0]), [])
    assert up.strong_model == "tiny-m"  # the registry's stronger bundled model
    assert up.strong_share["first"] == pytest.approx(0.4333, abs=1e-3)
    assert up.strong_share["last"] == pytest.approx(0.9333, abs=1e-3)
    assert up.targets["strong_model"] is True and "rose" in up.verdicts["strong_model"]
    down = compute_findings(rows(RISING, strong=[0.6, 0.5, 0.5, 0.3, 0.2, 0.1, 0.0, 0.1, 0.0]),
                            [])
    assert down.targets["strong_model"] is False and "fell" in down.verdicts["strong_model"]
    named = compute_findings(rows(RISING, strong=[0.6] * 9), [], strong_model="tiny-s")
    assert named.strong_model == "tiny-s" and named.strong_share["first"] == pytest.approx(0.4)


def test_steps_without_jobs_do_not_count_for_the_share():
    r = rows(RISING, strong=[0.0, 0.2, 0.4, 0.5, 0.5, 0.6, 0.8, 0.9, 1.0])
    r[0]["base_model_share"] = {}  # no job finished in step 1
    f = compute_findings(r, [])
    assert f.strong_share["first"] == pytest.approx(0.3)  # steps 2-3 (8 steps with jobs)


def test_hp_use_rises_or_falls():
    up = compute_findings(rows(RISING, hp=[0.2, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.8]), [])
    assert up.hp_use["first"] == pytest.approx(0.2333, abs=1e-3)
    assert up.targets["hp_use"] is True and "rose" in up.verdicts["hp_use"]
    down = compute_findings(rows(RISING, hp=[1.0] * 3 + [0.5] * 6), [])
    assert down.targets["hp_use"] is False and "fell" in down.verdicts["hp_use"]


def test_transfer_pools_episodes_over_tasks_with_t_intervals():
    held = [arm(4, "untrained", "fmt-a", [0.1, 0.2, 0.15, 0.1, 0.2]),
            arm(4, "untrained", "fmt-b", [0.2, 0.1, 0.15, 0.2, 0.1]),
            arm(4, "trained", "fmt-a", [0.6, 0.5, 0.55, 0.6, 0.5]),
            arm(4, "trained", "fmt-b", [0.5, 0.6, 0.55, 0.5, 0.6]),
            arm(2, "trained", "fmt-a", [0.0, 0.0])]  # an earlier eval: not the one reported
    f = compute_findings(rows(RISING), held)
    t = f.transfer
    assert t.step == 4 and t.trained.n == 10 and t.untrained.n == 10
    assert t.trained.mean == pytest.approx(0.55) and t.untrained.mean == pytest.approx(0.15)
    half = t.trained.ci95[1] - t.trained.mean
    sd = statistics.stdev([0.6, 0.5, 0.55, 0.6, 0.5] * 2)
    assert half == pytest.approx(2.262 * sd / 10 ** 0.5)  # t(9), not 1.96
    assert f.targets["transfer"] is True and "beats" in f.verdicts["transfer"]


def test_transfer_overlap_and_too_few_episodes():
    held = [arm(4, "untrained", "fmt-a", [0.0, 0.5, 0.2, 0.4]),
            arm(4, "trained", "fmt-a", [0.1, 0.6, 0.3, 0.5])]
    f = compute_findings(rows(RISING), held)
    assert f.targets["transfer"] is False and "overlapping" in f.verdicts["transfer"]
    lone = [{"step": 4, "arm": "untrained", "task": "a", "n": 1, "mean": 0.1, "ci95": [0.1, 0.1]},
            {"step": 4, "arm": "trained", "task": "a", "n": 1, "mean": 0.9, "ci95": [0.9, 0.9]}]
    f = compute_findings(rows(RISING), lone)
    assert f.transfer.trained.n == 1 and f.verdicts["transfer"] == NOT_ENOUGH
    # per-task means of several episodes cannot give an episode interval: not used
    means_only = [{**r, "n": 5} for r in lone]
    assert compute_findings(rows(RISING), means_only).transfer is None


def test_untrained_arm_cached_at_an_earlier_step():
    held = [arm(2, "untrained", "a", [0.1, 0.2, 0.1]), arm(6, "trained", "a", [0.5, 0.6, 0.5])]
    f = compute_findings(rows(RISING), held)
    assert f.transfer.step == 6 and f.transfer.untrained.n == 3


def test_t_quantiles_and_pooling():
    assert t95(1) == pytest.approx(12.706) and t95(9) == pytest.approx(2.262)
    assert t95(21) == pytest.approx(2.086) and t95(500) == pytest.approx(1.96)
    runs = [compute_findings(rows(RISING, hp=[0.1] * 3 + [0.9] * 6), []),
            compute_findings(rows([0.5] * 9, hp=[0.5] * 9), [])]
    pooled = pool_findings(runs)
    assert pooled["runs"] == 2
    assert pooled["reward_first"]["mean"] == pytest.approx(0.275)
    assert pooled["targets_met"]["reward"] == 1 and pooled["targets_known"]["reward"] == 2
    assert pooled["targets_met"]["hp_use"] == 1 and pooled["transfer_trained"] is None
    assert pooled["transfer_gain"] is None
    json.dumps(pooled)


def test_pooled_transfer_gain_is_paired_by_seed():
    held = [[arm(9, "untrained", "a", [0.1, 0.3]), arm(9, "trained", "a", [0.4, 0.6])],
            [arm(9, "untrained", "a", [0.5, 0.7]), arm(9, "trained", "a", [0.6, 0.8])]]
    pooled = pool_findings([compute_findings(rows(RISING), h) for h in held])
    # gains 0.3 and 0.1: the seeds' arm means differ by 0.4, which the pairing removes
    assert pooled["transfer_gain"]["mean"] == pytest.approx(0.2)
    assert pooled["transfer_gain"]["ci95"] == pytest.approx([0.2 - 12.706 * 0.1, 0.2 + 12.706 * 0.1])
