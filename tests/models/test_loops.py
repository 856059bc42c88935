"""Loop detection in sampled token ids (nestor/models/loops.py)."""

from nestor.models.loops import repeat_period


def test_a_piece_repeated_three_times_over_the_span_is_a_loop():
    assert repeat_period([7] * 48, 48) == 1
    piece = list(range(100, 112))  # a 12-token row tuple, as an RL episode repeated it
    assert repeat_period([1, 2, 3] + piece * 4, 48) == 12
    assert repeat_period([1, 2, 3] + piece * 4, 48, max_period=11) is None
    long = list(range(200, 260))  # a 60-token docstring: 3 copies = 180 tokens, over the span
    assert repeat_period(long * 3, 48) == 60
    assert repeat_period(long * 2 + long[:50], 48) is None


def test_text_that_only_looks_repetitive_is_not():
    assert repeat_period([7] * 47, 48) is None  # shorter than the span
    assert repeat_period([7] * 60 + [8], 48) is None  # the loop ended
    counting = [t for i in range(40) for t in (i // 10, i % 10, 99)]  # "00,01,02,...,39,"
    assert repeat_period(counting, 48) is None
    assert repeat_period([], 48) is None
