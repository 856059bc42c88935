"""LM slips and their repairs: each slip breaks a real composer job, its repair — run through the
real workspace tools — gives back the job byte for byte, and through the real probe the slipped
attempt fails with the check it aims at and the repaired one passes."""

from __future__ import annotations

import pytest

from nestor.policy.base import Message, Observation
from nestor.policy.composer import Composer, ComposerConfig
from nestor.sandbox.workspace import Workspace
from nestor.sft.slips import _VF_TYPOS, SLIPS, SlipThenRepair, draw_kinds, slip_rng, written_files
from nestor.tasks import TaskRegistry

# the probe's checks each slip fails (docs/lm-arc.md: what warm start 4's first submits failed);
# a misspelt name fails whichever runs it first: load() or a reward
FAILS = {"unterminated_string": {"imports"}, "vf_attribute": {"imports"},
         "undefined_name": {"load", "rewards_valid"}, "wrong_path": {"files"},
         "seed_overflow": {"config"}, "toml_quote": {"config"}, "answer_cap": {"budget"},
         "dropped_draw": {"load"}, "prompt_only_row": {"load"}}


def composer_job(task: str, seed: int) -> dict[str, str]:
    spec = TaskRegistry().get(task).spec(0)
    composer = Composer(ComposerConfig(job_form="short", seed=seed))
    turn = composer.act(Observation([Message("user", "write a job")], [], spec=spec, seed=seed))
    return written_files(turn.message.tool_calls)


def files_of(ws: Workspace, root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_every_slip_is_named_in_the_probe_check_table():
    assert set(SLIPS) == set(FAILS)


def test_each_vf_typo_is_a_name_verifiers_lacks_in_place_of_one_it_has():
    import verifiers.v1 as vf

    for good, bad in _VF_TYPOS.items():
        assert hasattr(vf, good[3:-1]) and not hasattr(vf, bad[3:-1]), (good, bad)


def test_where_a_slip_goes_is_not_fixed_by_the_draw_that_chose_it():
    job = composer_job("add", 3)
    for kind in ("vf_attribute", "undefined_name", "unterminated_string"):
        seeds = [s for s in range(300) if draw_kinds(job, s, 1) == [kind]]
        places = {SLIPS[kind](job, slip_rng(kind, s)).broken for s in seeds}
        assert len(seeds) > 10 and len(places) > 1, kind


@pytest.mark.parametrize("kind", sorted(SLIPS))
@pytest.mark.parametrize("task,seed", [("reverse", 0), ("add", 3), ("length", 11)])
def test_the_repair_undoes_the_slip_through_the_workspace_tools(tmp_path, kind, task, seed):
    job = composer_job(task, seed)
    slip = SLIPS[kind](job, slip_rng(kind, seed))
    assert slip is not None, f"{kind} found nothing to break in a composer job"
    ws = Workspace(tmp_path)
    for path, text in job.items():
        ws.write_file(path, text if path != slip.path else slip.broken)
    if slip.written_path != slip.path:  # the file went to the wrong place instead
        ws.delete_file(slip.path)
        ws.write_file(slip.written_path, slip.broken)
    assert files_of(ws, tmp_path) != job
    for call in slip.repair:
        answer = ws.call(call.name, call.arguments)
        assert "error" not in answer.lower(), answer
    assert files_of(ws, tmp_path) == job


def test_a_slip_that_finds_nothing_to_break_is_not_offered_and_is_refused():
    job = composer_job("reverse", 0)
    del job["config.toml"]
    kinds = draw_kinds(job, seed=0, k=len(SLIPS))
    assert kinds and not {"seed_overflow", "toml_quote", "answer_cap"} & set(kinds)

    class Writes:
        name, version = "w", 0

        def act(self, obs):
            from nestor.policy.base import ToolCall, Turn
            return Turn(Message("assistant", "", [ToolCall("write_file", {
                "path": p, "content": t}, f"c{i}") for i, (p, t) in enumerate(job.items())]))

    with pytest.raises(ValueError, match="seed_overflow"):
        SlipThenRepair(Writes(), "seed_overflow", 0).act(Observation([], []))


@pytest.mark.slow
def test_slipped_jobs_fail_the_real_probe_where_aimed_and_their_repairs_pass(tmp_path):
    from nestor.agent.episode import FAILED_SUBMIT
    from nestor.sft.demos import failed_attempt_turns, from_composer

    demos = from_composer(1, ["reverse"], tmp_path, slips_per_job=len(SLIPS))
    clean, *replays = demos
    assert clean.source == "composer" and clean.first_try
    assert sorted(d.source for d in replays) == sorted(f"slip:{k}" for k in SLIPS)
    for demo in replays:
        assert demo.passed and not demo.first_try and demo.group == "reverse/slip"
        reports = [m.content for m in demo.messages if m.role == "tool"
                   and m.content.startswith(FAILED_SUBMIT)]
        assert len(reports) == 1
        failed = {ln.split(":")[0].split()[-1] for ln in reports[0].splitlines()
                  if ln.startswith("FAIL")}
        assert FAILS[demo.source.removeprefix("slip:")] & failed, (demo.source, reports[0])
        # the slipped attempt is context; the repair (its calls, then submit) is the target
        turns = [k for k, m in enumerate(demo.messages) if m.role == "assistant"]
        context = failed_attempt_turns(demo.messages)
        repair = [k for k in turns if k not in context]
        assert context and repair and repair[-1] == turns[-1]
        assert demo.messages[repair[-1]].tool_calls[0].name == "submit"
        assert all(demo.messages[k].tool_calls[0].name in {"edit_file", "write_file",
                                                           "delete_file"}
                   for k in repair[:-1])
