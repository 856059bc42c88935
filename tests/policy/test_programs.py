"""The composer's dataset library: format inference, program search, row generation."""

import pytest

from nestor.policy.programs import build_rows, explain, infer_format
from nestor.tasks import TaskRegistry

REG = TaskRegistry()
TRAINING = [r.id for r in REG.training_tasks()]


@pytest.mark.parametrize("task_id", TRAINING)
def test_every_training_task_is_explained_and_generated_rows_are_correct(task_id):
    ref = REG.get(task_id)
    spec = ref.spec()
    exp = explain(spec.examples)
    assert exp.program is not None, f"no program explains {task_id}"
    rows, info = build_rows(spec.examples, title=spec.title, source="resampled", n_rows=200,
                            widen=False, framing="exact", seed=3)
    assert info["fallback"] is False and len(rows) == 200
    # generated rows are in the test's exact prompt format and right by the task's own solver
    example_prompts = {e.prompt for e in spec.examples}
    fresh = [r for r in rows if r["prompt"] not in example_prompts]
    assert len({r["prompt"] for r in fresh}) > 20
    for row in fresh:
        payload = exp.fmt.payload(row["prompt"])
        assert exp.fmt.render(payload) == row["prompt"]
        x = _input_of(task_id, payload)
        assert ref.task.prompt(x) == row["prompt"]
        assert ref.task.solve(x) == row["answer"], row


def _input_of(task_id: str, payload: str) -> str:
    """The task's raw input from a payload (add/subtract prompts write `a+b=`)."""
    if task_id in ("add", "subtract"):
        return payload.replace("+", " ").replace("-", " ")
    if task_id == "count":
        c, _, s = payload.partition(" in ")
        return f"{c} {s}"
    return payload


def test_subtract_rows_keep_the_examples_ordering_constraint():
    spec = REG.get("subtract").spec()
    rows, _ = build_rows(spec.examples, title=spec.title, source="resampled", n_rows=300,
                         widen=False, framing="exact", seed=0)
    assert all(not r["answer"].startswith("-") for r in rows)


def test_heldout_formatting_family_is_outside_the_library():
    for ref in REG.heldout_tasks():
        spec = ref.spec()
        assert explain(spec.examples).program is None
        rows, info = build_rows(spec.examples, title=spec.title, source="resampled", n_rows=10,
                                widen=False, framing="exact", seed=0)
        assert info["fallback"] is True
        assert {r["prompt"] for r in rows} <= {e.prompt for e in spec.examples}


def test_sources_framings_and_widening_differ():
    spec = REG.get("reverse").spec()
    kw = dict(title=spec.title, n_rows=400, seed=1)
    given, _ = build_rows(spec.examples, source="given", widen=False, framing="exact", **kw)
    assert {r["prompt"] for r in given} == {e.prompt for e in spec.examples}
    aug, _ = build_rows(spec.examples, source="augmented", widen=False, framing="exact", **kw)
    lens = {len(r["answer"]) for r in aug}
    assert lens <= {len(e.answer) for e in spec.examples}  # near copies keep lengths
    wide, _ = build_rows(spec.examples, source="resampled", widen=True, framing="exact", **kw)
    seen = [len(e.answer) for e in spec.examples]
    assert max(len(r["answer"]) for r in wide) > max(seen)
    marked, _ = build_rows(spec.examples, source="given", widen=False, framing="marker", **kw)
    assert all(r["prompt"].endswith("\nAnswer:") for r in marked)
    titled, _ = build_rows(spec.examples, source="given", widen=False, framing="titled", **kw)
    assert all(r["prompt"].startswith(spec.title + ": ") for r in titled)


def test_frame_inference_cuts_partial_fields():
    from nestor.tasks import Example

    exs = [Example(input="", prompt=p, answer="") for p in ("12+40=", "15+2=", "1+99=")]
    fmt = infer_format(exs)
    assert (fmt.prefix, fmt.suffix) == ("", "=")
