"""A harness failure is ours only when it is: whatever a job's files or replies make the trusted
side trip on (a TOML nesting bomb's RecursionError, a reward of 10**400, a lone surrogate in a
prompt) is a failed check of the job with a clear message, never a free retry; `run_job`
returns a status for every job and never raises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nestor.inner.run import WarmState, run_job
from nestor.inner.types import JobRequest
from nestor.job import tasksource
from nestor.job.config import JobConfigError, load_job_config
from nestor.job.layout import LayoutError, read_layout
from nestor.job.validate import validate_job
from nestor.tasks import TaskRegistry
from tests.job.test_hostile_jobs import SHORT, make_job

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
SPEC = TaskRegistry().get("reverse").spec()
TOML_BOMB = "x = " + "[" * 3000 + "]" * 3000 + "\n"  # 6 KB


@pytest.fixture
def job(tmp_path) -> Path:
    return Path(shutil.copytree(GOOD, tmp_path / "job",
                                ignore=shutil.ignore_patterns("__pycache__")))


def bomb(job: Path, kind: str) -> tuple[Path, str]:
    """Plant one bomb in `job`; returns it with a needle of the message that must name it."""
    if kind == "config_toml":
        (job / "config.toml").write_text(TOML_BOMB)
        return job, "nested too deeply"
    if kind == "pyproject_toml":
        (job / "env" / "pyproject.toml").write_text(TOML_BOMB)
        return job, "nested too deeply"
    if kind == "surrogate_prompt":
        rows = (job / "data" / "train.jsonl").read_text().splitlines()
        rows[3] = json.dumps({"prompt": "reverse \ud800abc", "answer": "cba"})  # "\\ud800"
        (job / "data" / "train.jsonl").write_text("\n".join(rows) + "\n")
        return job, "not valid Unicode"
    if kind == "huge_reward":
        shutil.rmtree(job)
        return make_job(job, reward="return 10**400"), "too large"
    raise ValueError(kind)


def test_toml_nesting_bombs_are_parse_errors_of_the_job(job):
    bomb(job, "config_toml")
    with pytest.raises(JobConfigError, match="nested too deeply"):
        load_job_config(job / "config.toml")
    (job / "config.toml").write_text((GOOD / "config.toml").read_text())
    bomb(job, "pyproject_toml")
    with pytest.raises(LayoutError, match="nested too deeply"):
        read_layout(job)


@pytest.mark.parametrize("text, needle", [
    ("max_steps = " + "9" * 5000 + "\n", "too many digits"),  # tomllib raises ValueError
    ("x" + ".x" * 20 + " = 1\n", "dotted more than 16 levels"),
    ("[x" + ".x" * 20 + "]\n", "dotted more than 16 levels"),
    ('"x"' + ' . "x"' * 20 + " = 1\n", "dotted more than 16 levels"),
    ("# padding\n" * 2000, "over 16,384 bytes"),  # 20 KB; a real one is < 4 KB
])
def test_toml_tomllib_trips_or_crawls_on_is_refused_with_what_to_fix(job, text, needle):
    (job / "config.toml").write_text(text)
    with pytest.raises(JobConfigError, match=needle):
        load_job_config(job / "config.toml")
    (job / "config.toml").write_text((GOOD / "config.toml").read_text())
    (job / "env" / "pyproject.toml").write_text(text)
    with pytest.raises(LayoutError, match=needle):
        read_layout(job)


def test_the_depth_scan_is_fast_and_passes_ordinary_toml(job):
    import time

    from nestor.job.config import _DEEP_KEY

    for name in ("config.toml", "env/pyproject.toml"):  # a real job's files pass the scan
        assert _DEEP_KEY.search((GOOD / name).read_text()) is None
    assert _DEEP_KEY.search('a.b.c = "1.2.3.4.5.6.7.8"\nurl = "https://x.y.z/a.b.c"\n') is None
    start = time.perf_counter()  # a guard against catastrophic backtracking (minutes), not a
    for worst in ("a" * 16000, "a." * 8000, '"' * 16000, "a.b." * 4000 + "\n" + "a " * 8000):
        _DEEP_KEY.search(worst)  # speed target: ~ms each here
    assert time.perf_counter() - start < 5


def test_config_toml_is_parsed_once_by_the_static_checks(job, monkeypatch):
    import tomllib

    from nestor.job.file_checks import trusted_checks
    from nestor.job.report import CheckLog

    (job / "config.toml").write_text('base_model = "nope"\nmax_steps = 0\n')
    calls, loads = [], tomllib.loads
    monkeypatch.setattr(tomllib, "loads", lambda text: calls.append(text) or loads(text))
    report = CheckLog()
    trusted_checks(job, None, 150_000, report)
    assert len(calls) == 1
    message = report.checks[0].message
    assert "max_steps" in message and "'nope' is not a known model" in message


def test_rewards_no_float_can_hold_and_undecodable_text_are_named():
    value, why = tasksource._reward_float(10**400)
    assert value is None and "too large" in why
    assert tasksource._reward_float(0.5) == (0.5, None)
    err = tasksource._undecodable([{"prompt": "ok"}, {"prompt": "bad \ud800", "answer": "x"}])
    assert "task 1's prompt is not valid Unicode" in err
    assert tasksource._undecodable([{"prompt": "ok", "answer": None}]) is None


def test_a_probe_that_trips_on_a_job_fails_the_job_not_the_harness(job, monkeypatch):
    """Whatever unforeseen error a job provokes in the probe is the job's failed check."""
    import nestor.job.validate as validate

    def trips(_root):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(validate, "read_layout", trips)
    report = validate_job(job, SPEC)
    assert not report.passed and not report.harness_failure
    assert "RecursionError" in report.failed()[0].message
    assert "not your job's fault" not in report.summary()


def test_run_job_never_raises(job, monkeypatch):
    import nestor.inner.run as run

    def trips(_root):
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(run, "read_layout", trips)
    result = run_job(JobRequest(job_dir=job, task_id="reverse"))
    assert result.status == "failed" and "OverflowError" in result.log_tail


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["config_toml", "pyproject_toml", "surrogate_prompt",
                                  "huge_reward"])
def test_every_bomb_is_a_failed_check_and_a_status(job, kind):
    job, needle = bomb(job, kind)
    report = validate_job(job, SPEC, timeouts=SHORT, dry_run=False)
    assert not report.passed and not report.harness_failure, report.summary()
    assert needle in report.summary(), report.summary()
    result = run_job(JobRequest(job_dir=job, task_id="reverse", max_steps=1),
                     warm=WarmState(threads=1))
    assert result.status in ("invalid", "failed"), result
    assert needle in result.log_tail or kind == "huge_reward", result.log_tail
