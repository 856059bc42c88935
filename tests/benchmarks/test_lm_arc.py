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
