from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import DEFAULT_N, HiddenEval, hidden_eval


def test_hidden_items_are_many_disjoint_and_correct():
    reg = TaskRegistry()
    for ref in reg.tasks(include_heldout=True):
        ev = hidden_eval(ref)
        assert len(ev.items) == DEFAULT_N
        example_inputs = {e.input for e in ref.spec().examples}
        assert not example_inputs & {it.input for it in ev.items}
        assert len({it.input for it in ev.items}) >= 150  # mostly distinct
        for it in ev.items[:20]:
            assert ev.score(it.answer, it) == 1
            assert ev.score(it.answer + "x", it) == 0


def test_hidden_eval_is_seeded_and_differs_from_examples_seed():
    ref = TaskRegistry().get("add")
    a, b = hidden_eval(ref), hidden_eval(ref)
    assert a.items == b.items
    assert hidden_eval(ref, difficulty=1).items != a.items


def test_score_normalisation():
    ref = TaskRegistry().get("add")
    item = hidden_eval(ref).items[0]
    assert HiddenEval.score(f"  {item.answer}.\n", item) == 1
