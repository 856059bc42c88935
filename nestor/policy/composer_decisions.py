"""The composer's decisions: what it chooses among, and which decisions a failed check blames.

Every grid lists the right or the scaffold's choice first (nestor/policy/composer.py builds its
version-0 priors from that). `knob_value` turns a knob's choice into a JobConfig value;
`split_key` parses an action key ("decision@family/model"). `blame` reads the probe's report
after a failed submit and names the decisions a retry resamples; `last_plan` reads the
composer's own previous plan back.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nestor.job.config import JobConfig
from nestor.models.registry import learning_rate_grid
from nestor.policy import composer_files as files
from nestor.policy.base import Message
from nestor.policy.programs import FRAMINGS
from nestor.tasks import TaskSpec

SCAFFOLD = "scaffold"  # a knob's choice "keep the scaffold's value"
CONFIG_MODES = ["keep_scaffold", "tune"]  # the whole config: the scaffold's, or knob by knob
CONFIG_KNOBS: dict[str, list[Any]] = {  # JobConfig knob -> grid; the scaffold's value first
    "learning_rate": [SCAFFOLD, "third", "triple", "tenfold"],  # × the model's default rate
    "max_steps": [SCAFFOLD, "quarter_budget", "half_budget", "full_budget"],
    "prompts_per_step": [SCAFFOLD, 8, 32],
    "group_size": [SCAFFOLD, 4, 16],
    "max_new_tokens": [SCAFFOLD, "half_spec", "double_spec"],  # scaffold: the spec's length
    "temperature": [SCAFFOLD, 0.7, 1.3],
    "lora_rank": [SCAFFOLD, 8, 32],
    "lora_alpha": [SCAFFOLD, 16, 64],
    "clip_ratio": [SCAFFOLD, 0.0, 0.4],
    "kl_coef": [SCAFFOLD, 0.02, 0.1],
    "updates_per_step": [SCAFFOLD, 2],
    "scale_rewards": [SCAFFOLD, True],
    "skip_zero_variance": [SCAFFOLD, False],
    "weight_decay": [SCAFFOLD, 0.01],
    "grad_clip": [SCAFFOLD, 0.0],
}
MODEL_CONDITIONED = ("config_mode", *CONFIG_KNOBS)  # sampled after, and offset by, the base model
_LR_CHOICE = {"third": 0, "triple": 2, "tenfold": 3}  # index into registry.learning_rate_grid
DATA_DECISIONS: dict[str, list[Any]] = {
    "data_source": ["given", "augmented", "resampled"],
    "n_rows": [8, 64, 256, 1024],
    "input_range": ["observed", "widened"],
    "framing": list(FRAMINGS),
    "rubric": list(files.RUBRICS),
    "extract": list(files.EXTRACTS),
}
# A naive writer's slips (composer_files.py): choice 0 is right, every other fails validation.
WRITER_SLIPS: dict[str, list[Any]] = {
    "reward_def": list(files.REWARD_DEFS),
    "exports": list(files.EXPORTS),
    "row_keys": list(files.ROW_KEYS),
}
# Which decisions a failing validation check points at (check names of nestor.job.validate).
_RUBRIC = ("rubric", "extract")
_BLAME: dict[str, tuple[str, ...]] = {
    "budget": ("max_steps", "prompts_per_step", "group_size", "max_new_tokens"),
    "config": ("base_model", *CONFIG_KNOBS),
    "dataset": ("data_source", "n_rows", "input_range", "framing", "row_keys"),
    "load": ("data_source", "n_rows", "row_keys"),
    "taskset": ("exports",),
    "context": ("framing", "max_new_tokens", "input_range"),
    "rewards_valid": ("reward_def", *_RUBRIC), "deterministic": _RUBRIC, "reward_speed": _RUBRIC,
    "reference_beats_empty": _RUBRIC, "reference_beats_corrupted": _RUBRIC,
    "not_constant": _RUBRIC,
    "dry_run": ("base_model", "max_new_tokens"),
}
_UNKNOWN = ("data_source", "n_rows", "framing", "rubric", "extract")  # files, imports, probe, ...
PLAN = "plan: "
_FAIL = re.compile(r"^FAIL\s+(?P<name>[^:]+):(?P<msg>.*)$", re.M)
_BUDGET_FIX = re.compile(r"max_steps = (\d+) fits")  # nestor.job.config's budget refusal
# Failures the job did not cause (a sandbox that could not start in time on a loaded machine,
# a crash of the probe itself): nothing to resample, the retry resubmits the same job.
_NOT_THE_JOB = re.compile(r"the sandbox did not start|this is not your job's fault")
MAX_STEPS_LIMIT = next(m.le for m in JobConfig.model_fields["max_steps"].metadata
                       if getattr(m, "le", None) is not None)


def knob_value(key: str, value: Any, cfg: dict, scaffold: JobConfig, spec: TaskSpec,
               budget: int) -> Any:
    """A knob's choice as a JobConfig value; `cfg` holds the knobs resolved before it."""
    if value == SCAFFOLD:
        return getattr(scaffold, key)
    if key == "max_new_tokens":
        n = spec.max_new_tokens
        return {"half_spec": max(1, n // 2), "double_spec": 2 * n}[value]
    if key == "learning_rate":
        grid = learning_rate_grid(cfg["base_model"], lora=cfg["lora_rank"] > 0)
        return grid[_LR_CHOICE[value]]
    if key == "max_steps":
        per_step = cfg["prompts_per_step"] * cfg["group_size"] * cfg["max_new_tokens"]
        share = {"quarter_budget": 0.25, "half_budget": 0.5, "full_budget": 1.0}[value]
        # a large budget over a small batch must not ask for more steps than JobConfig allows
        return min(MAX_STEPS_LIMIT, max(1, int(budget * share) // per_step))
    return value


def split_key(key: str) -> tuple[str, str, str]:
    """(decision, family, model) of an action key; absent parts are ""."""
    decision, _, rest = key.partition("@")
    family, _, model = rest.partition("/")
    return decision, family, model


def last_plan(messages: list[Message]) -> dict | None:
    for msg in reversed(messages):
        if msg.role == "assistant" and msg.content.startswith(PLAN):
            try:
                return json.loads(msg.content[len(PLAN):])
            except json.JSONDecodeError:
                return None
    return None


def written_files(messages: list[Message]) -> dict[str, str]:
    """path -> content of every write_file call the workspace accepted (the last one wins)."""
    written: dict[str, str] = {}
    calls: dict[str, dict] = {}
    for msg in messages:
        if msg.role == "assistant":  # call ids repeat across turns: a tool answers this turn's
            calls = {c.id: c.arguments for c in msg.tool_calls if c.name == "write_file"}
        elif msg.role == "tool" and msg.content.startswith("ok: wrote") and \
                (args := calls.get(msg.tool_call_id or "")):
            written[str(args.get("path"))] = str(args.get("content"))
    return written


def _since_plan(messages: list[Message]) -> list[str]:
    """The tool answers since the last plan: its writes' results and its submit's report."""
    tail: list[Message] = []
    for msg in reversed(messages):
        if msg.role == "assistant" and msg.content.startswith(PLAN):
            break
        tail.append(msg)
    return [m.content for m in tail if m.role == "tool"]


def copied_fixes(messages: list[Message]) -> dict[str, int]:
    """Knob values the last submit's report names as fitting (a budget refusal's
    `max_steps = K fits`): a repair that reads the report copies them."""
    for text in _since_plan(messages):
        for fail in _FAIL.finditer(text):
            if fail["name"].strip() == "budget" and (m := _BUDGET_FIX.search(fail["msg"])):
                return {"max_steps": int(m[1])}
    return {}


def blame(messages: list[Message], decisions: dict[str, list[Any]],
          skip: frozenset[str] = frozenset()) -> list[str]:
    """Decisions to resample: those the failing checks of the last submit (and any failed
    writes since the plan) point at, in decision order; checks in `skip` are fixed otherwise.
    Unknown failures blame the data and rubric decisions, the composer's most likely
    culprits."""
    texts = _since_plan(messages)
    failing = [m["name"].strip() for t in texts for m in _FAIL.finditer(t)
               if not _NOT_THE_JOB.search(m["msg"]) and m["name"].strip() not in skip]
    if any(t.startswith("error:") for t in texts):
        failing.append("write")  # a file tool refused a write: the data is the usual suspect
    blamed: set[str] = set()
    for name in failing:
        blamed.update(_BLAME.get(name, _UNKNOWN))
    return [d for d in decisions if d in blamed]
