"""The job host: runs jobs' untrusted tasksets inside the sandbox and speaks JSON lines.

STANDALONE: this file is bound into the sandbox and run by the same interpreter, so it imports
only the standard library and verifiers — never nestor. One request per stdin line, one JSON
object per stdout line; every reply has `ok`, failures carry `stage` and `error` (a message the
job's author can act on).

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
import importlib
import inspect
import json
import math
import os
import signal
import sys
import time
import traceback

PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
os.dup2(2, 1)  # C-level and Python-level writes to stdout now land on stderr
sys.stdout = sys.stderr

_t0 = time.perf_counter()
import verifiers.v1 as vf  # noqa: E402  (after the fd shuffle: its import may print)
from verifiers.v1.configs.taskset import TasksetConfig  # noqa: E402
from verifiers.v1.utils.generic import concrete_type  # noqa: E402

IMPORT_S = time.perf_counter() - _t0
MAX_TEXT = 16_384  # chars per prompt / answer we ship back; longer ones cannot fit a context

JOB: dict = {}  # in a job's child: its dir, Taskset class, loaded tasks
END_CODE = 77  # the child's exit status after a clean `end`


class Failure(Exception):
    def __init__(self, stage: str, error: str):
        super().__init__(error)
        self.stage, self.error = stage, error


def where(exc: BaseException) -> str:
    """The deepest traceback frame inside the job, as ` (env/pkg/file.py line N)`."""
    job = JOB.get("dir", "\0")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(job)]
    if not frames:
        return ""
    f = frames[-1]
    return f" ({os.path.relpath(f.filename, job)} line {f.lineno})"


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 500:
        text = text[:500] + "…"
    return text + where(exc)


def cmd_hello(req: dict) -> dict:
    return {"nonce": req.get("nonce"), "python": sys.version.split()[0],
            "verifiers": __import__("verifiers").__version__, "import_s": round(IMPORT_S, 3),
            "host": HOST["id"], "jobs": HOST["jobs"], "fresh_ns": HOST["fresh_ns"],
            "fresh_ns_error": HOST["fresh_ns_error"]}


def cmd_import(req: dict) -> dict:
    job, package = JOB["dir"], str(req["package"])
    if "taskset_cls" in JOB:
        raise Failure("import", "already imported")
    sys.path.insert(0, os.path.join(job, "env"))
    t0 = time.perf_counter()
    try:
        module = importlib.import_module(package)
    except BaseException as exc:  # the job's import-time code may raise anything, even SystemExit
        raise Failure("import", f"importing env/{package} failed: {describe(exc)}") from None
    elapsed = time.perf_counter() - t0
    names = getattr(module, "__all__", None)
    if names is None:
        raise Failure("taskset", f"env/{package}/__init__.py defines no __all__; export the "
                      "Taskset subclass there, e.g. __all__ = [\"MyTaskset\"]")
    try:
        found = [obj for name in list(names) if isinstance(obj := getattr(module, str(name), None),
                                                           type)
                 and issubclass(obj, vf.Taskset) and obj is not vf.Taskset]
    except BaseException as exc:
        raise Failure("taskset", f"reading __all__ failed: {describe(exc)}") from None
    if len(found) != 1:
        listed = ", ".join(c.__name__ for c in found) or "none"
        raise Failure("taskset", f"env/{package} must export exactly one vf.Taskset subclass in "
                      f"__all__; found {len(found)} ({listed}) among {list(names)[:10]}")
    taskset_cls = found[0]
    task_cls = taskset_cls.task_type()
    try:
        rewards = [name for klass in task_cls.__mro__ for name, fn in vars(klass).items()
                   if callable(fn) and hasattr(fn, "reward")]
    except BaseException as exc:
        raise Failure("taskset", f"inspecting {task_cls.__name__} failed: {describe(exc)}") from None
    if task_cls is vf.Task:
        raise Failure("taskset", f"{taskset_cls.__name__} must name its Task class: subclass "
                      "vf.Taskset[MyTask, vf.TasksetConfig]")
    if not rewards:
        raise Failure("taskset", f"{task_cls.__name__} has no @vf.reward methods; the rubric is "
                      "its `@vf.reward(weight=...) async def ...(self, trace) -> float` methods")
    for name in set(rewards):
        _guard_reward(task_cls, name)
    JOB["taskset_cls"] = taskset_cls
    return {"package": package, "taskset": taskset_cls.__name__, "task": task_cls.__name__,
            "rewards": sorted(set(rewards)), "import_s": round(elapsed, 3)}


def _guard_reward(task_cls: type, name: str) -> None:
    """Wrap a @vf.reward method so that a wrong return type is an error that names it.
    (verifiers itself would coerce "0.7" or True with float(); prime-rl may not.)"""
    fn = getattr(task_cls, name, None)
    if fn is None or not hasattr(fn, "reward"):
        return

    @functools.wraps(fn)
    async def guarded(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        if not inspect.isawaitable(result):
            raise TypeError(f"reward {name}() must be `async def` (verifiers awaits it)")
        value = await result
        values = value.values() if isinstance(value, dict) else [value]
        for v in values:
            if not isinstance(v, int | float):  # bools count: float(True) is 1.0
                raise TypeError(f"reward {name}() returned {type(v).__name__} {v!r:.40}; "
                                "return a float in [0, 1]")
        return value

    setattr(task_cls, name, guarded)


def _prompt_text(i: int, data) -> str:
    prompt = data.prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and getattr(prompt[0], "role", "") == "user" \
            and isinstance(prompt[0].content, str):
        return prompt[0].content
    kind = f"a list of {len(prompt)} messages" if isinstance(prompt, list) else repr(prompt)[:60]
    raise Failure("load", f"task {i}: prompt is {kind}; the model is tested on exactly one user "
                  "message, so make `prompt` that message's text (a string)")


def cmd_load(req: dict) -> dict:
    cls = JOB.get("taskset_cls")
    if cls is None:
        raise Failure("load", "import the job first")
    max_tasks = int(req.get("max_tasks", 20_000))
    try:
        config_cls = concrete_type(cls, TasksetConfig, origin=vf.Taskset) or TasksetConfig
        taskset = cls(config_cls())
    except BaseException as exc:
        raise Failure("load", f"constructing {cls.__name__} with its default config failed "
                      f"(every config field needs a default): {describe(exc)}") from None
    tasks, rows = [], []
    try:
        for task in taskset:
            if len(tasks) >= max_tasks:
                break
            i = len(tasks)
            if not isinstance(task, vf.Task):
                raise Failure("load", f"load() yielded a {type(task).__name__} at position {i}; "
                              "yield Task instances: MyTask(MyData(prompt=..., answer=...), "
                              "self.config.task)")
            prompt = _prompt_text(i, task.data)
            answer = getattr(task.data, "answer", None)
            answer = None if answer is None else str(answer)
            if len(prompt) > MAX_TEXT or (answer is not None and len(answer) > MAX_TEXT):
                raise Failure("load", f"task {i}: prompt or answer is over {MAX_TEXT} characters")
            tasks.append(task)
            rows.append({"prompt": prompt, "answer": answer,
                         "system_prompt": task.data.system_prompt})
    except Failure:
        raise
    except BaseException as exc:
        raise Failure("load", f"load() failed after {len(tasks)} tasks: {describe(exc)}") from None
    JOB["tasks"] = tasks
    return {"tasks": rows, "truncated": len(tasks) >= max_tasks}


LOOP = asyncio.new_event_loop()


def _trace(task, completion: str):
    data = task.data
    return vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        nodes=[vf.MessageNode(message=vf.UserMessage(content=data.prompt_text)),
               vf.MessageNode(parent=0, sampled=True,
                              message=vf.AssistantMessage(content=completion))],
    )


def _reward_value(trace) -> tuple[float | None, str | None, dict]:
    parts: dict = {}
    for name, reward in trace.rewards.items():
        if reward is None:
            return None, f"reward {name!r} was not scored", parts
        parts[name] = reward.score
    try:
        total = float(trace.reward)
    except (TypeError, ValueError, OverflowError) as exc:
        return None, f"reward sum is not a number: {exc}", parts
    if not math.isfinite(total) or any(not math.isfinite(v) for v in parts.values()):
        bad = {k: v for k, v in parts.items() if not math.isfinite(v)}
        return None, f"reward is not finite: {bad or total}", {}
    return total, None, parts


def cmd_score(req: dict) -> dict:
    tasks = JOB.get("tasks")
    if tasks is None:
        raise Failure("score", "load the tasks first")
    items = req["items"]
    traces = []
    for item in items:
        i = int(item["task"])
        if not 0 <= i < len(tasks):
            raise Failure("score", f"task index {i} out of range (have {len(tasks)})")
        traces.append((tasks[i], _trace(tasks[i], str(item["completion"]))))

    async def run_all():
        return await asyncio.gather(*(task.score(trace) for task, trace in traces),
                                    return_exceptions=True)

    t0 = time.perf_counter()
    outcomes = LOOP.run_until_complete(run_all())
    elapsed = time.perf_counter() - t0
    rewards, errors, components = [], [], []
    for (_task, trace), outcome in zip(traces, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            cause = outcome.__cause__ or outcome
            rewards.append(None)
            errors.append(f"scoring raised {describe(cause)}")
            components.append({})
            continue
        value, error, parts = _reward_value(trace)
        rewards.append(value)
        errors.append(error)
        components.append(parts)
    return {"rewards": rewards, "errors": errors, "components": components,
            "elapsed_s": round(elapsed, 6)}


COMMANDS = {"hello": cmd_hello, "import": cmd_import, "load": cmd_load, "score": cmd_score}


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


def serve_job(job_dir: str) -> None:
    """The job's child: answer its requests until `end` or EOF."""
    global LOOP
    OWNER[0] = os.getpid()
    _inbuf.clear()
    os.setpgid(0, 0)  # its own process group: whatever it forks dies with it
    LOOP = asyncio.new_event_loop()  # the zygote closed its own after the warm-up
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a request past its timeout kills the child
    JOB.clear()
    JOB["dir"] = os.path.realpath(job_dir)
    try:
        os.chdir(job_dir)
    except OSError as exc:
        reply({"ok": False, "stage": "host", "error": f"job dir {job_dir}: {exc}"})
        return
    reply({"ok": True, "pid": os.getpid()})
    while (line := read_line()) is not None:
        try:
            req = json.loads(line)
            cmd = req["cmd"]
        except (ValueError, KeyError, TypeError):
            reply({"ok": False, "stage": "host", "error": f"bad request: {line[:200]!r}"})
            continue
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
        except Failure as f:
            out = {"ok": False, "stage": f.stage, "error": f.error}
        except BaseException as exc:  # a job that raises SystemExit etc. from a reward
            out = {"ok": False, "stage": str(cmd), "error": describe(exc)}
        signal.setitimer(signal.ITIMER_REAL, 0)
        if os.getpid() != OWNER[0]:
            os._exit(0)
        reply(out)


def _load_ns():
    """host_ns.py, bound next to this file (-I keeps our directory off sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_ns.py")
    spec = importlib.util.spec_from_file_location("nestor_host_ns", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    while (line := read_line()) is not None:
        try:
            req = json.loads(line)
            cmd = req["cmd"]
        except (ValueError, KeyError, TypeError):
            reply({"ok": False, "stage": "host", "error": f"bad request: {line[:200]!r}"})
            continue
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


def _warm_up() -> None:
    """Score one throwaway trace, so that the first real batch does not pay for verifiers'
    lazy imports and pydantic's first validations."""

    class _Data(vf.TaskData):
        answer: str = ""

    class _Task(vf.Task[_Data]):
        @vf.reward(weight=1.0)
        async def same(self, trace) -> float:
            return float(trace.last_reply == self.data.answer)

    task = _Task(_Data(prompt="warm", answer="up"))
    LOOP.run_until_complete(task.score(_trace(task, "up")))


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
    global LOOP, NS
    NS = _load_ns()
    try:
        _warm_up()
    except Exception as exc:  # only ever a cost, never a reason to stop
        print(f"host warm-up failed: {exc}", file=sys.stderr)
    LOOP.close()  # its epoll fd and self-pipe must not pass on to jobs; each job makes its own
    LOOP = None
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
