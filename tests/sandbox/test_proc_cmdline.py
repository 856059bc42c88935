"""Nothing inside the sandbox shows the host's paths of its binds: bwrap (the sandbox's pid 1)
takes its options from a memfd, so /proc/1/cmdline holds no `--ro-bind HOST DST`."""

import sys

import pytest

from nestor.sandbox import Limits, run_sandboxed, sandbox_backend

SHOW = ("import os\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n        print(open(f'/proc/{pid}/cmdline', 'rb').read())\n"
        "    except OSError as e:\n        print(pid, e)\n")


def test_no_bind_source_in_any_cmdline(tmp_path):
    if sandbox_backend() != "bubblewrap":
        pytest.skip("needs bubblewrap")
    job = tmp_path / "secret-host-path-of-the-job"
    job.mkdir()
    res = run_sandboxed([sys.executable, "-c", SHOW], ro_binds={str(job): "/job"},
                        limits=Limits(wall_s=30))
    assert res.returncode == 0, res.stderr
    assert "--args" in res.stdout  # pid 1 is bwrap, as started
    assert str(job) not in res.stdout and "secret-host-path" not in res.stdout
    assert "--ro-bind" not in res.stdout
