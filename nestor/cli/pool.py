"""`nestor pool run JOB_DIR... --task ID`: run several jobs on a warm pool, print their results."""

from __future__ import annotations

from concurrent.futures import as_completed
from pathlib import Path

import typer
from rich.table import Table

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
    with_interval,
)
from nestor.cli.job import SkipValidationOpt, run_probe, skipped_line

app = typer.Typer(no_args_is_help=True, help="Warm worker pools: run jobs locally or on Ray.")

BackendOpt = typer.Option(None, "--backend", help="local | ray (default: the pool table of "
                          "nestor.toml, else local).")
WorkersOpt = typer.Option(None, "--workers", min=1, max=1024,
                          help="Workers (local default: cores, at most 16).")
AddressOpt = typer.Option(None, "--address",
                          help="Ray cluster: auto, host:port or ray://host:port.")


def open_pool(backend: str | None, workers: int | None, address: str | None):
    """The configured pool, or a one-line error (bad config, cluster not answering)."""
    from nestor.pool import PoolConfigError, PoolError, load_pool_config, make_pool

    if backend not in (None, "local", "ray"):
        fail(f"--backend must be local or ray, not {backend!r}")
    try:
        config = load_pool_config(backend=backend, workers=workers, address=address)
        return make_pool(config)
    except (PoolConfigError, PoolError) as exc:
        fail(str(exc))


def result_row(job_dir: Path, result) -> dict:
    return {"job_dir": str(job_dir), **result.model_dump(mode="json", exclude={"metrics"})}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@app.command("run")
def run(
    job_dirs: list[Path] = typer.Argument(..., help="Job directories to train."),
    task: str = typer.Option(..., "--task", help="Task id whose hidden eval scores the jobs."),
    backend: str | None = BackendOpt,
    workers: int | None = WorkersOpt,
    address: str | None = AddressOpt,
    difficulty: int = typer.Option(0, "--difficulty", min=0, max=5, help="Task difficulty level."),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Wall-clock cap per job (s)."),
    out_dir: Path | None = typer.Option(None, "--out-dir",
                                        help="Checkpoints go to OUT_DIR/<n>-<job>."),
    skip_validation: bool = SkipValidationOpt,
    tasks_module: list[str] | None = TasksModuleOpt,
    json_: bool = JsonOpt,
) -> None:
    """Validate each job, then run those that pass on a warm pool (cheapest free worker type
    first); exit 1 if any is not ok."""
    from nestor.inner.types import JobRequest, JobResult
    from nestor.tasks import TaskError

    missing = [str(d) for d in job_dirs if not (d / "config.toml").is_file()]
    if missing:
        fail(f"not a job directory (no config.toml): {', '.join(missing)}")
    try:
        spec = registry(tasks_module).get(task).spec(difficulty)
    except TaskError as exc:
        fail(str(exc))
    require_sandbox()  # the jobs run agent code: stop now if it would be refused
    results: dict[int, object] = {}
    if skip_validation:
        skipped_line("training")
    else:  # the one gate: the probe `nestor job validate` runs, before any job trains
        for i, d in enumerate(job_dirs):
            report = run_probe(d, spec, quiet=json_)
            if not report.passed:
                results[i] = JobResult(status="invalid", log_tail=report.summary())
    names = [f"{i}-{d.resolve().name}" for i, d in enumerate(job_dirs)]
    requests = {i: JobRequest(job_dir=d.resolve(), task_id=task, difficulty=difficulty,
                              timeout_s=timeout, tasks_modules=list(tasks_module or []),
                              request_id=name,
                              out_dir=(out_dir / name).resolve() if out_dir else None)
                for i, (name, d) in enumerate(zip(names, job_dirs, strict=True))
                if i not in results}
    pool = open_pool(backend, workers, address)
    try:
        with console.status(f"{len(requests)} job(s) on {pool.capacity()} worker(s)…") as status:
            futures = {pool.submit(r): i for i, r in requests.items()}
            for n, fut in enumerate(as_completed(futures), 1):
                i = futures[fut]
                results[i] = fut.result()
                status.update(f"{n}/{len(requests)} done; last: {job_dirs[i]} "
                              f"{results[i].status}")
    finally:
        pool.shutdown()
    rows = [result_row(job_dirs[i], results[i]) for i in range(len(job_dirs))]
    if json_:
        print_json(rows)
    else:
        table = Table("job", "status", "pre [95%]", "post [95%]", "Δ", "steps", "wall s", "$", "worker")
        for row in rows:
            table.add_row(shown(Path(row["job_dir"]).name), shown(row["status"]),
                          with_interval(row["pre_score"]), with_interval(row["post_score"]),
                          _fmt(row["improvement"]), str(row["steps"]), f"{row['wall_s']:.1f}",
                          f"{row['cost_usd']:.4f}", shown(row["worker"] or "-"))
        out_console().print(table)
        for row in rows:
            if row["status"] != "ok" and row["log_tail"]:
                console.print(f"[yellow]{shown(row['job_dir'])}[/yellow] ({shown(row['status'])}): "
                              f"{shown(row['log_tail'].splitlines()[-1])}", highlight=False)
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(1)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="pool")
