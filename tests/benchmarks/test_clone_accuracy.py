"""benchmarks/clone_accuracy.py: a warm start scores above the untrained model on its demos."""

import json
import sys
from pathlib import Path

from nestor.policy.base import Message, ToolCall
from nestor.sft.data import encode_demo, policy_encoders
from nestor.sft.demos import Demo, write_demos
from nestor.sft.run import make_policy
from nestor.sft.trainer import SFTConfig, Trainer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import clone_accuracy  # noqa: E402


def test_a_clone_scores_above_the_untrained_model(tmp_path, monkeypatch, capsys):
    demo = Demo([Message("system", "You write jobs."), Message("user", "Teach reverse."),
                 Message("assistant", "", [ToolCall("write_file", {
                     "path": "config.toml", "content": "max_steps = 4"}, "a")]),
                 Message("tool", "ok", tool_call_id="a")], [], id="d")
    write_demos(tmp_path / "demos.jsonl", [demo])
    config = tmp_path / "lm.toml"  # the LM arc's config, with tiny-m standing in for SmolLM2
    config.write_text((ROOT / "configs" / "lm-arc.toml").read_text().replace(
        '"smollm2-135m"', '"tiny-m"'))
    cfg = SFTConfig(model="tiny-m", steps=8, batch_sequences=1, learning_rate=3e-3,
                    warmup_steps=0, gradient_checkpointing=False, max_new_tokens=640)
    policy = make_policy(cfg)
    render, encode_action = policy_encoders(policy)
    Trainer(policy, cfg, tmp_path / "sft").train(encode_demo(demo, render, encode_action))

    monkeypatch.setattr("sys.argv", [
        "clone_accuracy.py", "--adapters", "none", str(tmp_path / "sft"), "--config",
        str(config), "--demos", str(tmp_path / "demos.jsonl"), "--out", str(tmp_path / "o")])
    clone_accuracy.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    untrained, clone = report["adapters"]
    assert report["demos"] == 1 and report["tokens"] > report["action_tokens"] > 0
    assert clone["loss"] < untrained["loss"]
    assert untrained["token_accuracy"] < clone["token_accuracy"] <= 1
    assert clone["argmax_departures_per_demo"] < untrained["argmax_departures_per_demo"]
