"""The trusted side never follows a job's links: symlinks, hard links and special files are a
failed `files` check, reads are capped by bytes read, and the staged copy is made of fresh files."""

import os
import shutil
import stat
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nestor.cli import app
from nestor.job import safe_read
from nestor.job.config import JobConfigError, load_job_config
from nestor.job.file_checks import check_dataset
from nestor.job.layout import LayoutError, read_layout
from nestor.job.validate import validate_job
from nestor.tasks import TaskRegistry

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
SPEC = TaskRegistry().get("reverse").spec()
SECRET = '{"prompt": "TOP-SECRET-outside-the-job", "answer": "x"}'


@pytest.fixture
def job(tmp_path) -> Path:
    return Path(shutil.copytree(GOOD, tmp_path / "job",
                                ignore=shutil.ignore_patterns("__pycache__")))


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "outside.jsonl"
    path.write_text(SECRET + "\n")
    return path


def _replace_data(job: Path, make) -> Path:
    data = job / "data" / "train.jsonl"
    data.unlink()
    make(data)
    return data


def _everything(report) -> str:
    return report.model_dump_json()


def test_symlinked_dataset_is_a_failed_files_check_and_never_read(job, secret):
    _replace_data(job, lambda d: d.symlink_to(secret))
    report = validate_job(job, SPEC, dry_run=False)
    failed = {c.name: c.message for c in report.failed()}
    assert list(failed) == ["files"], report.summary()
    assert "data/train.jsonl is a symbolic link" in failed["files"]
    assert "TOP-SECRET" not in _everything(report)  # the outside file's content never shows


def test_symlinked_directory_on_the_way_is_refused(job, tmp_path, secret):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(secret, outside / "train.jsonl")
    shutil.rmtree(job / "data")
    (job / "data").symlink_to(outside)
    with pytest.raises(LayoutError, match="data is a symbolic link"):
        read_layout(job)
    ok, message = check_dataset(job / "data" / "train.jsonl", root=job)
    assert not ok and "TOP-SECRET" not in message and "symbolic link" in message


def test_hardlinked_dataset_is_refused(job, secret):
    _replace_data(job, lambda d: os.link(secret, d))
    report = validate_job(job, SPEC, dry_run=False)
    assert [c.name for c in report.failed()] == ["files"]
    assert "hard link" in report.failed()[0].message
    assert "TOP-SECRET" not in _everything(report)


def test_fifo_does_not_hang_the_probe(job):
    _replace_data(job, lambda d: os.mkfifo(d))
    out = {}
    t = threading.Thread(target=lambda: out.update(r=validate_job(job, SPEC, dry_run=False)),
                         daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "validating a job with a FIFO hung"
    assert [c.name for c in out["r"].failed()] == ["files"]
    assert "FIFO" in out["r"].failed()[0].message
    with pytest.raises(safe_read.UnsafeFileError, match="FIFO"):
        safe_read.read_bytes(job, "data/train.jsonl", 100)  # returns at once, opens nothing


def test_links_deep_in_the_env_package_are_refused(job, secret):
    (job / "env" / "reverse_job" / "extra.py").symlink_to(secret)
    with pytest.raises(LayoutError, match="env/reverse_job/extra.py is a symbolic link"):
        read_layout(job)


def test_size_caps_count_bytes_read_not_stat():
    # /proc files report st_size 0 whatever they hold.
    proc = Path("/proc/self/maps")
    assert proc.stat().st_size == 0
    with pytest.raises(safe_read.UnsafeFileError, match="over 16 bytes"):
        safe_read.read_bytes("/proc/self", "maps", 16)
    assert len(safe_read.read_bytes("/proc/self", "maps", 1 << 24)) > 16


def test_zero_size_but_large_dataset_is_capped(job, monkeypatch):
    # A file whose stat says 0 bytes (like /proc) but that reads past the cap.
    import nestor.job.file_checks as file_checks

    monkeypatch.setattr(file_checks, "MAX_DATA_BYTES", 64)
    real_fstat = os.fstat
    monkeypatch.setattr(os, "stat", _zero_size(os.stat))
    monkeypatch.setattr(os, "fstat", _zero_size(real_fstat))
    ok, message = check_dataset(job / "data" / "train.jsonl", root=job)
    assert not ok and "over 64 bytes" in message


def _zero_size(fn):
    def wrapped(*a, **kw):
        st = fn(*a, **kw)
        if stat.S_ISREG(st.st_mode):
            values = list(st)
            values[6] = 0  # st_size
            return os.stat_result(values)
        return st
    return wrapped


def test_config_is_read_without_following_links(job, tmp_path):
    outside = tmp_path / "real.toml"
    shutil.move(job / "config.toml", outside)
    (job / "config.toml").symlink_to(outside)
    with pytest.raises(JobConfigError, match="symbolic link"):
        load_job_config(job / "config.toml")


def test_staged_copy_is_fresh_files(job, tmp_path):
    dst = tmp_path / "stage"
    safe_read.copy_tree(job, dst)
    data = dst / "data" / "train.jsonl"
    assert data.read_bytes() == (job / "data" / "train.jsonl").read_bytes()
    st = data.stat()
    assert st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o644
    assert st.st_ino != (job / "data" / "train.jsonl").stat().st_ino


def test_staged_copy_refuses_a_hardlink(job, tmp_path, secret):
    os.chmod(secret, 0o600)  # private to us: must not become world-readable in the stage
    os.link(secret, job / "env" / "reverse_job" / "notes.txt")
    dst = tmp_path / "stage"
    with pytest.raises(safe_read.UnsafeFileError, match="hard link"):
        safe_read.copy_tree(job, dst)
    assert not (dst / "env" / "reverse_job" / "notes.txt").exists()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_cli_validate_train_export_refuse_a_linked_job(job, secret, tmp_path):
    _replace_data(job, lambda d: d.symlink_to(secret))
    runner = CliRunner()
    for args in (["job", "validate", str(job), "--task", "reverse", "--json"],
                 ["job", "train", str(job), "--task", "reverse", "--json"],
                 ["job", "export", str(job), "--prime-rl", str(tmp_path / "rl.toml")]):
        result = runner.invoke(app, args)
        assert result.exit_code != 0, args
        assert "symbolic link" in result.output, (args, result.output)
        assert "TOP-SECRET" not in result.output


def test_task_source_refuses_to_stage_a_special_file(job):
    from nestor.job.tasksource import JobTaskSource, TaskSourceError

    os.mkfifo(job / "env" / "reverse_job" / "pipe")
    with pytest.raises(TaskSourceError, match="FIFO"):
        JobTaskSource(job, package="reverse_job")  # the package given: no layout check first
