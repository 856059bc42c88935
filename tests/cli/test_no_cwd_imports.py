"""No code of a job ever imports in a trusted process: every CLI command, started from inside a
hostile job directory whose root shadows the libraries nestor imports, imports none of them.

Each shadowing module writes a marker next to itself when imported. (Inside the sandbox the job
sees a staged read-only copy, so a marker can only come from the trusted side.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD_ADD = ROOT / "examples" / "jobs" / "good-add"
SHADOWS = ("torch", "transformers", "tokenizers", "safetensors", "peft", "tomli_w", "nestor",
           "verifiers", "numpy", "typer", "rich", "pydantic")
MARK = "import pathlib as _p\n_p.Path(__file__).with_suffix('.IMPORTED').write_text('x')\n"


@pytest.fixture
def hostile_job(tmp_path) -> Path:
    job = tmp_path / "job"
    shutil.copytree(GOOD_ADD, job, ignore=shutil.ignore_patterns("__pycache__"))
    for name in SHADOWS:
        (job / f"{name}.py").write_text(MARK)
    # settings of its own: a plugin file to import, weights and a pre-score cache of its own
    (job / "plugin.py").write_text(MARK)
    (job / "nestor.toml").write_text('[nestor]\ntask_modules = ["./plugin.py"]\n'
                                     'cache_dir = "cache"\n'
                                     '[nestor.model_paths]\n"tiny-m" = "weights"\n')
    return job


def _nestor(job: Path, tmp_path: Path, *args: str, module: bool = False,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """`nestor ARGS` started in `job`: as the console script does (its own dir first on
    sys.path), or as `python -m nestor.cli.main` (the cwd first)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NESTOR_HOME": str(tmp_path / "home"),
           "OMP_NUM_THREADS": "1"}
    if module:
        argv = [sys.executable, "-m", "nestor.cli.main", *args]
    else:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        entry = bin_dir / "nestor"
        entry.write_text("import sys\nfrom nestor.cli import app\nsys.exit(app())\n")
        argv = [sys.executable, str(entry), *args]
    return subprocess.run(argv, cwd=job, env=env, capture_output=True, text=True, timeout=timeout)


def _imported(job: Path) -> list[str]:
    return sorted(p.stem for p in job.rglob("*.IMPORTED"))


def test_tasks_list_and_eval_import_nothing_of_the_job(hostile_job, tmp_path):
    out = _nestor(hostile_job, tmp_path, "tasks", "list", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    out = _nestor(hostile_job, tmp_path, "eval", "--model", "tiny-m", "--task", "add", "--n", "2",
                  "--no-cache", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert _imported(hostile_job) == [] and not (hostile_job / "cache").exists()


def test_python_dash_m_drops_the_cwd(hostile_job, tmp_path):
    """`python -m` puts the cwd first on sys.path; nestor drops it before importing anything
    (a `nestor.py` there is found by Python itself first: that form needs `python -P`)."""
    (hostile_job / "nestor.py").unlink()
    out = _nestor(hostile_job, tmp_path, "tasks", "list", "--json", module=True)
    assert out.returncode == 0, out.stderr[-2000:]  # typer, rich, pydantic: ours
    assert _imported(hostile_job) == []


@pytest.mark.slow
def test_validate_train_and_episode_import_nothing_of_the_job(hostile_job, tmp_path):
    """`job validate` as `python -m` (the console-script form's probe runs in `episode run`)."""
    (hostile_job / "nestor.py").rename(tmp_path / "nestor.py")  # `python -m`: see above
    out = _nestor(hostile_job, tmp_path, "job", "validate", ".", "--task", "add", "--json",
                  module=True)
    (tmp_path / "nestor.py").rename(hostile_job / "nestor.py")
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    out = _nestor(hostile_job, tmp_path, "job", "train", ".", "--task", "add", "--max-steps", "1",
                  "--out", str(tmp_path / "out"), "--json")
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    out = _nestor(hostile_job, tmp_path, "episode", "run", "--task", "add", "--policy", "composer",
                  "--no-train", "--max-turns", "2", "--run-dir", str(tmp_path / "run"), "--json")
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert _imported(hostile_job) == []


def test_a_job_dir_on_sys_path_is_dropped_and_its_settings_ignored(hostile_job, tmp_path):
    """What Ray does with the driver's cwd (puts it on its workers' sys.path), and a job's own
    nestor.toml; a project whose virtualenv is called env/ keeps both. (A `nestor.py` there
    would be found before any of ours runs: docs/sandbox.md's known gaps.)"""
    (hostile_job / "nestor.py").unlink()
    project = tmp_path / "project"
    (project / "env").mkdir(parents=True)
    (project / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (project / "config.toml").write_text("")
    (project / "nestor.toml").write_text('[nestor]\ncache_dir = "/from/the/project"\n')
    code = ("import sys; sys.path[:0] = [{job!r}, {project!r}]\n"
            "import nestor\nfrom nestor.config import load_settings\n"
            "print({job!r} in sys.path, {project!r} in sys.path, load_settings().cache_dir)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cwd, cache in ((hostile_job, "cache"), (project, "/from/the/project")):
        out = subprocess.run([sys.executable, "-c", code.format(job=str(hostile_job),
                                                                project=str(project))],
                             cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        job_on_path, project_on_path, cache_dir = out.stdout.split()
        assert job_on_path == "False" and project_on_path == "True"
        assert (cache_dir == cache) == (cwd == project)
    assert _imported(hostile_job) == []
