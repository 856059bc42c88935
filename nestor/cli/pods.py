"""`nestor pods up|list|reap`: the run's rented GPU pods (Runpod), and cleaning up after a crash."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from nestor.cli.common import JsonOpt, console, fail, out_console, print_json

app = typer.Typer(no_args_is_help=True, help="Rented GPU pods of a run (Runpod).")

RunDirArg = typer.Argument(Path("."), help="The run directory (holds pods.sqlite).")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="pods")


def _api():
    from nestor.pool.podapi import PodApiError, RunpodApi

    try:
        return RunpodApi()
    except PodApiError as exc:
        fail(str(exc))


def _rows(run_dir: Path) -> list[dict]:
    from nestor.pool.podledger import FILENAME, PodLedger

    if not (run_dir / FILENAME).is_file():
        fail(f"{run_dir}: no {FILENAME} here; pass the run directory that created the pods")
    ledger = PodLedger(run_dir)
    now = time.time()
    try:
        return [{"pod_id": r.pod_id, "name": r.name, "worker_type": r.worker_type,
                 "gpu_type_id": r.gpu_type_id, "price_per_hr": r.price_per_hr,
                 "alive_s": round((r.ended_at or now) - r.created_at, 1),
                 "cost_usd": round(r.cost_usd(now), 4), "open": r.open,
                 "end_reason": r.end_reason} for r in ledger.rows()]
    finally:
        ledger.close()


@app.command("list")
def list_(run_dir: Path = RunDirArg, json_: bool = JsonOpt) -> None:
    """Every pod the run created, from its ledger (no cloud call): open ones still bill."""
    rows = _rows(run_dir)
    spent = round(sum(r["cost_usd"] for r in rows), 4)
    if json_:
        print_json({"pods": rows, "open": sum(r["open"] for r in rows), "spent_usd": spent})
        return
    table = Table("pod", "type", "$/h", "alive", "$", "state")
    for r in rows:
        table.add_row(r["pod_id"], r["worker_type"], f"{r['price_per_hr']:.2f}",
                      f"{r['alive_s'] / 60:.1f} min", f"{r['cost_usd']:.3f}",
                      "[yellow]open[/yellow]" if r["open"] else str(r["end_reason"]))
    out_console().print(table)
    out_console().print(f"spent ${spent:.2f}; {sum(r['open'] for r in rows)} open")


@app.command("reap")
def reap_(run_dir: Path = RunDirArg, json_: bool = JsonOpt) -> None:
    """Terminate every pod this run left running (after a crash or kill -9)."""
    from nestor.pool.podapi import PodApiError
    from nestor.pool.podledger import FILENAME, PodLedger
    from nestor.pool.runpod import reap

    if not (run_dir / FILENAME).is_file():
        fail(f"{run_dir}: no {FILENAME} here; pass the run directory that created the pods")
    api = _api()
    ledger = PodLedger(run_dir)
    try:
        reaped = reap(ledger, api)
    except PodApiError as exc:
        fail(f"reap incomplete, run it again: {exc}")
    finally:
        ledger.close()
    if json_:
        print_json({"reaped": reaped})
    else:
        console.print(f"terminated {len(reaped)} pod(s)" + (f": {', '.join(reaped)}" if reaped
                                                             else ""))


@app.command("up")
def up(
    config: Path = typer.Argument(..., help="TOML file with a [runpod] table (RunpodConfig)."),
    run_dir: Path = typer.Option(Path("."), "--run-dir", help="Where pods.sqlite goes."),
    pods: int | None = typer.Option(None, "--pods", min=0, help="Pods to keep (default max_pods)."),
    base_model: str | None = typer.Option(None, "--base-model", help="Rank GPU types by the "
                                          "cost matrix's $/job for this model."),
    json_: bool = JsonOpt,
) -> None:
    """Keep a warm pool of pods joined to the Ray head until Ctrl-C; then terminate them all."""
    from rich.live import Live

    from nestor.pool.config import load_pool_config
    from nestor.pool.cost import CostMatrix
    from nestor.pool.podapi import PodApiError
    from nestor.pool.runpod import Provisioner, RunpodConfigError, load_runpod_config

    try:
        cfg = load_runpod_config(config)
    except RunpodConfigError as exc:
        fail(str(exc))
    matrix = CostMatrix.load(load_pool_config().matrix_path())
    target = cfg.max_pods if pods is None else min(pods, cfg.max_pods)
    prov = Provisioner(cfg, _api(), run_dir, demand=lambda: target, matrix=matrix,
                       base_model=base_model)
    try:
        reaped = prov.start()
    except PodApiError as exc:
        fail(f"cannot reconcile pods left by an earlier session: {exc}; "
             f"retry, or run `nestor pods reap {run_dir}`")
    if reaped:
        console.print(f"terminated {len(reaped)} pod(s) left by an earlier session")

    def view() -> Table:
        table = Table(title=f"{len(prov.live())}/{target} pods · spent ${prov.spent_usd():.2f} "
                      f"of ${cfg.max_cost_usd:.2f} · ${prov.burn_per_hr():.2f}/h")
        table.add_column("event")
        table.add_column("detail")
        for kind, detail in prov.events[-12:]:
            table.add_row(kind, detail)
        return table

    try:
        with Live(view(), console=console, refresh_per_second=1, transient=json_) as live:
            while not prov.capped:
                prov.tick()
                live.update(view())
                time.sleep(cfg.poll_s)
    except KeyboardInterrupt:
        pass
    finally:
        prov.shutdown("exit")
    if json_:
        print_json({"events": prov.events, "spent_usd": round(prov.spent_usd(), 4),
                    "capped": prov.capped})
