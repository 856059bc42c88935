"""The composer's generated rubrics, scored in the real sandboxed reward server."""

import json

import pytest

from nestor.job.tasksource import JobTaskSource
from nestor.policy import composer_files as files
from nestor.tasks import TaskRegistry

SPEC = TaskRegistry().get("reverse").spec()


def _job(root, rubric: str, extract: str):
    env = root / "env" / files.package_name(SPEC.id)
    env.mkdir(parents=True)
    (env / "__init__.py").write_text(files.env_source(title=SPEC.title, rubric=rubric,
                                                      extract=extract, rows_note="test"))
    (root / "env" / "pyproject.toml").write_text(files.pyproject(SPEC.id))
    (root / "data").mkdir()
    rows = [{"prompt": e.prompt, "answer": e.answer} for e in SPEC.examples]
    (root / "data" / "train.jsonl").write_text(files.jsonl(rows))
    (root / "config.toml").write_text("")
    return root, rows


def test_partial_credit_rubric_in_the_sandbox(tmp_path):
    root, rows = _job(tmp_path, "partial", "whole")
    answer = rows[0]["answer"]
    half = answer[: len(answer) // 2] + "z" * (len(answer) - len(answer) // 2)
    replies = [answer, f"  {answer}.", half, "", f"it is {answer}"]
    with JobTaskSource(root) as src:
        got = src.score([0] * len(replies), replies)
    assert got[0] == got[1] == 1.0  # the test's normalisation
    assert 0.0 < got[2] < 1.0 and got[3] == 0.0 and got[4] < 1.0


@pytest.mark.parametrize("extract,reply,want", [
    ("whole", " abc \n", " abc \n"),
    ("first_line", "abc\nxyz", "abc"),
    ("last_word", "the answer is abc", "abc"),
    ("after_marker", "Answer: abc", " abc"),
    ("after_marker", "abc", ""),  # no marker: every reply extracts to "", the rubric is constant
])
def test_extraction_rules(extract, reply, want):
    namespace: dict = {}
    exec("def extract(reply):\n" + files._EXTRACT_SRC[extract], namespace)  # our own template
    assert namespace["extract"](reply) == want


def test_pyproject_names_the_package():
    text = files.pyproject("count")
    assert 'packages = ["composed_count"]' in text and json.dumps("composed-count") in text
