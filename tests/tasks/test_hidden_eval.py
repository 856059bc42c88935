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


def test_two_secrets_draw_different_items(monkeypatch):
    ref = TaskRegistry().get("add")
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "one secret of this installation")
    a = hidden_eval(ref)
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "another secret of another one")
    b = hidden_eval(ref)
    assert len({it.input for it in a.items} & {it.input for it in b.items}) < 20


def test_the_source_alone_does_not_regenerate_the_items():
    """What a reader of the source can compute (the salts are in it) is not the hidden eval:
    the generator an adversary wrote against main, which regenerated it exactly."""
    import random

    from nestor.tasks import hidden

    reg = TaskRegistry()
    for ref in reg.tasks(include_heldout=True):
        salt = ref.family.hidden_salt or hidden._BUILTIN_SALTS[ref.family.name]
        rng = random.Random(f"{salt}:{ref.id}:0")
        excluded = {e.input for e in ref.task.examples(0)}
        guess: list[str] = []
        for _ in range(50 * DEFAULT_N):
            x = ref.task.sample(rng, 0)
            if x not in excluded and x not in guess:
                guess.append(x)
            if len(guess) == DEFAULT_N:
                break
        got = [it.input for it in hidden_eval(ref).items]
        assert got != guess
        # no better than a fresh draw: far fewer shared items than a regenerated eval
        assert len(set(got) & set(guess)) < DEFAULT_N // 2, ref.id


def test_the_secret_is_made_once_private_and_cached_by_its_hash(tmp_path, monkeypatch):
    from nestor.tasks import secret

    monkeypatch.setenv("NESTOR_HOME", str(tmp_path / "home"))
    ref = TaskRegistry().get("add")
    first = hidden_eval(ref)
    path = tmp_path / "home" / "hidden_seed"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "home").stat().st_mode & 0o777 == 0o700
    assert hidden_eval(ref).items == first.items  # read back, not made again
    value = path.read_bytes().strip()
    assert value.decode() not in secret.secret_id() and len(secret.secret_id()) == 16
    path.chmod(0o644)
    try:
        hidden_eval(ref)
    except secret.SecretError as exc:
        assert "chmod 600" in str(exc) and value.decode() not in str(exc)
    else:
        raise AssertionError("a secret readable by others was used")
