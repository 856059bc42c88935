"""How long `nestor report` takes, and how big the episode browser gets, on a fixture run:

    .venv/bin/python benchmarks/report_speed.py [STEPS]   (default 50 steps = 200 episodes)

Target: under 10 s for a quickstart-sized run (figures dominate; the browser grows ~3 KiB an
episode on this fixture, ~27 KiB on a real quickstart run). The last line is one JSON object."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nestor.report.html import write_report  # noqa: E402
from tests.report.run_fixture import make_run  # noqa: E402


def main(steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run = make_run(Path(tmp) / "run", steps=steps)
        start = time.perf_counter()
        page = write_report(run)
        elapsed = time.perf_counter() - start
        browser = page.with_name("episodes.html")
        out = {"steps": steps, "episodes": steps * 4, "report_s": round(elapsed, 2),
               "index_kb": round(page.stat().st_size / 1024, 1),
               "episodes_html_kb": round(browser.stat().st_size / 1024, 1),
               "per_episode_kb": round(browser.stat().st_size / 1024 / (steps * 4), 2)}
    print(f"report of {steps} steps / {steps * 4} episodes in {out['report_s']} s; "
          f"episode browser {out['episodes_html_kb']} KiB")
    return out


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)))
