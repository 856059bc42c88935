"""The trainer's memory estimate: the probe refuses a job that would not fit, and says how to fix it."""

from pathlib import Path

import pytest

from nestor.job.config import JobConfig, load_job_config
from nestor.job.memory import GIB, MIB, ModelShape, check, estimate, memory_error, model_shape

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


# Qwen3-0.6B's config.json (Hub, bf16): the GPU path's model, without its weights here.
QWEN3_06B = ModelShape.from_config(dict(
    hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True))


def test_qwen3_fits_a_gpu_in_bf16_where_the_cpu_float32_cap_refuses_it():
    config = JobConfig(base_model="qwen3-0.6b", learning_rate=1e-5)
    assert 590e6 < QWEN3_06B.params < 600e6  # Qwen3-0.6B: 0.6B with its tied embedding
    assert memory_error(config, QWEN3_06B, 60)[1] is not None  # float32 under 2 GiB: no
    a40 = 46_068  # MiB, what torch reports for an A40
    est, error = memory_error(config, QWEN3_06B, 60, cap_mb=a40, dtype_bytes=2)
    assert error is None
    f32 = estimate(config, QWEN3_06B, 60, 4)
    assert est.parts["sampling"] < f32.parts["sampling"]  # a bf16 KV cache is half the size
    # bf16 weights (frozen base + trainable copy) plus the float32 masters of the full
    # fine-tune; gradients and AdamW's moments stay float32 whatever the weights' dtype
    assert est.parts["weights"] == 2 * QWEN3_06B.params * 2 + QWEN3_06B.params * 4
    assert est.parts["optimizer"] == f32.parts["optimizer"] == 3 * QWEN3_06B.params * 4


def test_micro_batches_shrink_the_update_and_are_advised():
    config = JobConfig(base_model="qwen3-0.6b", learning_rate=1e-5)
    whole = estimate(config, QWEN3_06B, 60, 2)
    one = estimate(config.model_copy(update={"micro_batch_prompts": 1}), QWEN3_06B, 60, 2)
    assert one.parts["update"] * 8 < whole.parts["update"]  # 1 of 16 prompt groups at a time
    assert one.parts["sampling"] == whole.parts["sampling"]  # the sampler still takes all
    cap = one.peak // MIB + 64  # fits only with micro-batches
    _, error = memory_error(config, QWEN3_06B, 60, cap_mb=cap, dtype_bytes=2)
    assert "micro_batch_prompts to " in error
    best = int(error.split("micro_batch_prompts to ")[1].split()[0])
    fixed = config.model_copy(update={"micro_batch_prompts": best})
    assert memory_error(fixed, QWEN3_06B, 60, cap_mb=cap, dtype_bytes=2)[1] is None


def test_the_worker_sizes_by_its_own_device_and_dtype():
    import torch

    from nestor.job.memory import Target, worker_target

    assert worker_target("cpu", torch.float32, 3000) == Target(3000, 4, "cpu")
    assert worker_target("cpu", torch.bfloat16).dtype_bytes == 2
    # (on a GPU the cap is its memory: benchmarks/gpu_check.py checks that half)


def test_the_driver_leaves_bf16_checkpoints_to_the_worker(tmp_path):
    from nestor.job.memory import driver_can_size

    (tmp_path / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    assert not driver_can_size(tmp_path)
    (tmp_path / "config.json").write_text('{"dtype": "float32"}')
    assert driver_can_size(tmp_path)
    (tmp_path / "config.json").unlink()
    assert not driver_can_size(tmp_path)  # unreadable: the worker decides
    from nestor.models.registry import resolve_model_dir

    assert driver_can_size(resolve_model_dir("tiny-m"))  # the CPU models stay checked here
