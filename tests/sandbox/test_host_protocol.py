"""The job host's answers to lines that are not its requests: an error reply, then it serves on."""

import shutil
import sys
from pathlib import Path

import pytest

from nestor.sandbox import SandboxedProcess, hosts, sandbox_backend

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"


@pytest.mark.skipif(sandbox_backend() != "bubblewrap", reason="the job host's sandbox")
def test_a_line_that_is_not_a_request_is_answered_and_the_host_serves_on(tmp_path):
    stage = tmp_path / "jobs"
    shutil.copytree(GOOD, stage / "a", ignore=shutil.ignore_patterns("__pycache__"))
    binds = {**hosts.HOST_FILES, str(stage): hosts.JOBS_IN}
    argv = [sys.executable, "-I", hosts.HOST_IN, "--no-fresh-ns"]
    with SandboxedProcess(argv, ro_binds=binds, limits=hosts.TRAIN_LIMITS, cwd="/tmp") as host:
        assert host.request({"cmd": "hello"}, timeout_s=90)["ok"] is True
        for not_a_request in ({"command": "hello"}, {"cmd": {"hello": 1}}):
            bad = host.request(not_a_request, timeout_s=30)
            assert bad["ok"] is False and bad["error"].startswith("bad request"), bad
        early = host.request({"cmd": "import", "package": "reverse_job"}, timeout_s=30)
        assert early["ok"] is False and "no job is open for 'import'" in early["error"]
        assert host.request({"cmd": "job", "dir": "/jobs/a"}, timeout_s=30)["ok"] is True
        # With a job open, the zygote still answers these itself (a list `cmd` once reached
        # the job's server and killed it); a command it does not know goes to the job.
        for not_a_request in ({"cmd": ["import"]}, {"package": "reverse_job"}):
            bad = host.request(not_a_request, timeout_s=30)
            assert bad["ok"] is False and bad["error"].startswith("bad request"), bad
        unknown = host.request({"cmd": "rm -rf"}, timeout_s=30)
        assert unknown == {"ok": False, "stage": "host", "error": "unknown command 'rm -rf'"}
        imported = host.request({"cmd": "import", "package": "reverse_job"}, timeout_s=30)
        assert imported["ok"] is True, imported
        assert host.request({"cmd": "end"}, timeout_s=30)["ended"] is True
