"""The rubric probe's replies: wrong answers made from the reference, for any answer text."""

import pytest

from nestor.job.rubric_probe import corruptions, normalise, probe_replies
from nestor.tasks import TaskRegistry


@pytest.mark.parametrize("answer", ["x²y", "²", "1³"])  # isdigit(), and int() refuses them
def test_answers_with_non_ascii_digits_are_corrupted(answer):
    out = corruptions(answer, None)
    assert out["one_char_changed"] != answer
    assert all(normalise(v) != normalise(answer) for v in out.values())


def test_probe_replies_take_a_superscript_answer():
    spec = TaskRegistry().get("add").spec(0)
    tasks = [{"prompt": f"q{i}", "answer": "x²y", "system_prompt": None} for i in range(40)]
    replies = probe_replies(tasks, list(range(16)), spec)
    assert any(r.kind == "corrupt:one_char_changed" for r in replies)
