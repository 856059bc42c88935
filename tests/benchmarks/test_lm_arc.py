"""benchmarks/lm_arc.py's phases: the demos' tasks, and an arm run end to end."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_arc.py"
spec = importlib.util.spec_from_file_location("lm_arc", SCRIPT)
lm_arc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm_arc)
import lm_arc_report  # noqa: E402  (lm_arc put benchmarks/ on the path)


def test_demo_tasks_default_to_the_runs_and_all_means_every_training_task():
    from argparse import Namespace

    from nestor.tasks import TaskRegistry

    config = Namespace(tasks=["add", "max"])
    assert lm_arc.demo_tasks(Namespace(demo_tasks=None), config) == ["add", "max"]
    assert lm_arc.demo_tasks(Namespace(demo_tasks=["reverse"]), config) == ["reverse"]
    every = lm_arc.demo_tasks(Namespace(demo_tasks=["all"]), config)
    reg = TaskRegistry()
    assert set(every) == {r.id for r in reg.training_tasks()} and {"add", "reverse"} <= set(every)
    assert not set(every) & {r.id for r in reg.heldout_tasks()}  # never the held-out family


@pytest.mark.slow
def test_a_trained_composer_is_an_arm_on_the_same_episodes(tmp_path, monkeypatch, capsys):
    import json

    import torch

    from nestor.policy.composer import Composer, ComposerConfig

    trained = Composer(ComposerConfig(base_models=["tiny-s", "tiny-m"]))
    with torch.no_grad():  # a checkpoint that has learnt one thing: tiny-m, always
        trained.shared["base_model"].copy_(torch.tensor([-30.0, 30.0]))
    step = tmp_path / "run" / "checkpoints" / "step-000001"
    trained.save(step / "policy")
    (step / "state.json").write_text("{}")
    (step.parent / "latest").write_text(step.name)
    assert lm_arc.policy_file(tmp_path / "run") == lm_arc.policy_file(step) == step / "policy"
    with pytest.raises(SystemExit, match="no policy there"):
        lm_arc.policy_file(tmp_path)
    monkeypatch.setattr("sys.argv", [
        "lm_arc.py", "--out", str(tmp_path / "out"), "--seeds", "0",
        "--composer-checkpoint", str(tmp_path / "run"), "--eval-tasks", "add",
        "--heldout-tasks", "dashes", "--eval-episodes", "2", "--heldout-episodes", "1",
        "--validate-only", "--skip", "untrained", "warm"])
    lm_arc.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    arm = report["arms"]["composer-trained"]
    assert (arm["train"]["n"], arm["heldout"]["n"]) == (2, 1)
    assert arm["train"]["tiny_m_share"] == arm["heldout"]["tiny_m_share"] == 1.0
    assert "composer" not in report["arms"]  # the untrained one only with --composer
    # the same arm read back from what the run recorded
    assert lm_arc_report.report_recorded([tmp_path / "out"])["arms"]["composer-trained"] == arm


def test_an_adapter_arm_is_a_name_and_a_directory(tmp_path):
    from argparse import ArgumentTypeError

    assert lm_arc.adapter_arm(f"rl-repair={tmp_path}") == ("rl-repair", tmp_path)
    for bad in (str(tmp_path), f"warm-started={tmp_path}", f"rl-s2={tmp_path}",
                f"Rl Repair={tmp_path}", f"rl-repair={tmp_path / 'none'}"):
        with pytest.raises(ArgumentTypeError, match="NAME=DIR|not a directory"):
            lm_arc.adapter_arm(bad)


@pytest.mark.slow
def test_an_adapter_arm_runs_the_configs_lm_policy_from_that_adapter(tmp_path, monkeypatch,
                                                                     capsys):
    """The arm's policy is the config's, with only its adapter changed; it runs on the same
    episodes as any other arm and, named rl-*, is compared with the warm start's held-out arm.
    (The policy itself is the composer here: an LM arm costs minutes of SmolLM2.)"""
    import json

    from nestor.policy.composer import Composer, ComposerConfig

    made = []

    def make_policy(config):
        made.append(config.policy)
        return Composer(ComposerConfig(job_form="short", base_models=["tiny-s"]))

    monkeypatch.setattr("nestor.outer.episodes.make_policy", make_policy)
    adapter = tmp_path / "repair" / "policy"
    adapter.mkdir(parents=True)
    monkeypatch.setattr("sys.argv", [
        "lm_arc.py", "--out", str(tmp_path / "out"), "--seeds", "0", "--eval-tasks",
        "--heldout-tasks", "dashes", "--heldout-episodes", "2", "--validate-only",
        "--adapter-arm", f"rl-repair={adapter}", "--skip", "untrained", "warm"])
    lm_arc.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(p.kind, p.adapter, p.model) for p in made] == [("lm", str(adapter), "smollm2-135m")]
    assert report["arms"]["rl-repair"]["heldout"]["n"] == 2
    assert report["arms"]["rl-repair"]["train"]["n"] == 0
    assert lm_arc_report.report_recorded([tmp_path / "out"])["arms"]["rl-repair"] == \
        report["arms"]["rl-repair"]
