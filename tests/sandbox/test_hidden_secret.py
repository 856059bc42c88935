"""The hidden-eval secret is not readable from inside the sandbox: where it lives by default
nothing is bound, and where a bound tree holds it anyway (NESTOR_HOME inside a job) it is
masked."""

import sys

import pytest

from nestor.sandbox import Limits, run_sandboxed, sandbox_backend
from nestor.tasks import secret

READ = ("import sys\n"
        "try:\n    print(repr(open(sys.argv[1], 'rb').read()))\n"
        "except OSError as e:\n    print('refused', type(e).__name__)\n")


@pytest.fixture(autouse=True)
def _bubblewrap():
    if sandbox_backend() != "bubblewrap":
        pytest.skip("needs bubblewrap")


def _read_inside(path: str, binds: dict) -> str:
    res = run_sandboxed([sys.executable, "-c", READ, path], ro_binds=binds,
                        limits=Limits(wall_s=30))
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_default_location_is_not_in_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("NESTOR_HOME", str(tmp_path / "home"))
    value = secret.hidden_secret()
    (tmp_path / "job").mkdir()
    out = _read_inside(str(secret.secret_path()), {str(tmp_path / "job"): "/job"})
    assert out.startswith("refused") and value.decode() not in out


def test_secret_under_a_bound_tree_is_masked(tmp_path, monkeypatch):
    job = tmp_path / "job"
    job.mkdir()
    monkeypatch.setenv("NESTOR_HOME", str(job / ".nestor"))
    value = secret.hidden_secret()
    (job / ".nestor").chmod(0o755)  # even were it open to others
    secret.secret_path().chmod(0o644)
    out = _read_inside("/job/.nestor/hidden_seed", {str(job): "/job"})
    assert value.decode() not in out and out in ("b''", "refused PermissionError")


def test_the_override_never_reaches_the_sandbox(monkeypatch):
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "research-seed-do-not-leak")
    res = run_sandboxed([sys.executable, "-c", "import os; print(sorted(os.environ.items()))"],
                        limits=Limits(wall_s=30))
    assert res.returncode == 0 and "research-seed-do-not-leak" not in res.stdout
