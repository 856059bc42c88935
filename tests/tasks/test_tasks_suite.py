import random
import subprocess
import sys

import pytest

from nestor.tasks import TaskError, TaskRegistry, normalise


@pytest.fixture(scope="module")
def reg():
    return TaskRegistry()


def test_suite_shape(reg):
    refs = reg.tasks(include_heldout=True)
    families = {r.family.name for r in refs}
    assert len(refs) >= 12 and len(families) >= 4
    heldout = {r.family.name for r in refs if r.heldout}
    assert len(heldout) == 1
    for fam in families:
        assert sum(r.family.name == fam for r in refs) >= 3
    assert all(not r.heldout for r in reg.training_tasks())


@pytest.mark.parametrize("difficulty", [0, 1])
def test_examples_are_solved_and_prompted(reg, difficulty):
    for ref in reg.tasks(include_heldout=True):
        spec = ref.spec(difficulty)
        assert 5 <= len(spec.examples) <= 10
        assert len({e.input for e in spec.examples}) == len(spec.examples)
        for ex in spec.examples:
            assert ex.answer == ref.task.solve(ex.input)
            assert ex.prompt == ref.task.prompt(ex.input)
            assert ex.prompt in spec.instructions and ex.answer in spec.instructions
            assert len(ex.answer) <= spec.max_new_tokens


def test_reference_solutions():
    reg = TaskRegistry()
    cases = {
        "reverse": ("abc", "cba"), "sort": ("cab", "abc"), "dedupe": ("abcabd", "abcd"),
        "shift": ("azb", "bac"), "add": ("12 30", "42"), "subtract": ("30 12", "18"),
        "max": ("7 70", "70"), "length": ("abcd", "4"), "vowels": ("banana", "3"),
        "count": ("a abca", "2"), "dashes": ("abc", "a-b-c"), "acronym": ("big red dog", "BRD"),
        "snake": ("big red dog", "big_red_dog"),
    }
    for task_id, (x, y) in cases.items():
        assert reg.get(task_id).task.solve(x) == y


def test_difficulty_grows_inputs(reg):
    task = reg.get("reverse").task
    rng0, rng2 = random.Random(0), random.Random(0)
    easy = [len(task.sample(rng0, 0)) for _ in range(50)]
    hard = [len(task.sample(rng2, 2)) for _ in range(50)]
    assert max(easy) < min(hard)


def test_normalise():
    assert normalise("  42.\n") == "42"
    assert normalise("a.b") == "a.b"
    assert normalise("Abc") != normalise("abc")  # case matters


def test_unknown_task_suggests_close_matches(reg):
    with pytest.raises(TaskError, match="did you mean reverse"):
        reg.get("revers")


def test_plugin_family_loads(reg):
    sys.path.insert(0, "tests/fixtures")
    try:
        with_plugin = TaskRegistry(["my_tasks"])
    finally:
        sys.path.remove("tests/fixtures")
    assert with_plugin.get("echo").family.name == "echo"
    assert len(with_plugin.tasks()) == len(reg.tasks()) + 1


@pytest.mark.parametrize("module, problem", [
    ("no_such_module_xyz", "failed to import"),
    ("tests.fixtures.broken_tasks", "malformed family"),
])
def test_bad_plugin_modules(module, problem):
    with pytest.raises(TaskError, match=problem) as exc:
        TaskRegistry([module])
    assert module in str(exc.value)


def test_public_api_never_loads_hidden_module():
    code = (
        "import sys\n"
        "from nestor.tasks import TaskRegistry\n"
        "reg = TaskRegistry()\n"
        "[r.spec(d) for r in reg.tasks(include_heldout=True) for d in (0, 1)]\n"
        "import nestor.cli\n"
        "bad = [m for m in sys.modules if m.startswith('nestor.tasks.hidden')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
