"""The probe's trusted checks: the job's files read as data, never imported or run.

files, config (with a known base model), budget and dataset need no sandbox: `nestor job
export` runs them alone (`static_checks`), and validate.py runs them beside the sandboxed ones.
Every file is read without following links and up to a cap (safe_read.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from nestor.job.config import DEFAULT_TOKEN_BUDGET, JobConfig, JobConfigError, job_config, read_toml
from nestor.job.layout import CONFIG, DATA, MAX_DATA_BYTES, JobLayout, LayoutError, read_layout
from nestor.job.report import Check, CheckLog
from nestor.job.safe_read import UnsafeFileError, is_plain_file, read_text

MAX_ROWS = 200_000


def static_checks(job_dir: Path | str,
                  token_budget: int = DEFAULT_TOKEN_BUDGET) -> list[Check]:
    """The checks that need no sandbox: files, config (with a known base model), budget,
    dataset. `nestor job export` runs these before writing anything."""
    report, job_dir = CheckLog(), Path(job_dir)
    try:
        read_layout(job_dir)
    except LayoutError as exc:
        report.add("files", False, str(exc))
    trusted_checks(job_dir, None, token_budget, report)
    return report.checks


def trusted_checks(job_dir: Path, layout: JobLayout | None, token_budget: int,
                   report: CheckLog) -> JobConfig | None:
    """config, budget and dataset, added to `report`; the job's config where it is valid."""
    config, data = None, None
    if is_plain_file(job_dir, CONFIG):  # a link or special file: the files check said so
        try:  # parsed once: tomllib is the slow part
            data = read_toml(job_dir, CONFIG)
            config = job_config(data, CONFIG)
        except JobConfigError as exc:
            problem = _model_problem(_raw_base_model(data))
            report.add("config", False, str(exc) + (f"; {problem}" if problem else ""))
        else:
            problem = _model_problem(config.base_model)
            if problem:
                report.add("config", False, problem)
                config = None
            else:
                report.add("config", True, f"base model {config.base_model}, {config.max_steps} "
                           f"steps of {config.prompts_per_step}×{config.group_size}")
    if config is not None:
        error = config.budget_error(token_budget)
        report.add("budget", error is None, error or f"{config.sampled_tokens():,} of "
                   f"{token_budget:,} sampled tokens")
    if is_plain_file(job_dir, DATA):
        ok, message = check_dataset(job_dir / DATA, root=job_dir)
        report.add("dataset", ok, message)
    elif layout is not None:  # the short form: the rows are load()'s, checked in the sandbox
        report.add("dataset", True, f"no {DATA}: the rows are the ones load() makes (the "
                   "load, context, memory and rubric checks run on them)")
    return config


def _raw_base_model(data: dict | None) -> str:
    """base_model as written, so an unknown model is named together with the schema errors."""
    value = (data or {}).get("base_model", "tiny-m")
    return value if isinstance(value, str) else "tiny-m"


def _model_problem(name: str) -> str | None:
    try:
        from nestor.models.registry import MODEL_NAMES
    except ImportError:  # the registry is not installed in this build: trust the name
        return None
    if name not in MODEL_NAMES:
        return f"config.toml: base_model {name!r} is not a known model; use one of " + \
            ", ".join(MODEL_NAMES)
    return None


def check_dataset(path: Path, root: Path | None = None) -> tuple[bool, str]:
    """Every line of data/train.jsonl is a JSON object with a string `prompt` (and, if present,
    a string or number `answer`). The file is read without following links from `root` (the
    job directory; default: the file's own directory), at most MAX_DATA_BYTES of it."""
    rows = 0
    root = Path(root) if root is not None else path.parent
    try:
        text = read_text(root, path.relative_to(root).as_posix(), MAX_DATA_BYTES)
    except UnsafeFileError as exc:
        return False, str(exc)
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            return False, f"{DATA} line {lineno}: not JSON ({exc}); write one JSON " \
                "object per line"
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            return False, f"{DATA} line {lineno}: each row must be a JSON object with " \
                f"a string \"prompt\", got {line.strip()[:80]!r}"
        if "answer" in row and not isinstance(row["answer"], str | int | float):
            return False, f"{DATA} line {lineno}: \"answer\" must be a string"
        rows += 1
        if rows > MAX_ROWS:
            return False, f"{DATA}: more than {MAX_ROWS:,} rows; keep it smaller"
    if rows == 0:
        return False, f"{DATA} is empty; write one JSON object per line"
    return True, f"{rows:,} rows"
