"""Does a job train on the hidden eval? Compared here, in the trusted process, on plain data.

A job's tasks are what its `load()` yielded in the sandbox (prompts and answers as strings: the
very prompts the trainer will see). An eval item counts as in the job when some task's prompt
holds the item's own words in order: the item's prompt less the words every item of the task
shares (the template), so "37+10=" is found in "What is 37 plus 10?", and in a few-shot prompt
that shows it among others. The task's answer is not asked for: the rubric, in the sandbox, may
score from anything (it can compute a reversal itself), so a wrong or blank answer must not hide
a hidden prompt.

An honest dataset of a small input space holds hidden items by chance (docs/tasks.md), and as
many as it holds of any other eval drawn the same way: it cannot tell the hidden eval from one
drawn under a fresh seed. So the job's count of hidden items is set beside its counts of a few
such fresh evals (`draw_items`), and the job is refused when an honest job would hold as many
with probability at most FALSE_REFUSAL (`over_honest`, an exact test). Comparing the job with
itself, not with a dataset of the task's sampler, is what lets an honest job draw its inputs its
own way (short inputs first, one length only) and keeps rows that hold no task's input (padding)
from widening the allowance. A row that holds many items of every eval (one that spells out a
small space, "0 1 2 … 99 0 1 2 … 99") counts for none of them: else it would hold every item,
hidden or fresh, and hide any copied beside it. The refusal names no item and no count, so that
it tells an agent nothing about which items are hidden.
"""

from __future__ import annotations

import math
import random
import re
import secrets
import unicodedata
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Sequence

from nestor.tasks.hidden import DEFAULT_N, EvalItem, draw_items, hidden_eval
from nestor.tasks.registry import TaskRef

FRESH_EVALS = 8  # drawn and matched with the hidden one: ~0.5 s for a 100,000-row job
FALSE_REFUSAL = 1e-4  # the chance that an honest job is refused, at most
ROW_CAP = 8  # a row holding more items of every eval spells out the space: it counts for none
# (item, row) pairs matched in all, at most (1.4–2.3 µs each): honest 3,000-row jobs make
# ≤ 11,000 over the nine evals, an 8-shot `add` job at the 3.2 MB reply cap 1.8 M (6 s); rows
# that each spell out `add`'s inputs make 1,800 a row (25 s at the cap when unbounded, 7 s now)
MAX_CANDIDATES = 5_000_000
REFUSAL = ("the job's tasks hold more of the hidden eval's items than a job that never saw it "
           "would; generate your own inputs (the hidden eval is not yours to see)")
TOO_DENSE = ("the job's prompts each hold so many of the task's inputs that they cannot be checked "
             "for the hidden eval's items; ask one question a prompt, with at most a few worked "
             "examples")


class TooDense(Exception):
    """Matching would pass MAX_CANDIDATES (item, row) pairs."""
_WORD = re.compile(r"[^\W_]+|[^\w\s]")  # runs of letters/digits, and single symbols


def _words(text: str) -> list[str]:
    """Lowercase words, folded so that look-alike or invisible characters hide none: compatibility
    forms read as their letters (fullwidth "ａｂｃ" is "abc"), format characters dropped (a
    zero-width space inside "abc" does not make it two words)."""
    text = "".join(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) != "Cf")
    return _WORD.findall(text.lower())


class JobTasks:
    """The words of a job's tasks (the text the trainer prompts with), indexed by word."""

    def __init__(self, tasks: list[dict]):
        self.texts = [_words(" ".join(str(t.get(k) or "") for k in ("system_prompt", "prompt")))
                      for t in tasks]
        self.rows_with: dict[str, set[int]] = defaultdict(set)
        for row, words in enumerate(self.texts):
            for w in words:
                self.rows_with[w].add(row)
        self._positions: dict[int, dict[str, list[int]]] = {}
        self.candidates = 0  # (item, row) pairs matched so far

    def _in_order(self, needle: list[str], row: int) -> bool:
        """Does the row hold `needle`'s words in order? By each word's positions in the row
        (built once per row), so a check costs O(len(needle) · log) whatever the row's length:
        walking the row instead let rows of 3,800 words, each a candidate for every item,
        cost ~80 s a job (2026-12-08)."""
        positions = self._positions.get(row)
        if positions is None:
            positions = self._positions[row] = defaultdict(list)
            for i, w in enumerate(self.texts[row]):
                positions[w].append(i)
        at = -1
        for w in needle:
            after = positions.get(w, ())
            k = bisect_right(after, at)
            if k == len(after):
                return False
            at = after[k]
        return True

    def holders(self, items: Sequence[EvalItem]) -> list[set[int]]:
        """Per distinct item (by input): the rows whose text holds its own words in order."""
        items_by_input = {it.input: it for it in items}
        words = {x: [w for w in _words(it.prompt) if w.isalnum()]
                 for x, it in items_by_input.items()}
        template = set.intersection(*(set(w) for w in words.values())) if words else set()
        found = []
        for x in items_by_input:
            own = [w for w in words[x] if w not in template] or words[x]
            if not own:
                continue
            postings = sorted((self.rows_with.get(w, set()) for w in set(own)), key=len)
            rows = postings[0].intersection(*postings[1:])
            self.candidates += len(rows)
            if self.candidates > MAX_CANDIDATES:
                raise TooDense
            found.append({row for row in rows if self._in_order(own, row)})
        return found

    def held(self, items: Sequence[EvalItem]) -> int:
        """How many distinct items some row holds."""
        return sum(bool(rows) for rows in self.holders(items))

    def counts(self, evals: list[Sequence[EvalItem]]) -> list[int]:
        """Items held of each eval (`unspelled_counts`)."""
        return unspelled_counts([self.holders(items) for items in evals])


def unspelled_counts(found: list[list[set[int]]]) -> list[int]:
    """Items held of each eval (its items' holders), leaving out rows that hold more than
    ROW_CAP items of every one of them (rows that spell out the space). Decided on all evals
    together, so that the hidden one is treated as any other: a row packed with hidden items
    holds few of a fresh eval's and stays counted."""
    loads = [Counter(row for rows in per_item for row in rows) for per_item in found]
    spelled = set.intersection(*({row for row, k in load.items() if k > ROW_CAP}
                                 for load in loads))
    return [sum(bool(rows - spelled) for rows in per_item) for per_item in found]


def hidden_items_held(ref: TaskRef, difficulty: int, tasks: list[dict],
                      n: int = DEFAULT_N) -> int:
    """How many distinct hidden items the job's tasks hold (never shown to the job)."""
    return JobTasks(tasks).held(hidden_eval(ref, n=n, difficulty=difficulty).items)


def fresh_evals(ref: TaskRef, difficulty: int, n: int = DEFAULT_N,
                evals: int = FRESH_EVALS) -> list[tuple[EvalItem, ...]]:
    """Evals drawn as the hidden one is, under fresh seeds (nothing an agent could aim at)."""
    return [draw_items(ref, n, difficulty, random.Random(secrets.token_hex(8)))
            for _ in range(evals)]


def _binomial_tail(trials: int, p: float, k: int) -> float:
    """P(Binomial(trials, p) >= k)."""
    def log_pmf(i: int) -> float:
        return (math.lgamma(trials + 1) - math.lgamma(i + 1) - math.lgamma(trials - i + 1)
                + i * math.log(p) + (trials - i) * math.log1p(-p))
    return sum(math.exp(log_pmf(i)) for i in range(k, trials + 1))


def over_honest(held: int, honest: list[int], alpha: float = FALSE_REFUSAL) -> bool:
    """Is `held` more than the `honest` counts it is set beside allow?

    For an honest job, its hidden count and its fresh counts are alike: each the hits of n
    draws of one procedure on the same rows, close to a binomial (variance at most its mean μ,
    so a Poisson is the wider model). Given their total, the hidden count's share is then
    Binomial(total, 1/(k+1)) for k fresh counts, whatever μ is, and the job is refused when a
    share as large has probability at most `alpha`. This allows for the baseline's own error,
    which a threshold of a mean plus a few standard deviations does not: under the rule before
    (three draws' mean + 4 sd + 2), draws holding 0, 1 and 1 where 2 is usual refused an honest
    job holding 7, which one honest job in 220 does.
    """
    total = held + sum(honest)
    return _binomial_tail(total, 1 / (len(honest) + 1), held) <= alpha


def contamination_error(ref: TaskRef, difficulty: int, tasks: list[dict],
                        n: int = DEFAULT_N) -> str | None:
    """None, or why the job is refused (a message that names no hidden item)."""
    job = JobTasks(tasks)
    try:
        hidden = job.holders(hidden_eval(ref, n=n, difficulty=difficulty).items)
        if not any(hidden):
            return None
        fresh = [job.holders(items) for items in fresh_evals(ref, difficulty, n)]
    except TooDense:
        return TOO_DENSE  # fails closed: a job that cannot be checked does not train
    held, *honest = unspelled_counts([hidden, *fresh])
    return REFUSAL if over_honest(held, honest) else None
