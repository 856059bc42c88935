"""Small integer arithmetic in decimal digits."""

import random

from nestor.tasks.base import Family, TaskDef


def _bound(d: int) -> int:
    return 10 ** (2 + d) - 1  # difficulty 0: 0–99


def _pair(rng: random.Random, d: int) -> str:
    hi = _bound(d)
    return f"{rng.randint(0, hi)} {rng.randint(0, hi)}"


def _ordered_pair(rng: random.Random, d: int) -> str:
    a, b = sorted(int(v) for v in _pair(rng, d).split())
    return f"{b} {a}"


def _distinct_pair(rng: random.Random, d: int) -> str:
    while True:
        a, b = (int(v) for v in _pair(rng, d).split())
        if a != b:
            return f"{a} {b}"


def _ranges(d: int) -> str:
    return f"`a` and `b` are integers 0–{_bound(d)}."


def _ab(x: str) -> tuple[int, int]:
    a, b = x.split()
    return int(a), int(b)


FAMILY = Family(
    name="arithmetic",
    description="Addition, subtraction and comparison of small integers.",
    tasks=(
        TaskDef("add", "Add two numbers", "Write the sum `a + b` in decimal digits.",
                _pair, lambda x: str(sum(_ab(x))), lambda x: "{}+{}=".format(*_ab(x)), _ranges,
                max_new_tokens=8),
        TaskDef("subtract", "Subtract two numbers",
                "Write the difference `a - b` (a ≥ b, so it is never negative).",
                _ordered_pair, lambda x: str(_ab(x)[0] - _ab(x)[1]),
                lambda x: "{}-{}=".format(*_ab(x)),
                lambda d: _ranges(d) + " Always a ≥ b.", max_new_tokens=8),
        TaskDef("max", "Larger of two numbers", "Write the larger of `a` and `b`.",
                _distinct_pair, lambda x: str(max(_ab(x))), lambda x: "max {} {}".format(*_ab(x)),
                lambda d: _ranges(d) + " Always a ≠ b.", max_new_tokens=8),
    ),
)
