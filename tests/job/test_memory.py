"""The trainer's memory estimate: the probe refuses a job that would not fit, and says how to fix it."""

from pathlib import Path

import pytest

from nestor.job.config import JobConfig, load_job_config
from nestor.job.memory import GIB, MIB, check, estimate, memory_error, model_shape

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
SHAPE = model_shape("tiny-m")


def test_shape_counts_the_real_parameters():
    from nestor.models.registry import load_model

    model, _ = load_model("tiny-m")
    assert SHAPE.params == sum(p.numel() for p in model.parameters())


def test_the_issue_example_is_refused_with_the_knob_to_lower():
    # ~1,000-character prompts, 256 prompts x 64 samples, 1 new token: 16,384 sampled tokens
    config = JobConfig(prompts_per_step=256, group_size=64, max_new_tokens=1, max_steps=1)
    assert config.budget_error() is None  # the token budget alone lets it through
    est, error = memory_error(config, SHAPE, 1_010)
    assert est.peak > 50 * GIB  # every rollout's KV cache over the whole prompt
    assert error is not None and "KV cache of 256×64 rollouts" in error
    assert "over the cap of 2.0 GiB" in error
    best = int(error.split("prompts_per_step to ")[1].split()[0])
    fixed = config.model_copy(update={"prompts_per_step": best})
    assert memory_error(fixed, SHAPE, 1_010)[1] is None  # the advice is enough ...
    worse = config.model_copy(update={"prompts_per_step": best + 1})
    assert memory_error(worse, SHAPE, 1_010)[1] is not None  # ... and no more than needed


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.iterdir()
                                        if p.name.startswith("good-")))
def test_good_examples_fit_the_default_cap(name):
    config = load_job_config(EXAMPLES / name / "config.toml")
    assert estimate(config, SHAPE, 60).peak < 1536 * MIB


@pytest.mark.parametrize("knob,value", [("prompts_per_step", 64), ("group_size", 32),
                                        ("max_new_tokens", 64), ("lora_rank", 0)])
def test_estimate_grows_with_every_shape_knob(knob, value):
    base = JobConfig(lora_rank=8)
    bigger = base.model_copy(update={knob: value})
    assert estimate(bigger, SHAPE, 40).peak > estimate(base, SHAPE, 40).peak
    assert estimate(base, SHAPE, 400).peak > estimate(base, SHAPE, 40).peak


def test_cap_is_configurable():
    config = JobConfig(prompts_per_step=64, group_size=16, max_new_tokens=24)
    peak = estimate(config, SHAPE, 40).peak
    assert memory_error(config, SHAPE, 40, cap_mb=peak // MIB + 1)[1] is None
    assert memory_error(config, SHAPE, 40, cap_mb=peak // MIB - 1)[1] is not None


def test_check_measures_the_prompts():
    config = JobConfig(prompts_per_step=64, group_size=16, max_new_tokens=1, max_steps=1)
    assert check(config, ["short"] * 40, None) is None
    assert "prompts_per_step" in check(config, ["x" * 1000] * 40, None)
