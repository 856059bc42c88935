"""The job writers `nestor bench agents --policy` can benchmark, by name.

    openai:MODEL   any OpenAI-compatible endpoint (--base-url, --api-key-env)
    composer       the composer, untrained; with --checkpoint DIR, as trained by a run
    lm:MODEL       a local HF chat LM (registry name or path) as the LM policy: untrained;
                   with --adapter DIR, warm-started by `nestor sft`; with --checkpoint DIR,
                   as RL-trained by `nestor train` (a run's checkpoints/<step>/policy)
    tinker:MODEL   the tinker policy on Tinker's API (--tinker-key-env); tinker-local:MODEL on
                   its offline stand-in; with --checkpoint DIR, as trained by a run
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class BenchPolicyError(ValueError):
    """The --policy/--adapter/--checkpoint combination cannot be built; says what to fix."""


def adapter_shape(adapter: Path) -> tuple[int, int]:
    """(rank, alpha) of a saved LoRA adapter (DIR or DIR/adapter)."""
    path = adapter / "adapter" if (adapter / "adapter").is_dir() else adapter
    try:
        cfg = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BenchPolicyError(f"{adapter}: not a LoRA adapter directory (the --out of "
                               f"`nestor sft`): {exc}") from None
    return int(cfg["r"]), int(cfg["lora_alpha"])


def make_bench_policy(spec: str, *, adapter: Path | None = None, checkpoint: Path | None = None,
                      budget: int, max_new_tokens: int | None = None, seed: int = 0,
                      temperature: float = 1.0, openai_kw: dict[str, Any] | None = None,
                      tinker_key_env: str = "TINKER_API_KEY"):
    """(policy, usage or None) for `--policy spec`."""
    if checkpoint is not None and (checkpoint / "policy").exists():
        checkpoint = checkpoint / "policy"  # a run's checkpoints/step-N/
    if adapter is not None and not spec.startswith("lm:"):
        raise BenchPolicyError("--adapter is for --policy lm:MODEL (a `nestor sft` warm start)")
    if spec.startswith("openai:"):
        from nestor.policy.openai_compat import OpenAICompatPolicy, PolicyError

        try:
            pol = OpenAICompatPolicy(model=spec.split(":", 1)[1], **(openai_kw or {}))
        except PolicyError as exc:
            raise BenchPolicyError(str(exc)) from None
        return pol, pol.usage
    if spec == "composer":
        from nestor.policy.composer import Composer, ComposerConfig

        pol = Composer(ComposerConfig(token_budget=budget, seed=seed))
        if checkpoint is not None:
            pol.load(checkpoint)
        return pol, None
    if spec.startswith("lm:") and spec[3:]:
        from nestor.policy.lm import LMPolicy

        rank, alpha = adapter_shape(adapter) if adapter is not None else (8, 16)
        pol = LMPolicy.from_pretrained(spec[3:], lora_rank=rank, lora_alpha=alpha, seed=seed,
                                       max_new_tokens=max_new_tokens, temperature=temperature)
        if adapter is not None:
            pol.load_adapter(adapter)
        if checkpoint is not None:
            pol.load(checkpoint)
        return pol, None
    if spec.startswith(("tinker:", "tinker-local:")):
        from nestor.policy.tinker import TinkerPolicyError, make_tinker_policy

        kind, model = spec.split(":", 1)
        kw = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
        try:
            return make_tinker_policy(model, local=kind == "tinker-local", checkpoint=checkpoint,
                                      api_key_env=tinker_key_env, seed=seed,
                                      temperature=temperature, **kw), None
        except TinkerPolicyError as exc:
            raise BenchPolicyError(str(exc)) from None
    raise BenchPolicyError(f"unknown --policy {spec!r}; use openai:MODEL, composer, lm:MODEL, "
                           "tinker:MODEL or tinker-local:MODEL")
