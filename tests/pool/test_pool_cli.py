"""`nestor pool run` and `nestor bench matrix` end to end, with the test job functions
configured through nestor.toml's [pool] table (config is data: no hidden flags)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nestor.cli import app

HERE = Path(__file__).parent
runner = CliRunner()


def write_settings(tmp_path: Path, extra: str = "") -> Path:
    matrix = tmp_path / "cost_matrix.json"
    (tmp_path / "nestor.toml").write_text(
        "[pool]\n"
        'job_fn = "pool_jobs:behave_job"\nwarm_state = "pool_jobs:CountingWarm"\n'
        f"python_path = [{json.dumps(str(HERE))}]\ncost_matrix = {json.dumps(str(matrix))}\n"
        "threads_per_worker = 1\n" + extra)
    return matrix


def test_pool_run_prints_every_result_as_json(tmp_path, monkeypatch, make_job):
    write_settings(tmp_path)
    monkeypatch.chdir(tmp_path)
    jobs = [make_job(f"j{i}", sleep=0.1) for i in range(3)]
    # the pool's mechanics on test job functions: their stand-in jobs skip the probe
    res = runner.invoke(app, ["pool", "run", *map(str, jobs), "--task", "reverse",
                              "--workers", "2", "--json", "--skip-validation"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["job_dir"] for r in rows] == [str(j) for j in jobs]  # submission order
    assert all(r["status"] == "ok" and r["worker"].startswith("local/") for r in rows)


def test_pool_run_bad_input_is_one_line(tmp_path, monkeypatch, make_job):
    write_settings(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["pool", "run", str(tmp_path / "nope"), "--task", "reverse"])
    assert res.exit_code == 2 and "no config.toml" in res.output
    res = runner.invoke(app, ["pool", "run", str(make_job()), "--task", "no-such-task"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    res = runner.invoke(app, ["pool", "run", str(make_job("b")), "--task", "reverse",
                              "--skip-validation", "--backend", "ray", "--address", "127.0.0.1:1"])
    assert res.exit_code == 2 and "does not answer" in res.output


def test_bench_matrix_measures_present_cells_and_stores_them(tmp_path, monkeypatch, make_job):
    matrix_path = write_settings(tmp_path, extra=(
        '[[pool.worker_types]]\nname = "cheap"\nprice_per_hour = 3.6\n'
        '[[pool.worker_types]]\nname = "dear"\nprice_per_hour = 36.0\nmodels = ["tiny-s"]\n'))
    monkeypatch.chdir(tmp_path)
    job = make_job(sleep=0.3)
    res = runner.invoke(app, ["bench", "matrix", "--job", str(job), "--skip-validation",
                              "--model", "tiny-s",
                              "--model", "tiny-m", "--model", "qwen3-1.7b", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert "qwen3-1.7b" in out["absent_models"]  # no weights here: not measured
    cells = {(r["worker_type"], r["base_model"]): r for r in out["rows"]}
    assert set(cells) == {("cheap", "tiny-s"), ("cheap", "tiny-m"), ("dear", "tiny-s")}
    for (wtype, _), r in cells.items():
        price = 3.6 if wtype == "cheap" else 36.0
        assert r["status"] == "ok" and r["seconds"] >= 0.3
        assert abs(r["dollars"] - r["seconds"] * price / 3600) < 1e-5
    stored = json.loads(matrix_path.read_text())
    assert len(stored["entries"]) == 3 and stored["reference_job"] == str(job)


@pytest.mark.slow
def test_pool_run_and_job_export_run_the_probe_first(tmp_path, monkeypatch):
    """The one gate: a job `nestor job validate` refuses (10 rows; load needs 32) is not trained
    by `pool run` nor exported by `job export`, and the probe's message says why."""
    import shutil

    write_settings(tmp_path)
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "ten-rows"
    shutil.copytree(HERE.parents[1] / "examples" / "jobs" / "good-reverse", job,
                    ignore=shutil.ignore_patterns("__pycache__"))
    rows = (job / "data" / "train.jsonl").read_text().splitlines()[:10]
    (job / "data" / "train.jsonl").write_text("\n".join(rows) + "\n")
    res = runner.invoke(app, ["pool", "run", str(job), "--task", "reverse", "--json"])
    assert res.exit_code == 1, res.output
    (row,) = json.loads(res.stdout)
    assert row["status"] == "invalid" and "load() yielded 10 tasks" in row["log_tail"]
    assert row["worker"] is None  # never reached a worker
    out = tmp_path / "rl.toml"
    res = runner.invoke(app, ["job", "export", str(job), "--task", "reverse",
                              "--prime-rl", str(out)])
    assert res.exit_code == 1 and "load() yielded 10 tasks" in res.output, res.output
    assert not out.exists()
