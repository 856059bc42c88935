"""Formatting words: the held-out family, used only for transfer evals."""

import random

from nestor.tasks.base import Family, TaskDef
from nestor.tasks.families._draw import WORDS, length_range, word


def _words(rng: random.Random, d: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2 + d, 3 + d)))


def _word_ranges(d: int) -> str:
    return f"`s` is {2 + d}–{3 + d} short lowercase words separated by single spaces."


FAMILY = Family(
    name="formatting",
    description="Reformatting words and letters.",
    heldout=True,
    tasks=(
        TaskDef("dashes", "Join letters with dashes",
                "Write the letters of `s` joined by `-`.",
                lambda rng, d: word(rng, *length_range(d, (2, 5))), lambda s: "-".join(s),
                lambda s: f"dashes {s}",
                lambda d: "`s` is {}–{} lowercase letters a–z.".format(*length_range(d, (2, 5)))),
        TaskDef("acronym", "Acronym", "Write the first letter of each word of `s`, uppercased.",
                _words, lambda s: "".join(w[0].upper() for w in s.split()),
                lambda s: f"acronym {s}", _word_ranges, max_new_tokens=8),
        TaskDef("snake", "Snake case", "Write `s` with each space replaced by `_`.",
                _words, lambda s: s.replace(" ", "_"), lambda s: f"snake {s}", _word_ranges,
                max_new_tokens=20),
    ),
)
