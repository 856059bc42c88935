"""What the agent reads: the system prompt and the first user message of an episode.

Built only from public material: the role, docs/job-format.md, the task's public TaskSpec, the
base models and the JobConfig surface. This module must never import `nestor.tasks.hidden`
(a test runs it in a fresh interpreter and checks).
"""

from __future__ import annotations

from pathlib import Path

from pydantic_core import PydanticUndefined

from nestor.job.config import JobConfig
from nestor.tasks import TaskSpec

JOB_FORMAT_DOC = Path(__file__).resolve().parents[2] / "docs" / "job-format.md"

ROLE = """You are a machine-learning engineer. You write reinforcement-learning training jobs that
teach a small language model one skill. You work in a job directory through tools: \
list_files, read_file, write_file, edit_file, delete_file; `submit` runs a validation probe \
on the directory and answers with its report. A job that passes is trained with GRPO on a \
worker; the trained model is then scored on a hidden test of the skill that you never see. \
You are rewarded for how much the test accuracy improves, a little for passing validation on \
the first try, and a very little for training fast."""


def _job_format() -> str:
    if JOB_FORMAT_DOC.is_file():
        return JOB_FORMAT_DOC.read_text(encoding="utf-8")
    return ("(docs/job-format.md is missing from this installation.) A job directory holds "
            "config.toml (the JobConfig below), data/train.jsonl ({\"prompt\", \"answer\"} rows), "
            "env/pyproject.toml and env/<name>/__init__.py exporting exactly one verifiers v1 "
            "vf.Taskset subclass in __all__, whose vf.Task carries the @vf.reward methods.")


def _agent_job_format() -> str:
    """The doc as the agent reads it: under the prompt's own `# The job format` heading (so the
    doc's is dropped, not repeated), without the doc's "For engineers" section (how the probe is
    built: for contributors, not for the job writer)."""
    text = _job_format()
    if text.startswith("# The job format"):
        text = text.split("\n", 1)[1].lstrip("\n")
    start = text.find("\n## For engineers")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + (text[end:] if end >= 0 else "\n")
    return text.rstrip() + "\n"


def _bounds(field) -> str:
    parts = []
    for m in field.metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            val = getattr(m, attr, None)
            if val is not None:
                parts.append(f"{sym} {val}")
    return ", ".join(parts)


def config_surface() -> str:
    """The JobConfig knobs as a markdown table: name, default, range, description."""
    rows = ["| knob | default | range | what it does |", "|---|---|---|---|"]
    for name, field in JobConfig.model_fields.items():
        default = field.default if field.default is not PydanticUndefined else "(required)"
        desc = (field.description or "").replace("|", "/")
        rows.append(f"| `{name}` | `{default!r}` | {_bounds(field)} | {desc} |")
    return "\n".join(rows)


def base_models(names: list[str]) -> str:
    from nestor.models.registry import MODELS

    out = []
    for name in names:
        entry = MODELS.get(name)
        out.append(f"- `{name}`: {entry.description if entry else 'a local model'}")
    return "\n".join(out)


def doc_job_files(section: str = "A complete minimal job") -> dict[str, str]:
    """The files of a worked job in docs/job-format.md: one section's fenced blocks, keyed by
    the `path`: line before each (empty when the doc is missing)."""
    import re

    text = _job_format()
    start = text.find(f"## {section}\n")
    if start < 0:
        return {}
    end = text.find("\n## ", start + 1)
    text = text[start:end if end > 0 else None]
    return {m.group(1): m.group(2) for m in re.finditer(
        r"^`([\w/.]+)`(?: \([^)]*\))?:\n\n```\w*\n(.*?)```", text, re.S | re.M)}


def _minimal_job() -> str:
    """The doc's "A complete minimal job" section: the short form's three files, worked."""
    text = _job_format()
    start = text.find("## A complete minimal job")
    end = text.find("\n## ", start + 1)
    if start < 0:
        return text[:3000]
    return text[start + 3:end if end > 0 else None].strip()


def budget_rule(spec: TaskSpec, token_budget: int) -> str:
    """The budget rule, worked for this task's reply cap at JobConfig's default batch: the
    arithmetic a small model gets wrong when it copies another task's max_steps (measured: the
    commonest failure of a warm-started SmolLM2 on tasks it never saw, docs/lm-arc.md)."""
    d = JobConfig.model_fields
    prompts, group = d["prompts_per_step"].default, d["group_size"].default
    per_step = prompts * group * spec.max_new_tokens
    fit = (f"max_steps ≤ {token_budget // per_step}" if token_budget >= per_step else
           "even one step is over: lower prompts_per_step or group_size")
    return (f"Budget: max_steps × prompts_per_step × group_size × max_new_tokens ≤ "
            f"{token_budget:,} sampled tokens. For this task's replies (max_new_tokens = "
            f"{spec.max_new_tokens}) at {prompts} prompts × {group} completions a step: {fit}.")


def compact_system_prompt(spec: TaskSpec, *, models: list[str], token_budget: int,
                          max_attempts: int) -> str:
    """For small-context or small models (SmolLM2-135M: the full prompt is ~4,200 of its 8,192
    tokens and costs a long prefill every turn): the role, one worked job, the budget rule and
    the task; the JobConfig table and the probe's details are left out (the probe's report
    still names what to fix)."""
    return f"""{ROLE}

A job directory holds config.toml (hyperparameters), env/pyproject.toml and \
env/<name>/__init__.py (a verifiers v1 taskset whose Task carries @vf.reward methods returning \
floats in [0, 1], and whose load() makes the rows in the task's exact test format from a seeded \
generator; or reads them from data/train.jsonl, {{"prompt", "answer"}} rows). Call write_file \
once per file, then submit.

# {_minimal_job()}

Base models: {", ".join(f"`{m}`" for m in models)}. {budget_rule(spec, token_budget)} \
{max_attempts} submit attempts.

# The task

{spec.instructions}"""


def short_system_prompt(spec: TaskSpec, *, models: list[str], token_budget: int,
                        max_attempts: int) -> str:
    """For a warm-started model (`nestor sft`), which learned the job format from
    demonstrations: the role, the four files, the budget rule and the task — no worked job and
    no JobConfig table. Every turn re-reads the prompt, so each token left out is paid back on
    every turn of every episode."""
    return f"""{ROLE}

Write the job with write_file, one call per file, then call submit: config.toml (base_model \
and GRPO hyperparameters), env/pyproject.toml and env/<name>/__init__.py (a verifiers v1 \
vf.Taskset whose load() makes the rows in the task's exact test format from a seeded generator, \
and whose Task has @vf.reward methods returning floats in [0, 1]); rows may instead come from \
data/train.jsonl ({{"prompt", "answer"}} rows). A failed submit's report names what to fix.

Base models: {", ".join(f"`{m}`" for m in models)}. {budget_rule(spec, token_budget)} \
{max_attempts} submit attempts.

# The task

{spec.instructions}"""


PROMPT_STYLES = ("full", "compact", "short")


def system_prompt(spec: TaskSpec, *, models: list[str], token_budget: int,
                  max_attempts: int, style: str = "full") -> str:
    """The episode's system prompt; `style="compact"` for small models, `"short"` for a
    warm-started one (see above)."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style {style!r}: choose {', '.join(PROMPT_STYLES)}")
    if style == "short":
        return short_system_prompt(spec, models=models, token_budget=token_budget,
                                   max_attempts=max_attempts)
    if style == "compact":
        return compact_system_prompt(spec, models=models, token_budget=token_budget,
                                     max_attempts=max_attempts)
    return f"""{ROLE}

# The job format

{_agent_job_format()}

# Base models you may train

{base_models(models)}

# The hyperparameter surface (config.toml)

{config_surface()}

{budget_rule(spec, token_budget)} You have {max_attempts} submit attempts; after a failed \
one, fix what the report names and submit again.

# The task

{spec.instructions}"""


def task_message(spec: TaskSpec) -> str:
    return (f"Write a training job that teaches the base model the task `{spec.id}` "
            f"({spec.title}), in the job directory, then call submit.")
