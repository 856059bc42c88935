"""benchmarks/gpu_check.py runs on a machine without a GPU: the CPU half, and a clear skip."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_runs_its_cpu_half_and_says_why_cuda_was_skipped():
    import torch

    out = subprocess.run([sys.executable, str(SCRIPT), "--steps", "2", "--n", "24",
                          "--threads", "1", "--group", "2", "--sft-steps", "4"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = summary["results"]["cpu"]
    assert cpu["grpo"]["steps"] == 2 and cpu["grpo"]["kl_sampler_max"] < 1e-3
    assert abs(cpu["lm"]["ratio_mean"] - 1) < 1e-2 and cpu["lm"]["lora_moved"]
    agent = cpu["lm_agent"]  # multi-turn episodes, one pass each, the prompt's KV reused
    assert agent["episodes_one_pass"] == agent["episodes"] == 2 and agent["lora_moved"]
    assert abs(agent["ratio_mean"] - 1) < 1e-3 and agent["lora_float32"]
    assert agent["prefix_tokens_reused"] > 0 and agent["oom_dropped_turns"] == 0
    warm = agent["warm_start"]  # behaviour cloning of the docs' job, before the RL step
    assert warm["steps"] == 4 and warm["loss_last"] < 0.75 * warm["loss_first"]
    assert cpu["eval"]["n"] == 24 and 0 <= cpu["eval"]["pre"] <= 1
    inner = cpu["inner"]  # the inner trainer's GPU items, their CPU half
    assert inner["memory"]["dtype_bytes"] == 2 and inner["memory"]["cap_mb"] == 2048
    assert inner["accumulate"]["max_rel_diff"] <= 0.05
    assert inner["lora_checkpoint"]["reloaded_diff"] < inner["lora_checkpoint"]["bf16_merge_diff"]
    assert inner["prescore_key"]["key"][0] == "cpu"
    assert summary["problems"] == []
    if not torch.cuda.is_available():
        assert summary["devices"] == ["cpu"]
        assert "sees no CUDA device" in summary["skipped"] and "skipped" in out.stderr
