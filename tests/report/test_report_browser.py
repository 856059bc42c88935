"""The report and the episode browser in headless Chromium, as a person would use them: the
headline table and every figure visible, an episode's job files and validation report opening,
the filters working, the page's own script running under its CSP and agent text never running.

Skipped (with the reason) where Debian's chromium is absent; .ci/run installs it."""

import base64
import hashlib
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nestor.report.figures import FIGURES
from nestor.report.html import write_report
from tests.report.run_fixture import make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                "(apt-get install chromium; .ci/run installs it)")

REPORT_PROBE = """
window.addEventListener('load', () => {
  const visible = el => { const r = el.getBoundingClientRect(); return el.checkVisibility() && r.width > 0 && r.height > 0; };
  const head = document.querySelector('table.headline');
  const imgs = [...document.querySelectorAll('section img')];
  const out = {
    headline_rows: head ? head.querySelectorAll('tr[id^=finding-]').length : 0,
    headline_visible: !!head && visible(head),
    images: imgs.length,
    images_ok: imgs.filter(i => i.complete && i.naturalWidth >= 1000 && visible(i)).length,
    browse_link: !!document.querySelector('a[href="episodes.html"]'),
  };
  const pre = document.createElement('pre');
  pre.id = 'r';
  pre.textContent = JSON.stringify(out);
  document.body.replaceChildren(pre);
});
"""

BROWSER_PROBE = """
window.addEventListener('load', () => {
  const visible = el => !!el && el.checkVisibility() && el.getBoundingClientRect().height > 0;
  const ep = document.querySelector('details.episode');
  const file = ep.querySelector('details.file');
  const report = ep.querySelector('details.report');
  const before = visible(file.querySelector('pre'));
  ep.open = true; file.open = true; report.open = true;
  const opened = {
    file_hidden_before_open: !before,
    file_visible: visible(file.querySelector('pre')),
    file_text: file.querySelector('pre').textContent.slice(0, 200),
    report_rows: [...report.querySelectorAll('tr')].filter(visible).length,
  };
  const select = document.querySelector('select[data-filter=task]');
  select.value = 'add';
  select.dispatchEvent(new Event('change'));
  const out = {
    ...opened,
    shown: document.getElementById('shown').textContent,
    visible_episodes: [...document.querySelectorAll('details.episode')].filter(e => !e.hidden)
      .map(e => e.dataset.task),
    scripts: document.scripts.length,
    pwned: window.PWNED || document.querySelector('[data-pwned]') ? 1 : 0,
    filters: document.body.dataset.filters || '',
  };
  const pre = document.createElement('pre');
  pre.id = 'r';
  pre.textContent = JSON.stringify(out);
  document.body.replaceChildren(pre);
});
"""


def _chromium(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         "--allow-file-access-from-files", "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=120)


def _with_probe(page: Path, probe: str) -> Path:
    """A copy of the page with a probe script, allowed by adding its hash to the page's CSP
    (the page's own policy stays in force for everything else)."""
    digest = "'sha256-" + base64.b64encode(hashlib.sha256(probe.encode()).digest()).decode() + "'"
    text = page.read_text()
    meta = re.search(r'(http-equiv="Content-Security-Policy" content=")([^"]+)"', text)
    policy = meta.group(2)
    policy = (policy.replace("script-src ", f"script-src {digest} ") if "script-src" in policy
              else f"{policy}; script-src {digest}")
    text = text[:meta.start(2)] + policy + text[meta.end(2):]
    out = page.with_name("probe-" + page.name)
    out.write_text(text.replace("</body>", f"<script>{probe}</script></body>"))
    return out


def _result(out: subprocess.CompletedProcess) -> dict:
    found = re.search(r"<pre id=\"?r\"?>(.*?)</pre>", out.stdout, re.S)
    assert found, out.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def test_report_headline_and_every_figure_visible(tmp_path):
    run = make_run(tmp_path / "run", steps=9)
    page = write_report(run)
    got = _result(_chromium(_with_probe(page, REPORT_PROBE).as_uri(), tmp_path, "--dump-dom"))
    assert got == {"headline_rows": 5, "headline_visible": True, "images": len(FIGURES),
                   "images_ok": len(FIGURES), "browse_link": True}


def test_episode_browser_opens_files_and_reports_and_filters(tmp_path):
    run = make_run(tmp_path / "run", steps=2, hostile=True)
    browser = write_report(run).with_name("episodes.html")
    got = _result(_chromium(_with_probe(browser, BROWSER_PROBE).as_uri(), tmp_path,
                            "--dump-dom"))
    assert got["file_hidden_before_open"] and got["file_visible"]
    assert "config.toml" in browser.read_text() and 'base_model = "' in got["file_text"]
    assert got["report_rows"] == 2  # the attempt's two checks
    assert got["visible_episodes"] == ["add", "add"] and got["shown"] == "2"
    assert got["scripts"] == 2 and got["pwned"] == 0  # the filter and the probe, nothing else
    assert got["filters"] == "ready"


def test_unmodified_browser_runs_only_its_own_script(tmp_path):
    run = make_run(tmp_path / "run", steps=1, hostile=True)
    browser = write_report(run).with_name("episodes.html")
    out = _chromium(browser.as_uri() + "#ep-ep-0-2", tmp_path, "--dump-dom")
    assert 'data-filters="ready"' in out.stdout, out.stderr[-2000:]  # allowed by its hash
    assert "data-pwned" not in out.stdout and "<script>window.PWNED" not in out.stdout
    assert re.search(r'<details class="episode" id="ep-ep-0-2"[^>]* open', out.stdout)


def test_job_file_links_resolve_from_the_page(tmp_path):
    """Each file's "open" link, resolved against the page the browser shows, is that file
    (only text types are linked; the inline preview is always there)."""
    run = make_run(tmp_path / "run", steps=1)
    for ep in ("ep-0-1", "ep-0-2"):
        (run / "episodes" / ep / "job" / "env").mkdir(parents=True, exist_ok=True)
        (run / "episodes" / ep / "job" / "env" / "rewards.py").write_text("x = 1\n")
    browser = write_report(run).with_name("episodes.html")
    hrefs = re.findall(r'<a href="(\.\./episodes/[^"]+)">open</a>', browser.read_text())
    assert len(hrefs) == 2  # the .py files; config.toml and data/train.jsonl are inline only
    for href in hrefs:
        assert (browser.parent / href).resolve().is_file(), href
