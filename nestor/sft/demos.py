"""Demonstrations: whole episodes of writing a job, as the LM agent would have had them.

A `Demo` is one episode's conversation (system prompt, task message, then assistant turns with
tool calls and the tools' answers, a failed submit and its repair included: they teach reading
the probe's report), the tool schemas it offered and its outcome. Three sources:

* `composer:N` — the composer writes N short-form jobs (docs/job-format.md) per training task
  through the same tools, validated by the real probe (and trained, with a pool). Its turns'
  text is its plan, which no LM could write: a demo keeps only the tool calls. With
  `slips_per_job`, jobs that passed first try are replayed with an LM's slips and their
  repairs (nestor/sft/slips.py).
* a run directory — every `episodes/*/transcript.json` of a `nestor train` or `episode` run.
* a `.jsonl` of OpenAI-format chat transcripts, one per line: {"messages": [...], "tools":
  [...], "reward": x, "passed": bool, "task": id} — e.g. a stronger model's `bench agents`
  run, to distil.

`select` filters by outcome: passed validation, reward ≥ x, the best of each group (rejection
sampling). Demos are plain data (JSONL through `write_demos`/`read_demos`); nestor/sft/data.py
turns them into the tokens the LM policy acts with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nestor.policy.base import Message, ToolCall
from nestor.policy.chat import content_text
from nestor.text import no_surrogates

PLAN_PREFIX = "plan: "  # the composer's turn text (composer_decisions.PLAN): dropped from demos
TRAINED_ENDS = ("ok", "job_failed", "not_trained")  # end reasons of an episode that validated


class DemoError(ValueError):
    """A demonstration source cannot be read; the message says what to fix."""


@dataclass
class Demo:
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    task: str = ""
    source: str = ""
    reward: float | None = None
    passed: bool = False  # the job passed validation (on some attempt)
    first_try: bool = False  # ... on the first
    group: str = ""  # demos of one group compete in `best_of_group`
    id: str = ""

    @property
    def assistant_turns(self) -> int:
        return sum(m.role == "assistant" for m in self.messages)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["messages"] = [m.to_dict() for m in self.messages]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Demo:
        fields = {k: d[k] for k in ("tools", "task", "source", "reward", "passed", "first_try",
                                    "group", "id") if k in d}
        return cls(messages=[Message.from_dict(m) for m in d["messages"]], **fields)


def write_demos(path: Path, demos: Iterable[Demo]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    # errors: a lone surrogate (json.loads of a transcript's "\ud800") cannot be UTF-8; it is
    # written as "?" rather than losing every demo after it
    with path.open("w", encoding="utf-8", errors="replace") as f:
        for demo in demos:
            f.write(json.dumps(demo.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_demos(path: Path) -> list[Demo]:
    """Demos written by `write_demos` (nestor's own format, one per line)."""
    demos = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                demos.append(Demo.from_dict(no_surrogates(json.loads(line))))
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                raise DemoError(f"{path} line {lineno}: not a demo written by nestor "
                                f"({type(exc).__name__}: {exc})"[:300]) from None
    return demos


def failed_attempt_turns(messages: list[Message]) -> set[int]:
    """Indices of the assistant turns of attempts whose submit failed validation: context for
    the repair that follows, but no target (cloning them would teach the mistake)."""
    from nestor.agent.episode import FAILED_SUBMIT

    failed: set[int] = set()
    attempt: list[int] = []
    submits: dict[str, list[int]] = {}  # a submit call's id -> the turns of its attempt
    for k, m in enumerate(messages):
        if m.role == "assistant":
            attempt.append(k)
            for call in m.tool_calls:
                if call.name == "submit":
                    submits[call.id] = attempt
                    attempt = []
        elif m.role == "tool" and m.content.startswith(FAILED_SUBMIT):
            failed.update(submits.get(m.tool_call_id or "", []))
    return failed


# ---- outcome filters ----------------------------------------------------------------------

def select(demos: list[Demo], *, passed: bool = True, min_reward: float | None = None,
           best_of_group: bool = False) -> list[Demo]:
    """Keep demos that passed validation (if `passed`), with reward ≥ `min_reward` (if set),
    and (if `best_of_group`) only the highest-reward demo of each group."""
    keep = [d for d in demos if (d.passed or not passed) and d.assistant_turns > 0
            and (min_reward is None or (d.reward is not None and d.reward >= min_reward))]
    if best_of_group:
        best: dict[str, Demo] = {}
        for d in keep:
            key = d.group or d.id
            if key not in best or (d.reward or 0.0) > (best[key].reward or 0.0):
                best[key] = d
        keep = list(best.values())
    return keep


# ---- sources ------------------------------------------------------------------------------

def lm_view(message: Message) -> Message:
    """An assistant turn as an LM would write it: the composer's plan text dropped."""
    if message.role == "assistant" and message.content.startswith(PLAN_PREFIX):
        return Message("assistant", "", list(message.tool_calls))
    return message


def one_call_per_turn(messages: list[Message]) -> list[Message]:
    """An assistant turn of k tool calls, answered by k tool messages, as k turns of one call
    each, every one followed by its answer: the same episode, in turns a small model's turn cap
    can hold (the composer writes a whole job, ~800 tokens, in one turn)."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        answers = messages[i + 1:i + 1 + len(m.tool_calls)]
        if m.role == "assistant" and len(m.tool_calls) > 1 and \
                [a.tool_call_id for a in answers] == [c.id for c in m.tool_calls]:
            for n, (call, answer) in enumerate(zip(m.tool_calls, answers, strict=True)):
                out += [Message("assistant", m.content if n == 0 else "", [call]), answer]
            i += 1 + len(answers)
        else:
            out.append(m)
            i += 1
    return out


def from_transcript(data: dict[str, Any], source: str = "run", group: str = "") -> Demo:
    """A Demo from an episode's transcript.json (nestor/agent/episode.py)."""
    from nestor.sandbox.workspace import TOOL_SCHEMAS

    comps = data.get("components") or {}
    reward = data.get("reward")
    messages = [lm_view(Message.from_dict(m)) for m in data.get("messages") or []]
    if data.get("policy") == "composer":  # its one turn of four calls, as an LM writes it
        messages = one_call_per_turn(messages)
    return Demo(messages=messages,
                tools=TOOL_SCHEMAS, task=str(data.get("task", "")), source=source,
                reward=None if reward is None else float(reward),
                passed=data.get("end_reason") in TRAINED_ENDS,
                first_try=float(comps.get("validation_efficiency") or 0.0) >= 1.0,
                group=group or str(data.get("group_id") or data.get("task", "")),
                id=str(data.get("episode_id", "")))


def from_run_dir(run_dir: Path) -> list[Demo]:
    paths = sorted(Path(run_dir).glob("episodes/*/transcript.json"))
    if not paths:
        raise DemoError(f"{run_dir}: no episodes/*/transcript.json; pass the directory of a "
                        "`nestor train` or `nestor episode run` run")
    return [from_transcript(json.loads(p.read_text(encoding="utf-8"))) for p in paths]


def _openai_message(m: Any, n: int) -> Message:
    if not isinstance(m, dict):
        raise DemoError(f"message {n}: is a {type(m).__name__}, not a JSON object")
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise DemoError(f"message {n}: role {role!r} is not system, user, assistant or tool")
    content = content_text(m.get("content") or "")
    if not isinstance(content, str):
        raise DemoError(f"message {n}: content is a {type(content).__name__}; it must be a "
                        "string, a list of text parts or null")
    tool_call_id = m.get("tool_call_id")
    if tool_call_id is not None and not isinstance(tool_call_id, str):
        raise DemoError(f"message {n}: tool_call_id must be a string, not "
                        f"{type(tool_call_id).__name__}")
    tool_calls = m.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise DemoError(f"message {n}: tool_calls must be a list")
    calls = []
    for i, tc in enumerate(tool_calls):
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict):
            raise DemoError(f"message {n}, tool call {i}: needs a \"function\" object "
                            '({"name": ..., "arguments": ...})')
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                # "\\ud800" in the arguments' text is a lone surrogate once parsed
                args = no_surrogates(json.loads(args)) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise DemoError(f"message {n}, tool call {i}: arguments are not JSON "
                                f"({exc.msg})") from None
        if not isinstance(fn.get("name"), str) or not isinstance(args, dict):
            raise DemoError(f"message {n}, tool call {i}: needs function.name (a string) and "
                            "function.arguments (a JSON object)")
        call_id = tc.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise DemoError(f"message {n}, tool call {i}: id must be a string, not "
                            f"{type(call_id).__name__}")
        calls.append(ToolCall(fn["name"], args, call_id or f"call_{n}_{i}"))
    return Message(role, content, calls, tool_call_id)


def _number(obj: dict[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value):
        raise DemoError(f"{key} must be a finite number or null, not {value!r:.40}")
    return float(value)


def _flag(obj: dict[str, Any], key: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):  # bool("false") is True: a string is refused, not read
        raise DemoError(f"{key} must be true or false, not {value!r:.40}")
    return value


def _openai_demo(obj: Any, lineno: int) -> Demo:
    """One line's transcript, every field of the type it must have (DemoError if not)."""
    from nestor.sandbox.workspace import TOOL_SCHEMAS

    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
        raise DemoError('each line needs {"messages": [...]}')
    obj = no_surrogates(obj)  # a lone "\ud800" cannot be tokenized (nor written as UTF-8)
    messages = [_openai_message(m, n) for n, m in enumerate(obj["messages"])]
    tools = obj.get("tools") or TOOL_SCHEMAS
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise DemoError("tools must be a list of tool schemas (JSON objects)")
    return Demo(messages=messages, tools=tools, task=str(obj.get("task", "")), source="jsonl",
                reward=_number(obj, "reward"), passed=_flag(obj, "passed", True),
                first_try=_flag(obj, "first_try", False),
                group=str(obj.get("group", obj.get("task", ""))),
                id=str(obj.get("id", f"line-{lineno}")))


def from_openai_jsonl(path: Path) -> list[Demo]:
    """OpenAI-format chat transcripts, one JSON object per line."""
    demos = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            demos.append(_openai_demo(json.loads(line), lineno))
        except RecursionError:
            raise DemoError(f"{path} line {lineno}: nested too deeply to read (a value, e.g. "
                            "tool arguments, inside ~1,000 levels of lists or objects)") from None
        except (json.JSONDecodeError, DemoError) as exc:
            raise DemoError(f"{path} line {lineno}: {exc}") from None
    return demos


def from_composer(n: int, tasks: list[str], run_dir: Path, *, episode: Any = None,
                  pool: Any = None, seed: int = 0, slips_per_job: int = 0,
                  on_episode: Callable[[Demo], None] | None = None) -> list[Demo]:
    """The composer (short form) writes `n` jobs per task through the episode's tools; each is
    validated by the probe (and trained when a `pool` is given). Episodes land in `run_dir`.
    `slips_per_job`: each job that passed first try is replayed that many times, each with a
    different LM slip and its repair (nestor/sft/slips.py); a replay is kept only when the
    slip failed the probe and the repair passed it."""
    from nestor.agent.episode import EpisodeConfig, run_episode
    from nestor.ledger import Ledger
    from nestor.sft.slips import SlipThenRepair, draw_kinds, written_files
    from nestor.tasks import TaskRegistry

    cfg = episode or EpisodeConfig(prompt_style="compact")
    composer = demo_composer(cfg, seed)
    registry = TaskRegistry()
    ledger = Ledger(Path(run_dir))
    demos = []
    try:
        for t, task in enumerate(tasks):
            spec = registry.get(task).spec(cfg.difficulty)
            for i in range(n):
                ep_seed = seed * 100_003 + t * 1009 + i
                demo = _demo(run_episode(composer, spec, pool, ledger, cfg, group_id=task,
                                         seed=ep_seed), task, "composer", task)
                replays = []
                if demo.first_try and slips_per_job:
                    job = written_files([c for m in demo.messages for c in m.tool_calls])
                    for kind in draw_kinds(job, ep_seed, slips_per_job):
                        rec = run_episode(SlipThenRepair(composer, kind, ep_seed), spec, pool,
                                          ledger, cfg, group_id=f"{task}/slip", seed=ep_seed)
                        replay = _demo(rec, task, f"slip:{kind}", f"{task}/slip")
                        if replay.passed and not replay.first_try:  # failed, then repaired
                            replays.append(replay)
                for d in (demo, *replays):
                    demos.append(d)
                    if on_episode is not None:
                        on_episode(d)
    finally:
        ledger.close()
    return demos


def demo_composer(episode: Any, seed: int) -> Any:
    """The composer that writes demos: short-form jobs for the episode's base models and token
    budget; read_report: its budget repairs copy the refusal's max_steps, a fix a clone can
    learn."""
    from nestor.policy.composer import Composer, ComposerConfig

    return Composer(ComposerConfig(job_form="short", repair="read_report", seed=seed,
                                   base_models=episode.models,
                                   token_budget=episode.token_budget))


def _demo(rec: Any, task: str, source: str, group: str) -> Demo:
    """A Demo of a composer episode's record, in the turns an LM would write."""
    return Demo(messages=one_call_per_turn([lm_view(m) for m in rec.messages]), tools=_tools(),
                task=task, source=source, reward=rec.reward,
                passed=rec.end_reason in TRAINED_ENDS,
                first_try=rec.components.get("validation_efficiency", 0) >= 1.0,
                group=group, id=rec.id)


def _tools() -> list[dict[str, Any]]:
    from nestor.sandbox.workspace import TOOL_SCHEMAS

    return TOOL_SCHEMAS


def load_source(source: str, out_dir: Path, **composer_kw: Any) -> list[Demo]:
    """`composer:N`, a run directory, a `.jsonl` of OpenAI transcripts, or a demos file
    written by nestor (`demos.jsonl`, recognised by its `source` fields)."""
    if source.startswith("composer:"):
        try:
            n = int(source.partition(":")[2])
        except ValueError:
            raise DemoError(f"{source!r}: write composer:N with N a number of jobs per task "
                            "(e.g. composer:4)") from None
        if not 1 <= n <= 1000:
            raise DemoError(f"{source!r}: N must be within 1..1000")
        return from_composer(n, run_dir=out_dir / "composer", **composer_kw)
    path = Path(source)
    if path.is_dir():
        return from_run_dir(path)
    if path.is_file() and path.suffix == ".jsonl":
        first = _first_row(path)
        if first is not None and "source" in first and "passed" in first:
            return read_demos(path)
        return from_openai_jsonl(path)
    raise DemoError(f"{source!r}: not composer:N, a run directory or a .jsonl file")


def _first_row(path: Path) -> dict | None:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, RecursionError):  # from_openai_jsonl says where
                    return None
                return obj if isinstance(obj, dict) else None
    return None
