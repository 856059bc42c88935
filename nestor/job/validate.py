"""The validation probe: is this job safe and sensible to train? Run on every submit.

Each check reports a name, ok and a message the job's author can act on. The job's own code
runs only in the sandboxed host (tasksource.py); this module sees plain data. A check whose
inputs are missing (an earlier check failed) is left out rather than reported as a failure, so
a report (report.py) names the first thing to fix in each chain:

  files -> config -> budget                (trusted: reads files as data, file_checks.py)
  files -> dataset                         (short form, no data file: load()'s rows instead)
  files -> imports -> taskset -> load -> context -> memory
                                load -> rewards_valid -> reward_speed -> deterministic
                                        -> reference_beats_empty, reference_beats_corrupted,
                                           not_constant
  memory + rewards_valid -> dry_run      (a few base-model rollouts scored by the rubric)
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

from nestor.job.config import DEFAULT_TOKEN_BUDGET, JobConfig
from nestor.job.dryrun import rollouts, tokenizer_for
from nestor.job.file_checks import trusted_checks
from nestor.job.layout import DATA, LayoutError, read_layout
from nestor.job.memory import (
    DEFAULT_MEMORY_CAP_MB,
    MIB,
    driver_can_size,
    longest_prompt,
    memory_error,
    model_shape,
    prompt_tokens,
)
from nestor.job.report import Check, CheckLog, ValidationReport
from nestor.job.rubric_probe import RubricProbe, probe_replies
from nestor.job.tasksource import (
    MAX_MESSAGE,
    TRAIN_LIMITS,
    JobTaskSource,
    TaskSourceError,
    Timeouts,
    clean_text,
)
from nestor.sandbox import SandboxError, SandboxUnavailable
from nestor.tasks import TaskSpec

log = logging.getLogger("nestor.job")

MIN_TASKS = 32  # load() must yield at least this many tasks
RUBRIC_TASKS = 16  # tasks probed by the rubric checks
DRY_RUN_PROMPTS, DRY_RUN_SAMPLES = 4, 2
MAX_SECONDS_PER_REPLY = 0.02  # mean rubric time per completion; a GRPO step scores ~128
# One source: the probe runs the job under training's own limits and request timeouts, so that
# nothing the job can observe from inside (rlimits, a request's alarm) tells the two apart.
PROBE_LIMITS = TRAIN_LIMITS
PROBE_TIMEOUTS = Timeouts()


def validate_job(job_dir: Path | str, spec: TaskSpec, *, token_budget: int = DEFAULT_TOKEN_BUDGET,
                 warm: bool = True, dry_run: bool = True, timeouts: Timeouts = PROBE_TIMEOUTS,
                 memory_cap_mb: int = DEFAULT_MEMORY_CAP_MB,
                 on_check: Callable[[Check], None] | None = None) -> ValidationReport:
    """Run every check on the job in `job_dir` for the task `spec`. Never raises for anything
    the job contains (raises SandboxUnavailable where agent code would be refused). `warm`
    reuses an idle sandboxed host (kept from the last probe, or started ahead by
    `nestor.job.tasksource.prewarm(PROBE_LIMITS)` while the agent works).
    `on_check` sees each check as it completes."""
    t0 = time.perf_counter()
    report = CheckLog(on_check)
    try:
        _validate(Path(job_dir), spec, token_budget, warm, dry_run, timeouts, memory_cap_mb,
                  report)
    except SandboxUnavailable:
        raise  # no sandbox for agent code here: not the job's fault, the run must stop
    except Exception as exc:  # whatever the job made the probe trip on: the job's failed check
        # Not a harness failure: a job that can crash the probe must not earn a free retry
        # (issue 25). A real bug of ours shows in the log, with its traceback.
        log.exception("validation probe raised on %s", job_dir)
        report.add("probe", False, f"the probe could not check this job: "
                   f"{type(exc).__name__}: {clean_text(str(exc))[:300]}; look for extreme "
                   "values in the job's files or replies (deep nesting, huge numbers, "
                   "invalid text)")
    checks = report.checks
    return ValidationReport(passed=bool(checks) and all(c.ok for c in checks), checks=checks,
                            elapsed_s=round(time.perf_counter() - t0, 3),
                            harness_failure=report.harness_failure)


def _validate(job_dir: Path, spec: TaskSpec, token_budget: int, warm: bool, dry_run: bool,
              timeouts: Timeouts, memory_cap_mb: int, report: CheckLog) -> None:
    try:
        layout = read_layout(job_dir)
    except LayoutError as exc:
        report.add("files", False, str(exc))
        trusted_checks(job_dir, None, token_budget, report)
        return
    rows = DATA if layout.has_data else "no data file (load() makes the rows)"
    report.add("files", True, f"config.toml, {rows}, env/pyproject.toml, env/{layout.package}/")
    # The child imports verifiers (seconds) while we check files and load the base model.
    try:
        source = JobTaskSource(layout.root, limits=PROBE_LIMITS, timeouts=timeouts,
                               warm=warm, package=layout.package)
    except SandboxError as exc:  # the sandbox itself did not start: ours, not the job's
        trusted_checks(job_dir, layout, token_budget, report)
        report.harness_failure = True
        report.add("imports", False, f"the sandbox did not start: {exc}; this is not your "
                   "job's fault — resubmit")
        return
    except TaskSourceError as exc:  # staging the job's files failed: the files' problem
        trusted_checks(job_dir, layout, token_budget, report)
        report.add("imports", False, f"could not stage the job for the sandbox: {exc}")
        return
    with source:
        config = trusted_checks(job_dir, layout, token_budget, report)
        tokenizer = _tokenizer(config.base_model) if config else None
        _sandbox_checks(source, spec, config, tokenizer, dry_run, memory_cap_mb, report)


# ----------------------------------------------------------------------------- the sandbox

def _sandbox_checks(source: JobTaskSource, spec: TaskSpec, config: JobConfig | None,
                    tokenizer, dry_run: bool, memory_cap_mb: int, report: CheckLog) -> None:
    try:
        source.start()
    except TaskSourceError as exc:  # no job code runs before import: the host's trouble
        report.harness_failure = True
        report.add("imports", False, f"the sandbox did not start: {exc}; this is not your "
                   "job's fault — resubmit")
        return
    try:
        info = source.import_env()
    except TaskSourceError as exc:
        report.add("imports" if exc.stage in ("import", "host") else "taskset", False, str(exc))
        if exc.stage == "taskset":  # the import itself went through
            report.checks.insert(-1, Check(name="imports", ok=True,
                                           message=f"env/{source.package} imports"))
        return
    report.add("imports", True, f"env/{source.package} imports in "
               f"{source.timings.get('import', 0):.2f} s")
    names = f"{info.get('taskset')} -> {info.get('task')}, rewards: " \
        f"{', '.join(map(str, info.get('rewards') or []))}"
    report.add("taskset", True, clean_text(names, MAX_MESSAGE))
    try:
        tasks = source.load()
    except TaskSourceError as exc:
        report.add("load", False, str(exc))
        return
    if not check_tasks(tasks, source, report):
        return
    fits = config is not None and check_context(tasks, config, tokenizer, report) \
        and _check_memory(tasks, config, tokenizer, memory_cap_mb, report)
    valid = _rubric_checks(source, tasks, spec, report)
    if dry_run and valid and fits:
        _dry_run(source, tasks, config, report)


def check_tasks(tasks: list[dict], source: JobTaskSource, report: CheckLog) -> bool:
    """The probe's row checks; training re-runs them on the rows load() yields there."""
    if len(tasks) < MIN_TASKS:
        return report.add("load", False, f"load() yielded {len(tasks)} tasks; it needs at least "
                          f"{MIN_TASKS} (varied prompts: the trainer samples a batch per step)")
    with_system = sum(t.get("system_prompt") is not None for t in tasks)
    if with_system:
        return report.add("load", False, f"{with_system} tasks set a system_prompt; the test "
                          "shows the model exactly one user message and no system prompt, so "
                          "put everything in `prompt`")
    empty = sum(not t["prompt"].strip() for t in tasks)
    if empty:
        return report.add("load", False, f"{empty} tasks have an empty prompt")
    distinct = len({t["prompt"] for t in tasks})
    more = " (capped)" if source.info.get("truncated") else ""
    return report.add("load", True, f"{len(tasks):,} tasks{more}, {distinct:,} distinct prompts "
                      f"in {source.timings.get('load', 0):.2f} s")


def check_context(tasks: list[dict], config: JobConfig, tokenizer, report: CheckLog) -> bool:
    limit = _context_length(config.base_model)
    if tokenizer is None or limit is None:
        return report.add("context", True, f"skipped: no tokenizer for {config.base_model} here")
    worst, worst_i, exact = prompt_tokens([t["prompt"] for t in tasks], tokenizer)
    need = worst + config.max_new_tokens
    if need > limit:
        size = "" if exact else "up to "  # too many long prompts to measure: its bytes bound it
        return report.add("context", False, f"task {worst_i}'s prompt is {size}{worst} tokens; with "
                          f"max_new_tokens={config.max_new_tokens} that is {need}, over "
                          f"{config.base_model}'s context of {limit}; shorten the prompts")
    return report.add("context", True, f"longest prompt {worst} tokens + {config.max_new_tokens} new "
               f"≤ {limit}")


def _check_memory(tasks: list[dict], config: JobConfig, tokenizer, cap_mb: int,
                  report: CheckLog) -> bool:
    """The trainer's estimated peak memory (job/memory.py) within the cap."""
    shape = model_shape(config.base_model)
    if shape is None:
        return report.add("memory", True, f"sized on the worker: no config of "
                          f"{config.base_model} here")
    from nestor.models.registry import resolve_model_dir

    if not driver_can_size(resolve_model_dir(config.base_model)):
        return report.add("memory", True, f"sized on the worker: {config.base_model} trains in "
                          "its checkpoint's dtype on a GPU, against that GPU's memory")
    tokens, _ = longest_prompt([t["prompt"] for t in tasks], tokenizer)
    est, error = memory_error(config, shape, tokens, cap_mb)
    if error is not None:
        return report.add("memory", False, error)
    return report.add("memory", True, f"about {est.peak / MIB:,.0f} MiB at the trainer's peak "
                      f"(cap {cap_mb:,} MiB)")


def _rubric_checks(source: JobTaskSource, tasks: list[dict], spec: TaskSpec,
                   report: CheckLog) -> bool:
    """Score probe replies twice; returns whether rewards were valid (the dry run needs it)."""
    picks = random.Random(0).sample(range(len(tasks)), min(RUBRIC_TASKS, len(tasks)))
    replies = probe_replies(tasks, picks, spec)
    try:
        first = source.score_batch([r.task for r in replies], [r.text for r in replies])
    except TaskSourceError as exc:
        report.add("rewards_valid", False, str(exc))
        return False
    probe = RubricProbe(replies, first)
    ok, message = probe.valid()
    if not report.add("rewards_valid", ok, message):
        return False
    if not report.add("reward_speed", *probe.speed(MAX_SECONDS_PER_REPLY)):
        return True  # too slow to probe further within the probe's own time
    try:
        second = source.score_batch([r.task for r in replies], [r.text for r in replies])
    except TaskSourceError as exc:
        report.add("deterministic", False, str(exc))
        return True
    if not report.add("deterministic", *probe.deterministic(second)):
        return True
    report.add("reference_beats_empty", *probe.beats_empty())
    report.add("reference_beats_corrupted", *probe.beats_corrupted())
    report.add("not_constant", *probe.not_constant())
    return True


def _dry_run(source: JobTaskSource, tasks: list[dict], config: JobConfig,
             report: CheckLog) -> None:
    t0 = time.perf_counter()
    try:
        picks = random.Random(1).sample(range(len(tasks)), min(DRY_RUN_PROMPTS, len(tasks)))
        indices = [i for i in picks for _ in range(DRY_RUN_SAMPLES)]
        texts = rollouts(config, [tasks[i]["prompt"] for i in indices])
    except Exception as exc:  # the model could not be loaded here: an actionable config problem
        report.add("dry_run", False, f"sampling from {config.base_model} failed: "
                   f"{type(exc).__name__}: {exc}")
        return
    try:
        batch = source.score_batch(indices, texts)
    except TaskSourceError as exc:
        report.add("dry_run", False, f"scoring base-model rollouts: {exc}")
        return
    for i, (r, err) in enumerate(zip(batch.rewards, batch.errors, strict=True)):
        if r is None or not 0.0 <= r <= 1.0:
            report.add("dry_run", False, f"task {indices[i]}, base-model reply {texts[i]!r}: "
                       f"{err or f'reward {r} outside [0, 1]'}")
            return
    mean = sum(batch.rewards) / len(batch.rewards)
    report.add("dry_run", True, f"{len(texts)} rollouts of {config.base_model} scored, mean "
               f"reward {mean:.2f} ({time.perf_counter() - t0:.2f} s)")


# ----------------------------------------------------------------------------- base models

def _tokenizer(name: str):
    try:
        return tokenizer_for(name)
    except Exception as exc:  # no weights here: the context check says it skipped
        log.info("no tokenizer for %s: %s", name, exc)
        return None


def _context_length(name: str) -> int | None:
    try:
        from nestor.models.registry import context_length

        return context_length(name)
    except Exception:
        return None

