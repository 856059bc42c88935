"""The system prompt: role, job format, spec, models, the JobConfig surface; never hidden evals."""

import subprocess
import sys

from nestor.agent.prompt import JOB_FORMAT_DOC, config_surface, system_prompt
from nestor.job.config import JobConfig
from nestor.tasks import TaskRegistry


def test_system_prompt_has_every_part():
    spec = TaskRegistry().get("count").spec()
    text = system_prompt(spec, models=["tiny-s", "tiny-m"], token_budget=12_345, max_attempts=2)
    assert spec.instructions in text
    for e in spec.examples:
        assert e.prompt in text
    for name, field in JobConfig.model_fields.items():
        assert f"`{name}` | `{field.default!r}`" in text
    assert "`tiny-s`" in text and "`tiny-m`" in text
    assert "12,345 sampled tokens" in text and "2 submit attempts" in text
    if JOB_FORMAT_DOC.is_file():
        assert JOB_FORMAT_DOC.read_text()[:200] in text


def test_compact_prompt_keeps_the_task_and_one_worked_job():
    spec = TaskRegistry().get("count").spec()
    full = system_prompt(spec, models=["tiny-m"], token_budget=12_345, max_attempts=2)
    compact = system_prompt(spec, models=["tiny-m"], token_budget=12_345, max_attempts=2,
                            style="compact")
    assert spec.instructions in compact and "12,345" in compact and "2 submit" in compact
    for part in ("config.toml", "data/train.jsonl", "env/pyproject.toml", "@vf.reward",
                 "class ReverseTaskset"):
        assert part in compact
    assert "| `learning_rate` |" not in compact  # the config table is what is left out
    assert len(compact) < 0.45 * len(full)


def test_config_surface_shows_ranges():
    table = config_surface()
    assert "| `learning_rate` | `0.0003` | > 0, ≤ 0.01 |" in table


def test_rendering_an_episode_prompt_never_imports_the_hidden_eval():
    code = ("import sys\n"
            "from nestor.tasks import TaskRegistry\n"
            "from nestor.agent.prompt import system_prompt\n"
            "import nestor.agent.episode, nestor.policy.composer\n"
            "for ref in TaskRegistry().tasks(include_heldout=True):\n"
            "    system_prompt(ref.spec(), models=['tiny-m'], token_budget=1, max_attempts=1)\n"
            "print('nestor.tasks.hidden' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_full_prompt_has_the_job_format_once_and_no_engineers_section():
    spec = TaskRegistry().get("count").spec()
    text = system_prompt(spec, models=["tiny-m"], token_budget=12_345, max_attempts=2)
    assert text.count("# The job format") == 1
    if JOB_FORMAT_DOC.is_file():
        assert "## For engineers" in JOB_FORMAT_DOC.read_text()  # the doc has one ...
        assert "For engineers" not in text and "host_ns.py" not in text  # ... the agent not
        assert "## A complete minimal job" in text and "## The validation probe" in text


def test_short_prompt_keeps_the_task_and_rules_but_no_worked_job():
    import pytest

    spec = TaskRegistry().get("count").spec()
    kwargs = dict(models=["tiny-s", "tiny-m"], token_budget=12_345, max_attempts=2)
    compact = system_prompt(spec, style="compact", **kwargs)
    short = system_prompt(spec, style="short", **kwargs)
    assert spec.instructions in short and "12,345" in short and "2 submit" in short
    for part in ("config.toml", "data/train.jsonl", "env/pyproject.toml", "@vf.reward",
                 "`tiny-s`", "`tiny-m`", "write_file", "submit"):
        assert part in short
    assert "class ReverseTaskset" not in short and "| `learning_rate` |" not in short
    # (the compact prompt shrank too: its worked job is now the 3-file short form)
    assert len(short) - len(spec.instructions) < 0.55 * (len(compact) - len(spec.instructions))
    assert "load() makes the rows" in short  # the short form first, as the warm start wrote it
    with pytest.raises(ValueError, match="choose full, compact, short"):
        system_prompt(spec, style="tiny", **kwargs)


def test_every_prompt_works_the_budget_for_its_tasks_reply_cap():
    import re

    for ref in TaskRegistry().tasks(include_heldout=True):
        spec = ref.spec()
        for style in ("full", "compact", "short"):
            text = system_prompt(spec, models=["tiny-m"], token_budget=20_000, max_attempts=2,
                                 style=style)
            m = re.search(r"max_new_tokens = (\d+)\) at (\d+) prompts × (\d+) completions a "
                          r"step: max_steps ≤ (\d+)\.", text)
            assert m, (ref.id, style)
            new, prompts, group, steps = map(int, m.groups())
            assert new == spec.max_new_tokens
            config = JobConfig(max_new_tokens=new, prompts_per_step=prompts, group_size=group,
                               max_steps=steps)
            assert config.budget_error(20_000) is None  # the number fits ...
            over = config.model_copy(update={"max_steps": steps + 1})
            assert over.budget_error(20_000) is not None  # ... and is the largest that does
    tiny = system_prompt(spec, models=["tiny-m"], token_budget=100, max_attempts=2)
    assert "even one step is over" in tiny
