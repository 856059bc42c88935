"""A job that trains on the hidden eval is refused; an honest one of the same size is not, and
the refusal says nothing about which items are hidden."""

import json
import random
from pathlib import Path

import pytest

from nestor.inner.contamination import REFUSAL, contamination_error, hidden_items_held
from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import hidden_eval

GOOD_ADD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-add"
REG = TaskRegistry()


def _honest(task_id: str, size: int, seed: int) -> list[dict]:
    ref, rng = REG.get(task_id), random.Random(seed)
    inputs = {ref.task.sample(rng, 0) for _ in range(size)}
    return [{"prompt": ref.task.prompt(x), "answer": ref.task.solve(x)} for x in inputs]


@pytest.mark.parametrize("task_id", ["add", "reverse", "count", "acronym"])
def test_the_hidden_eval_as_data_is_refused(task_id):
    ref = REG.get(task_id)
    tasks = [{"prompt": it.prompt, "answer": it.answer} for it in hidden_eval(ref).items]
    # one constant message, whatever the items: it cannot tell which are hidden
    assert contamination_error(ref, 0, tasks) == REFUSAL


def test_honest_data_of_a_small_input_space_passes(monkeypatch):
    """good-add's own 2,000 rows hold dozens of the 200 hidden items by chance (the input
    space is 10,000): as many as any honest draw of that size does."""
    # One installation's secret, fixed: under a fresh clone's random one an honest 3,000-row
    # `reverse` draw was once refused (the threshold's false-refusal rate is an open question).
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "a fixed installation secret")
    rows = [json.loads(line) for line in
            (GOOD_ADD / "data" / "train.jsonl").read_text().splitlines()]
    ref = REG.get("add")
    assert hidden_items_held(ref, 0, rows) > 10  # overlap by chance is real on `add`
    assert contamination_error(ref, 0, rows) is None
    for task_id in ("add", "reverse", "max"):
        assert contamination_error(REG.get(task_id), 0, _honest(task_id, 3000, 7)) is None


def test_reworded_or_diluted_hidden_items_are_found():
    ref = REG.get("add")
    items = hidden_eval(ref).items
    reworded = [{"prompt": "Q: what is {} plus {}?".format(*it.prompt[:-1].split("+")),
                 "answer": it.answer} for it in items]
    assert hidden_items_held(ref, 0, reworded) == len({it.input for it in items})
    diluted = _honest("add", 2000, 3) + reworded[:120]
    assert contamination_error(ref, 0, diluted) == REFUSAL
    unanswered = [{"prompt": t["prompt"], "answer": None} for t in reworded]
    assert contamination_error(ref, 0, unanswered) == REFUSAL


def test_another_installations_hidden_eval_is_not_this_one(monkeypatch):
    ref = REG.get("reverse")
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "the secret the job's author guessed")
    guessed = [{"prompt": it.prompt, "answer": it.answer} for it in hidden_eval(ref).items]
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "this installation's own secret")
    assert hidden_items_held(ref, 0, guessed) == 0
