"""benchmarks/repair_rl.py: a group updates the policy only when its repairs differ, each episode
weighted by its reward against the group's mean; a run saves a policy repair_eval can load."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # repair_rl imports repair_eval, as a script does
spec = importlib.util.spec_from_file_location("repair_rl", ROOT / "benchmarks" / "repair_rl.py")
repair_rl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repair_rl)


class Recorder:
    def __init__(self):
        self.batches = []

    def train_step(self, batch):
        self.batches.append(batch)
        return {"loss": 0.0}


def group(*repaired):
    return [(SimpleNamespace(train_item=lambda a: a), {"repaired": r}) for r in repaired]


def test_a_repair_is_paid_against_the_groups_mean_and_one_outcome_trains_nothing():
    agent = Recorder()
    assert repair_rl.train_group(agent, group(True, False, False, False)) == {"loss": 0.0}
    assert agent.batches == [[0.75, -0.25, -0.25, -0.25]]
    assert repair_rl.train_group(agent, group(False, False)) is None
    assert repair_rl.train_group(agent, group(True, True)) is None
    assert len(agent.batches) == 1


def test_repair_rates_over_the_first_and_last_half_of_the_steps():
    steps = [{"rewards": r} for r in ([0, 0], [1, 0], [0, 1], [1, 1], [1, 1])]
    assert repair_rl.half_rates(steps) == [0.25, 1.0]  # the middle step in neither half
    assert repair_rl.half_rates(steps[:1]) == [None, None]


def tiny_config(tmp_path: Path) -> Path:
    """configs/lm-arc.toml with tiny-m as the agent."""
    text = (ROOT / "configs" / "lm-arc.toml").read_text()
    path = tmp_path / "tiny.toml"
    path.write_text(text.replace('model = "smollm2-135m"', 'model = "tiny-m"').replace(
        "max_new_tokens = 640", "max_new_tokens = 16"))
    return path


@pytest.mark.slow
def test_the_learner_trains_on_the_repairers_tokens_only(tmp_path):
    from nestor.ledger import Ledger
    from nestor.outer.config import load_run_config
    from nestor.outer.episodes import make_policy
    from nestor.sft.demos import demo_composer

    config = load_run_config(tiny_config(tmp_path))
    episode, agent = config.episode_config(), make_policy(config)
    composer = demo_composer(episode, 0)
    ledger = Ledger(tmp_path / "ledger")
    case, = repair_rl.repair_cases(["length"], 1, ["seed_overflow"], composer, ledger, episode, 0)
    results = [repair_rl.repair_episode(case, composer, agent, ledger, episode) for _ in range(2)]
    results = [(rec, {**row, "repaired": i == 0}) for i, (rec, row) in enumerate(results)]
    ledger.close()
    # the replayed job's turns are the composer's (no token ids); the learner sees the agent's
    own = [t for rec, _ in results for t in rec.turns if t.action_ids]
    assert own and len(own) < sum(len(rec.turns) for rec, _ in results)
    stats = repair_rl.train_group(agent, results)
    assert stats["tokens"] == sum(len(t.action_ids) for t in own) and agent.version == 1


@pytest.mark.slow
def test_a_tiny_lm_acts_repair_groups_and_its_policy_loads_as_an_adapter(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setattr("sys.argv", [
        "repair_rl.py", "--config", str(tiny_config(tmp_path)), "--tasks", "length",
        "--kinds", "seed_overflow", "--steps", "2", "--group", "2", "--out", str(tmp_path / "r")])
    repair_rl.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["cases"] == 1 and len(report["steps"]) == 2
    for step in report["steps"]:
        assert step["kind"] == "seed_overflow" and step["caught"] and len(step["rewards"]) == 2
        assert step["updated"] == (len(set(step["rewards"])) > 1)
    assert report["updates"] == sum(s["updated"] for s in report["steps"])
    from nestor.outer.config import load_run_config

    assert load_run_config(tmp_path / "r" / "config.toml").policy.model == "tiny-m"  # resolved

    from nestor.policy.lm import LMPolicy

    LMPolicy.from_pretrained("tiny-m", max_new_tokens=16).load_adapter(report["policy"])


def test_a_group_of_one_and_a_bad_learning_rate_are_refused(monkeypatch):
    monkeypatch.setattr("sys.argv", ["repair_rl.py", "--group", "1"])
    with pytest.raises(SystemExit, match="--group"):
        repair_rl.main()
    monkeypatch.setattr("sys.argv", ["repair_rl.py", "--learning-rate", "-1"])
    with pytest.raises(SystemExit, match="learning_rate"):
        repair_rl.main()
