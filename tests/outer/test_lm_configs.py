"""The LM recipes' configs load, and their policy starts from a warm start's adapter: the LM
arc (SmolLM2) and the Qwen3 agent (tested with tiny-m standing in for the local path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nestor.outer.config import load_run_config, parse_run_config
from nestor.outer.episodes import make_policy

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _warm_start(tmp_path: Path, rank: int = 8, alpha: int = 16) -> tuple[Path, dict]:
    """A saved adapter with non-zero LoRA B weights (as after `nestor sft`)."""
    from nestor.policy.lm import LMPolicy

    torch.manual_seed(0)
    pol = LMPolicy.from_pretrained("tiny-m", lora_rank=rank, lora_alpha=alpha)
    with torch.no_grad():
        for name, p in pol.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    pol.model.save_pretrained(tmp_path / "sft" / "adapter")
    weights = {n: p.detach().clone() for n, p in pol.model.named_parameters() if "lora_" in n}
    return tmp_path / "sft", weights


def _lora(policy) -> dict:
    return {n: p.detach() for n, p in policy.model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("name", ["lm-arc.toml", "qwen3-agent.toml"])
def test_the_lm_recipe_configs_start_from_the_adapter(name, tmp_path):
    raw = load_run_config(CONFIGS / name).model_dump(mode="json")
    assert raw["policy"]["kind"] == "lm"
    adapter, weights = _warm_start(tmp_path)
    # tiny-m on the CPU stands in for SmolLM2 / the Qwen3 path
    raw["policy"].update(model="tiny-m", device="cpu", adapter=str(adapter))
    policy = make_policy(parse_run_config(raw, name))
    loaded = _lora(policy)
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)
    raw["policy"]["lora_rank"] = 4  # a mismatch is named, with the fix
    with pytest.raises(ValueError, match="lora_rank"):
        make_policy(parse_run_config(raw, name))


def test_bench_builds_lm_policies_from_an_adapter_or_a_checkpoint(tmp_path):
    from nestor.cli.bench_policies import BenchPolicyError, make_bench_policy

    adapter, weights = _warm_start(tmp_path, rank=4, alpha=8)
    pol, usage = make_bench_policy("lm:tiny-m", adapter=adapter, budget=5000)
    assert usage is None and pol.model.peft_config["default"].r == 4  # the adapter's shape
    assert all(torch.equal(_lora(pol)[k], weights[k]) for k in weights)
    pol.save(tmp_path / "ckpt" / "policy")
    again, _ = make_bench_policy("lm:tiny-m", adapter=adapter, checkpoint=tmp_path / "ckpt",
                                 budget=5000)
    assert again.version == pol.version
    untrained, _ = make_bench_policy("lm:tiny-m", budget=5000)
    assert not any(torch.equal(_lora(untrained)[k], weights[k]) for k in weights
                   if "lora_B" in k)
    with pytest.raises(BenchPolicyError, match="lm:MODEL"):
        make_bench_policy("composer", adapter=adapter, budget=5000)
    with pytest.raises(BenchPolicyError, match="not a LoRA adapter"):
        make_bench_policy("lm:tiny-m", adapter=tmp_path / "nowhere", budget=5000)
