"""The synthetic pretraining corpus of the tiny models.

Built from the PUBLIC task definitions (input samplers and reference solutions) with the corpus's
own seeds — never from `nestor.tasks.hidden`. Each skill appears in many phrasings and formats
(chat and plain text, single rows and short lists, Python-ish and Q/A), and only a small share of
rows uses the exact test format, so the models get the skills partly and the test formats
imperfectly: room for an inner trainer to improve them. A small share of chat documents with
tool calls, Python and TOML keeps an LM agent on a tiny model producing well-formed-ish calls.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from nestor.models.tokenizer import IM_END, IM_START, TOOL_CALL, TOOL_CALL_END
from nestor.tasks import TaskRef, TaskRegistry


@dataclass(frozen=True)
class CorpusMix:
    """Shares of document kinds; the rest are paraphrased single rows and lists."""

    test_format_share: float = 0.2  # chat rows in the exact test format
    tool_share: float = 0.02  # tool-call / code / TOML chats
    list_share: float = 0.35  # plain lists of 3-6 rows of one skill
    hard_share: float = 0.1  # rows drawn at difficulty 1 (longer inputs)
    # Per-task factors on a skill's share of documents (1 when absent): skills that a tiny
    # model learns slowly (arithmetic) get more practice, quick ones less, so that one step
    # count leaves most skills partly learned.
    emphasis: tuple[tuple[str, float], ...] = ()


def chat(user: str, assistant: str) -> str:
    return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{assistant}{IM_END}\n"


# A paraphrase renders (task, input, answer) as text. `t` is the TaskDef; `p` the test prompt.
Phrase = Callable[..., str]

CHAT_PHRASES: tuple[Phrase, ...] = (
    lambda t, x, a, p: chat(f"{t.title}: {x}", a),
    lambda t, x, a, p: chat(f"{t.skill}\nInput: {x}", a),
    lambda t, x, a, p: chat(f"Task: {t.title.lower()}\nInput: {x}\nAnswer with the result only.", a),
    lambda t, x, a, p: chat(f"{t.id}: {x}", a),
    lambda t, x, a, p: chat(f"Please do this ({t.title.lower()}) for \"{x}\".", f"The answer is {a}."),
)
PLAIN_PHRASES: tuple[Phrase, ...] = (
    lambda t, x, a, p: f"{t.title}: {x} -> {a}\n",
    lambda t, x, a, p: f"Input: {x}\n{t.title}: {a}\n",
    lambda t, x, a, p: f"{t.id}({x!r}) == {a!r}\n",
    lambda t, x, a, p: f"Q: {t.title.lower()} for {x}?\nA: {a}\n",
    lambda t, x, a, p: f"{p}\n{a}\n",  # the test prompt, but as plain text
)


def _words(x: str) -> list[str]:
    return x.split()


# Extra task-specific phrasings for the built-in skills (plugin tasks use the generic ones).
SPECIFIC: dict[str, tuple[Phrase, ...]] = {
    "reverse": (lambda t, x, a, p: f"{x} backwards is {a}\n",
                lambda t, x, a, p: chat(f"Spell {x} backwards.", a)),
    "sort": (lambda t, x, a, p: f"the letters of {x} in order: {a}\n",
             lambda t, x, a, p: chat(f"Sort the letters of {x} alphabetically.", a)),
    "dedupe": (lambda t, x, a, p: f"{x} without repeated letters is {a}\n",
               lambda t, x, a, p: chat(f"Remove repeated letters from {x}.", a)),
    "shift": (lambda t, x, a, p: f"{x} with every letter moved one step on: {a}\n",
              lambda t, x, a, p: chat(f"Caesar shift {x} by one.", a)),
    "add": (lambda t, x, a, p: "{} plus {} is {}\n".format(*_words(x), a),
            lambda t, x, a, p: chat("What is {} + {}?".format(*_words(x)), a)),
    "subtract": (lambda t, x, a, p: "{} minus {} is {}\n".format(*_words(x), a),
                 lambda t, x, a, p: chat("What is {} - {}?".format(*_words(x)), a)),
    "max": (lambda t, x, a, p: "the larger of {} and {} is {}\n".format(*_words(x), a),
            lambda t, x, a, p: chat("Which is bigger, {} or {}?".format(*_words(x)), a)),
    "length": (lambda t, x, a, p: f"{x} has {a} letters\n",
               lambda t, x, a, p: chat(f"How many letters are in {x}?", a)),
    "vowels": (lambda t, x, a, p: f"{x} has {a} vowels\n",
               lambda t, x, a, p: chat(f"How many vowels does {x} have?", a)),
    "count": (lambda t, x, a, p: "{1} has {2} {0}'s\n".format(*_words(x), a),
              lambda t, x, a, p: chat("How many times does {} occur in {}?".format(*_words(x)), a)),
    "dashes": (lambda t, x, a, p: f"{x} spelled out with dashes: {a}\n",
               lambda t, x, a, p: chat(f"Put a dash between the letters of {x}.", a)),
    "acronym": (lambda t, x, a, p: f"the initials of {x} are {a}\n",
                lambda t, x, a, p: chat(f"Make an acronym from: {x}", a)),
    "snake": (lambda t, x, a, p: f"{x} in snake_case is {a}\n",
              lambda t, x, a, p: chat(f"Convert to snake_case: {x}", a)),
}


def _row(ref: TaskRef, rng: random.Random, mix: CorpusMix) -> tuple[str, str, str]:
    difficulty = 1 if rng.random() < mix.hard_share else 0
    x = ref.task.sample(rng, difficulty)
    return x, ref.task.solve(x), ref.task.prompt(x)


def task_document(ref: TaskRef, rng: random.Random, mix: CorpusMix) -> str:
    """One document exercising one skill."""
    t = ref.task
    u = rng.random()
    if u < mix.test_format_share:
        x, a, p = _row(ref, rng, mix)
        return chat(p, a)
    if u < mix.test_format_share + mix.list_share:
        header = rng.choice((f"{t.title}\n", f"# {t.skill}\n", f"Examples of {t.id}:\n"))
        arrow = rng.choice((" -> ", " => ", ": "))
        rows = [_row(ref, rng, mix) for _ in range(rng.randint(3, 6))]
        return header + "".join(f"{x}{arrow}{a}\n" for x, a, _ in rows)
    x, a, p = _row(ref, rng, mix)
    phrases = CHAT_PHRASES + PLAIN_PHRASES + SPECIFIC.get(t.id, ())
    return rng.choice(phrases)(t, x, a, p)


# --- agent-style documents: tool calls, Python and TOML (a small share) -------------------

_FILES = ("config.toml", "data/train.jsonl", "env/pyproject.toml", "env/job_env/__init__.py",
          "notes.md")
_KEYS = (("learning_rate", lambda r: f"{r.choice((1, 2, 3, 5))}e-{r.choice((3, 4, 5))}"),
         ("max_steps", lambda r: str(r.choice((20, 40, 60, 80, 100)))),
         ("group_size", lambda r: str(r.choice((4, 8, 16)))),
         ("temperature", lambda r: str(r.choice((0.7, 1.0, 1.2)))),
         ("lora_rank", lambda r: str(r.choice((0, 4, 8, 16)))),
         ("seed", lambda r: str(r.randint(0, 99))))


def _toml(rng: random.Random) -> str:
    keys = rng.sample(_KEYS, rng.randint(2, len(_KEYS)))
    return f'base_model = "{rng.choice(("tiny-s", "tiny-m"))}"\n' + "".join(
        f"{k} = {v(rng)}\n" for k, v in keys)


def _python(rng: random.Random, ref: TaskRef) -> str:
    return (f"def {ref.id}_reward(completion, answer):\n"
            f"    return 1.0 if completion.strip() == answer else 0.0\n")


def _jsonl(rng: random.Random, ref: TaskRef) -> str:
    lines = []
    for _ in range(rng.randint(2, 4)):
        x = ref.task.sample(rng, 0)
        lines.append(json.dumps({"prompt": ref.task.prompt(x), "answer": ref.task.solve(x)}))
    return "\n".join(lines) + "\n"


def _call(name: str, arguments: dict) -> str:
    return f"{TOOL_CALL}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_END}"


def tool_document(refs: list[TaskRef], rng: random.Random) -> str:
    ref = rng.choice(refs)
    kind = rng.randrange(5)
    if kind == 0:
        return _toml(rng)
    if kind == 1:
        return _python(rng, ref)
    if kind == 2:  # the agent writes a file and gets a result back
        path = rng.choice(_FILES)
        content = {"config.toml": _toml(rng), "data/train.jsonl": _jsonl(rng, ref)}.get(
            path, _python(rng, ref))
        user = rng.choice((f"Write {path}.", f"Teach the model to {ref.task.title.lower()}.",
                           f"Create the file {path}"))
        reply = _call("write_file", {"path": path, "content": content})
        result = f"wrote {len(content)} bytes to {path}"
        return (f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{reply}{IM_END}\n"
                f"{IM_START}user\n<tool_response>\n{result}\n</tool_response>{IM_END}\n")
    if kind == 3:
        reply = _call(rng.choice(("list_files", "submit")), {})
        return chat(rng.choice(("What files are there?", "Submit the job.", "Done?")), reply)
    path = rng.choice(_FILES)
    return chat(f"Show me {path}", _call("read_file", {"path": path}))


def build_corpus(n_docs: int, seed: int = 0, mix: CorpusMix | None = None,
                 registry: TaskRegistry | None = None) -> list[str]:
    """`n_docs` documents over all skills (held-out family included); deterministic in `seed`."""
    mix = mix or CorpusMix()
    refs = (registry or TaskRegistry()).tasks(include_heldout=True)
    rng = random.Random(f"nestor-corpus:{seed}")
    # Skills with longer answers need more practice: weight ~ sqrt(answer budget).
    emphasis = dict(mix.emphasis)
    unknown = set(emphasis) - {ref.id for ref in refs}
    if unknown:
        raise ValueError(f"corpus emphasis names unknown tasks: {', '.join(sorted(unknown))}")
    weights = [math.sqrt(ref.task.max_new_tokens) * emphasis.get(ref.id, 1.0) for ref in refs]
    docs = []
    for _ in range(n_docs):
        if rng.random() < mix.tool_share:
            docs.append(tool_document(refs, rng))
        else:
            docs.append(task_document(rng.choices(refs, weights)[0], rng, mix))
    rng.shuffle(docs)
    return docs
