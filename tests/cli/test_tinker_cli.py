"""The tinker policy from `nestor episode run` and `nestor bench agents`: without a key, one
actionable line (no traceback) before any model or sandbox work."""

import pytest
from typer.testing import CliRunner

from nestor.cli import app


@pytest.mark.parametrize("argv", [
    ["episode", "run", "--task", "length", "--policy", "tinker", "--no-train"],
    ["bench", "agents", "--policy", "tinker:Qwen/Qwen3-8B", "--tasks", "length"],
])
def test_tinker_without_a_key_is_one_line(argv, monkeypatch, tmp_path):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    out = CliRunner().invoke(app, [*argv, "--run-dir", str(tmp_path / "r")])
    assert out.exit_code != 0
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "$TINKER_API_KEY" in lines[0] and "tinker-local" in lines[0]
    assert "Traceback" not in out.output
