"""benchmarks/docs_walk.py's plan: every shell block of the docs is run or skipped with a reason,
heavy commands are capped, placeholders get values. (The walk itself is run by hand: tens of
minutes on a CPU.)"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import docs_walk  # noqa: E402

CTX = {"good_job": "GOOD", "episode_dir": "runs/episode-1", "episode_id": "ep1",
       "run": "runs/r", "port": "9999"}


def _plan():
    return [docs_walk.plan(s, dict(CTX)) for doc in docs_walk.DOCS
            for s in docs_walk.commands(doc)]


def test_every_doc_is_walked_and_exists():
    docs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert docs | {"README.md"} == set(docs_walk.DOCS)


def test_every_step_runs_capped_or_says_why_not():
    steps = _plan()
    assert len(steps) >= 20
    for s in steps:
        if s.skip:
            assert len(s.skip) > 10, s
            continue
        assert " [-" not in s.command and "…" not in s.command, s  # optional parts, placeholders
        if s.command.startswith(("nestor train", "nestor quickstart")):
            assert "--steps 1" in s.command
        if s.command.startswith("nestor job train"):
            assert "--max-steps 2" in s.command
    commands = [s.command for s in steps if not s.skip]
    assert "nestor quickstart --steps 1" in commands  # README's `make quickstart`
    assert "nestor job init walk-job --task reverse" in commands
    assert "nestor episode show ep1 --run-dir runs/episode-1" in commands
    serve = next(s for s in steps if s.command.startswith("nestor serve"))
    assert serve.background and "--port 9999" in serve.command
    assert any("localhost:9999" in c for c in commands)
    reasons = {s.text.split()[0]: s.skip for s in steps if s.skip}
    assert reasons.get("make") and reasons.get("export")
    assert not [c for c in commands if "smollm2" in c or "lm_arc" in c or "lm-arc" in c]


def test_output_lines_and_comments_are_not_commands(tmp_path, monkeypatch):
    doc = tmp_path / "docs" / "x.md"
    doc.parent.mkdir()
    doc.write_text("```\nnestor tasks list   # all of them\n{\"out\": 1}\n```\n\n```bash\n"
                   "nestor job init DIR \\\n    --task add  # scaffold\n```\n\n```\nnestor/\n"
                   "  tasks/\n```\n")
    monkeypatch.setattr(docs_walk, "ROOT", tmp_path)
    steps = docs_walk.commands("docs/x.md")
    assert [s.text for s in steps] == ["nestor tasks list", "nestor job init DIR --task add"]


@pytest.mark.slow
def test_the_walk_runs_the_tasks_doc(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "docs_walk.py"), "--docs",
                          "docs/tasks.md"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert '"failed": []' in out.stdout.splitlines()[-1]
