"""`nestor job validate|export|init|train`: one training job directory at a time."""

from __future__ import annotations

from pathlib import Path

import typer

from nestor.cli.common import (
    JsonOpt,
    TasksModuleOpt,
    console,
    fail,
    out_console,
    print_json,
    registry,
    require_sandbox,
    shown,
)

app = typer.Typer(no_args_is_help=True, help="Training jobs: validate, export, scaffold, train.")

JobDirArg = typer.Argument(..., help="The job directory (config.toml, data/, env/).")
TaskOpt = typer.Option(..., "--task", help="Task id the job teaches, e.g. reverse.")
DifficultyOpt = typer.Option(0, "--difficulty", min=0, max=3, help="Task input-size level.")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="job")


def _spec(task_id: str, difficulty: int, tasks_module: list[str] | None):
    from nestor.tasks import TaskError

    try:
        return registry(tasks_module).get(task_id).spec(difficulty)
    except TaskError as exc:
        fail(str(exc))


def _job_dir(path: Path) -> Path:
    if path.is_file():
        fail(f"{path} is a file; give the job directory that holds config.toml, data/ and env/"
             f" (`nestor job init DIR --task T` makes one)")
    if not path.is_dir():
        fail(f"{path}: no such job directory (`nestor job init {path} --task T` makes one)")
    return path


SkipValidationOpt = typer.Option(False, "--skip-validation", help="Do not run the validation "
                                 "probe first (the job is trained unchecked; say so on purpose).")


def run_probe(job_dir: Path, spec, *, token_budget: int | None = None,
              memory_cap: int | None = None, quiet: bool = False):
    """The validation probe on `job_dir`, each check printed as it completes (unless `quiet`).
    The one gate: `job validate`, and `job train`, `job export` and `pool run` before they
    train or export anything."""
    from nestor.job.config import DEFAULT_TOKEN_BUDGET
    from nestor.job.memory import DEFAULT_MEMORY_CAP_MB
    from nestor.job.validate import validate_job

    require_sandbox()
    from rich.console import Console

    out = Console()
    if out.is_terminal and console.is_terminal:
        out = console  # one screen: the spinner's console prints the lines above itself

    def on_check(check) -> None:  # each as it completes: progress that also reads in CI logs
        if not quiet:  # a check's message quotes the job (its file names, its output)
            mark = "[green]ok  [/green]" if check.ok else "[red]FAIL[/red]"
            out.print(f"{mark} {shown(check.name)}: {shown(check.message)}", highlight=False)

    if not quiet:
        out.print(f"validating {job_dir} for {spec.id} (the first check starts the "
                  f"sandbox, ~10-20 s cold)", highlight=False)
    with console.status("checking…"):
        report = validate_job(job_dir, spec, token_budget=token_budget or DEFAULT_TOKEN_BUDGET,
                              memory_cap_mb=memory_cap or DEFAULT_MEMORY_CAP_MB,
                              on_check=on_check)
    if not quiet:
        verdict = "[green]passed[/green]" if report.passed else "[red]failed[/red]"
        out.print(f"{verdict} in {report.elapsed_s:.1f} s", highlight=False)
    return report


def skipped_line(what: str) -> None:
    console.print(f"[yellow]validation skipped[/yellow] (--skip-validation): {what} without "
                  "the probe's checks", highlight=False)


@app.command("validate")
def validate(
    job_dir: Path = JobDirArg,
    task: str = TaskOpt,
    difficulty: int = DifficultyOpt,
    token_budget: int | None = typer.Option(None, "--token-budget", min=1,
                                            help="Cap on sampled tokens (default: the standard cap)."),
    memory_cap: int | None = typer.Option(None, "--memory-cap", min=64, help="Cap in MiB on the "
                                          "trainer's estimated peak memory (default 2048)."),
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Run the validation probe; exit 0 when the job passes, 1 when it does not."""
    spec = _spec(task, difficulty, tasks_module)
    _job_dir(job_dir)
    report = run_probe(job_dir, spec, token_budget=token_budget, memory_cap=memory_cap,
                       quiet=json_)
    if json_:
        print_json(report.model_dump())
    raise typer.Exit(0 if report.passed else 1)


@app.command("export")
def export(
    job_dir: Path = JobDirArg,
    prime_rl: Path = typer.Option(..., "--prime-rl", help="Where to write the prime-rl rl.toml."),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs of the machine that runs it: 1 = "
                             "trainer and vLLM share one; more = vLLM on one, the trainer the rest."),
    task: str | None = typer.Option(None, "--task", help="Task id the job teaches: the "
                                    "validation probe checks the job for it before anything "
                                    "is written (needed unless --skip-validation)."),
    difficulty: int = DifficultyOpt,
    skip_validation: bool = SkipValidationOpt,
    tasks_module: list[str] | None = TasksModuleOpt,
) -> None:
    """Validate the job, then render it as a prime-rl rl.toml (`rl @ OUT.toml`)."""
    from nestor.job.config import JobConfigError
    from nestor.job.export import static_problems, to_prime_rl_toml
    from nestor.job.layout import LayoutError

    problems = static_problems(_job_dir(job_dir))
    if problems:
        fail(f"{job_dir} is not a valid job, nothing written: {'; '.join(problems)}")
    if skip_validation:
        skipped_line("exporting for training")
    elif task is None:
        fail("give --task T: the probe checks the job for its task before it is exported for "
             "training (or --skip-validation to export it unchecked)")
    else:
        report = run_probe(job_dir, _spec(task, difficulty, tasks_module))
        if not report.passed:
            fail(f"{job_dir} failed validation, nothing written: {report.summary()}", code=1)
    try:
        text = to_prime_rl_toml(job_dir, gpus=gpus)
    except (LayoutError, JobConfigError) as exc:
        fail(f"{job_dir}: {exc}")
    try:
        prime_rl.parent.mkdir(parents=True, exist_ok=True)
        prime_rl.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {prime_rl}: {exc.strerror or exc}")
    console.print(f"wrote {prime_rl}", highlight=False)


@app.command("init")
def init(
    job_dir: Path = JobDirArg,
    task: str = TaskOpt,
    force: bool = typer.Option(False, "--force", help="Write into a non-empty directory."),
    tasks_module: list[str] | None = TasksModuleOpt,
) -> None:
    """Scaffold a minimal valid job for TASK, to edit by hand."""
    from nestor.job.scaffold import ScaffoldError, init_job
    from nestor.tasks import TaskError

    try:
        ref = registry(tasks_module).get(task)
    except TaskError as exc:
        fail(str(exc))
    try:
        written = init_job(job_dir, ref, force=force, modules=tuple(tasks_module or ()))
    except ScaffoldError as exc:
        fail(str(exc))
    for path in written:
        console.print(f"wrote {path}", highlight=False)
    console.print(f"next: edit it, then `nestor job validate {job_dir} --task {task}`",
                  highlight=False)


@app.command("train")
def train(
    job_dir: Path = JobDirArg,
    task: str = TaskOpt,
    difficulty: int = DifficultyOpt,
    out: Path | None = typer.Option(None, "--out", help="Where the results go: OUT/checkpoint "
                                    "(default: runs/job-<YYYYmmdd-HHMMSS>/ in the current "
                                    "directory)."),
    timeout_s: float = typer.Option(3600.0, "--timeout", min=1, help="Wall-clock limit, seconds."),
    threads: int = typer.Option(1, "--threads", min=1, max=256, help="torch CPU threads (the "
                                "tiny models gain little from more; raise it for bigger ones)."),
    device: str = typer.Option("cpu", "--device", help="Torch device to train and score on: "
                               "cpu, cuda, cuda:N."),
    dtype: str | None = typer.Option(None, "--dtype", help="Weights dtype: auto, float32, "
                                     "bfloat16, float16 (default float32 on cpu, the "
                                     "checkpoint's own on a GPU)."),
    memory_cap: int | None = typer.Option(None, "--memory-cap", min=64, help="Cap in MiB on the "
                                          "trainer's estimated peak memory (default 2048)."),
    max_steps: int | None = typer.Option(None, "--max-steps", min=1, max=2000, help="Train this "
                                         "many steps instead of config.toml's max_steps (a quick "
                                         "smoke run; the job directory is not changed)."),
    skip_validation: bool = SkipValidationOpt,
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Validate the job, then GRPO-train its base model and score it before and after on the
    hidden eval.

    Exit 0 when the job trained (status ok), 1 otherwise (refused by the probe, invalid,
    failed, timeout)."""
    import time

    from pydantic import ValidationError

    from nestor.pool.config import WorkerType

    try:  # the worker type's own rules for device and dtype
        WorkerType(name="cli", device=device, dtype=dtype)
    except ValidationError as exc:
        fail(f"--device {device!r} / --dtype {dtype!r}: use --device cpu, cuda or cuda:N and "
             f"--dtype auto, float32, bfloat16 or float16 ({exc.error_count()} problem(s))")
    from nestor.inner.run import WarmState
    from nestor.inner.types import JobRequest
    from nestor.job.config import JobConfigError, load_job_config

    spec = _spec(task, difficulty, tasks_module)
    require_sandbox()
    source = _job_dir(job_dir).resolve()
    out = (out or Path("runs") / f"job-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    validation: dict | str = "skipped"
    if skip_validation:
        skipped_line("training")
    else:
        report = run_probe(job_dir, spec, memory_cap=memory_cap, quiet=json_)
        validation = report.model_dump()
        if not report.passed:
            if json_:
                print_json({"status": "invalid", "validation": validation, "out": None})
            else:
                console.print(f"{job_dir} not trained: {shown(report.summary())}",
                              highlight=False)
            raise typer.Exit(1)
    request = JobRequest(job_dir=source, task_id=task, difficulty=difficulty,
                         out_dir=out / "checkpoint", timeout_s=timeout_s, max_steps=max_steps,
                         tasks_modules=list(tasks_module or []),
                         **({"memory_cap_mb": memory_cap} if memory_cap else {}))
    try:
        total = max_steps or load_job_config(source / "config.toml").max_steps
    except JobConfigError:
        total = None  # run_job reports it as an invalid job
    result = _train_with_progress(request, total, quiet=json_,
                                  warm=WarmState(device=device, dtype=dtype, threads=threads))
    fields = _fields(result)
    if json_:
        print_json({**fields, "validation": validation,
                    "out": str(out) if result.checkpoint else None})
    else:
        _print_result(job_dir, task, result, fields)
        if result.checkpoint:
            console.print(f"results in {out}", highlight=False)
    raise typer.Exit(0 if result.status == "ok" else 1)


def _train_with_progress(request, total: int | None, *, quiet: bool, warm):
    """run_job with a progress bar, and a line every ~5% of the steps (a log shows it too)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from nestor.inner.run import run_job

    every = max(1, (total or 20) // 20)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=quiet) as progress:
        bar = progress.add_task("loading model, pre-score, reward server…", total=total)

        def on_step(m: dict) -> None:
            progress.update(bar, completed=m["step"], description=(
                f"training: reward {m['reward_mean']:.3f}, {m['tokens_per_s']:.0f} tok/s"))
            if not quiet and (m["step"] % every == 0 or m["step"] == total):
                progress.console.print(
                    f"step {m['step']}/{total or '?'}: reward {m['reward_mean']:.3f} "
                    f"±{m['reward_std']:.3f}, {m.get('groups_trained', 0)} groups trained, "
                    f"{m['step_s']:.1f} s", highlight=False)

        return run_job(request, warm=warm, on_step=on_step)


FIELDS = ("status", "pre_score", "post_score", "improvement", "eval_n", "wall_s", "train_s",
          "steps", "weight_change", "reward_curve", "checkpoint", "base_model", "log_tail")


def _fields(result) -> dict:
    from nestor.inner.evaluate import wilson

    fields = {k: getattr(result, k) for k in FIELDS}
    for key in ("pre_score", "post_score"):  # the interval `nestor eval` shows
        value, n = fields[key], result.eval_n
        fields[key.replace("score", "ci95")] = None if value is None or not n else \
            wilson(round(value * n), n)
    return fields


def _print_result(job_dir: Path, task: str, result, fields: dict) -> None:
    from rich.table import Table

    colour = "green" if result.status == "ok" else "red"
    table = Table(show_header=False)
    n = fields["eval_n"]
    for key in ("pre_score", "post_score", "improvement", "wall_s", "train_s", "steps",
                "weight_change", "reward_curve", "checkpoint", "base_model"):
        value = fields[key]
        if key in ("pre_score", "post_score") and value is not None:
            ci = fields[key.replace("score", "ci95")]
            value = f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}] n={n}" if ci else "")
        elif key == "weight_change" and value is not None:
            value = f"{value:.2e} (||Δθ||/||θ||)"
        elif isinstance(value, float):
            value = f"{value:+.3f}" if key == "improvement" else f"{value:.3f}"
        elif key == "reward_curve":
            value = " ".join(f"{r:.2f}" for r in value)
        # base_model is recorded as the job's config.toml names it, before any check
        table.add_row(key, "-" if value is None else shown(value))
    out = out_console()
    out.print(f"{job_dir} on {task}: [{colour}]{result.status}[/{colour}]", highlight=False)
    out.print(table)
    if result.status != "ok" and result.log_tail:
        console.print(shown(result.log_tail), highlight=False)
