"""An LM's slips, written into jobs that passed, and their repairs: demos of reading the report.

Why: a warm start cloned from the composer learns the composer's repairs — it resamples its
decisions and rewrites whole files — not fixes for the mistakes a small LM makes. Warm start 4
(docs/lm-arc.md) repaired 0 of 25 second submits, each a resubmit of the first one's failure.
Its first-submit failures were slips of typing, not of design: an unterminated string, an
undefined name, a `vf.` attribute that does not exist, the package at the wrong path, a seed
past int32, a broken TOML line, a copied `max_new_tokens = 1024`. Warm start 5's own first
submits added two slips of the row generator: a drawn value used but never assigned (a NameError
on `v1`) and a row that is the prompt alone (load() cannot unpack it). `SLIPS` makes each.

`SlipThenRepair` replays a composer episode that passed on its first try (same seed, so the
same job) with one slip written into one file. The real probe fails it and reports why; the
next turns undo exactly what the slip changed — `edit_file` of the broken line, or the file
written at its right path and the wrong one deleted — and submit again. A demo of it pairs a
real report with the fix it points at; the slipped attempt is context, not a target
(demos.failed_attempt_turns), so the clone learns the repair, not the slip. Handed a
`repairer`, the same replay measures another agent's repair (benchmarks/repair_eval.py).
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from nestor.policy.base import Message, Observation, ToolCall, Turn


@dataclass(frozen=True)
class Slip:
    kind: str
    path: str  # the file the slip breaks, as the job has it
    written_path: str  # where the broken text is written (differs for `wrong_path`)
    broken: str  # the broken file's text
    repair: tuple[ToolCall, ...]  # the calls that undo the slip (a submit follows)


def _module(files: dict[str, str]) -> tuple[str, str] | None:
    """(path, text) of the taskset's module, env/<pkg>/__init__.py."""
    for path, text in files.items():
        if re.fullmatch(r"env/\w+/__init__\.py", path):
            return path, text
    return None


def _edit(kind: str, path: str, text: str, line: str, broken_line: str) -> Slip | None:
    """`line` of `text` replaced by `broken_line`; repaired by editing it back. None when the
    broken line would not be unique (edit_file needs its old_string once)."""
    broken = text.replace(line, broken_line, 1)
    if broken == text or broken.count(broken_line) != 1:
        return None
    fix = ToolCall("edit_file", {"path": path, "old_string": broken_line, "new_string": line})
    return Slip(kind, path, path, broken, (fix,))


def _module_slip(options_of: Callable[[str, str], list[tuple[str, str]]]):
    """A slip that breaks one line of the taskset's module: `options_of(path, text)` lists the
    (line, broken line) pairs it may write, and the slip's rng picks one."""
    @functools.wraps(options_of)
    def make(files: dict[str, str], rng: random.Random) -> Slip | None:
        found = _module(files)
        if found is None:
            return None
        path, text = found
        options = options_of(path, text)
        return _edit(options_of.__name__, path, text, *rng.choice(options)) if options else None
    return make


@_module_slip
def unterminated_string(path: str, text: str) -> list[tuple[str, str]]:
    """A string literal's closing quote dropped: the module no longer compiles."""
    options = []
    for line in text.splitlines():
        m = re.search(r"\"[^\"\\\n]+\"|'[^'\\\n]+'", line)
        if m and '"""' not in line:
            broken_line = line[:m.end() - 1] + line[m.end():]
            try:
                compile(text.replace(line, broken_line, 1), path, "exec")
            except SyntaxError:
                options.append((line, broken_line))
    return options


@_module_slip
def undefined_name(path: str, text: str) -> list[tuple[str, str]]:
    """One use of a variable misspelt (`pairs` -> `pair`): a NameError when the code runs."""
    lines = text.splitlines()
    assigned = {m.group(1) for ln in lines if (m := re.match(r"\s+(\w{3,}) = ", ln))}
    options = []
    for name in sorted(assigned):
        typo = name[:-1] if name.endswith("s") else name + "s"
        if re.search(rf"\b{typo}\b", text):
            continue
        for ln in lines:
            if re.search(rf"\b{name}\b", ln) and not re.match(rf"\s+{name} = ", ln):
                options.append((ln, re.sub(rf"\b{name}\b", typo, ln, count=1)))
    return options


def _rows_yield(text: str) -> tuple[ast.FunctionDef, ast.Yield] | None:
    """(`rows()`, its first yield) when the module has that generator."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "rows":
            found = next((n for n in ast.walk(fn) if isinstance(n, ast.Yield)), None)
            return (fn, found) if found and found.value else None
    return None


@_module_slip
def dropped_draw(path: str, text: str) -> list[tuple[str, str]]:
    """A value the row is made of never assigned (`v1 = ...` left out): a NameError when load()
    runs. Repaired by writing the line back in above the one that followed it."""
    found = _rows_yield(text)
    if found is None:
        return []
    fn, yielded = found
    used = {n.id for n in ast.walk(yielded) if isinstance(n, ast.Name)}
    lines = text.splitlines()
    return [(f"{lines[n.lineno - 1]}\n{lines[n.lineno]}", lines[n.lineno]) for n in ast.walk(fn)
            if isinstance(n, ast.Assign) and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name) and n.targets[0].id in used
            and n.end_lineno == n.lineno < len(lines)]


@_module_slip
def prompt_only_row(path: str, text: str) -> list[tuple[str, str]]:
    """A row yielded as its prompt alone, the answer left out: load()'s `for prompt, answer in
    rows()` cannot unpack it (a row of the wrong shape)."""
    found = _rows_yield(text)
    if found is None or found[1].lineno != found[1].end_lineno:
        return []
    value = found[1].value
    whole = ast.get_source_segment(text, value)
    prompt = (ast.get_source_segment(text, value.elts[0])
              if isinstance(value, ast.Tuple) and len(value.elts) == 2 else f"{whole}[0]")
    line = text.splitlines()[found[1].lineno - 1]
    return [(line, line.replace(whole, prompt, 1))]


# attributes verifiers.v1 has, and a plausible misspelling of each that it has not
_VF_TYPOS = {"vf.Taskset[": "vf.TaskSet[", "vf.TaskData)": "vf.Taskdata)",
             "vf.reward(": "vf.rewards(", "vf.Trace)": "vf.Traces)"}  # (vf.trace is a module)


@_module_slip
def vf_attribute(path: str, text: str) -> list[tuple[str, str]]:
    """A `vf.` name that verifiers does not have: the import fails with AttributeError."""
    return [(ln, ln.replace(good, bad, 1)) for ln in text.splitlines()
            for good, bad in _VF_TYPOS.items() if good in ln]


def wrong_path(files: dict[str, str], rng: random.Random) -> Slip | None:
    """The taskset's module written outside env/<pkg>/: the package is missing."""
    found = _module(files)
    if found is None:
        return None
    path, text = found
    pkg = path.split("/")[1]
    wrong = rng.choice([f"env/{pkg}.py", f"{pkg}/__init__.py", "env/__init__.py"])
    repair = (ToolCall("write_file", {"path": path, "content": text}),
              ToolCall("delete_file", {"path": wrong}))
    return Slip("wrong_path", path, wrong, text, repair)


def _config_line(files: dict[str, str], key: str) -> tuple[str, str] | None:
    text = files.get("config.toml")
    if text is None:
        return None
    m = re.search(rf"^{key} = .*$", text, re.M)
    return (text, m.group(0)) if m else None


def seed_overflow(files: dict[str, str], rng: random.Random) -> Slip | None:
    """A ten-digit seed, past the int32 the config allows."""
    found = _config_line(files, "seed")
    if found is None:
        return None
    text, line = found
    return _edit("seed_overflow", "config.toml", text, line,
                 f"seed = {rng.randint(2**32, 9_999_999_999)}")


def toml_quote(files: dict[str, str], rng: random.Random) -> Slip | None:
    """A TOML string's closing quote dropped: config.toml no longer parses."""
    found = _config_line(files, "base_model")
    if found is None or not found[1].endswith('"'):
        return None
    text, line = found
    return _edit("toml_quote", "config.toml", text, line, line[:-1])


def answer_cap(files: dict[str, str], rng: random.Random) -> Slip | None:
    """`max_new_tokens = 1024` copied for a task whose answers take a few tokens: the job's
    sampled tokens blow the token budget."""
    found = _config_line(files, "max_new_tokens")
    if found is None or found[1].endswith(" 1024"):
        return None
    text, line = found
    return _edit("answer_cap", "config.toml", text, line, "max_new_tokens = 1024")


SLIPS: dict[str, Callable[[dict[str, str], random.Random], Slip | None]] = {
    f.__name__: f for f in (unterminated_string, undefined_name, vf_attribute, wrong_path,
                            seed_overflow, toml_quote, answer_cap, dropped_draw, prompt_only_row)}


def written_files(calls: list[ToolCall]) -> dict[str, str]:
    return {c.arguments["path"]: c.arguments["content"] for c in calls
            if c.name == "write_file"}


def slip_rng(kind: str, seed: int) -> random.Random:
    """Where a slip goes: its own stream, so that whatever drew the kind from `seed` does not
    also fix the place (one draw deciding both put every slip of a kind at the same spot)."""
    return random.Random(f"slip:{kind}:{seed}")


def draw_kinds(files: dict[str, str], seed: int, k: int) -> list[str]:
    """`k` different slips (fewer if fewer apply) that can be written into a job of these
    files."""
    kinds = [s for s, make in SLIPS.items() if make(files, slip_rng(s, seed)) is not None]
    return random.Random(f"kinds:{seed}").sample(kinds, min(k, len(kinds)))


class SlipThenRepair:
    """One episode's policy: `inner`'s first turn with the `kind` slip written into it, one call
    a turn (as an LM with a turn cap writes, and as demos are rendered), ending in a submit the
    probe fails. Then, by default, the slip's repair, one call a turn, and a submit: a demo. With
    a `repairer` (any policy), it acts from the failed report on instead: its repair is what
    benchmarks/repair_eval.py measures. `seed` picks where the slip goes, so a replay writes
    the same one."""

    def __init__(self, inner, kind: str, seed: int, repairer=None):
        self.inner, self.kind, self.seed, self.repairer = inner, kind, seed, repairer
        self.name = f"{inner.name}+{kind}" + (f"+{repairer.name}" if repairer else "")
        self.version = (repairer or inner).version
        self.slip: Slip | None = None
        self._script: list[ToolCall] | None = None  # the calls still to write, one a turn

    def act(self, obs: Observation) -> Turn:
        if self._script is None:
            calls = list(self.inner.act(obs).message.tool_calls)
            self.slip = SLIPS[self.kind](written_files(calls), slip_rng(self.kind, self.seed))
            if self.slip is None:
                raise ValueError(f"slip {self.kind!r} does not apply to this job")
            for i, c in enumerate(calls):
                if c.name == "write_file" and c.arguments["path"] == self.slip.path:
                    calls[i] = ToolCall("write_file", {"path": self.slip.written_path,
                                                       "content": self.slip.broken})
            if self.repairer is None:
                calls += [*self.slip.repair, ToolCall("submit", {})]
            self._script = calls
        if self._script:
            call = self._script.pop(0)
            n = sum(m.role == "assistant" for m in obs.messages)
            return Turn(Message("assistant", "", [ToolCall(call.name, call.arguments, f"s{n}")]))
        if self.repairer is not None:
            return self.repairer.act(obs)
        return Turn(Message("assistant", ""))  # the scripted repair did not pass: stop here
