"""host_ns.enter on its own: a job's fresh /tmp keeps what the sandbox bound below /tmp (a
virtualenv under /tmp, as in a CI checkout there) read-only, and hides everything else."""

import json
import sys
from pathlib import Path

import pytest

from nestor.sandbox import SandboxedProcess, sandbox_backend

HOST_NS = Path(__file__).resolve().parents[2] / "nestor" / "sandbox" / "host_ns.py"
SCRIPT = """
import json, os, sys
sys.path.insert(0, "/opt/nestor")
import host_ns
open("/tmp/left-by-the-host", "w").close()
shared = os.stat("/tmp").st_dev
host_ns.enter(1 << 20)
out = {"fresh": os.stat("/tmp").st_dev != shared,
       "left_visible": os.path.exists("/tmp/left-by-the-host"),
       "bound": open("/tmp/venv-like/lib/marker.txt").read()}
try:
    open("/tmp/venv-like/lib/new.txt", "w").close()
    out["bound_writable"] = True
except OSError:
    out["bound_writable"] = False
open("/tmp/mine.txt", "w").close()  # the fresh tmpfs is the job's to write
sys.stdin.readline()
print(json.dumps(out), flush=True)
"""


@pytest.mark.skipif(sandbox_backend() != "bubblewrap", reason="needs bubblewrap")
def test_a_fresh_tmp_keeps_the_sandboxs_binds_below_it_read_only(tmp_path):
    venv = tmp_path / "venv-like" / "lib"
    venv.mkdir(parents=True)
    (venv / "marker.txt").write_text("site-packages")
    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    for p in (tmp_path, tmp_path / "venv-like", venv, venv / "marker.txt", script):
        p.chmod(0o755 if p.is_dir() else 0o644)
    with SandboxedProcess([sys.executable, "-I", "/opt/t.py"], zygote=True, ro_binds={
            str(script): "/opt/t.py", str(HOST_NS): "/opt/nestor/host_ns.py",
            str(tmp_path / "venv-like"): "/tmp/venv-like"}) as proc:
        reply = proc.request({"go": 1}, timeout_s=30)
    assert reply == {"fresh": True, "left_visible": False, "bound": "site-packages",
                     "bound_writable": False}, json.dumps(reply)
