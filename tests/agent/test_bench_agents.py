"""`nestor bench agents` with an API policy pointed at a real `nestor serve`, and at nothing."""

import csv
import json

from typer.testing import CliRunner

from nestor.cli import app
from tests.conftest import free_port

runner = CliRunner()


def _bench(tmp_path, name, *args):
    board = tmp_path / "board.csv"
    out = runner.invoke(app, ["bench", "agents", *args, "--tasks", "length", "--episodes", "1",
                              "--workers", "1", "--max-turns", "3", "--budget", "2000",
                              "--run-dir", str(tmp_path / name), "--leaderboard", str(board),
                              "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout), board


def _errors(run_dir):
    return [json.loads(p.read_text())["components"].get("error", "")
            for p in run_dir.glob("episodes/*/transcript.json")]


def test_bench_agents_appends_rows(served_tiny_s, tmp_path):
    # A served char-level tiny model cannot hold the 12k-character system prompt in its 4,096
    # positions: the server answers 400, and each episode ends with that recorded, not a crash.
    for name in ("a", "b"):
        row, board = _bench(tmp_path, name, "--policy", "openai:tiny-s", "--base-url",
                            served_tiny_s)
        assert row["episodes"] == 1 and row["tasks"] == "length"
        assert row["validation_pass_rate"] == 0.0 and "policy_error=1" in row["end_reasons"]
        assert any("exceeds the model's context" in e for e in _errors(tmp_path / name))
    rows = list(csv.DictReader(board.open()))
    assert [r["policy"] for r in rows] == ["openai:tiny-s", "openai:tiny-s"]


def test_unreachable_endpoint_ends_episodes_with_a_reason(tmp_path):
    row, _ = _bench(tmp_path, "c", "--policy", "openai:m", "--max-retries", "1",
                    "--base-url", f"http://127.0.0.1:{free_port()}/v1")
    assert row["episodes"] == 1 and "policy_error=1" in row["end_reasons"]
    assert row["mean_reward"] == 0.0
    assert any("cannot reach" in e for e in _errors(tmp_path / "c"))


def test_unknown_policy_is_one_line_error():
    out = runner.invoke(app, ["bench", "agents", "--policy", "gpt"])
    assert out.exit_code == 2 and "openai:MODEL" in out.output


def test_documented_bench_from_a_fresh_dir(served_tiny_s, tmp_path, monkeypatch):
    # docs/agents.md's serve + bench example, run as a user would: from an empty directory, no
    # --out, piped output. Results land in runs/bench-*/ (leaderboard.csv inside, nothing in the
    # cwd), the table keeps whole cells, the reason each episode failed is printed in full, and
    # the server logged the error it returned.
    monkeypatch.chdir(tmp_path)
    out = runner.invoke(app, ["bench", "agents", "--policy", "openai:tiny-s", "--base-url",
                              served_tiny_s, "--tasks", "length", "--episodes", "1",
                              "--workers", "1", "--max-turns", "2", "--budget", "2000",
                              "--prompt-style", "compact", "--max-retries", "0"])
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    (bench,) = (tmp_path / "runs").iterdir()
    assert bench.name.startswith("bench-") and (bench / "leaderboard.csv").is_file()
    assert "openai:tiny-s" in out.stdout and "policy_error=1" in out.stdout  # not `ope…`
    assert "exceeds the model's context of 4096" in out.stdout
    assert "--prompt-style compact" in out.stdout  # the server's error says what to do
    assert "-> HTTP 400: prompt of" in served_tiny_s.log.read_text()
