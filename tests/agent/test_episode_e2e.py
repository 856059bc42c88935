"""A whole episode on the real stack: composer -> probe -> local pool -> GRPO -> hidden eval."""

import pytest
import torch

from nestor.agent.episode import EpisodeConfig, run_episode
from nestor.ledger import Ledger
from nestor.policy.composer import Composer, ComposerConfig
from nestor.pool.base import make_pool
from nestor.pool.config import PoolConfig
from nestor.tasks import TaskRegistry

GOOD = {"base_model": "tiny-s", "config_mode": "tune", "learning_rate": "scaffold",
        "max_steps": "full_budget", "prompts_per_step": "8", "group_size": "4",
        "max_new_tokens": "scaffold", "data_source": "resampled", "n_rows": "256",
        "framing": "exact", "rubric": "partial", "extract": "whole", "lora_rank": "scaffold",
        "updates_per_step": "scaffold", "grad_clip": "scaffold",
        "reward_def": "async_def", "exports": "all", "row_keys": "prompt"}  # no slips


def _confident(comp: Composer) -> None:
    """Put almost all probability on a known-good plan (as training would)."""
    with torch.no_grad():
        for name, value in GOOD.items():
            idx = [str(c) for c in comp.decisions[name]].index(value)
            comp.shared[name][idx] = 30.0


@pytest.mark.slow
def test_composer_episode_trains_and_is_rewarded(tmp_path):
    comp = Composer(ComposerConfig(token_budget=1_600, seed=0))
    _confident(comp)
    spec = TaskRegistry().get("reverse").spec()
    cfg = EpisodeConfig(token_budget=1_600, job_timeout_s=600)
    pool = make_pool(PoolConfig(workers=1))
    try:
        with Ledger(tmp_path) as ledger:
            rec = run_episode(comp, spec, pool, ledger, cfg)
            ep = ledger.episode(rec.id)
    finally:
        pool.shutdown()
    assert rec.attempts == 1 and rec.end_reason == "ok", rec.summary()
    res = rec.result
    assert res.status == "ok" and res.pre_score is not None and res.post_score is not None
    c = rec.components
    assert c["validation_efficiency"] == 1.0
    assert c["improvement"] == pytest.approx(res.post_score - res.pre_score, abs=1e-9)
    quality = 0.25 * res.post_score + 0.75 * c["improvement"]  # the seed preset
    assert c["trained"] == 1.0 and c["quality"] == pytest.approx(quality)
    assert rec.reward == pytest.approx(0.35 + 0.60 * quality + 0.05 * c["speed"])
    assert ep["jobs"][0]["result"]["status"] == "ok" and ep["status"] == "done"
    assert (tmp_path / "episodes" / rec.id / "job" / "config.toml").is_file()
