"""benchmarks/sft_speed.py: every mode measured, float32 checkpointed the reference."""

import json
import sys
from pathlib import Path

from nestor.policy.base import Message, ToolCall
from nestor.sft.demos import Demo, write_demos

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import sft_speed  # noqa: E402


def test_every_mode_is_timed_against_float32_with_the_same_gradient(tmp_path, monkeypatch,
                                                                    capsys):
    demo = Demo([Message("system", "You write jobs."), Message("user", "Teach reverse."),
                 Message("assistant", "", [ToolCall("write_file", {
                     "path": "config.toml", "content": "max_steps = 4"}, "a")]),
                 Message("tool", "ok", tool_call_id="a")], [], id="d")
    write_demos(tmp_path / "demos.jsonl", [demo])
    monkeypatch.setattr("sys.argv", ["sft_speed.py", "--model", "tiny-m", "--demos",
                                     str(tmp_path / "demos.jsonl"), "--reps", "1",
                                     "--threads", "1"])
    sft_speed.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    modes = report["modes"]
    assert set(modes) == {"float32-checkpointed", "float32", "bfloat16-checkpointed", "bfloat16"}
    assert modes["float32-checkpointed"]["speedup"] == 1.0
    assert modes["float32"]["grad_cosine"] > 0.9999  # checkpointing recomputes the same math
    assert modes["bfloat16"]["grad_cosine"] > 0.98 and modes["bfloat16"]["s_per_sequence"] > 0
    assert report["tokens"] > report["targets"] > 0
