"""`[policy] kind = "tinker"` end to end on the local stand-in: the shipped config builds a
policy, and `nestor train` runs real episodes (sandbox, local pool), checkpoints and resumes.
The run fails on each of the defects the cluster-paths issue found: a refused kind, identical
replies within a group, max_tokens past the context window (the stand-in refuses it, the
episode ends policy_error), a second checkpoint of the same name (refused)."""

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from nestor.outer.config import RunConfigError, parse_run_config
from nestor.outer.episodes import make_policy
from nestor.outer.metrics import read_jsonl
from nestor.policy.base import Message, Observation

CONFIGS = Path(__file__).parents[2] / "configs"

RUN = """name = "tk"
seed = 1
tasks = ["length"]
group_size = 2
groups_per_step = 1
max_in_flight = 2
steps = 2
learning_rate = 1e-3
clip_ratio = 0.2

[policy]
kind = "tinker"
model = "tiny-m"
lora_rank = 4
max_new_tokens = 4000     # past tiny-m's 4,096-token window once the prompt is in
tinker_service = "local"

[pool]
backend = "local"
workers = 1

[episode]
max_turns = 2
max_attempts = 1
prompt_style = "compact"
token_budget = 1000
job_timeout_s = 60
models = ["tiny-s"]
"""


def test_shipped_tinker_config_runs_on_the_local_stand_in(tmp_path, monkeypatch):
    data = tomllib.loads((CONFIGS / "tinker.toml").read_text())
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(RunConfigError, match=r"\[policy\].*TINKER_API_KEY"):
        make_policy(parse_run_config(data))
    data["policy"].update(model="tiny-m", tinker_service="local")
    config = parse_run_config(data)
    policy = make_policy(config, tmp_path)
    assert (policy.clip_ratio, policy.tis_cap, policy.token_level) == (0.2, 2.0, True)
    assert policy.tool_format.name == "json" and policy.max_context == 4096
    turn = policy.act(Observation([Message("user", "go")], [], seed=0))
    assert 0 < len(turn.action_ids) <= config.policy.max_new_tokens


def _first_turns(run_dir: Path) -> dict[int, list[list[int]]]:
    groups: dict[int, list[list[int]]] = {}
    for ep in read_jsonl(run_dir / "outer" / "episodes.jsonl"):
        groups.setdefault(ep["group_id"], []).append(ep["turns"][0]["action_ids"])
    return groups


def _tinker_paths(run_dir: Path) -> list[str]:
    return [json.loads((p / "policy" / "tinker.json").read_text())["tinker_path"]
            for p in sorted((run_dir / "checkpoints").glob("step-*"))]


@pytest.mark.slow
def test_nestor_train_with_the_tinker_policy_then_resume(tmp_path):
    from nestor.cli import app

    runner = CliRunner()
    cfg = tmp_path / "run.toml"
    cfg.write_text(RUN)
    run_dir = tmp_path / "run"
    out = runner.invoke(app, ["train", str(cfg), "--run-dir", str(run_dir), "--json"])
    assert out.exit_code == 0, out.output[-2000:]
    episodes = read_jsonl(run_dir / "outer" / "episodes.jsonl")
    assert episodes and all(e["info"]["end_reason"] != "policy_error" for e in episodes), \
        [e["info"].get("error") for e in episodes]
    for turns in _first_turns(run_dir).values():  # each episode of a group samples its own
        assert len(turns) < 2 or turns[0] != turns[1]
    for ep in episodes:
        for t in ep["turns"]:
            assert len(t["context_ids"]) + len(t["action_ids"]) <= 4096
    first = _tinker_paths(run_dir)
    assert len(first) == 2 and len(set(first)) == 2  # unique names, steps with data or not

    saved = tomllib.loads((run_dir / "config.toml").read_text())
    saved["steps"] = 3
    (run_dir / "config.toml").write_text(tomli_w.dumps(saved))
    out = runner.invoke(app, ["train", "--resume", str(run_dir), "--json"])
    assert out.exit_code == 0, out.output[-2000:]
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    paths = _tinker_paths(run_dir)
    assert paths[0] == first[1] and paths[1] not in first
    state = json.loads((run_dir / "checkpoints" / "step-000003" / "policy" /
                        "tinker.json").read_text())
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert state["version"] == rows[-1]["policy_version"]
    assert Path(state["tinker_path"]).is_relative_to(run_dir / "tinker-local")


@pytest.mark.slow
def test_loop_trains_the_tinker_policy_on_policy_and_resumes(tmp_path):
    """Rewards that differ within every group: each step trains (ratio 1 on policy, a new
    version), and a fresh policy resumes the run's checkpoint."""
    import torch

    from nestor.outer.groups import EpisodeSummary
    from nestor.outer.loop import OuterLoop

    torch.set_num_threads(1)

    def episode(policy, ticket) -> EpisodeSummary:
        version = policy.version
        turn = policy.act(Observation([Message("user", f"Task {ticket.task_id}: go.")], [],
                                      seed=ticket.seed))
        reward = len(turn.action_ids) / 100 + 0.01 * ticket.slot  # never zero-variance
        return EpisodeSummary(ticket.group_id, ticket.slot, ticket.task_id, reward, version,
                              turns=[turn])

    data = tomllib.loads(RUN)
    data["policy"].update(max_new_tokens=12)
    config = parse_run_config({**data, "tasks": ["a"], "steps": 2, "learning_rate": 1e-2})
    policy = make_policy(config, tmp_path)
    loop = OuterLoop(config, policy, episode, tmp_path)
    rows = loop.run()
    loop.join()
    assert [r["policy_version"] for r in rows] == [1, 2] and policy.version == 2
    assert all(r["train"]["datums"] == 2 for r in rows)
    assert abs(rows[0]["train"]["ratio_mean"] - 1.0) < 1e-3  # step 1 is on policy

    fresh = make_policy(config.model_copy(update={"steps": 3}), tmp_path)
    resumed = OuterLoop(config.model_copy(update={"steps": 3}), fresh, episode, tmp_path)
    assert resumed.resume() and fresh.version == 2
    probe = Observation([Message("user", "probe")], [], seed=7)
    assert fresh.act(probe).action_ids == policy.act(probe).action_ids
    resumed.run()
    resumed.join()
    assert fresh.version == 3
