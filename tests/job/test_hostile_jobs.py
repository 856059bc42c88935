"""Hostile or broken job code ends as a failed check with a clear message, within its time
limit, and the harness (and the next job) carry on."""

import shutil
import time
import uuid
from pathlib import Path

import pytest

import nestor.tasks
from nestor.job import tasksource
from nestor.job.tasksource import Timeouts, prewarm
from nestor.job.validate import PROBE_LIMITS, validate_job
from nestor.sandbox import sandbox_backend
from nestor.tasks import TaskRegistry
from tests.sandbox.sandbox_helpers import host_listener, processes_with

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
SPEC = TaskRegistry().get("reverse").spec()
SHORT = Timeouts(start_s=90, import_s=2, load_s=2, score_s=2)
HIDDEN = Path(nestor.tasks.__file__).with_name("hidden.py")

HEAD = '''
import json, math, os, socket, sys, time
from pathlib import Path
import verifiers.v1 as vf
DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"

class D(vf.TaskData):
    answer: str
'''
TASKSET = '''
class TS(vf.Taskset[T, vf.TasksetConfig]):
    def load(self):
        LOAD_HOOK
        for line in DATA.open():
            row = json.loads(line)
            yield T(D(prompt=row["prompt"], answer=row["answer"]), self.config.task)

__all__ = ["TS"]
'''


def _reward(body: str) -> str:
    return f'''
class T(vf.Task[D]):
    @vf.reward(weight=1.0)
    async def r(self, trace: vf.Trace) -> float:
        reply = trace.last_reply
        {body}
'''


GOOD_REWARD = "return float(reply == self.data.answer)"


def make_job(root: Path, *, at_import: str = "", in_load: str = "pass",
             reward: str = GOOD_REWARD, tail: str | None = None) -> Path:
    shutil.copytree(GOOD, root, ignore=shutil.ignore_patterns("__pycache__"))
    code = HEAD + at_import + "\n" + _reward(reward) + (
        TASKSET.replace("LOAD_HOOK", in_load) if tail is None else tail)
    (root / "env" / "reverse_job" / "__init__.py").write_text(code)
    return root


def check(job: Path, name: str, *needles: str, within_s: float = 20.0,
          timeouts: Timeouts = SHORT):
    # One sandbox per job: every probe needs a fresh host. Start it first, so that the time
    # measured is the job's (a host start-up on a loaded machine is not what is tested here).
    prewarm(PROBE_LIMITS, wait=True)
    t0 = time.monotonic()
    report = validate_job(job, SPEC, timeouts=timeouts, dry_run=False)
    elapsed = time.monotonic() - t0
    failed = {c.name: c.message for c in report.failed()}
    assert name in failed, report.summary()
    for needle in needles:
        assert needle in failed[name], failed[name]
    assert elapsed < within_s
    return failed[name]


needs_bwrap = pytest.mark.skipif(sandbox_backend() != "bubblewrap",
                                 reason="filesystem isolation needs bubblewrap")


@needs_bwrap
def test_reads_outside_the_job_fail(tmp_path):
    secret = tmp_path / "run" / "ledger.txt"
    secret.parent.mkdir()
    secret.write_text("episode rewards")
    for path in (HIDDEN, secret, Path.home() / ".bashrc", Path.cwd() / "pyproject.toml"):
        job = make_job(tmp_path / f"job-{path.name}", at_import=f"open({str(path)!r}).read()")
        check(job, "imports", "FileNotFoundError")
    # nor can it import the harness
    check(make_job(tmp_path / "nestor", at_import="import nestor.tasks.hidden"), "imports",
          "No module named 'nestor'")


@pytest.mark.skipif(sandbox_backend() == "rlimits", reason="the rlimits fallback has no netns")
def test_network_is_unreachable(tmp_path):
    with host_listener() as port:  # reachable from here: the sandbox alone must be what blocks
        job = make_job(tmp_path / "j",
                       at_import=f"socket.create_connection(('127.0.0.1', {port}), 2)")
        check(job, "imports", "OSError")


@pytest.mark.skipif(sandbox_backend() != "bubblewrap",
                    reason="the fallbacks may run as root, where RLIMIT_NPROC is not enforced")
def test_fork_bomb(tmp_path):
    message = check(make_job(tmp_path / "j", at_import="while True:\n    os.fork()"), "imports",
                    within_s=15)
    # the process limit stops it, or its timeout does when the bomb starves it of CPU
    assert "BlockingIOError" in message or "did not finish within 2 s" in message
    # the harness is fine, and the next job validates
    assert validate_job(GOOD, SPEC, dry_run=False).passed


@pytest.mark.parametrize("hog", ["bytes(10**11)", "[b'x' * 10**7 for _ in range(10**4)]"])
def test_memory_bombs_in_load(tmp_path, hog):
    # filling the 1 GiB allowance takes seconds on a busy machine: a longer load timeout
    check(make_job(tmp_path / "j", in_load=f"hog = {hog}"), "load", "MemoryError",
          timeouts=Timeouts(import_s=5, load_s=30, score_s=5), within_s=45)


@pytest.mark.parametrize("where", ["import", "load", "reward"])
def test_endless_loops_are_cut_at_their_timeout(tmp_path, where):
    job = make_job(tmp_path / "j", **{"import": {"at_import": "while True: pass"},
                                     "load": {"in_load": "while True: pass"},
                                     "reward": {"reward": "while True: pass"}}[where])
    name = {"import": "imports", "load": "load", "reward": "rewards_valid"}[where]
    check(job, name, "did not finish within 2 s", within_s=15)


def test_gigabytes_of_output(tmp_path):
    job = make_job(tmp_path / "j", at_import="while True:\n    print('x' * 100_000)")
    check(job, "imports", "did not finish within 2 s", within_s=15)


def test_stray_stdout_does_not_corrupt_the_protocol(tmp_path):
    job = make_job(tmp_path / "j", at_import="print('hello'); os.write(1, b'{not json}\\n')",
                   reward="print(reply); return float(reply == self.data.answer)")
    report = validate_job(job, SPEC, timeouts=SHORT, dry_run=False)
    # the prints change no reward: the job is good-reverse's, and validates as it does
    assert report.passed, report.summary()
    assert {c.name for c in report.checks} >= {"rewards_valid", "deterministic"}


@pytest.mark.parametrize("value,needle", [
    ("float('nan')", "not finite"),
    ("'high'", "returned str"),
    ("1e300", "outside [0, 1]"),
    ("None", "returned NoneType"),
])
def test_bad_reward_values(tmp_path, value, needle):
    check(make_job(tmp_path / "j", reward=f"return {value}"), "rewards_valid", needle)


def test_sync_reward_is_named(tmp_path):
    tail = TASKSET.replace("LOAD_HOOK", "pass")
    code = _reward(GOOD_REWARD).replace("async def r", "def r")
    job = make_job(tmp_path / "j", tail=tail)
    init = job / "env" / "reverse_job" / "__init__.py"
    init.write_text(HEAD + code + tail)
    check(job, "rewards_valid", "must be `async def`")


@pytest.mark.parametrize("exports,needle", [("[]", "found 0"), ("['TS', 'TS2']", "found 2")])
def test_taskset_count(tmp_path, exports, needle):
    tail = TASKSET.replace("LOAD_HOOK", "pass").replace('__all__ = ["TS"]', (
        "class TS2(TS):\n    pass\n\n__all__ = " + exports))
    check(make_job(tmp_path / "j", tail=tail), "taskset", needle)


@pytest.mark.parametrize("code,needle", [("sys.exit(0)", "SystemExit"),
                                         ("os._exit(3)", "exited with code 3")])
def test_exits_at_import(tmp_path, code, needle):
    check(make_job(tmp_path / "j", at_import=code), "imports", needle)


def _gone(marker: str, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not processes_with(marker)


# The host's own processes (the zygote, and C that set up this job's namespaces) are outside
# the job's pid namespace (one NSpid entry); the job's are inside (two). For each host process:
# open its memory, environment and fds, use the cross-process calls on it, and signal it by
# pidfd (from /proc) and by number (numbers that also name a process of the job's own namespace
# are left out: kill() reads them in that namespace).
ATTACK_HOST = '''
import ctypes, errno, signal
libc = ctypes.CDLL(None, use_errno=True)
def nspid(p):
    try:
        return [l.split()[1:] for l in open(f"/proc/{p}/status") if l.startswith("NSpid:")][0]
    except (OSError, IndexError):
        return []
def cmdline(p):
    try:
        return open(f"/proc/{p}/cmdline", "rb").read()
    except OSError:
        return b""
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
hosts = [p for p in pids if b"/opt/nestor/host.py" in cmdline(p) and len(nspid(p)) == 1]
ours = {int(nspid(p)[-1]) for p in pids if len(nspid(p)) == 2}
found = {"hosts": str(len(hosts))}
def note(key, value):
    found.setdefault(key, set()).add(value)
for p in hosts:
    for what in ("mem", "environ", "fd/0", "fd/1"):
        try:
            open(f"/proc/{p}/{what}", "r+b" if what == "mem" else "rb").close()
            note(what, "OPENED")
        except OSError as e:
            note(what, type(e).__name__)
    for name, nr in (("process_vm_writev", 311), ("pidfd_getfd", 438), ("ptrace", 101)):
        libc.syscall(nr, p, 0, 0, 0, 0, 0)
        note(name, errno.errorcode.get(ctypes.get_errno(), "0"))
    try:
        fd = os.open(f"/proc/{p}", os.O_RDONLY | os.O_DIRECTORY)
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        note("pidfd_kill", "SENT")
    except OSError as e:
        note("pidfd_kill", errno.errorcode.get(e.errno, "?"))
    if p not in ours:
        try:
            os.kill(p, signal.SIGKILL)
            note("kill", "SENT")
        except OSError as e:
            note("kill", type(e).__name__)
os.kill(os.getppid(), signal.SIGKILL)  # the job's pid 1: ignores signals from inside
note("unshare", errno.errorcode.get(ctypes.get_errno(), "0") if libc.unshare(0x10000000) else "OK")
ret = libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None)
note("mount", errno.errorcode.get(ctypes.get_errno(), "0") if ret else "OK")
raise RuntimeError("ATTACK " + " ".join(f"{k}:{','.join(sorted(v)) if isinstance(v, set) else v}"
                                        for k, v in found.items()))
'''


@needs_bwrap
def test_job_cannot_reach_or_signal_its_host(tmp_path):
    from nestor.job.tasksource import JobTaskSource, TaskSourceError

    job = make_job(tmp_path / "j", at_import=ATTACK_HOST)
    with JobTaskSource(job, timeouts=SHORT) as src:
        with pytest.raises(TaskSourceError, match="ATTACK") as err:
            src.import_env()
        host = src._zygote
    message = str(err.value)
    results = dict(item.split(":") for item in message.split("ATTACK ")[1].split()[:12])
    if not host.hello.get("fresh_ns"):
        pytest.skip(f"no fresh namespaces here: {host.hello.get('fresh_ns_error')}")
    assert int(results.pop("hosts")) >= 1, message  # it found the zygote
    assert results.pop("kill", "ESRCH") == "ProcessLookupError", message
    assert results == {"mem": "PermissionError", "environ": "PermissionError",
                       "fd/0": "PermissionError", "fd/1": "PermissionError",
                       "process_vm_writev": "EPERM", "pidfd_getfd": "EPERM", "ptrace": "EPERM",
                       "pidfd_kill": "EINVAL", "unshare": "EPERM", "mount": "EPERM"}, message
    assert host.alive and host in tasksource._idle  # still serving: the next job gets it
    with JobTaskSource(GOOD) as src:
        assert src.score_batch([0, 0], ["bume", ""]).rewards == [1.0, 0.0]
        assert src._zygote is host and src.info["job"]["jobs"] >= 2


# A daemon that outlives job A's child and answers every request on the host's streams with a
# reward of 1: before one-sandbox-per-job, the next job would have been served by it.
TAKEOVER = '''
import __main__
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.dup2(__main__.PROTOCOL.fileno(), 1)
        os.execve(sys.executable, [sys.executable, "-c", """
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    n = len(req.get("items", [])) or 1
    print(json.dumps({"ok": True, "ended": True, "nonce": req.get("nonce"), "pid": 1,
                      "rewards": [1.0] * n, "errors": [None] * n, "components": [{}] * n,
                      "elapsed_s": 0.0}), flush=True)
""", "MARKER"], {})
    os._exit(0)
'''


@needs_bwrap
@pytest.mark.parametrize("ask", [False, True])
def test_a_job_cannot_take_over_the_next_jobs_host(tmp_path, ask):
    """The daemon holds job A's request and reply pipes; with `ask` it may answer a request of
    A's (then A's host is not reused), without it A ends cleanly and the same warm host serves
    the next job: either way, the daemon is gone once A has ended."""
    from nestor.job.tasksource import JobTaskSource, TaskSourceError

    marker = f"nestor-takeover-{uuid.uuid4().hex}"
    job = make_job(tmp_path / "a", at_import=TAKEOVER.replace("MARKER", marker))
    with JobTaskSource(job, timeouts=SHORT) as src:
        try:
            src.load() if ask else src.import_env()
        except TaskSourceError:
            pass  # the daemon may well garble job A's own replies: its own business
        deadline = time.monotonic() + 10
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)  # double fork and exec: it may come after the reply
        assert processes_with(marker), "the daemon did not start"
        host = src._zygote
    # killed with job A's namespaces (a generous bound: gone, not merely slow to go)
    assert _gone(marker, within_s=10), "job A's daemon outlived its job"
    with JobTaskSource(GOOD) as src:  # the next job: served by genuine code, honest rewards
        assert src.score_batch([0, 0], ["bume", ""]).rewards == [1.0, 0.0]
        warm = src._zygote is host
    if not ask:  # (asked, either A's server or the daemon reads the request: a race)
        assert warm == bool(host.hello.get("fresh_ns"))


@needs_bwrap
def test_background_spinners_forked_at_import_do_not_outlive_the_probe(tmp_path):
    marker = f"nestor-spinner-{uuid.uuid4().hex}"
    spin = (f"if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execve(sys.executable, [sys.executable, '-c', 'while True: pass', "
            f"'{marker}'], {{}})\n    os._exit(0)\n")
    report = validate_job(make_job(tmp_path / "j", at_import=spin), SPEC, timeouts=SHORT,
                          dry_run=False)
    assert report.checks  # the probe ran (it may pass: the job itself is fine)
    assert _gone(marker), "a spinner survived the probe"
