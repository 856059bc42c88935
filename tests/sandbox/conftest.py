"""Fixtures of the sandbox tests: a job dir beside a run dir, a marker for leftover processes."""

import uuid

import pytest


@pytest.fixture
def marker() -> str:
    return f"nestor-test-{uuid.uuid4().hex}"


@pytest.fixture
def job_dir(tmp_path):
    """A job dir next to a sibling 'run dir' holding a secret, as in a real run."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "config.toml").write_text("lr = 0.1\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "secret.txt").write_text("hidden eval answers\n")
    return job
