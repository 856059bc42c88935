"""A job that trains on the hidden eval is refused; an honest one of the same size is not, and
the refusal says nothing about which items are hidden."""

import json
import math
import random
from pathlib import Path

import pytest

from nestor.inner import contamination
from nestor.inner.contamination import (
    FALSE_REFUSAL,
    FRESH_EVALS,
    REFUSAL,
    TOO_DENSE,
    JobTasks,
    contamination_error,
    hidden_items_held,
    over_honest,
)
from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import EvalItem, hidden_eval

GOOD_ADD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-add"
REG = TaskRegistry()


def _rows(ref, inputs) -> list[dict]:
    return [{"prompt": ref.task.prompt(x), "answer": ref.task.solve(x)} for x in inputs]


def _honest(task_id: str, size: int, seed: int) -> list[dict]:
    ref, rng = REG.get(task_id), random.Random(seed)
    return _rows(ref, {ref.task.sample(rng, 0) for _ in range(size)})


def _copied(ref, k: int | None = None) -> list[dict]:
    """The first k hidden items (all when None) as rows, answers and all."""
    return [{"prompt": it.prompt, "answer": it.answer} for it in hidden_eval(ref).items[:k]]


@pytest.mark.parametrize("task_id", ["add", "reverse", "count", "acronym"])
def test_the_hidden_eval_as_data_is_refused(task_id):
    ref = REG.get(task_id)
    tasks = _copied(ref)
    # one constant message, whatever the items: it cannot tell which are hidden
    assert contamination_error(ref, 0, tasks) == REFUSAL


def test_honest_data_of_a_small_input_space_passes():
    """good-add's own 2,000 rows hold dozens of the 200 hidden items by chance (the input
    space is 10,000): as many as any honest draw of that size does. Under whatever secret this
    installation has: an honest job is refused with probability at most FALSE_REFUSAL."""
    rows = [json.loads(line) for line in
            (GOOD_ADD / "data" / "train.jsonl").read_text().splitlines()]
    ref = REG.get("add")
    assert hidden_items_held(ref, 0, rows) > 10  # overlap by chance is real on `add`
    assert contamination_error(ref, 0, rows) is None
    for task_id in ("add", "reverse", "max"):
        assert contamination_error(REG.get(task_id), 0, _honest(task_id, 3000, 7)) is None


def _poisson(k: int, mean: float) -> float:
    return math.exp(k * math.log(mean) - mean - math.lgamma(k + 1))


def _honest_refusal_rate(mean: float, fresh: int) -> float:
    """P(over_honest refuses), when the hidden count and each of `fresh` counts are
    Poisson(mean): summed over the fresh counts' total t (all an exact test looks at), times the
    chance that the hidden count reaches the fewest items refused beside t."""
    rate, spread = 0.0, 10 * math.sqrt(fresh * mean) + 10
    for t in range(max(0, int(fresh * mean - spread)), int(fresh * mean + spread)):
        counts = [t] + [0] * (fresh - 1)
        least = next(x for x in range(1, 10_000) if over_honest(x, counts))
        tail = 1 - sum(_poisson(x, mean) for x in range(least))
        rate += _poisson(t, fresh * mean) * max(tail, 0.0)
    return rate


@pytest.mark.parametrize(("mean", "fresh"), [(0.5, 3), (2, 3), (5, 3), (11, 3),
                                             (2, FRESH_EVALS), (11, FRESH_EVALS)])
def test_an_honest_job_is_refused_at_most_at_the_stated_rate(mean, fresh):
    """Where the fresh counts are low by chance, the limit must still not refuse honest jobs:
    a mean of three plus four standard deviations plus two (the rule before) refuses 5.7 in
    10,000 at a mean of 2, the `reverse` task's at 3,000 rows."""
    assert _honest_refusal_rate(mean, fresh) <= FALSE_REFUSAL


def test_an_honest_job_that_draws_its_own_way_passes():
    """The shortest third of 9,000 `acronym` draws: two-word inputs only, so it holds far more
    of the hidden eval's two-word items than a draw of the sampler's own would. It holds as many
    of any eval drawn the same way, so it passes (the rule before refused 20 of 20 such jobs,
    benchmarks/contamination_refusals.py)."""
    ref, rng = REG.get("acronym"), random.Random(4)
    draws = sorted((ref.task.sample(rng, 0) for _ in range(9000)), key=len)[:3000]
    rows = _rows(ref, set(draws))
    assert hidden_items_held(ref, 0, rows) > 40
    assert contamination_error(ref, 0, rows) is None


def test_hidden_items_among_rows_of_no_task_are_refused():
    """Padding widened the rule before's allowance (a sampler's draw of as many distinct
    prompts); rows that hold no task's input hold no fresh eval's items either."""
    ref = REG.get("add")
    padding = [{"prompt": f"filler {i}", "answer": f"f{i}"} for i in range(5000)]
    copied = _copied(ref, 20)
    assert contamination_error(ref, 0, padding + copied) == REFUSAL


def test_hidden_prompts_under_wrong_answers_or_among_examples_are_found():
    """The answer the trusted side sees need not be the one the rubric scores by (a rubric can
    compute a reversal itself), and a few-shot prompt trains on every example it shows."""
    ref = REG.get("reverse")
    items = hidden_eval(ref).items
    blank = [{"prompt": it.prompt, "answer": "?"} for it in items]
    assert contamination_error(ref, 0, blank) == REFUSAL
    shots = [{"prompt": f"{a.prompt} -> {a.answer}\n{b.prompt} -> {b.answer}\nreverse xyzzy",
              "answer": "yzzyx"} for a, b in zip(items[::2], items[1::2], strict=True)]
    assert hidden_items_held(ref, 0, shots) == len({it.input for it in items})
    assert contamination_error(ref, 0, shots) == REFUSAL


def test_hidden_prompts_in_look_alike_or_invisible_characters_are_found():
    ref = REG.get("reverse")
    items = hidden_eval(ref).items
    fullwidth = str.maketrans({c: chr(ord(c) + 0xFEE0) for c in "abcdefghijklmnopqrstuvwxyz"})
    zero_width = "\u200b"
    disguised = [{"prompt": f"reverse {zero_width.join(it.input)}", "answer": it.answer}
                 for it in items[:100]]
    disguised += [{"prompt": f"reverse {it.input.translate(fullwidth)}", "answer": it.answer}
                  for it in items[100:]]
    assert hidden_items_held(ref, 0, disguised) == len({it.input for it in items})


def test_a_row_that_spells_out_the_space_does_not_hide_copied_items():
    """"0 1 … 99 0 1 … 99" holds every `add` item of every eval, hidden or fresh, in order: were
    it counted, the 200 hidden items beside it would hold no more than a fresh eval's 200."""
    ref = REG.get("add")
    numbers = " ".join(str(i) for i in range(100))
    spelled = {"prompt": f"{numbers} {numbers}", "answer": "0"}
    copied = _copied(ref)
    assert hidden_items_held(ref, 0, [spelled]) == len({it.input for it in hidden_eval(ref).items})
    assert contamination_error(ref, 0, [spelled, *copied]) == REFUSAL


@pytest.mark.parametrize("task_id", ["reverse", "count"])
def test_rows_packed_with_hidden_items_are_counted(task_id):
    """Each hidden item asked beside eight others as worked examples: a row that holds many
    hidden items but few of a fresh eval's is not a row that spells out the space. (On `add`,
    a space of few words, such rows hold many fresh items too: docs/tasks.md, what it misses.)"""
    ref = REG.get(task_id)
    items = hidden_eval(ref).items
    packed = [{"prompt": "\n".join(f"{o.prompt} {o.answer}" for o in (items * 2)[i + 1:i + 9])
               + f"\n{it.prompt}", "answer": it.answer} for i, it in enumerate(items)]
    assert contamination_error(ref, 0, packed) == REFUSAL


def test_a_few_hidden_items_above_chance_are_refused():
    """On `reverse` an honest 3,000-row job holds ~2 hidden items: 15 more are refused."""
    ref = REG.get("reverse")
    honest = _honest("reverse", 3000, 5)
    copied = _copied(ref, 15)
    assert contamination_error(ref, 0, honest + copied) == REFUSAL


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


def test_an_item_is_held_only_in_order_and_as_often_as_it_repeats():
    items = [EvalItem("a", "12+34=", "46"), EvalItem("b", "7+7=", "14"), EvalItem("c", "1+2=", "3")]
    job = JobTasks([{"prompt": "( 34 ( 12 ( 7"}, {"prompt": "12 and later, 34"},
                    {"prompt": "7 plus 7"}])
    # own words (symbols are no item's words): 12 34, 7 7, 1 2
    assert job.holders(items) == [{1}, {2}, set()]


def test_rows_too_dense_to_check_are_refused_in_bounded_time(monkeypatch):
    """Rows that each spell out `add`'s inputs are candidates for every item of every eval:
    matching them is bounded (MAX_CANDIDATES), and a job past the bound does not train. An
    honest job stays far under it."""
    monkeypatch.setattr(contamination, "MAX_CANDIDATES", 20_000)
    numbers = " ".join(str(i) for i in range(100))
    dense = [{"prompt": f"{numbers} {i}", "answer": "0"} for i in range(12)]  # 12 × 1,800 pairs
    ref = REG.get("add")
    assert contamination_error(ref, 0, dense) == TOO_DENSE
    assert contamination_error(ref, 0, dense[:10]) is None  # 18,000: checked, spelled, none held
    assert contamination_error(ref, 0, _honest("add", 3000, 7)) is None


def test_another_installations_hidden_eval_is_not_this_one(monkeypatch):
    ref = REG.get("reverse")
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "the secret the job's author guessed")
    guessed = _copied(ref)
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "this installation's own secret")
    assert hidden_items_held(ref, 0, guessed) == 0
