"""`nestor sft` end to end on tiny-m from a JSONL of transcripts, resumed; and composer demos."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from nestor.cli import app

runner = CliRunner()
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def transcripts(path, n=3):
    lines = []
    for i in range(n):
        lines.append(json.dumps({"tools": TOOLS, "task": "reverse", "reward": i / n,
                                 "messages": [
            {"role": "system", "content": "Write jobs."}, {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "type": "function",
             "function": {"name": "write_file", "arguments": json.dumps({"path": f"f{i}"})}}]},
            {"role": "tool", "tool_call_id": "a", "content": "ok"}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_sft_cli_trains_resumes_and_reports_json(tmp_path):
    demos = transcripts(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    args = ["sft", "--demos", str(demos), "--model", "tiny-m", "--out", str(out), "--json",
            "--min-reward", "0.3", "--val-fraction", "0.5"]
    first = runner.invoke(app, [*args, "--steps", "1"])
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout)
    assert summary["demos_read"] == 3 and summary["demos_kept"] == 2  # reward ≥ 0.3
    # one of the two held out: trained on one sequence, scored on the other
    assert summary["demos_held_out"] == 1 and summary["sequences"] == 1
    assert summary["val_loss"] > 0 and 0 <= summary["val_token_accuracy"] <= 1
    assert 0 <= summary["token_accuracy_last"] <= 1
    assert summary["steps"] == 1 and (out / "adapter" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "sft.json").read_text())["min_reward"] == 0.3
    again = runner.invoke(app, [*args, "--steps", "2"])  # not empty, no --resume: refused
    assert again.exit_code == 2 and "--resume" in again.output
    resumed = runner.invoke(app, [*args, "--steps", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads(resumed.stdout)
    assert summary["resumed_from_step"] == 1 and summary["steps"] == 2


def test_sft_cli_errors_are_one_line(tmp_path):
    out = runner.invoke(app, ["sft", "--demos", "composer:x", "--model", "tiny-m",
                              "--out", str(tmp_path / "o")])
    assert out.exit_code == 2 and "composer:N" in out.output
    out = runner.invoke(app, ["sft", "--demos", str(tmp_path / "none.txt"), "--model", "tiny-m",
                              "--out", str(tmp_path / "p")])
    assert out.exit_code == 2 and "run directory" in out.output
    out = runner.invoke(app, ["sft", "--demos", str(tmp_path), "--slips-per-job", "1",
                              "--model", "tiny-m", "--out", str(tmp_path / "q")])
    assert out.exit_code == 2 and "composer:N" in out.output and not (tmp_path / "q").exists()


@pytest.mark.slow
def test_composer_demos_are_short_form_one_call_a_turn(tmp_path):
    from nestor.agent.episode import EpisodeConfig
    from nestor.sft.demos import from_composer

    (demo,) = from_composer(1, ["reverse"], tmp_path, episode=EpisodeConfig(
        prompt_style="compact"))
    assert demo.passed and demo.source == "composer"
    turns = [m for m in demo.messages if m.role == "assistant"]
    assert all(len(m.tool_calls) == 1 and not m.content.startswith("plan") for m in turns)
    paths = [m.tool_calls[0].arguments.get("path") for m in turns]
    assert "data/train.jsonl" not in paths and turns[-1].tool_calls[0].name == "submit"
    # each call is answered by its own tool message, right after it
    for k, m in enumerate(demo.messages):
        if m.role == "assistant":
            assert demo.messages[k + 1].tool_call_id == m.tool_calls[0].id
    # the same episode read back from the run directory's transcript is the same demo
    from nestor.sft.demos import from_run_dir

    (again,) = from_run_dir(tmp_path)
    assert again.messages == demo.messages and again.passed and again.first_try
