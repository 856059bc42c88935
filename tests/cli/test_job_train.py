"""`nestor job train` as a user runs it: the probe first (or a plain line saying it was skipped
on request), every read of the job through safe_read (also with --max-steps: nothing is copied,
no link followed, no special file opened), results under --out, progress and intervals."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nestor.cli import app

ROOT = Path(__file__).resolve().parents[2]
GOOD = ROOT / "examples" / "jobs" / "good-reverse"
runner = CliRunner()


@pytest.fixture
def job(tmp_path) -> Path:
    return Path(shutil.copytree(GOOD, tmp_path / "job", ignore=shutil.ignore_patterns(
        "__pycache__")))


@pytest.fixture
def tmp_root(tmp_path, monkeypatch) -> Path:
    """A temp dir of the test's own, to see what a run leaves behind in it."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setenv("TMPDIR", str(root))
    return root


def train(job: Path, *args: str, env: dict | None = None, timeout: float = 120.0):
    """The CLI in its own process, under a timeout: a hang fails the test instead of it."""
    cmd = [sys.executable, "-m", "nestor.cli.main", "job", "train", str(job), "--task", "reverse",
           "--max-steps", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=job.parent,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize("skip", [[], ["--skip-validation"]])
def test_a_config_linked_outside_is_refused_not_rewritten(job, tmp_path, tmp_root, skip):
    outside = tmp_path / "mine.toml"
    text = (GOOD / "config.toml").read_text() + "# my notes\n"
    outside.write_text(text)
    (job / "config.toml").unlink()
    (job / "config.toml").symlink_to(outside)
    res = runner.invoke(app, ["job", "train", str(job), "--task", "reverse", "--max-steps", "1",
                              "--out", str(tmp_path / "out"), *skip])
    assert res.exit_code == 1, res.output
    assert "config.toml is a symbolic link" in res.output and "Traceback" not in res.output
    assert outside.read_text() == text  # comments and all: nothing wrote through the link
    assert ("validation skipped" in res.output) == bool(skip)
    assert list(tmp_root.iterdir()) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_config_linked_to_a_special_file_neither_hangs_nor_fills_memory(job, tmp_path,
                                                                           tmp_root, target):
    if target == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    (job / "config.toml").unlink()
    (job / "config.toml").symlink_to(target)
    for args in ([], ["--skip-validation"]):
        res = train(job, *args, env={"TMPDIR": str(tmp_root)})
        assert res.returncode == 1, res.stderr
        assert "config.toml is a symbolic link" in res.stdout + res.stderr
        assert "Traceback" not in res.stderr
    # ru_maxrss of the largest child, in KiB: the CLI itself, never a /dev/zero's worth
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 2 << 20
    assert list(tmp_root.iterdir()) == []


def test_a_fifo_in_the_job_is_a_clear_error(job, tmp_path, tmp_root):
    os.mkfifo(job / "config.toml.new")
    os.mkfifo(job / "data" / "extra.jsonl")
    (job / "config.toml").unlink()
    os.mkfifo(job / "config.toml")
    for args in ([], ["--skip-validation"]):
        res = train(job, *args, env={"TMPDIR": str(tmp_root)})
        assert res.returncode == 1, res.stderr
        out = res.stdout + res.stderr
        assert "is a FIFO (named pipe)" in out and "Traceback" not in out
    assert list(tmp_root.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("change,needle", [
    ("rows", "load() yielded 10 tasks; it needs at least 32"),
    ("def", "must be `async def`")])
def test_the_probe_refuses_what_it_refuses_in_validate(job, change, needle):
    if change == "rows":
        rows = (job / "data" / "train.jsonl").read_text().splitlines()[:10]
        (job / "data" / "train.jsonl").write_text("\n".join(rows) + "\n")
    else:
        init = next((job / "env").glob("*/__init__.py"))
        init.write_text(init.read_text().replace("async def", "def"))
    res = runner.invoke(app, ["job", "train", str(job), "--task", "reverse", "--max-steps", "1",
                              "--out", str(job.parent / "out")])
    assert res.exit_code == 1 and needle in res.output, res.output
    assert "not trained" in res.output and not (job.parent / "out").exists()


@pytest.mark.slow
def test_results_land_under_out_and_name_the_users_job(job, tmp_path, tmp_root):
    out = tmp_path / "out"
    res = runner.invoke(app, ["job", "train", str(job), "--task", "reverse", "--max-steps", "1",
                              "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    meta = json.loads((out / "checkpoint" / "nestor_job.json").read_text())
    assert meta["job_dir"] == str(job.resolve()) and meta["steps"] == 1
    assert "passed in" in res.output and "step 1/1: reward" in res.output
    assert "n=200" in res.output and f"results in {out}" in res.output  # Wilson interval shown
    assert not [p for p in tmp_root.iterdir() if p.name.startswith("nestor-job-")]
    assert (job / "config.toml").read_text() == (GOOD / "config.toml").read_text()


def test_a_sparse_file_is_not_inflated_past_the_job_budget(job, tmp_path, tmp_root):
    """256 MiB of holes: the staging copy stops at the job budget (64 MiB) and is removed."""
    with (job / "data" / "blob.bin").open("wb") as fh:
        fh.truncate(256 << 20)
    res = train(job, env={"TMPDIR": str(tmp_root)})
    assert res.returncode == 1, res.stderr
    out = res.stdout + res.stderr
    assert "over 67,108,864 bytes (at data/blob.bin)" in out and "Traceback" not in out
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 2 << 20
    assert list(tmp_root.iterdir()) == []


@pytest.mark.parametrize("kind", [
    "config_toml", "pyproject_toml",
    pytest.param("surrogate_prompt", marks=pytest.mark.slow),
    pytest.param("huge_reward", marks=pytest.mark.slow)])
def test_every_bomb_ends_job_train_with_a_status_not_a_traceback(job, tmp_path, kind):
    from tests.job.test_job_bombs import bomb

    job, needle = bomb(job, kind)
    for args in ([], ["--skip-validation"]):  # the probe's verdict, then run_job's status
        res = runner.invoke(app, ["job", "train", str(job), "--task", "reverse", "--max-steps",
                                  "1", "--out", str(tmp_path / "out"), "--json", *args])
        assert res.exit_code == 1, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
        shown = json.loads(res.stdout)
        assert shown["status"] in ("invalid", "failed")
        if not args:
            assert needle in json.dumps(shown["validation"]), shown["validation"]
        elif kind != "huge_reward":  # run_job: the canary's re-probe words it its own way
            assert needle in shown["log_tail"], shown["log_tail"]


def test_a_job_result_prints_job_text_inert(capsys):
    from nestor.cli.job import _fields, _print_result
    from nestor.inner.types import JobResult

    # base_model is recorded as config.toml names it, before it is checked; the log is the job's
    evil = "m[/bold]\x1b]0;PWNED\x07\x1b]52;c;ZWNobw==\x1b\\\ud800"
    result = JobResult(status="failed", base_model=evil, log_tail=f"boom {evil}\x1b[2J")
    _print_result(Path("job"), "reverse", result, _fields(result))
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err
    assert "m[/bold]␛]0;PWNED␇" in out and "boom m[/bold]␛]0;PWNED" in err
