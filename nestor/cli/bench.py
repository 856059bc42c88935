"""`nestor bench ...`: measurements that feed decisions. `bench matrix` measures the cost matrix
(seconds and dollars per reference job for each worker type x base model present)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from nestor.cli.common import (
    JsonOpt,
    console,
    default_out,
    fail,
    out_console,
    print_json,
    registry,
    shown,
)

app = typer.Typer(no_args_is_help=True, help="Benchmarks that feed decisions (cost matrix, ...).")

DEFAULT_JOB = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"


@app.command("matrix")
def matrix(
    job: Path = typer.Option(DEFAULT_JOB, "--job", help="Reference job directory."),
    task: str = typer.Option("reverse", "--task", help="Task id the reference job is scored on."),
    model: list[str] | None = typer.Option(None, "--model", help="Only these base models "
                                           "(default: every model a worker type lists, else all)."),
    max_steps: int = typer.Option(3, "--max-steps", min=1, max=2000,
                                  help="Cap on the reference job's steps."),
    backend: str | None = typer.Option(None, "--backend",
                                       help="local | ray (default: nestor.toml, else local)."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address."),
    timeout: float = typer.Option(900.0, "--timeout", min=1.0, help="Cap per reference job (s)."),
    output: Path | None = typer.Option(None, "--output", help="Matrix file (default: "
                                       "<cache_dir>/cost_matrix.json)."),
    skip_validation: bool = typer.Option(False, "--skip-validation", help="Do not run the "
                                         "validation probe on the reference job first."),
    json_: bool = JsonOpt,
) -> None:
    """Validate the reference job, then run it on every worker type x base model present;
    store the matrix."""
    from nestor.pool import CostMatrix, PoolConfigError, PoolError, load_pool_config
    from nestor.pool.matrix import candidate_models, measure_matrix, present_models
    from nestor.tasks import TaskError

    if backend not in (None, "local", "ray"):
        fail(f"--backend must be local or ray, not {backend!r}")
    if not (job / "config.toml").is_file():
        fail(f"reference job {job} has no config.toml; pass --job DIR")
    try:
        spec = registry().get(task).spec()
        config = load_pool_config(backend=backend, address=address, cost_matrix=output)
    except TaskError as exc:
        fail(str(exc))
    except PoolConfigError as exc:
        fail(str(exc))
    from nestor.cli.job import run_probe, skipped_line

    if skip_validation:  # the one gate, as for every command that trains a job
        skipped_line("training the reference job")
    elif not (report := run_probe(job, spec, quiet=json_)).passed:
        fail(f"reference job {job} failed validation: {report.summary()}", code=1)
    present, absent = present_models(candidate_models(config, model))
    for name, why in absent.items():
        console.print(f"[yellow]skip {shown(name)}:[/yellow] {shown(why)}", highlight=False)
    if not present:
        fail("no base model is present here; see `nestor models list`")
    rows: list[dict] = []
    try:
        with console.status("measuring…") as status:
            def progress(row: dict) -> None:
                status.update(shown(f"{len(rows) + 1} cell(s) done; last: {row['worker_type']} x "
                                    f"{row['base_model']} {row['status']}"))

            measured, rows = measure_matrix(config, job.resolve(), task, present,
                                            max_steps=max_steps, timeout_s=timeout,
                                            on_row=progress)
    except PoolError as exc:
        fail(str(exc))
    path = config.matrix_path()
    old = CostMatrix.load(path)
    fresh = {(e.worker_type, e.base_model) for e in measured.entries}
    kept = [e for e in (old.entries if old else []) if (e.worker_type, e.base_model) not in fresh]
    measured.entries = kept + measured.entries  # re-measuring one cell keeps the others
    measured.save(path)
    if json_:
        print_json({"path": str(path), "rows": rows, "absent_models": absent})
        return
    table = Table("worker type", "base model", "status", "seconds/job", "$/job")
    for r in rows:
        table.add_row(shown(r["worker_type"]), shown(r["base_model"]), shown(r["status"]),
                      "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
                      "-" if r["dollars"] is None else f"{r['dollars']:.5f}")
    out_console().print(table)
    console.print(f"saved {path}", highlight=False)


def episode_failures(records: list) -> list[dict[str, str]]:
    """Each episode that did not end `ok`, with the reason in full: the policy's error (an
    endpoint's HTTP 400 says why), the job's status and last log line, or the end reason."""
    out = []
    for rec in records:
        if rec.end_reason == "ok":
            continue
        why = str(rec.components.get("error") or "").strip()
        if not why and rec.result is not None:
            tail = (rec.result.log_tail or "").strip().splitlines()
            why = f"job {rec.result.status}" + (f": {tail[-1]}" if tail else "")
        out.append({"episode_id": rec.id, "task": rec.task_id, "end_reason": rec.end_reason,
                    "why": why or {"no_submit": "the policy never called submit",
                                   "turn_limit": "out of turns before a job passed validation",
                                   "invalid": "no submitted job passed validation",
                                   "token_limit": "out of tokens"}.get(rec.end_reason, "–")})
    return out


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="bench")


@app.command("agents")
def agents(
    policy: str = typer.Option(..., "--policy", help="openai:MODEL (any OpenAI-compatible "
                               "endpoint), composer, lm:MODEL (a local HF chat LM), "
                               "tinker:MODEL (Tinker's API) or tinker-local:MODEL (its offline "
                               "stand-in on a local model)."),
    adapter: Path | None = typer.Option(None, "--adapter", help="lm:MODEL: start from this "
                                        "`nestor sft` adapter (its --out DIR)."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="composer, lm:MODEL or "
                                           "tinker: load a trained policy (a run's "
                                           "checkpoints/<step>/policy)."),
    tinker_key_env: str = typer.Option("TINKER_API_KEY", "--tinker-key-env",
                                       help="tinker: environment variable holding the key."),
    base_url: str = typer.Option("https://api.openai.com/v1", "--base-url",
                                 help="Chat-completions base URL (e.g. a `nestor serve`)."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env",
                                    help="Environment variable holding the API key."),
    tasks: list[str] = typer.Option(["all"], "--tasks", "--task", help="Task ids, "
                                    "comma-separated or repeated, or all (training families; "
                                    "as `nestor eval --tasks`)."),
    episodes: int = typer.Option(2, "--episodes", min=1, help="Episodes per task."),
    max_retries: int = typer.Option(5, "--max-retries", min=0, max=20,
                                    help="Retries (exponential backoff) on 429, 5xx, no answer."),
    request_timeout: float = typer.Option(120.0, "--request-timeout", min=1.0,
                                          help="Seconds to wait for one reply (a CPU-served "
                                          "model needs minutes for a long prompt)."),
    budget: int = typer.Option(20_000, "--budget", min=1000, help="Sampled-token cap per job."),
    workers: int = typer.Option(2, "--workers", min=1, help="Local pool workers."),
    max_turns: int = typer.Option(12, "--max-turns", min=1, max=200),
    prompt_style: str = typer.Option("full", "--prompt-style", help="full, compact (for "
                                     "small-context models, e.g. a served smollm2-135m) or "
                                     "short (a warm-started model)."),
    run_dir: Path | None = typer.Option(None, "--out", "--run-dir", help="Where everything "
                                        "goes: ledger, episodes, leaderboard.csv (default "
                                        "runs/bench-<timestamp>)."),
    leaderboard: Path | None = typer.Option(None, "--leaderboard", help="CSV the row is "
                                            "appended to (default OUT/leaderboard.csv; name one "
                                            "file, e.g. runs/leaderboard.csv, to compare runs)."),
    json_: bool = JsonOpt,
) -> None:
    """Run episodes with an untrained job writer and append a leaderboard row."""
    from nestor.agent.bench import append_row, leaderboard_row, run_benchmark
    from nestor.agent.episode import EpisodeConfig
    from nestor.ledger import Ledger
    from nestor.pool.base import PoolError, make_pool
    from nestor.pool.config import PoolConfigError, load_pool_config
    from nestor.tasks import TaskError

    reg = registry()
    try:
        ids = [t.strip() for item in tasks for t in item.split(",") if t.strip()]
        refs = reg.training_tasks() if "all" in ids else [reg.get(t) for t in ids]
    except TaskError as exc:
        fail(str(exc))
    from nestor.cli.bench_policies import BenchPolicyError, make_bench_policy

    try:
        pol, usage = make_bench_policy(
            policy, adapter=adapter, checkpoint=checkpoint, budget=budget,
            tinker_key_env=tinker_key_env,
            openai_kw={"base_url": base_url, "api_key_env": api_key_env,
                       "max_retries": max_retries, "timeout_s": request_timeout})
    except (BenchPolicyError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    run_dir = run_dir or default_out("bench")
    leaderboard = leaderboard or run_dir / "leaderboard.csv"
    if prompt_style not in ("full", "compact", "short"):
        fail(f"--prompt-style {prompt_style!r}: choose full, compact or short")
    cfg = EpisodeConfig(max_turns=max_turns, token_budget=budget, prompt_style=prompt_style)
    try:
        pool = make_pool(load_pool_config(workers=workers))
    except (PoolError, PoolConfigError) as exc:
        fail(str(exc))
    specs = [r.spec() for r in refs]
    try:
        with Ledger(run_dir) as ledger, console.status("benchmarking…") as status:
            done: list = []

            def progress(rec) -> None:
                done.append(rec)
                status.update(shown(f"{len(done)}/{len(specs) * episodes} episodes; last "
                                    f"{rec.task_id}: {rec.end_reason}, reward {rec.reward:.3f}"))

            records = run_benchmark(pol, policy, specs, episodes, pool, ledger, cfg,
                                    concurrency=workers, on_episode=progress)
    finally:
        pool.shutdown()
    row = leaderboard_row(policy, [r.id for r in refs], records, usage)
    append_row(leaderboard, row)
    failures = episode_failures(records)
    if json_:
        print_json({**row, "failures": failures, "leaderboard": str(leaderboard),
                    "run_dir": str(run_dir)})
        return
    # one row, many columns: printed as label/value pairs so no cell is ever cut
    table = Table(show_header=False, title=f"bench agents · {policy}")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in row.items():
        table.add_row(key, "" if value is None else shown(value))
    con = out_console()
    con.print(table)
    for f in failures:  # why an episode earned nothing, in the words of whoever failed
        con.print(shown(f"episode {f['episode_id']} ({f['task']}): {f['end_reason']}: "
                        f"{f['why']}"), highlight=False, soft_wrap=True)
    console.print(f"appended to {leaderboard}; episodes in {run_dir} "
                  f"(`nestor episode show ID --run-dir {run_dir}`)", highlight=False,
                  soft_wrap=True)
