"""`nestor episode run|list|show`, and a run killed with SIGKILL mid-episode."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from typer.testing import CliRunner

from nestor.cli import app

runner = CliRunner()


def test_unknown_task_is_a_one_line_error(tmp_path):
    res = runner.invoke(app, ["episode", "run", "--task", "revrese", "--run-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "unknown task 'revrese'" in res.output and "reverse" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["episode", "list", "--run-dir", str(tmp_path / "none")])
    assert res.exit_code == 2 and "no ledger" in res.output


def test_composer_episode_without_training_prints_json(tmp_path):
    # the composer's seed-0 draw makes no slip on `add`: its job validates at the first submit
    res = runner.invoke(app, ["episode", "run", "--task", "add", "--run-dir", str(tmp_path),
                              "--no-train", "--attempts", "1", "--budget", "20000", "--seed", "0",
                              "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"reward", "components", "attempts", "result", "end_reason"} <= out.keys()
    assert out["attempts"] == 1 and out["result"] is None
    assert out["end_reason"] == "not_trained"
    assert out["components"]["validation_efficiency"] == 1.0
    ep_dir = tmp_path / "episodes" / out["episode_id"]
    assert (ep_dir / "attempt-1" / "config.toml").is_file()
    assert (ep_dir / "job").is_dir()  # the validated job, frozen
    listed = runner.invoke(app, ["episode", "list", "--run-dir", str(tmp_path), "--json"])
    assert json.loads(listed.stdout)[0]["id"] == out["episode_id"]
    shown = runner.invoke(app, ["episode", "show", out["episode_id"], "--run-dir",
                                str(tmp_path), "--json"])
    ep = json.loads(shown.stdout)
    assert [t["role"] for t in ep["turns"]][:4] == ["system", "user", "assistant", "tool"]
    assert ep["turns"][2]["action_keys"][0] == "base_model@arithmetic"
    verdicts = [t["content"] for t in ep["turns"] if t["content"].startswith("validation passed")]
    assert all("not trained here" in v and "sent for training" not in v for v in verdicts)
    assert ep["paths"]["workspace"] == str(ep_dir / "workspace")
    text = runner.invoke(app, ["episode", "show", out["episode_id"], "--run-dir", str(tmp_path)])
    assert text.exit_code == 0 and "…" not in text.stdout  # nothing cut
    assert ep["turns"][0]["content"].splitlines()[-1] in text.stdout
    assert f"workspace: {ep_dir / 'workspace'}" in text.stdout
    table = runner.invoke(app, ["episode", "list", "--run-dir", str(tmp_path)], terminal_width=60)
    assert out["episode_id"] in table.stdout  # the id `show` needs is never cut


def test_sigkill_mid_episode_leaves_a_readable_ledger(tmp_path):
    cmd = [sys.executable, "-c", "from nestor.cli import app; app()", "episode", "run",
           "--task", "reverse", "--run-dir", str(tmp_path), "--no-train", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    db = tmp_path / "ledger.sqlite"
    try:
        deadline = time.time() + 120
        attempts = 0
        while time.time() < deadline and proc.poll() is None:
            if db.is_file():
                con = sqlite3.connect(db, timeout=5)
                try:
                    attempts = con.execute("SELECT count(*) FROM attempts").fetchone()[0]
                except sqlite3.OperationalError:
                    attempts = 0  # tables not created yet
                con.close()
                if attempts:
                    break  # the first submit is being validated right now
            time.sleep(0.05)
        assert attempts, "the episode never reached its first submit"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and everything it started
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    listed = runner.invoke(app, ["episode", "list", "--run-dir", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)
    assert row["status"] == "running" and row["end_reason"] is None
    shown = runner.invoke(app, ["episode", "show", row["id"], "--run-dir", str(tmp_path),
                                "--json"])
    assert shown.exit_code == 0, shown.output
    ep = json.loads(shown.stdout)
    assert [t["role"] for t in ep["turns"]][:3] == ["system", "user", "assistant"]
    assert ep["attempts"] == 1


def test_documented_episode_run_from_a_fresh_dir(tmp_path, monkeypatch):
    # README / docs/agent.md as a user runs them, from an empty directory with no --out: the
    # episode lands in runs/episode-<timestamp>/ and nothing else is written to the cwd; `runs
    # list` (piped: no cell cut) calls it a finished episodes directory, not "no steps yet".
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["episode", "run", "--task", "add", "--no-train", "--attempts",
                              "1", "--budget", "20000"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("episode-") and (run / "ledger.sqlite").is_file()
    assert f"run dir: {os.path.join('runs', run.name)}" in res.stdout
    listed = runner.invoke(app, ["runs", "list"])
    assert listed.exit_code == 0, listed.output
    line = next(x for x in listed.stdout.splitlines() if run.name in x)  # whole name, piped
    assert "episodes" in line and "finished" in line and "no steps yet" not in line
    shown = json.loads(runner.invoke(app, ["runs", "show", str(run), "--json"]).stdout)
    assert shown["kind"] == "episodes" and shown["status"] == "finished"
