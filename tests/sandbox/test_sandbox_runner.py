"""The runner's API: results, limits, the JSON-lines SandboxedProcess, and the fallbacks."""

import logging
import textwrap
import time

import pytest
from sandbox_helpers import PY, host_listener, processes_with

from nestor.sandbox import Limits, SandboxedProcess, SandboxError, run_sandboxed, sandbox_backend
from nestor.sandbox import backend as backend_mod

SERVER = textwrap.dedent("""
    import json, sys, time
    print("server up", file=sys.stderr, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        if op == "sleep":
            print("about to hang", file=sys.stderr, flush=True)
            time.sleep(60)
        elif op == "garbage":
            print("this is not json", flush=True)
        elif op == "list":
            print("[1, 2]", flush=True)
        elif op == "chatty":
            print(flush=True)  # blank lines are skipped
            print(json.dumps({"first": 1}), flush=True)
            print(json.dumps({"unasked": 2}), flush=True)
        elif op == "die":
            print("fatal: reward crashed", file=sys.stderr, flush=True)
            sys.exit(3)
        else:
            print(json.dumps({"echo": req, "n": len(line)}), flush=True)
""")


@pytest.fixture
def server_job(job_dir):
    (job_dir / "server.py").write_text(SERVER)
    return job_dir


def start(job_dir, marker="", **kw):
    return SandboxedProcess([PY, "/job/server.py", marker], ro_binds={job_dir: "/job"},
                            name="reward server", **kw)


def test_result_fields_for_a_clean_run():
    r = run_sandboxed([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    assert r.ok and r.returncode == 0 and r.reason is None
    assert r.stdout == "out\n" and r.stderr == "err\n"
    assert not r.timed_out and not r.truncated and r.elapsed_s > 0
    assert r.backend == sandbox_backend()


def test_nonzero_exit_is_reported_with_its_code():
    r = run_sandboxed([PY, "-c", "import sys; sys.exit(7)"])
    assert r.returncode == 7 and not r.ok
    assert r.reason == "exited with code 7"


def test_binds_accept_a_list_and_bad_binds_are_errors(job_dir):
    r = run_sandboxed([PY, "-c", f"print(open('{job_dir}/config.toml').read())"],
                      ro_binds=[job_dir])
    assert r.ok and "lr = 0.1" in r.stdout
    with pytest.raises(FileNotFoundError):
        run_sandboxed([PY, "-c", "pass"], ro_binds={job_dir / "missing": "/job"})
    with pytest.raises(ValueError):
        run_sandboxed([PY, "-c", "pass"], ro_binds={job_dir: "relative"})


def test_limits_are_validated():
    with pytest.raises(ValueError):
        Limits(cpu_s=0)
    with pytest.raises(ValueError):
        Limits(wall_s=-1)


def test_process_round_trips_many_requests(server_job):
    with start(server_job) as proc:
        assert proc.request({"a": 1}) == {"echo": {"a": 1}, "n": 9}
        big = "y" * 200_000  # larger than a pipe buffer, both ways
        for i in range(20):
            assert proc.request({"i": i, "big": big}, timeout_s=10)["echo"]["i"] == i
        assert proc.alive
        assert "server up" in proc.stderr_tail()
    assert not proc.alive


def test_process_rejects_replies_nobody_asked_for(server_job):
    with start(server_job) as proc:
        assert proc.request({"op": "chatty"}) == {"first": 1}
        time.sleep(0.2)
        with pytest.raises(SandboxError, match="without being asked"):
            proc.request({"a": 1})


def test_process_timeout_kills_and_reports_stderr(server_job, marker):
    proc = start(server_job, marker)
    with pytest.raises(SandboxError) as err:
        proc.request({"op": "sleep"}, timeout_s=0.5)
    msg = str(err.value)
    assert "reward server did not reply within 0.5 s" in msg and "about to hang" in msg
    assert not proc.alive and processes_with(marker) == []
    with pytest.raises(SandboxError, match="no longer running"):
        proc.request({"a": 1})
    proc.close()  # idempotent after a failure


@pytest.mark.parametrize("op, expected", [
    ("garbage", "not JSON: 'this is not json'"),
    ("list", "JSON that is not an object"),
    ("die", "exited with code 3"),
])
def test_process_failures_raise_sandbox_error(server_job, op, expected):
    with start(server_job) as proc:
        with pytest.raises(SandboxError, match=expected) as err:
            proc.request({"op": op}, timeout_s=5)
        assert not proc.alive
    if op == "die":
        assert "fatal: reward crashed" in str(err.value)


def test_process_that_fails_to_start_raises_with_stderr(job_dir):
    with SandboxedProcess([PY, "-c", "import sys; sys.exit('no such env package')"],
                          name="host") as proc:
        with pytest.raises(SandboxError, match="host exited with code 1") as err:
            proc.request({"op": "load"}, timeout_s=5)
    assert "no such env package" in str(err.value)


def test_close_leaves_no_process(server_job, marker):
    proc = start(server_job, marker)
    proc.request({"a": 1})
    assert processes_with(marker)
    proc.close()
    assert processes_with(marker) == []


@pytest.fixture
def forced_backend(monkeypatch):
    def force(name):
        monkeypatch.setenv(backend_mod.BACKEND_ENV, name)
        monkeypatch.setenv(backend_mod.WARNED_ENV, "0")  # so that teardown restores it
        monkeypatch.delenv(backend_mod.WARNED_ENV)
        backend_mod.detect_backend.cache_clear()
    yield force
    backend_mod.detect_backend.cache_clear()


def test_rlimits_fallback_translates_binds_and_warns_once(forced_backend, job_dir, caplog):
    forced_backend("rlimits-unsafe")
    with caplog.at_level(logging.WARNING, logger="nestor.sandbox"):
        assert sandbox_backend() == "rlimits"
        assert sandbox_backend() == "rlimits"
    assert len([r for r in caplog.records if "weaker" in r.message]) == 1
    r = run_sandboxed([PY, "-c", "import sys; print(open(sys.argv[1]).read())",
                       "/job/config.toml"], ro_binds={job_dir: "/job"})
    assert r.ok and r.backend == "rlimits" and "lr = 0.1" in r.stdout
    r = run_sandboxed([PY, "-c", "while True: pass"], limits=Limits(wall_s=0.5))
    assert r.timed_out


@pytest.mark.skipif(backend_mod._probe(bubblewrap=False) is not None,
                    reason="unshare --net is not permitted here")
def test_unshare_fallback_has_no_network(forced_backend):
    forced_backend("unshare-unsafe")
    with host_listener() as port:  # reachable from here: the sandbox alone must be what blocks
        r = run_sandboxed([PY, "-c", textwrap.dedent(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=2)
                print("CONNECTED")
            except OSError as e:
                print("BLOCKED", type(e).__name__)
        """)])
    assert r.ok and r.backend == "unshare", r
    assert "BLOCKED" in r.stdout and "CONNECTED" not in r.stdout


def test_unknown_forced_backend_is_a_clear_error(forced_backend):
    forced_backend("docker")
    with pytest.raises(ValueError, match="expected one of bubblewrap, unshare-unsafe, rlimits-unsafe"):
        sandbox_backend()

