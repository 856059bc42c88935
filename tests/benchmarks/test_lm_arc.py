"""benchmarks/lm_arc.py's measurements: its intervals and what it reads from a written job."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_arc.py"
spec = importlib.util.spec_from_file_location("lm_arc", SCRIPT)
lm_arc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm_arc)


def test_wilson_interval_matches_the_textbook_values():
    # 0 of 1 and 5 of 10 (Wilson score, z = 1.96): [0, 0.7935], [0.2366, 0.7634]
    p, lo, hi = lm_arc.wilson(0, 1)
    assert p == 0 and lo == 0 and hi == pytest.approx(0.7935, abs=1e-4)
    p, lo, hi = lm_arc.wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert lm_arc.wilson(0, 0) == (None, None, None)


def test_job_traits_read_model_knobs_rubrics_and_form(tmp_path):
    job = tmp_path / "ep" / "job"
    (job / "env" / "j").mkdir(parents=True)
    (job / "config.toml").write_text('base_model = "tiny-s"\nmax_steps = 5\nlearning_rate = 1e-3\n')
    (job / "env" / "j" / "__init__.py").write_text(
        "class T:\n    @vf.reward(weight=0.5)\n    async def exact(self, trace):\n        ...\n"
        "    @vf.reward(weight=0.5)\n    async def positions(self, trace):\n        ...\n")
    traits = lm_arc.job_traits(tmp_path / "ep")
    assert traits == {"base_model": "tiny-s", "knobs": ["learning_rate", "max_steps"],
                      "rubrics": ["exact", "positions"], "short_form": True}
    assert lm_arc.job_traits(tmp_path / "nothing")["base_model"] is None


def test_repairs_count_episodes_that_resubmitted_and_those_that_then_passed():
    def row(first_try, passed, submits):
        return {"first_try": first_try, "passed": passed, "submits": submits, "reward": 0.0,
                "quality": None, "base_model": "tiny-m", "knobs": [], "rubrics": [],
                "malformed": 0}

    rows = [row(True, True, 1), row(False, True, 2), row(False, False, 3), row(False, True, 3),
            row(False, False, 1)]  # the last never resubmitted (its turns ran out)
    s = lm_arc.summarize(rows, trained=False)
    assert s["repairs"] == {"passed": 2, "of": 3} and s["first_try"]["rate"] == 0.2
    assert "repaired 2/3" in lm_arc.fmt(s)


def test_thirds_compare_first_and_last():
    assert lm_arc.thirds([0.0, 0.1, 0.2, 0.3, 0.4, 0.9]) == (pytest.approx(0.05),
                                                             pytest.approx(0.65))
    assert lm_arc.thirds([]) == (None, None)


def test_halves_count_first_try_jobs_and_malformed_turns_per_half():
    steps = [{"episodes": 4, "first_try_pass_rate": r, "malformed_tool_calls": m}
             for r, m in [(0.5, 0), (0.75, 2), (0.25, 5), (0.0, 9), (0.5, 1)]]
    assert lm_arc.halves(steps) == {"first_try": [[5, 8], [3, 12]], "malformed_turns": [2, 15]}


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
