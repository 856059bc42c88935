"""Does a job train on the hidden eval? Compared here, in the trusted process, on plain data.

A job's tasks are what its `load()` yielded in the sandbox (prompts and answers as strings: the
very prompts the trainer will see). A hidden item counts as in the job when some task has the
item's answer (or none) and its prompt holds the item's own words in order: the item's prompt
less the words every item of the task shares (the template), so "37+10=" is found in "What is
37 plus 10?". The job is refused when it holds more hidden items than a dataset of the same
size drawn from the task's own sampler would (its mean over a few draws, plus four standard
deviations): an honest dataset of a small input space overlaps the hidden eval by chance
(docs/tasks.md), a copied one far more. The refusal names no item and no count, so that it
tells an agent nothing about which items are hidden.
"""

from __future__ import annotations

import math
import random
import re
import secrets
from collections import defaultdict

from nestor.tasks.base import normalise
from nestor.tasks.hidden import DEFAULT_N, hidden_eval
from nestor.tasks.registry import TaskRef

HONEST_DRAWS = 3
MAX_DRAWS = 200_000  # per honest draw: covers a space of ~10^4 inputs, bounds the work
REFUSAL = ("the job's tasks hold more of the hidden eval's items than a dataset of the same size "
           "drawn from the task would; generate your own inputs (the hidden eval is not yours to "
           "see)")
_WORD = re.compile(r"[^\W_]+|[^\w\s]")  # runs of letters/digits, and single symbols


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _in_order(needle: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(w in it for w in needle)


def hidden_items_held(ref: TaskRef, difficulty: int, tasks: list[dict],
                      n: int = DEFAULT_N) -> int:
    """How many distinct hidden items the job's tasks hold (never shown to the job)."""
    items = {it.input: it for it in hidden_eval(ref, n=n, difficulty=difficulty).items}
    words = {x: [w for w in _words(it.prompt) if w.isalnum()] for x, it in items.items()}
    template = set.intersection(*(set(w) for w in words.values())) if words else set()
    by_answer: dict[str, list[list[str]]] = defaultdict(list)
    unanswered: dict[str, list[list[str]]] = defaultdict(list)  # by each word they hold
    for task in tasks:
        prompt = _words(str(task.get("prompt", "")))
        answer = task.get("answer")
        if answer is None:
            for w in set(prompt):
                unanswered[w].append(prompt)
        else:
            by_answer[normalise(str(answer))].append(prompt)
    held = 0
    for x, item in items.items():
        own = [w for w in words[x] if w not in template] or words[x]
        candidates = by_answer.get(normalise(item.answer), []) + unanswered.get(own[0], []) \
            if own else []
        held += any(_in_order(own, prompt) for prompt in candidates)
    return held


def honest_overlap(ref: TaskRef, difficulty: int, size: int, n: int = DEFAULT_N,
                   draws: int = HONEST_DRAWS) -> tuple[float, float]:
    """Mean and standard deviation of the hidden items held by `size` distinct inputs drawn
    from the task's sampler (fresh seeds: nothing an agent could aim at)."""
    hidden = {it.input for it in hidden_eval(ref, n=n, difficulty=difficulty).items}
    counts = []
    for _ in range(draws):
        rng = random.Random(secrets.token_hex(8))
        seen: set[str] = set()
        for _ in range(min(50 * max(size, 1), MAX_DRAWS)):
            if len(seen) >= size:
                break
            seen.add(ref.task.sample(rng, difficulty))
        counts.append(len(seen & hidden))
    mean = sum(counts) / len(counts)
    # a draw's count is close to binomial: its variance is at most its mean
    return mean, math.sqrt(max(mean, 1.0))


def contamination_error(ref: TaskRef, difficulty: int, tasks: list[dict],
                        n: int = DEFAULT_N) -> str | None:
    """None, or why the job is refused (a message that names no hidden item)."""
    size = len({str(t.get("prompt", "")) for t in tasks})
    held = hidden_items_held(ref, difficulty, tasks, n)
    if held == 0:
        return None
    mean, sd = honest_overlap(ref, difficulty, size, n)
    return REFUSAL if held > mean + 4 * sd + 2 else None
