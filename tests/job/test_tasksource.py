"""The sandboxed reward server: data out, rewards back, one clean child per job."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from nestor.job import tasksource
from nestor.job.tasksource import JobTaskSource, TaskSourceError
from nestor.sandbox import hosts, sandbox_backend

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"


def _copy(tmp_path, name: str, edit=None) -> Path:
    job = Path(shutil.copytree(GOOD, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__")))
    if edit:
        init = job / "env" / "reverse_job" / "__init__.py"
        init.write_text(edit(init.read_text()))
    return job


def test_prompts_answers_and_rewards():
    with JobTaskSource(GOOD) as src:
        prompts, answers = src.prompts(), src.answers()
        assert len(prompts) == 2000 and prompts[0] == "reverse emub" and answers[0] == "bume"
        rewards = src.score([0, 0, 0, 1], ["bume", " bume. ", "bumx", ""])
        assert rewards[:2] == [1.0, 1.0] and 0 < rewards[2] < 1 and rewards[3] == 0.0
        batch = src.score_batch([0], ["bumx"])
        assert batch.components == [{"exact": 0.0, "positions": 0.75}]
        with pytest.raises(ValueError, match="out of range"):
            src.score([5000], ["x"])


def test_out_of_range_reward_raises_for_the_trainer(tmp_path):
    job = _copy(tmp_path, "big", lambda s: s.replace(
        "return same / max(len(reply), len(answer))", "return 5.0 * same"))
    with JobTaskSource(job) as src, pytest.raises(TaskSourceError, match=r"outside \[0, 1\]"):
        src.score([0], ["bume"])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_next_job_is_served_by_the_same_host_in_fresh_processes(tmp_path):
    """Job A leaves marks in its interpreter; job B runs on the same warm host (no second
    verifiers import) but in new processes forked from the clean zygote."""
    marker = "import builtins, os\nbuiltins.LEAK = 1\nos.environ['LEAK'] = '1'\n"
    a = _copy(tmp_path, "a", lambda s: marker + s)
    b = _copy(tmp_path, "b", lambda s: s.replace(
        "return float(normalise(trace.last_reply) == self.data.answer)",
        "import builtins, os\n        return float(hasattr(builtins, 'LEAK') or "
        "'LEAK' in os.environ)"))
    with JobTaskSource(a) as src:
        src.load()
        host_a, job_a = src._zygote, src.info["job"]
    if not host_a.hello.get("fresh_ns"):
        pytest.skip(f"no fresh namespaces here: {host_a.hello.get('fresh_ns_error')}")
    assert host_a.alive and host_a in tasksource._idle  # ended cleanly: kept warm
    with JobTaskSource(b) as src:
        assert src.score_batch([0], ["x"]).components[0]["exact"] == 0.0
        assert src._zygote is host_a
        job_b, hello_b = src.info["job"], src.info["host"]
    assert job_b["host"] == job_a["host"] and job_b["jobs"] == job_a["jobs"] + 1
    assert hello_b["import_s"] == host_a.hello["import_s"]  # one verifiers import for both
    assert job_b["fresh_ns"] is True


def test_without_fresh_namespaces_each_job_gets_its_own_host(tmp_path):
    """The fallback (forced here by the trusted side): one host per job, killed on close."""
    with JobTaskSource(GOOD, fresh_ns=False) as src:
        assert src.score([0], ["bume"]) == [1.0]
        host = src._zygote
        assert host.hello["fresh_ns"] is False and "--no-fresh-ns" in host.hello["fresh_ns_error"]
    assert not host.alive and not _pid_alive(host.process._proc.pid)
    deadline = time.monotonic() + 10
    while not any(z.fresh_ns is False for z in tasksource._idle) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(z.alive and z.fresh_ns is False for z in tasksource._idle)  # its successor
    with JobTaskSource(GOOD, fresh_ns=False) as src:
        assert src._zygote is not host and src.score([0], ["bume"]) == [1.0]


def test_a_host_that_never_opened_its_job_is_kept(tmp_path):
    with JobTaskSource(GOOD) as src:
        host = src._zygote  # staged, never started: no job code ran in it
    assert host.alive and host in tasksource._idle
    with JobTaskSource(GOOD) as src:
        assert src._zygote is host and len(src.prompts()) == 2000


def test_a_dead_child_reopens_the_same_job(tmp_path):
    job = _copy(tmp_path, "exit", lambda s: "import os\nos._exit(3)\n" + s)
    with JobTaskSource(job) as src:
        with pytest.raises(TaskSourceError, match="exited with code 3") as err:
            src.import_env()
        assert err.value.stage == "import"
        host = src._zygote
    with JobTaskSource(GOOD) as src:
        assert src._zygote is not host and len(src.prompts()) == 2000


def test_each_job_gets_its_own_cpu_limit(tmp_path):
    from nestor.job.tasksource import TRAIN_LIMITS, Timeouts

    spin = _copy(tmp_path, "spin", lambda s: s.replace("    def load(self):\n",
                                                       "    def load(self):\n        while True: pass\n"))
    limits = TRAIN_LIMITS.model_copy(update={"cpu_s": 1})
    with JobTaskSource(spin, limits=limits, timeouts=Timeouts(load_s=30)) as src:
        with pytest.raises(TaskSourceError, match="CPU time limit"):
            src.load()
    with JobTaskSource(GOOD) as src:
        assert src.score([0], ["bume"]) == [1.0]


@pytest.mark.skipif(sandbox_backend() != "bubblewrap", reason="a private /tmp needs bubblewrap")
def test_the_next_job_finds_a_clean_tmp_and_dev_shm(tmp_path):
    a = _copy(tmp_path, "a", lambda s: "open('/tmp/note', 'w').write('a')\n"
              "open('/dev/shm/note', 'w').write('a')\n" + s)
    b = _copy(tmp_path, "b", lambda s: s.replace(
        "return float(normalise(trace.last_reply) == self.data.answer)",
        "import os\n        return float(os.path.exists('/tmp/note') or "
        "os.path.exists('/dev/shm/note') or any(not e.is_dir() for d in ('/tmp', '/dev/shm') "
        "for e in os.scandir(d)))"))  # directories only: the parents of binds below /tmp
    with JobTaskSource(a) as src:
        src.load()
        host = src._zygote
    with JobTaskSource(b) as src:
        assert src.score_batch([0], ["x"]).components[0]["exact"] == 0.0
        assert src._zygote is host or not host.hello.get("fresh_ns")  # the warm path


def test_a_job_that_forges_replies_costs_its_host(tmp_path):
    forge = ("import __main__\n__main__.PROTOCOL.write('{\"ok\": true}\\n')\n"
             "__main__.PROTOCOL.flush()\n")
    job = _copy(tmp_path, "forge", lambda s: forge + s)
    with JobTaskSource(job) as src:
        with pytest.raises(TaskSourceError):
            src.load()
        forged_host = src._zygote
    assert forged_host not in tasksource._idle and not forged_host.alive


@pytest.mark.parametrize("reply, needle", [
    ("'[' * 200000", "nested more than"),  # RecursionError inside json, caught
    ("'{\"a\": ' * 30 + '1' + '}' * 30", "nested more than"),  # parses; too deep for us
    ("'{\"ok\": true, \"rewards\": 7, \"errors\": 7, \"components\": 7}'", "another shape"),
])
def test_a_hostile_reply_ends_the_host_with_a_clear_error(tmp_path, reply, needle):
    code = ("import __main__\n__main__.PROTOCOL.write(" + reply + " + '\\n')\n"
            "__main__.PROTOCOL.flush()\n")
    job = _copy(tmp_path, "deep", lambda s: s.replace(
        "return float(normalise(trace.last_reply) == self.data.answer)",
        code.replace("\n", "\n        ") + "return 1.0"))
    with JobTaskSource(job) as src:
        src.load()
        with pytest.raises(TaskSourceError) as err:
            src.score_batch([0], ["x"])
        assert err.value.stage == "score" and needle in str(err.value), str(err.value)
        assert not src._zygote.alive  # that host is ended


def test_a_host_is_retired_after_its_last_job(monkeypatch):
    monkeypatch.setattr(hosts, "MAX_JOBS_PER_HOST", 1)  # the host pool lives in sandbox/
    with JobTaskSource(GOOD) as src:
        assert src.score([0], ["bume"]) == [1.0]
        host = src._zygote
    assert not host.alive and host not in tasksource._idle


@pytest.mark.skipif(sandbox_backend() != "bubblewrap", reason="the job host's sandbox")
def test_a_host_that_cannot_unshare_says_so_and_serves_one_job(tmp_path):
    """Fail closed: under the ordinary filter (unshare refused) the host's trial run fails;
    it says why in `hello` and refuses a second job."""
    from nestor.sandbox import SandboxedProcess
    from nestor.sandbox.seccomp import filter_program

    bpf = tmp_path / "seccomp.bpf"
    bpf.write_bytes(filter_program())
    stage = tmp_path / "jobs"
    shutil.copytree(GOOD, stage / "a", ignore=shutil.ignore_patterns("__pycache__"))
    binds = {**tasksource.HOST_FILES, str(bpf): tasksource.FILTER_IN,
             str(stage): tasksource.JOBS_IN}
    with SandboxedProcess([sys.executable, "-I", tasksource.HOST_IN], ro_binds=binds,
                          limits=tasksource.TRAIN_LIMITS, cwd="/tmp") as host:
        hello = host.request({"cmd": "hello"}, timeout_s=90)
        assert hello["fresh_ns"] is False and "unshare" in hello["fresh_ns_error"], hello
        job = {"cmd": "job", "dir": "/jobs/a"}
        assert host.request(job, timeout_s=30)["ok"] is True
        assert host.request({"cmd": "import", "package": "reverse_job"}, timeout_s=30)["ok"]
        assert host.request({"cmd": "end"}, timeout_s=30)["ended"] is True
        second = host.request(job, timeout_s=30)
        assert second["ok"] is False and "one job only" in second["error"], second


def test_a_jobs_stderr_tail_holds_none_of_the_previous_jobs_output(tmp_path):
    a = _copy(tmp_path, "a", lambda s: "import sys\nprint('SECRET-OF-A', file=sys.stderr)\n" + s)
    b = _copy(tmp_path, "b", lambda s: "import sys\nprint('OUTPUT-OF-B', file=sys.stderr)\n" + s)
    with JobTaskSource(a) as src:
        src.import_env()
        deadline = time.monotonic() + 5
        while "SECRET-OF-A" not in src.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "SECRET-OF-A" in src.stderr_tail()
        host = src._zygote
    with JobTaskSource(b) as src:
        src.import_env()
        deadline = time.monotonic() + 5
        while "OUTPUT-OF-B" not in src.stderr_tail() and time.monotonic() < deadline:
            time.sleep(0.05)
        tail = src.stderr_tail(100_000)
        assert "OUTPUT-OF-B" in tail and "SECRET-OF-A" not in tail, tail
        assert src._zygote is host or not host.hello.get("fresh_ns")  # the warm path


def test_a_job_that_cannot_be_staged_releases_its_host_once(tmp_path):
    job = _copy(tmp_path, "link")
    (job / "env" / "reverse_job" / "extra.py").symlink_to(job / "config.toml")
    with pytest.raises(TaskSourceError, match="could not stage"):
        JobTaskSource(job, package="reverse_job")
    import gc

    gc.collect()  # the half-built source's __del__ must not release its host a second time
    assert len(tasksource._idle) == len(set(map(id, tasksource._idle)))


def test_a_host_started_from_a_short_lived_thread_outlives_it():
    import threading

    tasksource.shutdown_hosts()
    t = threading.Thread(target=lambda: tasksource.prewarm(wait=True))
    t.start()
    t.join()
    time.sleep(0.5)  # bwrap's parent-death signal, were the host a child of that thread
    assert tasksource._idle and all(z.alive for z in tasksource._idle)


def test_the_trusted_side_rechecks_the_caps_job_code_can_patch(tmp_path):
    """protocol.py's caps run in the sandbox, beside the job's code, which can change them."""
    patch = ("import sys, __main__\nsys.modules['nestor_protocol'].MAX_TEXT = 10**9\n"
             "_load = __main__.COMMANDS['load']\n"
             "__main__.COMMANDS['load'] = lambda req: _load({**req, 'max_tasks': 10**9})\n")
    job = _copy(tmp_path, "patched", lambda s: patch + s)
    with JobTaskSource(job, max_tasks=100) as src, \
            pytest.raises(TaskSourceError, match="2,000 tasks, over the cap of 100"):
        src.load()
    data = job / "data" / "train.jsonl"
    data.write_text('{"prompt": "' + "a" * 20_000 + '", "answer": "x"}\n' + data.read_text())
    with JobTaskSource(job) as src, \
            pytest.raises(TaskSourceError, match="task 0's prompt is 20,000 characters"):
        src.load()


def test_names_in_replies_are_cleaned_and_bounded(tmp_path):
    """A reward named with a lone surrogate cannot reach sqlite; a 100 KB class name cannot
    reach a report."""
    tail = ("\nsetattr(ReverseTask, 'r\\ud800', ReverseTask.__dict__['exact'])\n"
            "ReverseTaskset.__name__ = 'T' * 100_000\n")
    job = _copy(tmp_path, "names", lambda s: s + tail)
    with JobTaskSource(job) as src:
        info = src.import_env()
        assert "r\ufffd" in info["rewards"] and len(info["taskset"]) < 300
        for text in [info["taskset"], *info["rewards"]]:
            text.encode("utf-8")  # raises on a surrogate


def test_clean_text_bounds_what_it_keeps():
    assert tasksource.clean_text("x" * 5000, 100) == "x" * 100 + "… (5,000 characters)"
    assert tasksource.clean_text("a\ud800") == "a\ufffd"


def test_rows_over_the_reply_cap_say_what_to_do(tmp_path):
    """load()'s rows come back as one reply line, capped (16 × output_bytes): the error names
    the cap and the fix."""
    job = _copy(tmp_path, "many")
    row = '{"prompt": "reverse ' + "ab" * 90 + '", "answer": "x"}\n'
    (job / "data" / "train.jsonl").write_text(row * 20_000)  # ~4 MB of reply
    with JobTaskSource(job) as src, pytest.raises(TaskSourceError) as err:
        src.load()
    message = str(err.value)
    assert err.value.stage == "load" and "longer than 3,200,000 bytes" in message, message
    assert "yield fewer or shorter rows" in message


def test_the_trusted_text_cap_is_the_protocols():
    """MAX_TEXT is written twice: protocol.py runs in the sandbox and is never imported here."""
    import re

    source = (Path(tasksource.__file__).with_name("protocol.py")).read_text()
    assert int(re.search(r"^MAX_TEXT = ([\d_]+)", source, re.M).group(1)) == tasksource.MAX_TEXT
