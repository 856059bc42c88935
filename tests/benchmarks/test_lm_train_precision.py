"""benchmarks/lm_train_precision.py on a run recorded by hand: tiny-m acted two episodes as
version 0; re-scored in float32 the ratio is the sampler's own (exactly 1), in bf16 only near
it, and each precision takes its train steps."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_train_precision.py"
spec = importlib.util.spec_from_file_location("lm_train_precision", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def recorded_run(run_dir: Path) -> None:
    from nestor.ledger import Ledger
    from nestor.outer.config import parse_run_config, save_run_config
    from nestor.outer.episodes import make_policy
    from nestor.policy.base import Message, Observation

    config = parse_run_config({"tasks": ["reverse"], "clip_ratio": 0.2, "policy": {
        "kind": "lm", "model": "tiny-m", "max_new_tokens": 16, "temperature": 1.0}})
    save_run_config(config, run_dir / "config.toml")
    policy = make_policy(config, run_dir)
    ledger = Ledger(run_dir)
    for slot, reward in ((0, 1.0), (1, 0.0)):
        eid = f"g00000-s0{slot}"
        ledger.start_episode(eid, task_id="reverse", family="f", difficulty=0, policy="lm",
                             policy_version=0, config={}, group_id=f"0:{slot}")
        obs = Observation([Message("system", "You write jobs."),
                           Message("user", f"Task {slot}")], tools=[])
        ledger.add_turn(eid, 0, policy.act(obs).to_dict() | {"role": "assistant"})
        ledger.finish_episode(eid, end_reason="ok", reward=reward, components={})
    ledger.close()


def test_float32_re_scores_as_the_sampler_did_and_bf16_near_it(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    recorded_run(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lm_train_precision.py", str(tmp_path), "--reps", "1",
                                      "--threads", "1"])
    bench.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    f32, b16 = out["float32"], out["bfloat16"]
    assert out["episodes"] == 2 and f32["tokens"] == b16["tokens"] > 0
    assert f32["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert f32["abs_log_ratio_q50_q90_q99"][2] < 1e-3
    assert b16["abs_log_ratio_q50_q90_q99"][2] > f32["abs_log_ratio_q50_q90_q99"][2]
    assert b16["ratio_mean"] == pytest.approx(1.0, abs=0.1)
    assert f32["step_cpu_s"] > 0 and b16["step_cpu_s"] > 0 and out["speedup"] > 0


def test_a_group_that_two_versions_acted_in_is_refused(tmp_path):
    import sqlite3

    recorded_run(tmp_path)
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        db.execute("UPDATE episodes SET policy_version = 1 WHERE id = 'g00000-s01'")
    with pytest.raises(SystemExit, match="versions \\[0, 1\\]"):
        bench.group_items(tmp_path, 0)
