"""The held-out transfer eval: both arms recorded with n and an interval, the untrained arm
computed once, and its episodes kept out of the training loop's view of the ledger."""

import json

from nestor.agent.episode import EpisodeConfig
from nestor.ledger import Ledger
from nestor.outer.episodes import ledger_episodes
from nestor.outer.heldout import HELDOUT_FILE, HeldoutEval, mean_ci95
from nestor.policy.base import Message, Turn
from nestor.tasks import TaskRegistry


class Silent:
    """A policy that never calls a tool: each episode ends after one turn, reward 0."""

    name = "silent"

    def __init__(self, version=0):
        self.version = version
        self.acts = 0

    def act(self, obs):
        self.acts += 1
        return Turn(message=Message("assistant", "thinking"))


def test_mean_ci95():
    mean, (lo, hi) = mean_ci95([0.0, 1.0, 0.0, 1.0])
    assert mean == 0.5 and lo < 0.5 < hi
    assert mean_ci95([0.3]) == (0.3, [0.3, 0.3])


def test_heldout_arms_cached_and_invisible_to_training(tmp_path):
    untrained = []

    def make_untrained():
        untrained.append(Silent())
        return untrained[-1]

    trained = Silent(version=3)
    phases: list = []
    with Ledger(tmp_path) as ledger:
        ev = HeldoutEval(run_dir=tmp_path, registry=TaskRegistry(), pool=None, ledger=ledger,
                         episode_config=EpisodeConfig(max_turns=1), difficulty=0, every=2,
                         episodes=2, make_untrained_policy=make_untrained,
                         progress=phases.append)
        assert ev.due(2, final=False) and not ev.due(3, final=False) and ev.due(3, final=True)
        first = ev.run(trained, step=2)
        second = ev.run(trained, step=4)
        heldout_ids = {r.id for r in TaskRegistry().heldout_tasks()}
        assert {r["task"] for r in first} == heldout_ids
        assert all(r["n"] == 2 and r["ci95"][0] <= r["mean"] <= r["ci95"][1] for r in first)
        assert len(untrained) == 1 and untrained[0].acts == 2 * len(heldout_ids)  # once, cached
        assert trained.acts == 2 * 2 * len(heldout_ids)
        total = 2 * len(heldout_ids)  # progress: per episode of each arm, then None when done
        assert phases[:2] == [f"held-out eval, untrained arm: 0/{total} episodes",
                              f"held-out eval, untrained arm: 1/{total} episodes"]
        assert f"held-out eval, trained arm: {total}/{total} episodes" in phases
        assert phases[-1] is None and phases.count(None) == 2
        assert {r["arm"] for r in second} == {"trained", "untrained"}
        assert all(r.get("cached") for r in second if r["arm"] == "untrained")
        assert ledger_episodes(ledger, tmp_path) == []  # never read back as training episodes
        assert len(ledger.episodes()) == 3 * 2 * len(heldout_ids)
    rows = [json.loads(line) for line in (tmp_path / HELDOUT_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows].count(4) == 2 * len(heldout_ids)
