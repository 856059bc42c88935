"""Every example job gets the verdict it was written for: good and wrong-rubric jobs pass the
probe, each bad-<check> job fails exactly <check>."""

from pathlib import Path

import pytest

from nestor.job.validate import validate_job
from nestor.tasks import TaskRegistry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
JOBS = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())
REGISTRY = TaskRegistry()


def _task(name: str) -> str:
    return "reverse" if name.startswith("bad-") else name.rsplit("-", 1)[-1]


def test_examples_cover_the_issue():
    checks = {n.removeprefix("bad-") for n in JOBS if n.startswith("bad-")}
    assert {"files", "config", "budget", "dataset", "imports", "taskset", "load", "context",
            "rewards_valid", "deterministic", "reward_speed", "reference_beats_empty",
            "reference_beats_corrupted", "not_constant", "dry_run", "memory"} <= checks
    strings = {t.id for t in REGISTRY.tasks(family="strings")}
    assert {f"good-{t}" for t in strings} <= set(JOBS)
    families = {REGISTRY.get(_task(n)).family.name for n in JOBS if n.startswith("good-")}
    assert {"strings", "arithmetic", "counting"} <= families
    assert any(n.startswith("wrong-rubric-") for n in JOBS)


@pytest.mark.parametrize("name", JOBS)
def test_example_verdict(name):
    if name == "bad-dry_run":
        from nestor.models.registry import ModelNotFoundError, resolve_model_dir

        try:
            resolve_model_dir("qwen3-1.7b")
            pytest.skip("Qwen3-1.7B weights are installed here, so its dry run can succeed")
        except ModelNotFoundError:
            pass
    report = validate_job(EXAMPLES / name, REGISTRY.get(_task(name)).spec())
    failed = [c.name for c in report.failed()]
    if name.startswith("bad-"):
        assert failed == [name.removeprefix("bad-")], report.summary()
        (check,) = report.failed()
        assert len(check.message) > 20  # says what to fix
    else:
        assert report.passed, report.summary()
        names = [c.name for c in report.checks]
        assert "dry_run" in names and "reference_beats_corrupted" in names
    assert not report.harness_failure  # every verdict above is the job's own


def test_a_sandbox_that_does_not_start_in_time_is_not_the_jobs_fault():
    from nestor.job.tasksource import Timeouts

    report = validate_job(EXAMPLES / "good-length", REGISTRY.get("length").spec(), warm=False,
                          dry_run=False, timeouts=Timeouts(start_s=0.01))
    assert not report.passed and report.harness_failure
    assert [c.name for c in report.failed()] == ["imports"]
    assert "not your job's fault" in report.failed()[0].message
