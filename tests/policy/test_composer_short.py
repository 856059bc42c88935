"""The composer's short form: its programs as source, and the jobs it writes that way."""

from __future__ import annotations

import random

import pytest

from nestor.policy.composer import Composer, ComposerConfig
from nestor.policy.composer_short import program_source, rows_source
from nestor.policy.programs import Field, Structure, explain, library
from nestor.tasks import TaskRegistry

REGISTRY = TaskRegistry()
STRUCTURES = {
    ("word",): Structure((0,), (Field("word", 1, 7),)),
    ("int", "int"): Structure((0, "+", 1), (Field("int", 0, 99), Field("int", 0, 99))),
    ("int",): Structure((0,), (Field("int", 0, 999),)),
    ("word", "word"): Structure((0, " in ", 1), (Field("word", 1, 1), Field("word", 2, 8))),
}


@pytest.mark.parametrize("kinds", list(STRUCTURES))
def test_every_program_has_source_that_computes_it(kinds):
    structure, rng = STRUCTURES[kinds], random.Random(0)
    programs = library(structure)
    assert programs
    for program in programs:
        src = program_source(program.name, kinds)
        assert src is not None, program.name
        for _ in range(20):
            values = structure.sample(rng)
            env = {f"v{i}": v for i, v in enumerate(values)}
            try:
                want = program(values)
            except ValueError:  # e.g. shift after upper: the library skips such a program
                continue
            assert eval(src, {}, env) == want, (program.name, values)  # noqa: S307


@pytest.mark.parametrize("task", ["reverse", "add", "length"])
def test_rows_in_code_match_the_spec_examples_format(task):
    spec = REGISTRY.get(task).spec()
    exp = explain(spec.examples)
    assert exp.program is not None
    src, note = rows_source(spec.examples, exp, source="resampled", n_rows=50, widen=False,
                            framing="exact", title=spec.title, seed=1)
    scope: dict = {"random": random}
    exec(src, scope)  # noqa: S102 (our own generated code, in a test)
    rows = list(scope["rows"]())
    assert len(rows) == 50 and "program" in note
    # every generated row is right by the program the examples pin down, in their frame
    kinds = tuple(f.kind for f in exp.structure.fields)
    for prompt, answer in rows:
        values = exp.structure.parse(exp.fmt.payload(prompt))
        assert values is not None, prompt
        assert answer == exp.program(values)
        assert eval(program_source(exp.program.name, kinds),  # noqa: S307
                    {}, {f"v{i}": v for i, v in enumerate(values)}) == answer


def _write(calls, root):
    for call in calls:
        if call.name == "write_file":
            path = root / call.arguments["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(call.arguments["content"])


def test_a_short_composer_job_has_no_data_file_and_passes_the_probe(tmp_path):
    from nestor.job.validate import validate_job
    from nestor.policy.base import Message, Observation

    spec = REGISTRY.get("reverse").spec()
    composer = Composer(ComposerConfig(job_form="short", p_slip=0.0))
    # a plan that works: the scaffold's config, resampled rows, a partial-credit rubric
    choices = {k: 0 for k in composer.decisions}
    for key, value in (("data_source", "resampled"), ("n_rows", 256), ("rubric", "partial"),
                       ("extract", "whole"), ("framing", "exact")):
        choices[key] = composer.decisions[key].index(value)
    calls = composer._write_calls(spec, choices, seed=5)
    paths = [c.arguments.get("path") for c in calls if c.name == "write_file"]
    assert "data/train.jsonl" not in paths and len(paths) == 3
    assert sum(len(c.arguments["content"]) for c in calls if c.name == "write_file") < 2600
    _write(calls, tmp_path)
    report = validate_job(tmp_path, spec, dry_run=False)
    assert report.passed, report.summary()
    assert "256 tasks" in {c.name: c.message for c in report.checks}["load"]
    # and the composer acts in the short form end to end (its own sampled plan)
    turn = composer.act(Observation([Message("system", "s"), Message("user", "u")], [],
                                    spec=spec, seed=1))
    assert all(c.arguments.get("path") != "data/train.jsonl" for c in turn.message.tool_calls)
