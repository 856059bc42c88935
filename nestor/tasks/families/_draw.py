"""Shared input samplers for the built-in families."""

import random

LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOWELS = "aeiou"
WORDS = (
    "cat dog sun red big top map cup pen box hat fox owl bee ant elk ice oak sky "
    "run fly sit low new old hot wet dry fun art ink jam key leg man net pie rug"
).split()


def word(rng: random.Random, lo: int, hi: int, alphabet: str = LETTERS) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def length_range(difficulty: int, base: tuple[int, int]) -> tuple[int, int]:
    """Difficulty d adds 3·d letters to both ends of the range."""
    lo, hi = base
    return lo + 3 * difficulty, hi + 3 * difficulty
