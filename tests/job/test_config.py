"""The job config's token budget: a refusal names the number that fits, as memory's does."""

import re

import pytest

from nestor.job.config import JobConfig


@pytest.mark.parametrize("shape", [(30, 16, 8, 24), (40, 8, 8, 16), (200, 8, 8, 8)])
def test_the_budget_refusal_names_the_max_steps_that_fit(shape):
    steps, prompts, group, new = shape
    config = JobConfig(max_steps=steps, prompts_per_step=prompts, group_size=group,
                       max_new_tokens=new)
    cap = 20_000
    error = config.budget_error(cap)
    assert error is not None and f"{steps}×{prompts}×{group}×{new}" in error
    best = int(re.search(r"max_steps = (\d+) fits", error)[1])
    assert config.model_copy(update={"max_steps": best}).budget_error(cap) is None  # enough
    assert config.model_copy(update={"max_steps": best + 1}).budget_error(cap) is not None


def test_when_one_step_is_over_the_refusal_names_the_batch_that_fits():
    config = JobConfig(max_steps=10, prompts_per_step=64, group_size=16, max_new_tokens=32)
    error = config.budget_error(20_000)
    batch = int(re.search(r"group_size ≤ (\d+) fits", error)[1])
    assert batch * 32 <= 20_000 < (batch + 1) * 32
    assert JobConfig(max_steps=1, prompts_per_step=batch // 8, group_size=8,
                     max_new_tokens=32).budget_error(20_000) is None
