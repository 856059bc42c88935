"""PRIVATE: hidden evals. Imported only by the trusted scorer (nestor.inner.evaluate) and the
CLI's `eval`. Nothing that renders prompts for the agent, writes into a workspace or runs agent
code may import this module (a test enforces it for the public API).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from nestor.tasks.base import normalise
from nestor.tasks.registry import TaskRef
from nestor.tasks.secret import keyed_seed

EVAL_VERSION = 2  # bump when items or scoring change: invalidates cached pre-scores
DEFAULT_N = 200

# Salts of the built-in families' hidden generators: public (they are in the source); what keeps
# the items secret is the installation's secret mixed into every seed (nestor.tasks.secret).
_BUILTIN_SALTS = {
    "strings": "hs-7f3a91",
    "arithmetic": "ha-2c88d0",
    "counting": "hc-b41e77",
    "formatting": "hf-09d5c2",
}


@dataclass(frozen=True)
class EvalItem:
    input: str
    prompt: str
    answer: str


@dataclass(frozen=True)
class HiddenEval:
    task_id: str
    difficulty: int
    items: tuple[EvalItem, ...]
    max_new_tokens: int
    version: int = EVAL_VERSION

    @staticmethod
    def score(prediction: str, item: EvalItem) -> int:
        """1 when the reply equals the answer after `normalise`, else 0."""
        return int(normalise(prediction) == normalise(item.answer))


def hidden_eval(ref: TaskRef, n: int = DEFAULT_N, difficulty: int = 0) -> HiddenEval:
    """n distinct items from the task's sampler under a secret seed, disjoint from the
    spec's worked examples."""
    salt = ref.family.hidden_salt or _BUILTIN_SALTS[ref.family.name]
    rng = random.Random(keyed_seed(f"{salt}:{ref.id}:{difficulty}"))
    return HiddenEval(ref.id, difficulty, draw_items(ref, n, difficulty, rng),
                      ref.task.new_tokens(difficulty))


def draw_items(ref: TaskRef, n: int, difficulty: int,
               rng: random.Random) -> tuple[EvalItem, ...]:
    """How a hidden eval's items are drawn, from any seed: n distinct inputs of the task's
    sampler, none a worked example of the spec. Small input spaces may hold fewer than n
    distinct items; then items repeat (drawn with replacement) so that n stays as asked."""
    excluded = {e.input for e in ref.task.examples(difficulty)}
    distinct: list[str] = []
    seen: set[str] = set()
    draws = 0
    while len(distinct) < n and draws < 50 * n:
        draws += 1
        x = ref.task.sample(rng, difficulty)
        if x not in excluded and x not in seen:
            seen.add(x)
            distinct.append(x)
    inputs = distinct + [rng.choice(distinct) for _ in range(n - len(distinct))]
    return tuple(EvalItem(x, ref.task.prompt(x), ref.task.solve(x)) for x in inputs)
