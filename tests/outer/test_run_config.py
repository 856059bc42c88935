"""The run config: defaults, ranges, the held-out refusal, the resolved TOML round-trip, CLI errors."""


import pytest
import torch
from typer.testing import CliRunner

from nestor.cli import app
from nestor.outer.config import (
    RunConfig,
    RunConfigError,
    load_run_config,
    parse_run_config,
    save_run_config,
)
from nestor.tasks import TaskRegistry

runner = CliRunner()


def test_ranges_give_one_line_errors():
    with pytest.raises(RunConfigError, match="group_size"):
        parse_run_config({"tasks": ["reverse"], "group_size": 1})
    with pytest.raises(RunConfigError, match="tasks"):
        parse_run_config({"tasks": []})
    with pytest.raises(RunConfigError, match="stale_groups"):
        parse_run_config({"tasks": ["reverse"], "stale_groups": "maybe"})


def test_heldout_and_unknown_tasks_are_refused():
    reg = TaskRegistry()
    heldout = reg.heldout_tasks()[0].id
    with pytest.raises(RunConfigError, match="held-out family"):
        RunConfig(tasks=["reverse", heldout]).check_tasks(reg)
    with pytest.raises(RunConfigError, match="unknown task 'revers'.*reverse"):
        RunConfig(tasks=["revers"]).check_tasks(reg)
    RunConfig(tasks=["reverse", "add"]).check_tasks(reg)


def test_pool_and_episode_tables_are_checked():
    with pytest.raises(RunConfigError, match=r"\[pool\].*backend"):
        RunConfig(tasks=["reverse"], pool={"backend": "moon"}).pool_config()
    with pytest.raises(RunConfigError, match=r"\[episode\].*max_attempts"):
        RunConfig(tasks=["reverse"], episode={"max_attempts": 0}).episode_config()
    ep = RunConfig(tasks=["reverse"], difficulty=1, reward={"w_valid": 0.5},
                   episode={"max_attempts": 2}).episode_config()
    assert (ep.difficulty, ep.max_attempts, ep.reward.w_valid) == (1, 2, 0.5)


def test_resolved_config_round_trips(tmp_path):
    cfg = RunConfig(tasks=["reverse", "sort"], pool={"backend": "local", "workers": 1},
                    episode={"models": ["tiny-s"], "token_budget": 8000}, clip_ratio=0.2)
    save_run_config(cfg, tmp_path / "config.toml")
    assert load_run_config(tmp_path / "config.toml") == cfg


def test_quickstart_config_is_valid():
    from nestor.cli.train import QUICKSTART

    cfg = load_run_config(QUICKSTART)
    cfg.check(TaskRegistry())
    assert cfg.policy.kind == "composer" and cfg.pool_config().backend == "local"


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('tasks = ["dashes"]\n')
    res = runner.invoke(app, ["train", str(bad)])
    assert res.exit_code == 2 and "held-out" in res.output and "Traceback" not in res.output
    bad.write_text("tasks = [\n")
    res = runner.invoke(app, ["train", str(bad)])
    assert res.exit_code == 2 and "not valid TOML" in res.output
    res = runner.invoke(app, ["train", "--resume", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no config.toml" in res.output
    res = runner.invoke(app, ["train"])
    assert res.exit_code == 2 and "--resume" in res.output


def test_lm_memory_knobs_reach_the_policy():
    from nestor.outer.episodes import make_policy

    with pytest.raises(RunConfigError, match="must be below max_context"):
        parse_run_config({"tasks": ["reverse"], "policy": {
            "kind": "lm", "max_context": 512, "max_new_tokens": 512}})
    with pytest.raises(RunConfigError, match="dtype"):
        parse_run_config({"tasks": ["reverse"], "policy": {"kind": "lm", "dtype": "fp8"}})
    with pytest.raises(RunConfigError, match="train_precision"):
        parse_run_config({"tasks": ["reverse"], "policy": {"kind": "lm",
                                                           "train_precision": "fp8"}})
    cfg = parse_run_config({"tasks": ["reverse"], "learning_rate": 1e-3, "policy": {
        "kind": "lm", "model": "tiny-m", "max_context": 1024, "max_new_tokens": 64,
        "gradient_checkpointing": False, "prefix_cache_tokens": 0, "extend_contexts": False,
        "stop_repeats": 0, "train_precision": "bfloat16"}})
    policy = make_policy(cfg)
    assert policy.max_context == 1024 and policy.max_new_tokens == 64 and policy.stop_repeats == 0
    assert policy.train_autocast is torch.bfloat16
    assert not policy.gradient_checkpointing and policy.prefix_cache is None
    assert not policy.contexts.extend
