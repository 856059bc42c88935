"""Counting characters in a string."""

import random

from nestor.tasks.base import Family, TaskDef
from nestor.tasks.families._draw import LETTERS, VOWELS, length_range, word


def _ranges(d: int) -> str:
    lo, hi = length_range(d, (2, 9))
    return f"`s` is {lo}–{hi} lowercase letters a–z."


def _letters(rng: random.Random, d: int) -> str:
    return word(rng, *length_range(d, (2, 9)))


def _letter_and_word(rng: random.Random, d: int) -> str:
    c = rng.choice(LETTERS[:5])
    return f"{c} {word(rng, *length_range(d, (3, 8)), alphabet=LETTERS[:5])}"


def _count_letter(x: str) -> str:
    c, s = x.split()
    return str(s.count(c))


FAMILY = Family(
    name="counting",
    description="Counting characters.",
    tasks=(
        TaskDef("length", "Length of a string", "Write how many letters `s` has.",
                _letters, lambda s: str(len(s)), lambda s: f"len {s}", _ranges,
                max_new_tokens=4),
        TaskDef("vowels", "Count vowels", "Write how many letters of `s` are vowels (a e i o u).",
                _letters, lambda s: str(sum(c in VOWELS for c in s)),
                lambda s: f"vowels {s}", _ranges, max_new_tokens=4),
        TaskDef("count", "Count one letter", "Write how many times the letter `c` occurs in `s`.",
                _letter_and_word, _count_letter, lambda x: "count {} in {}".format(*x.split()),
                lambda d: "`c` is one of a–e; `s` is {}–{} letters drawn from a–e.".format(
                    *length_range(d, (3, 8))), max_new_tokens=4),
    ),
)
