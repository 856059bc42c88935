"""The composer's file writer: decisions in, the job's files out (as text for `write_file`).

The rubric is code the composer generates from two decisions, its form and the rule that
extracts the answer from the reply. Some combinations cannot work — `after_marker` looks for
an `Answer:` the model is never taught to write, so every reply scores the same and the
validation probe rejects the rubric as constant. That is a real consequence to learn from.

Three more decisions are the slips real job writers make (an LM agent trained on older
verifiers code, on Hugging Face datasets or on chat APIs makes each of them); their first
choice is right, every other one writes a job that the probe really rejects:

* `reward_def` — `plain_def`: the reward is a plain `def` (verifiers v0's reward functions
  were sync; v1 awaits them). The sandboxed host reports it on the first scored reply
  (`rewards_valid` fails: "reward ... must be `async def`").
* `exports` — `no_all`: the module defines the Taskset but no `__all__` (`taskset` fails).
* `row_keys` — `question`: rows keyed `question` (the gsm8k/HF habit) while the taskset, copied
  from the scaffold, reads `row["prompt"]` (`dataset` and `load` fail); `messages`: `prompt` a
  list of chat messages instead of one user message's text (`dataset` fails).
"""

from __future__ import annotations

import json

from nestor.job.config import JobConfig
from nestor.job.layout import env_pyproject

RUBRICS = ("exact", "normalised", "partial", "similarity")
EXTRACTS = ("whole", "first_line", "last_word", "after_marker")
REWARD_DEFS = ("async_def", "plain_def")  # the right choice first, then the writer's slips
EXPORTS = ("all", "no_all")
ROW_KEYS = ("prompt", "question", "messages")

_EXTRACT_SRC = {
    "whole": "    return reply",
    "first_line": "    lines = reply.strip().splitlines()\n    return lines[0] if lines else \"\"",
    "last_word": "    words = reply.split()\n    return words[-1] if words else \"\"",
    "after_marker": "    head, sep, tail = reply.rpartition(\"Answer:\")\n"
                    "    return tail if sep else \"\"",
}

_RUBRIC_SRC = {
    "exact": """    @vf.reward(weight=1.0)
    {adef}def exact(self, trace: vf.Trace) -> float:
        return float(extract(trace.last_reply) == self.data.answer)
""",
    "normalised": """    @vf.reward(weight=1.0)
    {adef}def normalised(self, trace: vf.Trace) -> float:
        return float(normalise(extract(trace.last_reply)) == normalise(self.data.answer))
""",
    "partial": """    @vf.reward(weight=0.5)
    {adef}def exact(self, trace: vf.Trace) -> float:
        return float(normalise(extract(trace.last_reply)) == normalise(self.data.answer))

    @vf.reward(weight=0.5)
    {adef}def positions(self, trace: vf.Trace) -> float:
        reply, answer = normalise(extract(trace.last_reply)), normalise(self.data.answer)
        if not reply and not answer:
            return 1.0
        same = sum(a == b for a, b in zip(reply, answer))
        return same / max(len(reply), len(answer))
""",
    "similarity": """    @vf.reward(weight=1.0)
    {adef}def similarity(self, trace: vf.Trace) -> float:
        reply, answer = normalise(extract(trace.last_reply)), normalise(self.data.answer)
        if not reply:
            return 0.0
        return difflib.SequenceMatcher(None, reply, answer).ratio()
""",
}

_ENV_TEMPLATE = '''"""{title}: a composed job ({rubric} rubric, `{extract}` answer extraction).

Rows: {rows_note}.
"""

{imports}

def normalise(text: str) -> str:
    """The test's normalisation: surrounding whitespace and one trailing period go."""
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


def extract(reply: str) -> str:
{extract_src}


class RowData(vf.TaskData):
    answer: str


class RowTask(vf.Task[RowData]):
{rubric_src}

class RowTaskset(vf.Taskset[RowTask, vf.TasksetConfig]):
{load_src}{exports_src}'''

_LOAD_FILE = '''    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                row = json.loads(line)
                yield RowTask(RowData(prompt=row["prompt"], answer=row["answer"]),
                              self.config.task)
'''
# The short form (composer_short.py): rows() is the generator's source, defined at module level.
_LOAD_CODE = '''    def load(self):
        for prompt, answer in rows():
            yield RowTask(RowData(prompt=prompt, answer=answer), self.config.task)
'''


def package_name(task_id: str) -> str:
    safe = "".join(c if c.isalnum() else "_" for c in task_id.lower())
    return f"composed_{safe}"


_IMPORTS_FILE = """import difflib
import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"
"""
_IMPORTS_CODE = """import difflib
import random

import verifiers.v1 as vf
"""


def env_source(*, title: str, rubric: str, extract: str, rows_note: str,
               reward_def: str = "async_def", exports: str = "all",
               rows_src: str | None = None) -> str:
    """The taskset's source; `rows_src` (a `rows()` generator's source) makes it the short
    form, whose load() draws the rows in code instead of reading data/train.jsonl."""
    rubric_src = _RUBRIC_SRC[rubric].replace("{adef}", "async " if reward_def == "async_def"
                                             else "")
    exports_src = '\n\n__all__ = ["RowTaskset"]\n' if exports == "all" else ""
    text = _ENV_TEMPLATE.format(
        title=title, rubric=rubric, extract=extract, rows_note=rows_note,
        extract_src=_EXTRACT_SRC[extract], rubric_src=rubric_src, exports_src=exports_src,
        imports=_IMPORTS_FILE if rows_src is None else _IMPORTS_CODE,
        load_src=_LOAD_FILE if rows_src is None else _LOAD_CODE)
    if rows_src is not None:  # rows() before the classes that use it
        text = text.replace("\n\nclass RowData", f"\n\n{rows_src}\n\nclass RowData", 1)
    return text


def keyed_rows(rows: list[dict], row_keys: str = "prompt") -> list[dict]:
    """The dataset rows as the writer keys them: `prompt` (the format), `question` (the wrong
    key) or `messages` (prompt as a chat message list instead of its text)."""
    if row_keys == "question":
        return [{"question": r["prompt"], "answer": r["answer"]} for r in rows]
    if row_keys == "messages":
        return [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                for r in rows]
    return rows


def pyproject(task_id: str) -> str:
    pkg = package_name(task_id)
    return env_pyproject(pkg, f"Composed job for task {task_id}.")


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


def config_toml(cfg: JobConfig, comment: str) -> str:
    lines = [f"# {comment}"] + [f"{k} = {_toml_value(v)}" for k, v in cfg.model_dump().items()]
    return "\n".join(lines) + "\n"


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
