"""Loops in sampled text: a small model's reply that repeats one piece ('5555…', a blank line,
the same docstring) until the turn's cap. Measured on SmolLM2 RL episodes (docs/lm-arc.md):
most malformed turns were such loops. Plain Python (no torch): the config imports it too.
"""

from __future__ import annotations

from collections.abc import Sequence

LOOP_MIN_SPAN = 48  # a loop's shortest span that ends a reply (no well-formed turn had one)
MAX_REPEAT_PERIOD = 128  # the longest repeated piece looked for (a docstring, a data row)
REPEAT_CHECK_EVERY = 8  # tokens between the sampler's checks: each is Python over a row's tail


def is_check_point(steps: int, min_span: int) -> bool:
    """Whether the sampler looks for a loop after `steps` sampled tokens."""
    return steps >= min_span and steps % REPEAT_CHECK_EVERY == 0


def check_window(min_span: int) -> int:
    """The longest tail `repeat_period` can need: the sampler passes no more than this."""
    return max(min_span, 3 * MAX_REPEAT_PERIOD)


def repeat_period(ids: Sequence[int], min_span: int,
                  max_period: int = MAX_REPEAT_PERIOD) -> int | None:
    """The shortest period p <= max_period with which `ids` ends in one piece repeated: its last
    max(min_span, 3p) tokens equal themselves shifted by p (three copies or more); else None."""
    ids = list(ids)
    n = len(ids)
    for p in range(1, max_period + 1):
        span = max(min_span, 3 * p)
        if span > n:
            return None
        if ids[n - span + p:] == ids[n - span:n - p]:
            return p
    return None
