"""The job host: runs jobs' untrusted tasksets inside the sandbox and speaks JSON lines.

STANDALONE: this file is bound into the sandbox and run by the same interpreter, so it imports
only the standard library and verifiers — never nestor. One request per stdin line, one JSON
object per stdout line; every reply has `ok`, failures carry `stage` and `error` (a message the
job's author can act on). This file is the plumbing; what a job's server does with `import`,
`load` and `score` (the verifiers protocol) is nestor/job/protocol.py, bound next to it and
loaded by path like host_ns.py.

The process is a zygote: it imports verifiers (seconds) once, then serves many jobs, one at a
time, each in processes forked for it and never in its own (host_ns.py, bound next to this
file): C unshares a user, pid, mount, ipc and network namespace and mounts a fresh /tmp and
/dev/shm; G, pid 1 there, drops every capability and stacks the full seccomp filter; J, G's
child, is the job's server. The job gets its own request and reply pipes: the zygote relays
one reply line per request and never lets a job near its own stream. On `end` it closes the
job's requests, and (if J does not exit within END_GRACE_S) has C kill G; when G exits the
kernel kills every process of the namespace, and only then does the zygote answer. The zygote
is not dumpable, so no job can read or write its memory, fds or environment. A trial run at
start (host_ns.probe) decides whether it can do this; where not (or with --no-fresh-ns), it
serves one job only and the trusted side starts a fresh host, in a fresh sandbox, per job.

  {"cmd": "hello", "nonce": x}          -> versions, import time, host id, jobs served,
                                           fresh_ns (and why not); x echoed
  {"cmd": "job", "dir": DIR, "cpu_s": c, "memory_mb": m}
                                        -> starts the job's processes, J under those limits;
                                           replies {"pid", "host", "jobs", "fresh_ns"}
  {"cmd": "import", "package": NAME}    -> imports DIR/env/NAME, finds its one Taskset
  {"cmd": "load", "max_tasks": N}       -> tasks [{"prompt", "answer", "system_prompt"}]
  {"cmd": "score", "items": [{"task": i, "completion": s}]}
                                        -> rewards [float|null], errors [str|null],
                                           components [{name: score}], elapsed_s
  {"cmd": "end"}                        -> the zygote ends the job (nothing of it runs any
                                           more), replies {"ended", "clean"}

If J dies mid-request (a CPU limit, a timeout, os._exit in the job), the zygote answers for it
with stage "died"; if the job wrote a line nobody asked for, with stage "protocol" (the job is
ended). The job's prints would corrupt the protocol, so fd 1 is moved to a private
descriptor and whatever the job writes to stdout goes to stderr instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import signal
import sys
import time

PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
os.dup2(2, 1)  # C-level and Python-level writes to stdout now land on stderr
sys.stdout = sys.stderr


def _load_sibling(name: str, module_name: str, register: bool = False, path: str = ""):
    """A file bound next to this one (-I keeps our directory off sys.path, and nestor is not
    in the sandbox): host_ns.py, protocol.py (or at `path`)."""
    import importlib.util

    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    if register:  # pydantic resolves the models a module defines through sys.modules
        sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


_t0 = time.perf_counter()
# What runs inside for a job (import, load, score); it imports verifiers, which may print, so
# only after the fd shuffle above.
# --protocol names where it is: bound next to us in bubblewrap; under an opted-in fallback,
# which cannot bind, the trusted side's argv translation names its place in the repository
_PROTOCOL = sys.argv[sys.argv.index("--protocol") + 1] if "--protocol" in sys.argv else ""
P = _load_sibling("protocol.py", "nestor_protocol", register=True, path=_PROTOCOL)
IMPORT_S = time.perf_counter() - _t0
END_CODE = 77  # the child's exit status after a clean `end`


def cmd_hello(req: dict) -> dict:
    return {"nonce": req.get("nonce"), "python": sys.version.split()[0],
            "verifiers": __import__("verifiers").__version__, "import_s": round(IMPORT_S, 3),
            "host": HOST["id"], "jobs": HOST["jobs"], "fresh_ns": HOST["fresh_ns"],
            "fresh_ns_error": HOST["fresh_ns_error"]}


COMMANDS = {"hello": cmd_hello, **P.COMMANDS}


OWNER = [os.getpid()]  # the one process allowed to reply: the zygote, then the job's child


def reply(obj: dict) -> None:
    if os.getpid() != OWNER[0]:  # a process the job forked is running our code: stay silent
        os._exit(0)
    try:
        line = json.dumps(obj, allow_nan=False)
    except ValueError:
        line = json.dumps({"ok": False, "stage": "host", "error": "reply was not JSON-safe"})
    PROTOCOL.write(line + "\n")
    PROTOCOL.flush()


_inbuf = bytearray()


def read_line() -> bytes | None:
    """One request line from fd 0, unbuffered beyond it: a forked child and the zygote take
    turns reading the same pipe, so neither may read ahead."""
    while True:
        nl = _inbuf.find(b"\n")
        if nl >= 0:
            line = bytes(_inbuf[:nl])
            del _inbuf[: nl + 1]
            return line
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None
        _inbuf.extend(chunk)


def requests():
    """Each request from fd 0 as (its line, the request, its command); a line that is not a
    request (not a JSON object, no string `cmd`) is answered as such and skipped."""
    while (line := read_line()) is not None:
        try:
            req = json.loads(line)
            cmd = req["cmd"]
        except (ValueError, KeyError, TypeError):
            cmd = None
        if isinstance(cmd, str):
            yield line, req, cmd
        else:
            reply({"ok": False, "stage": "host", "error": f"bad request: {line[:200]!r}"})


def serve_job(job_dir: str) -> None:
    """The job's child: answer its requests until `end` or EOF."""
    OWNER[0] = os.getpid()
    _inbuf.clear()
    os.setpgid(0, 0)  # its own process group: whatever it forks dies with it
    P.LOOP = asyncio.new_event_loop()  # the zygote closed its own after the warm-up
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a request past its timeout kills the child
    P.JOB.clear()
    P.JOB["dir"] = os.path.realpath(job_dir)
    try:
        os.chdir(job_dir)
    except OSError as exc:
        reply({"ok": False, "stage": "host", "error": f"job dir {job_dir}: {exc}"})
        return
    reply({"ok": True, "pid": os.getpid()})
    for _line, req, cmd in requests():
        if cmd == "end":
            return  # the zygote acknowledges once everything of ours is gone
        if cmd not in COMMANDS:
            reply({"ok": False, "stage": "host", "error": f"unknown command {cmd!r}"})
            continue
        try:
            timeout = max(0.0, float(req.get("timeout_s") or 0))
        except (TypeError, ValueError):
            timeout = 0.0
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            out = {"ok": True, **COMMANDS[cmd](req)}
        except P.Failure as f:
            out = {"ok": False, "stage": f.stage, "error": f.error}
        except BaseException as exc:  # a job that raises SystemExit etc. from a reward
            out = {"ok": False, "stage": str(cmd), "error": P.describe(exc)}
        signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() != OWNER[0]:
            os._exit(0)
        reply(out)


NS = None  # host_ns, once main() loaded it
HOST = {"id": os.urandom(8).hex(), "fresh_ns": False, "fresh_ns_error": "not probed",
        "jobs": 0, "tmp_bytes": 64 << 20}
MAX_REPLY = 64 << 20  # one relayed reply line; the trusted side's own cap is lower
END_GRACE_S = 2.0  # an honest job's server exits at once when its requests end


def _job_main(req: dict) -> int:
    """J, the job's server (in the job's namespaces, confined): its exit status."""
    code = END_CODE
    try:
        NS.lower_limits(req)
        serve_job(str(req.get("dir", "")))
    except BaseException:  # noqa: BLE001 - J must never return into the zygote's code
        code = 1
    with contextlib.suppress(BaseException):
        PROTOCOL.flush()
    return code


def _finish(job, grace_s: float) -> tuple[int | None, str | None]:
    status, error = job.finish(grace_s)
    if not HOST["fresh_ns"]:
        NS.reap_strays()
    return status, error


def _open_job(req: dict):
    """Start a job's processes; (the job, the reply) or (None, an error reply)."""
    t0 = time.perf_counter()
    # Before any of its code runs: the trusted side shows a job only stderr after this line.
    os.write(2, f"\n[nestor host: job {HOST['jobs'] + 1} starts]\n".encode())
    job = NS.JobProcess(functools.partial(_job_main, req), fresh=HOST["fresh_ns"],
                        tmp_bytes=HOST["tmp_bytes"], prog=NS_FILTER[0],
                        proto_fd=PROTOCOL.fileno())
    try:
        line = job.read_reply(MAX_REPLY)
        first = json.loads(line) if line else None  # our own code wrote it, before any job's
    except (OSError, ValueError):
        first = None
    if isinstance(first, dict) and first.get("ok") and "pid" in first:
        HOST["jobs"] += 1
        return job, {"ok": True, "pid": first["pid"], "host": HOST["id"], "jobs": HOST["jobs"],
                     "fresh_ns": HOST["fresh_ns"], "setup_s": round(time.perf_counter() - t0, 4)}
    status, error = _finish(job, 0.0)
    if isinstance(first, dict) and not first.get("ok"):
        return None, first
    return None, {"ok": False, "stage": "host",
                  "error": f"could not open the job: {error or NS.exit_reason(status)}"}


def _relay(job, line: bytes):
    """Forward one request to the job and its one reply line back; the job, or None if it
    ended (then the reply says why)."""
    if job.buf.strip():
        _finish(job, 0.0)
        text = bytes(job.buf).strip().splitlines()[0][:200]
        reply({"ok": False, "stage": "protocol",
               "error": f"the job wrote to its reply pipe without being asked: {text!r}"})
        return None
    job.buf.clear()
    job.send(line + b"\n")
    try:
        out = job.read_reply(MAX_REPLY)
    except OSError as exc:
        _finish(job, 0.0)
        reply({"ok": False, "stage": "protocol", "error": str(exc)})
        return None
    if out is not None:
        PROTOCOL.flush()
        view = memoryview(out)
        while view:
            view = view[os.write(PROTOCOL.fileno(), view):]
        return job
    status, _ = _finish(job, END_GRACE_S)
    reply({"ok": False, "stage": "died", "error": NS.exit_reason(status)})
    return None


def zygote() -> None:
    """Serve jobs one at a time, each in fresh namespaces (host_ns.py); without them, one job."""
    job = None
    for line, req, cmd in requests():
        if cmd == "hello":
            reply({"ok": True, **cmd_hello(req)})
        elif cmd == "end":  # the zygote, never the job, says when a job has ended
            clean = True
            if job is not None:
                status, _ = _finish(job, END_GRACE_S)
                job, clean = None, status is not None and os.WIFEXITED(status) \
                    and os.WEXITSTATUS(status) == END_CODE
            reply({"ok": True, "ended": True, "clean": clean})
        elif cmd == "job":
            if job is not None:
                reply({"ok": False, "stage": "host", "error": "a job is open: end it first"})
            elif HOST["jobs"] and not HOST["fresh_ns"]:
                reply({"ok": False, "stage": "host", "error": "this host serves one job only "
                       f"(no fresh namespaces here: {HOST['fresh_ns_error']})"})
            else:
                job, out = _open_job(req)
                reply(out)
        elif job is None:
            reply({"ok": False, "stage": "host", "error": f"no job is open for {cmd!r}"})
        else:
            job = _relay(job, line)


NS_FILTER: list = [None]  # the full seccomp filter each job gets stacked on (host_ns.py)


def _fresh_ns(argv: list[str]) -> None:
    """Whether jobs get fresh namespaces here: asked for (no --no-fresh-ns), and a trial run
    of the whole set-up works (host_ns.probe). Either way, `hello` says so."""
    if "--tmp-mb" in argv:
        HOST["tmp_bytes"] = int(argv[argv.index("--tmp-mb") + 1]) << 20
    if "--no-fresh-ns" in argv:
        HOST["fresh_ns_error"] = "turned off by the trusted side (--no-fresh-ns)"
        return
    try:
        NS_FILTER[0] = NS.load_filter()
        why = NS.probe(NS_FILTER[0], HOST["tmp_bytes"])
    except Exception as exc:  # noqa: BLE001 - fail closed: one job per host
        why = f"{type(exc).__name__}: {exc}"
    HOST["fresh_ns"], HOST["fresh_ns_error"] = why is None, why


def main() -> None:
    global NS
    NS = _load_sibling("host_ns.py", "nestor_host_ns")
    try:
        P.warm_up()
    except Exception as exc:  # only ever a cost, never a reason to stop
        print(f"host warm-up failed: {exc}", file=sys.stderr)
    P.LOOP.close()  # its epoll fd and self-pipe must not pass on to jobs; each job makes its own
    P.LOOP = None
    # Blocked here, so that C (host_ns) cannot be stopped by it before its handler is set.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    # verifiers leaves ~10^6 long-lived objects; without this the first full collections
    # in every job walk them all (0.6 s on the first big batch). Frozen, they also stay
    # shared copy-on-write with the forked children.
    gc.collect()
    gc.freeze()
    NS.not_dumpable()
    _fresh_ns(sys.argv[1:])
    zygote()


if __name__ == "__main__":
    main()
    PROTOCOL.flush()
    os._exit(0)  # stdin closed: leave now, without waiting on threads verifiers may have started
