"""benchmarks/lm_arc_report.py: its intervals and tests, what it reads from a written job, and
the report it assembles from recorded runs."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_arc_report.py"
spec = importlib.util.spec_from_file_location("lm_arc_report", SCRIPT)
lm_arc_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lm_arc_report)


def test_wilson_interval_matches_the_textbook_values():
    # 0 of 1 and 5 of 10 (Wilson score, z = 1.96): [0, 0.7935], [0.2366, 0.7634]
    p, lo, hi = lm_arc_report.wilson(0, 1)
    assert p == 0 and lo == 0 and hi == pytest.approx(0.7935, abs=1e-4)
    p, lo, hi = lm_arc_report.wilson(5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert lm_arc_report.wilson(0, 0) == (None, None, None)


def test_fisher_exact_matches_the_textbook_values():
    # the two-sided p of 1/12 against 9/12 (the dieting table on Wikipedia's page) and of
    # 8/10 against 1/6 (scipy.stats.fisher_exact's docstring example)
    assert lm_arc_report.fisher_p(1, 12, 9, 12) == pytest.approx(0.002759, abs=1e-6)
    assert lm_arc_report.fisher_p(8, 10, 1, 6) == pytest.approx(0.034965, abs=1e-6)
    assert lm_arc_report.fisher_p(5, 24, 5, 24) == 1.0 and lm_arc_report.fisher_p(0, 0, 3, 4) == 1.0


def record_arm(run_dir, first_try: list[bool], *, version: int = 0, rewards=None):
    """A ledger as run_arm (or an RL run) leaves it: one episode per entry, one policy turn each,
    a malformed one where the job did not pass first try."""
    from nestor.ledger import Ledger

    with Ledger(run_dir) as ledger:
        for i, ok in enumerate(first_try):
            eid = f"e{i}"
            ledger.start_episode(eid, task_id="dashes", family="format", difficulty=1,
                                 policy="lm", policy_version=version, config={})
            ledger.add_turn(eid, 0, {"role": "system", "content": "spec"})
            ledger.add_turn(eid, 1, {"role": "assistant", "content": "x",
                                     "parse_error": None if ok else "no closing tag"})
            ledger.finish_episode(eid, end_reason="not_trained" if ok else "invalid",
                                  reward=(rewards or [0.0] * len(first_try))[i],
                                  components={"validation_efficiency": 1.0 if ok else 0.0})


def test_a_report_of_recorded_runs_pools_arms_across_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    record_arm(a / "eval-warm-started-heldout", [True] * 6 + [False] * 6)
    record_arm(b / "eval-warm-started-heldout", [True] * 3 + [False] * 9)
    record_arm(a / "eval-warm-started", [True, False])
    record_arm(a / "eval-rl-s0-heldout", [True] * 2 + [False] * 10)
    record_arm(b / "eval-rl-s1-heldout", [True] * 3 + [False] * 9)
    for seed, curve in ((0, [0.3, 0.2, 0.2, 0.1]), (1, [0.1, 0.2, 0.3, 0.4])):
        run = (a if seed == 0 else b) / f"rl-s{seed}"
        record_arm(run, [True, False], version=1, rewards=[0.5, 0.1])
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": i + 1, "reward_mean": r, "episodes": 2, "first_try_pass_rate": 0.5,
                        "malformed_tool_calls": 1}) + "\n" for i, r in enumerate(curve)))
    report = lm_arc_report.report_recorded([a, b])
    arms = report["arms"]
    assert arms["warm-started"]["heldout"]["n"] == 24  # 12 in each directory, pooled
    assert arms["warm-started"]["heldout"]["first_try"]["rate"] == 9 / 24
    assert arms["warm-started"]["train"]["n"] == 2 and arms["warm-started"]["heldout"][
        "malformed_turns"] == 15
    assert arms["rl-pooled"]["heldout"]["n"] == 24 and arms["rl-pooled"]["train"]["n"] == 0
    transfer = report["heldout_transfer"]
    assert transfer["warm_started_first_try"] == [9, 24]
    assert transfer["rl_first_try"] == {"rl-s0": [2, 12], "rl-s1": [3, 12], "rl-pooled": [5, 24]}
    assert transfer["fisher_p"]["rl-pooled"] == pytest.approx(lm_arc_report.fisher_p(5, 24, 9, 24))
    assert report["rl_reward_thirds"] == {0: (0.3, 0.1), 1: (0.1, 0.4)}
    assert report["rl_lifted_seeds"] == 1
    assert report["rl_by_version"][0] == {1: [2, pytest.approx(0.3)]}
    assert report["rl_halves"][1] == {"first_try": [[2, 4], [2, 4]], "malformed_turns": [2, 2]}
    with pytest.raises(SystemExit, match="no such directory"):
        lm_arc_report.report_recorded([tmp_path / "missing"])


def test_job_traits_read_model_knobs_rubrics_and_form(tmp_path):
    job = tmp_path / "ep" / "job"
    (job / "env" / "j").mkdir(parents=True)
    (job / "config.toml").write_text('base_model = "tiny-s"\nmax_steps = 5\nlearning_rate = 1e-3\n')
    (job / "env" / "j" / "__init__.py").write_text(
        "class T:\n    @vf.reward(weight=0.5)\n    async def exact(self, trace):\n        ...\n"
        "    @vf.reward(weight=0.5)\n    async def positions(self, trace):\n        ...\n")
    traits = lm_arc_report.job_traits(tmp_path / "ep")
    assert traits == {"base_model": "tiny-s", "knobs": ["learning_rate", "max_steps"],
                      "rubrics": ["exact", "positions"], "short_form": True}
    assert lm_arc_report.job_traits(tmp_path / "nothing")["base_model"] is None


def test_repairs_count_episodes_that_resubmitted_and_those_that_then_passed():
    def row(first_try, passed, submits):
        return {"first_try": first_try, "passed": passed, "submits": submits, "reward": 0.0,
                "quality": None, "base_model": "tiny-m", "knobs": [], "rubrics": [],
                "malformed": 0}

    rows = [row(True, True, 1), row(False, True, 2), row(False, False, 3), row(False, True, 3),
            row(False, False, 1)]  # the last never resubmitted (its turns ran out)
    s = lm_arc_report.summarize(rows, trained=False)
    assert s["repairs"] == {"passed": 2, "of": 3} and s["first_try"]["rate"] == 0.2
    assert "repaired 2/3" in lm_arc_report.fmt(s)


def test_thirds_compare_first_and_last():
    assert lm_arc_report.thirds([0.0, 0.1, 0.2, 0.3, 0.4, 0.9]) == (pytest.approx(0.05),
                                                             pytest.approx(0.65))
    assert lm_arc_report.thirds([]) == (None, None)


def test_halves_count_first_try_jobs_and_malformed_turns_per_half():
    steps = [{"episodes": 4, "first_try_pass_rate": r, "malformed_tool_calls": m}
             for r, m in [(0.5, 0), (0.75, 2), (0.25, 5), (0.0, 9), (0.5, 1)]]
    assert lm_arc_report.halves(steps) == {"first_try": [[5, 8], [3, 12]], "malformed_turns": [2, 15]}
