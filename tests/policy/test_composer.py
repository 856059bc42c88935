"""The composer policy: what it writes, how it retries, and that its IS-GRPO step learns."""

import math
from pathlib import Path

import pytest
import torch

from nestor.job.config import load_job_config
from nestor.policy.base import Message, Observation, Policy, TrainItem
from nestor.policy.composer import CONFIG_KNOBS, Composer, ComposerConfig
from nestor.sandbox.workspace import TOOL_SCHEMAS, Workspace
from nestor.tasks import TaskRegistry

REG = TaskRegistry()


def _obs(task_id: str, *extra: Message) -> Observation:
    return Observation([Message("system", "s"), Message("user", "u"), *extra], TOOL_SCHEMAS,
                       REG.get(task_id).spec())


def _apply(turn, root: Path) -> Workspace:
    ws = Workspace(root)
    for call in turn.message.tool_calls:
        if call.name != "submit":
            assert not ws.call(call.name, call.arguments).startswith("error"), call.arguments
    return ws


def test_first_turn_samples_every_decision_and_writes_a_complete_job(tmp_path):
    torch.manual_seed(0)
    comp = Composer(ComposerConfig(token_budget=40_000, seed=3))
    assert isinstance(comp, Policy)
    turn = comp.act(_obs("reverse"))
    names = [k.partition("@")[0] for k in turn.action_keys]
    assert names == list(comp.decisions) and all(k.endswith("@strings") for k in turn.action_keys)
    # uniform logits: each sampled choice has probability 1/n
    for name, logp in zip(names, turn.sample_logprobs, strict=True):
        assert logp == pytest.approx(-math.log(len(comp.decisions[name])), abs=1e-6)
    assert [c.name for c in turn.message.tool_calls][-1] == "submit"
    _apply(turn, tmp_path)
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["config.toml", "data/train.jsonl", "env/composed_reverse/__init__.py",
                     "env/pyproject.toml"]
    cfg = load_job_config(tmp_path / "config.toml")  # the TOML it writes parses and validates
    plan = comp_plan(turn)
    assert cfg == comp.job_config(REG.get("reverse").spec(), plan["choices"], plan["data_seed"])


def comp_plan(turn) -> dict:
    import json

    return json.loads(turn.message.content.removeprefix("plan: "))


def test_budget_relative_max_steps_stay_in_budget():
    comp = Composer(ComposerConfig(token_budget=20_000))
    spec = REG.get("add").spec()
    base = {k: 0 for k in comp.decisions}
    for i, choice in enumerate(CONFIG_KNOBS["max_steps"]):
        for pps in range(3):
            cfg = comp.job_config(spec, {**base, "max_steps": i, "prompts_per_step": pps}, 0)
            if choice == "full_budget":
                assert cfg.budget_error(20_000) is None
                assert cfg.sampled_tokens() > 20_000 * 0.8
            if choice == "default":
                assert cfg.max_steps == 30
    # the default choice can break a small budget: a real consequence the report will name
    big = {**base, "max_steps": 0, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3}
    assert comp.job_config(spec, big, 0).budget_error(20_000) is not None


def test_retry_resamples_only_the_decisions_the_failing_checks_name():
    comp = Composer(ComposerConfig(seed=5))
    first = comp.act(_obs("add"))
    report = Message("tool", "validation failed (attempt 1 of 3): 1 of 9 checks failed.\n"
                     "ok   files: fine\nFAIL not_constant: every reply scores 0.0",
                     tool_call_id="c4")
    second = comp.act(_obs("add", first.message, report))
    assert [k.partition("@")[0] for k in second.action_keys] == ["rubric", "extract"]
    p1, p2 = comp_plan(first), comp_plan(second)
    assert p2["data_seed"] == p1["data_seed"]
    kept = {k: v for k, v in p1["choices"].items() if k not in ("rubric", "extract")}
    assert kept.items() <= p2["choices"].items()
    budget = Message("tool", "FAIL budget: over the cap\nFAIL load: 8 tasks", tool_call_id="c4")
    third = comp.act(_obs("add", first.message, report, second.message, budget))
    assert set(k.partition("@")[0] for k in third.action_keys) == {
        "max_steps", "prompts_per_step", "group_size", "max_new_tokens", "data_source", "n_rows"}


def test_without_a_spec_it_says_so_instead_of_writing():
    turn = Composer().act(Observation([Message("user", "hi")], TOOL_SCHEMAS, None))
    assert not turn.message.tool_calls and "spec" in turn.message.content


def _bandit(comp: Composer, task_id: str, steps: int, good: dict[str, str]) -> None:
    """Reward 1 when each decision in `good` takes its value: group advantages, IS-GRPO."""
    for _ in range(steps):
        turns = [comp.act(_obs(task_id)) for _ in range(8)]
        rewards = []
        for t in turns:
            values = comp_plan(t)["values"]
            rewards.append(float(all(str(values[k]) == v for k, v in good.items())))
        mean = sum(rewards) / len(rewards)
        comp.train_step([TrainItem([t], r - mean, comp.version) for t, r in zip(turns, rewards,
                                                                                 strict=True)])


def test_train_step_learns_a_bandit_and_bumps_the_version():
    torch.manual_seed(0)
    comp = Composer(ComposerConfig(lr=0.2, seed=1, family_conditioned=True))
    before = comp.probabilities("strings")
    _bandit(comp, "sort", 25, {"extract": "whole", "rubric": "partial"})
    after = comp.probabilities("strings")
    assert comp.version == 25
    assert after["extract"]["whole"] > 0.6 > before["extract"]["whole"]
    assert after["rubric"]["partial"] > 0.5
    # an unrelated family moved only through the shared logits, less than the trained one
    assert comp.probabilities("arithmetic")["extract"]["whole"] < after["extract"]["whole"]


def test_stale_samples_are_importance_weighted_and_clipped():
    comp = Composer(ComposerConfig(lr=0.5, clip_ratio=0.2, seed=2))
    turn = comp.act(_obs("reverse"))
    stats = [comp.train_step([TrainItem([turn], 1.0, 0)]) for _ in range(4)]
    assert stats[0]["ratio_mean"] == pytest.approx(1.0)  # on-policy at first
    assert stats[-1]["ratio_mean"] > 1.2 and stats[-1]["clip_frac"] > 0
    # once every ratio is past 1+ε a positive advantage carries no more gradient
    frozen = comp.probabilities("strings")
    comp.train_step([TrainItem([turn], 1.0, 0)])
    assert comp.probabilities("strings")["rubric"] == pytest.approx(frozen["rubric"], abs=0.02)


def test_save_load_round_trip(tmp_path):
    comp = Composer(ComposerConfig(lr=0.3, seed=4))
    _bandit(comp, "add", 3, {"lora_rank": "0"})
    comp.save(tmp_path / "composer.pt")
    fresh = Composer(ComposerConfig(seed=4))
    fresh.load(tmp_path / "composer.pt")
    assert fresh.version == comp.version == 3
    assert fresh.probabilities("arithmetic") == comp.probabilities("arithmetic")


def test_unknown_failures_and_refused_writes_blame_data_and_rubric():
    comp = Composer(ComposerConfig(seed=6))
    first = comp.act(_obs("max"))
    refused = Message("tool", "error: data/train.jsonl: over the 200,000-byte file quota",
                      tool_call_id="c1")
    odd = Message("tool", "validation failed\nFAIL imports: env/composed_max failed",
                  tool_call_id="c4")
    second = comp.act(_obs("max", first.message, refused, odd))
    assert {k.partition("@")[0] for k in second.action_keys} == {
        "data_source", "n_rows", "framing", "rubric", "extract"}
    # nothing failed (e.g. the submit never ran): submit again without new decisions
    third = comp.act(_obs("max", first.message, Message("tool", "ok: wrote", tool_call_id="c0")))
    assert third.action_ids == [] and [c.name for c in third.message.tool_calls] == ["submit"]


def test_act_is_thread_safe():
    from concurrent.futures import ThreadPoolExecutor

    comp = Composer(ComposerConfig(seed=8))
    with ThreadPoolExecutor(4) as ex:
        turns = list(ex.map(lambda t: comp.act(_obs(t)), ["sort", "add", "count", "shift"] * 3))
    for turn in turns:
        assert len(turn.action_ids) == len(comp.decisions)
        for key, idx in zip(turn.action_keys, turn.action_ids, strict=True):
            assert 0 <= idx < len(comp.decisions[key.partition("@")[0]])
