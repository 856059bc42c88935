"""Screenshots of a run's report and episode browser for docs/img/ (headless Chromium):

    .venv/bin/python -m tests.report.screenshots RUN_DIR docs/img

The episode shown open is the first one whose job trained; its copy of the page opens it
statically, so the picture needs no scrolling or script."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nestor.report.html import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def shoot(url: str, out: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={profile}",
                        "--allow-file-access-from-files", "--virtual-time-budget=4000",
                        f"--window-size={width},{height}", f"--screenshot={out}", url],
                       check=True, capture_output=True, timeout=120)


def main(run_dir: Path, out_dir: Path) -> None:
    page = write_report(run_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shoot(page.as_uri(), out_dir / "report-top.png", 1280, 1500)
    text = page.with_name("episodes.html").read_text()
    trained = re.search(r'<details class="episode" id="(ep-[^"]+)"[^>]*data-end="ok"', text)
    if trained:
        opened = re.sub(rf'(<details class="episode" id="{re.escape(trained.group(1))}"[^>]*)>',
                        r"\1 open>", text, count=1)
        start = opened.index(f'id="{trained.group(1)}"')
        end = opened.find('<details class="episode"', start)
        body = opened[start:end if end > 0 else len(opened)]
        opened = opened.replace(body, body.replace("<details class=\"report\">",
                                                   "<details class=\"report\" open>", 1)
                                .replace("<details class=\"file\">",
                                         "<details class=\"file\" open>", 1))
        shot = page.with_name("episodes-screenshot.html")
        shot.write_text(opened)
        shoot(shot.as_uri(), out_dir / "report-episodes.png", 1280, 1500)
        shot.unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
