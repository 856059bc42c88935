"""String transforms on lowercase letters."""

import random

from nestor.tasks.base import Family, TaskDef
from nestor.tasks.families._draw import LETTERS, length_range, word


def _letters(rng: random.Random, d: int) -> str:
    return word(rng, *length_range(d, (3, 6)))


def _ranges(d: int) -> str:
    lo, hi = length_range(d, (3, 6))
    return f"`s` is {lo}–{hi} lowercase letters a–z (repeats allowed)."


def _dedupe(s: str) -> str:
    return "".join(dict.fromkeys(s))


def _rotate(s: str) -> str:
    return "".join(LETTERS[(LETTERS.index(c) + 1) % 26] for c in s)


FAMILY = Family(
    name="strings",
    description="Character-level string transforms.",
    tasks=(
        TaskDef("reverse", "Reverse a string", "Write the letters of `s` in reverse order.",
                _letters, lambda s: s[::-1], lambda s: f"reverse {s}", _ranges),
        TaskDef("sort", "Sort letters", "Write the letters of `s` in alphabetical order.",
                _letters, lambda s: "".join(sorted(s)), lambda s: f"sort {s}", _ranges),
        TaskDef("dedupe", "Remove repeated letters",
                "Write `s` keeping only the first occurrence of each letter.",
                lambda rng, d: word(rng, *length_range(d, (4, 7)), alphabet=LETTERS[:6]),
                _dedupe, lambda s: f"dedupe {s}",
                lambda d: "`s` is {}–{} letters drawn from a–f, so repeats are common.".format(
                    *length_range(d, (4, 7)))),
        TaskDef("shift", "Shift each letter", "Replace each letter of `s` by the next letter "
                "of the alphabet (z becomes a).", _letters, _rotate, lambda s: f"shift {s}",
                _ranges),
    ),
)
