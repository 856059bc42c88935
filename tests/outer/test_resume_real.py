"""A real run (composer, local pool, tiny-s jobs) killed with SIGKILL mid-step and resumed:
every count of the ledger, journal, metrics and checkpoints adds up, and no episode is left
`running`."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from nestor.ledger import Ledger
from nestor.outer.metrics import read_jsonl

CONFIG = """name = "killed"
seed = 4
tasks = ["length"]
group_size = 2
groups_per_step = 1
max_in_flight = 4
steps = 3
learning_rate = 0.3

[pool]
backend = "local"
workers = 1

[episode]
max_attempts = 2
token_budget = 600
job_timeout_s = 90
models = ["tiny-s"]
"""


def _running(run_dir: Path) -> int:
    if not (run_dir / "ledger.sqlite").is_file():
        return 0
    with Ledger(run_dir, readonly=True) as led:
        return sum(1 for e in led.episodes() if e["status"] == "running")


@pytest.mark.slow
def test_sigkill_mid_step_then_resume_leaves_a_true_ledger(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-m", "nestor.cli.main"]
    proc = subprocess.Popen([*cmd, "train", str(cfg), "--run-dir", str(run_dir), "--json"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 400
    try:  # kill -9 (the whole process group: workers too) once step 1 is done and more runs
        while time.monotonic() < deadline and proc.poll() is None:
            if read_jsonl(run_dir / "metrics.jsonl") and _running(run_dir) > 0:
                break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert read_jsonl(run_dir / "metrics.jsonl"), "step 1 never finished"
    with Ledger(run_dir, readonly=True) as led:
        in_flight = {e["id"] for e in led.episodes() if e["status"] == "running"}
    assert in_flight, "nothing was running at the kill"

    out = subprocess.run([*cmd, "train", "--resume", str(run_dir), "--json"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]

    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    state = json.loads((run_dir / "checkpoints" / "step-000003" / "state.json").read_text())
    assert len(state["consumed"]) == 3 and state["step"] == 3
    assert [len(r["group_ids"]) for r in rows] == [1, 1, 1]
    assert state["counters"]["episodes_orphaned"] == len(in_flight)

    with Ledger(run_dir, readonly=True) as led:
        episodes = led.episodes()
        by_status = Counter(e["status"] for e in episodes)
        results = {r["job_id"]: r for r in led.job_results()}
        pending = led.pending_jobs()
        jobs = [j for e in episodes for j in led.episode(e["id"])["jobs"]]
    assert by_status["running"] == 0 and set(by_status) == {"done"}
    orphaned = {e["id"] for e in episodes if e["end_reason"] == "orphaned"}
    assert orphaned == in_flight  # closed with their own reason, nothing else
    assert all(e["reward"] is None for e in episodes if e["id"] in orphaned)
    assert pending == [] and len(jobs) == len(results)  # every job has exactly one result
    assert all(j["result"]["status"] == "lost" for e in episodes if e["id"] in orphaned
               for j in led_jobs(run_dir, e["id"]))
    # the journal: each trained (group, slot) once; the trained groups are the consumed ones
    journal = read_jsonl(run_dir / "outer" / "episodes.jsonl")
    keys = [(e["group_id"], e["slot"]) for e in journal]
    assert len(keys) == len(set(keys))
    trained = {(g, s) for g in state["consumed"] for s in range(2)}
    assert trained <= set(keys)
    # every journaled episode is a finished, non-orphaned ledger episode
    ids = {e["info"]["episode_id"] for e in journal}
    done = {e["id"] for e in episodes if e["end_reason"] not in ("orphaned", "stopped")}
    assert ids <= done
    from nestor.report.data import RunData

    assert RunData.load(run_dir).status() == "finished"


def led_jobs(run_dir: Path, episode_id: str) -> list[dict]:
    with Ledger(run_dir, readonly=True) as led:
        return led.episode(episode_id)["jobs"]
