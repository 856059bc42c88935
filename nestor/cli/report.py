"""`nestor report RUN_DIR`: figures and an HTML page for a run (finished, running or crashed)."""

from __future__ import annotations

import time
import webbrowser
from pathlib import Path

import typer

from nestor.cli.common import JsonOpt, console, fail, print_json


def report(
    run_dir: Path = typer.Argument(..., help="A run directory (has metrics.jsonl / ledger.sqlite)."),
    open_: bool = typer.Option(False, "--open", help="Open the page in a browser."),
    json_: bool = JsonOpt,
) -> None:
    """Write RUN_DIR/report/index.html and its PNG figures."""
    from nestor.report.data import RunDirError
    from nestor.report.html import write_report

    start = time.perf_counter()
    try:
        page = write_report(run_dir)
    except RunDirError as exc:
        fail(str(exc))
    elapsed = time.perf_counter() - start
    figures = sorted(p.name for p in page.parent.glob("*.png"))
    if json_:
        print_json({"report": str(page), "figures": figures, "elapsed_s": round(elapsed, 2)})
    else:
        console.print(f"wrote {page} ({len(figures)} figures, {elapsed:.1f} s)")
    if open_:
        webbrowser.open(page.resolve().as_uri())


def register(app: typer.Typer) -> None:
    app.command("report")(report)
