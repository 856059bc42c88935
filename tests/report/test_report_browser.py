"""Loads the report page in headless Chromium and checks every figure decoded and rendered."""

import shutil
import subprocess

import pytest

from nestor.report.figures import FIGURES
from nestor.report.html import write_report
from tests.report.run_fixture import make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Replaces the page body with the number of images that decoded (naturalWidth > 0).
_PROBE = """<script>window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth >= 1000).length;
  document.body.innerHTML = '<pre id=r>IMAGES ' + ok + '/' + imgs.length + '</pre>';
});</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_every_figure_renders_in_chromium(tmp_path):
    run = make_run(tmp_path / "run")
    page = write_report(run)
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", _PROBE + "</body>"))
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         "--allow-file-access-from-files", "--virtual-time-budget=5000", "--dump-dom",
         probe.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert f"IMAGES {len(FIGURES)}/{len(FIGURES)}" in out.stdout, out.stderr[-2000:]
