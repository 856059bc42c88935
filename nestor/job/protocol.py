"""What runs inside the sandbox for a job: the verifiers protocol (import, load, score).

STANDALONE, like host.py: bound read-only next to it (/opt/nestor/protocol.py) and loaded by
path from there, because `python -I` keeps that directory off sys.path and nestor itself is
not in the sandbox. It imports only the standard library and verifiers — never nestor. The
process plumbing around it (the request/reply framing, the zygote, each job's fresh
namespaces) is nestor/sandbox/host.py's; this file is what that plumbing serves: a job's
Taskset imported, its tasks loaded, completions scored by its rubric, each failure a `Failure`
whose message the job's author can act on.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import math
import os
import sys
import time
import traceback

import verifiers.v1 as vf
from verifiers.v1.configs.taskset import TasksetConfig
from verifiers.v1.utils.generic import concrete_type

MAX_TEXT = 16_384  # chars per prompt / answer we ship back; longer ones cannot fit a context

JOB: dict = {}  # in a job's child: its dir, Taskset class, loaded tasks


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


COMMANDS = {"import": cmd_import, "load": cmd_load, "score": cmd_score}


def warm_up() -> None:
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
