"""Pay for training, end to end: a job that runs every step but moves nothing earns neither the
validation nor the speed term; the example jobs still earn both (real trainer, real sandboxed
reward server, bundled tiny-m, two steps)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nestor.agent.reward import RewardConfig, compute_reward, improvement_of
from nestor.inner.run import WarmState, run_job
from nestor.inner.types import JobRequest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def warm():
    return WarmState(threads=1)


def run(tmp_path, warm, example: str, task: str, extra: str = ""):
    job = tmp_path / "job"
    shutil.copytree(ROOT / "examples" / "jobs" / example, job,
                    ignore=shutil.ignore_patterns("__pycache__"))
    if extra:
        lines = (job / "config.toml").read_text().splitlines()
        keys = {kv.split("=")[0].strip() for kv in extra.splitlines()}
        kept = [ln for ln in lines if ln.split("=")[0].strip() not in keys]
        (job / "config.toml").write_text("\n".join([*kept, extra, ""]))
    res = run_job(JobRequest(job_dir=job, task_id=task, max_steps=2, out_dir=tmp_path / "ck"),
                  warm=warm)
    assert res.status == "ok", res.log_tail
    assert sum(m["groups_trained"] for m in res.metrics) > 0  # it ran real updates
    return res, compute_reward(res, passed_on=1, max_attempts=3, timeout_s=600.0)[1]


@pytest.mark.parametrize("example,task", [("good-length", "length"), ("good-add", "add")])
def test_example_jobs_are_paid_for_training(tmp_path, warm, example, task):
    res, c = run(tmp_path, warm, example, task)
    assert c["trained"] == 1.0 and c["weighted_validation"] > 0 and c["weighted_speed"] > 0
    assert res.weight_change > 1e-4


@pytest.mark.parametrize("extra", ["learning_rate = 1e-12", "grad_clip = 1e-9"])
def test_a_job_that_does_not_move_the_model_is_not_paid(tmp_path, warm, extra):
    res, c = run(tmp_path, warm, "good-length", "length", extra)
    # weights moved below change.py's floors can still flip one borderline hidden-eval item
    # (AdamW steps ~lr·g/eps under a 1e-9 clip): seen once in CI, 0.33 → 0.335. Not the
    # pre-score cache: tiny-m scored the same under 1 and 2 threads (4 tasks × 200 items).
    assert abs(res.post_score - res.pre_score) <= 0.01
    assert c["trained"] == 0.0 and c["weighted_validation"] == 0.0 and c["weighted_speed"] == 0.0
    # quality is the uplift alone — a hair either way where such an item flipped — never the
    # base model's own post-score share (nothing moved)
    post_share = RewardConfig().weights()["post_share"]
    assert c["quality"] == pytest.approx((1 - post_share) * improvement_of(res), abs=1e-12)
    assert abs(c["quality"]) <= 0.01
