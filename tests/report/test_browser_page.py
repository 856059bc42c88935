"""The episode browser as HTML: everything an episode holds is on the page, and nothing the
agent wrote can become markup or script."""

import base64
import hashlib
import re

from nestor.ledger import Ledger
from nestor.report.browser import CSP, FILTER_SCRIPT, cut, sparkline
from nestor.report.data import RunData
from nestor.report.html import write_report
from tests.report.run_fixture import HOSTILE, make_run


def test_every_episode_with_its_parts(tmp_path):
    run = make_run(tmp_path / "run", steps=2)
    write_report(run)
    page = (run / "report" / "episodes.html").read_text()
    assert page.count('<details class="episode"') == 8
    assert 'id="ep-ep-1-2"' in page and 'data-task="length"' in page
    assert 'data-end="job_failed"' in page and 'data-model="tiny-s"' in page
    for needle in ("Reward terms", "validation_efficiency", "Validation reports", "attempt 1:",
                   "Job files (job)", "config.toml", "Transcript", "write_file", "log tail",
                   "hidden eval before → after", "<polyline"):
        assert needle in page, needle
    assert "max_steps = 10" in page  # config.toml, shown inline (not linked: see below)
    assert '<a href="episodes.html">Browse the 8 episodes' in (run / "report" / "index.html").read_text()


def test_steps_come_from_the_groups_each_step_trained_on(tmp_path):
    run = make_run(tmp_path / "run", steps=1)
    (run / "metrics.jsonl").write_text('{"step": 4, "group_ids": [7]}\n')
    with Ledger(run) as ledger:
        ledger.start_episode("late", task_id="add", family="x", difficulty=0, policy="composer",
                             policy_version=3, config={}, group_id="7:1")
        ledger.start_episode("ho", task_id="dashes", family="y", difficulty=0,
                             policy="composer", policy_version=3, config={},
                             group_id="heldout:trained:4")
    write_report(run)
    page = (run / "report" / "episodes.html").read_text()
    assert re.search(r'id="ep-late" data-step="step 4"', page)
    assert re.search(r'id="ep-ho" data-step="held-out"', page)
    assert '<option value="step 4">' in page


def test_hostile_agent_text_stays_text(tmp_path):
    run = make_run(tmp_path / "run", steps=1, hostile=True)
    write_report(run)
    page = (run / "report" / "episodes.html").read_text()
    body = page.split("<body>", 1)[1]
    assert body.count("<script") == 1  # ours, the filter
    assert "window.PWNED" in body  # the hostile text is shown...
    assert "<script>window.PWNED" not in body and "<img src=x" not in body  # ...as text
    assert "&lt;/textarea&gt;&lt;/pre&gt;&lt;/script&gt;" in body
    assert "&#34;quotes&#34;" in body or "&quot;quotes&quot;" in body
    # the only script allowed is ours, by hash; nothing is loaded from elsewhere
    meta = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    digest = base64.b64encode(hashlib.sha256(FILTER_SCRIPT.encode()).digest()).decode()
    assert meta == CSP and f"'sha256-{digest}'" in meta and "unsafe-inline" not in \
        meta.split("script-src")[1]
    assert f"<script>{FILTER_SCRIPT}</script>" in page
    assert HOSTILE not in page


def test_huge_text_is_cut(tmp_path):
    run = make_run(tmp_path / "run", steps=1)
    with Ledger(run) as ledger:
        ledger.start_episode("big", task_id="add", family="x", difficulty=0, policy="composer",
                             policy_version=0, config={})
        ledger.add_turn("big", 0, {"role": "assistant", "content": "A" * 5_000_000})
    (run / "episodes" / "big" / "workspace").mkdir(parents=True)
    (run / "episodes" / "big" / "workspace" / "huge.jsonl").write_text("B" * 3_000_000)
    write_report(run)
    page = (run / "report" / "episodes.html").read_text()
    assert len(page) < 500_000
    assert "4,980,000 more characters not shown here" in page
    huge = run / "episodes" / "big" / "workspace" / "huge.jsonl"
    assert f"2,992,000 more bytes: the whole file is {huge}" in page
    assert len(cut("x" * 10, 5)) > 5 and cut("short") == "short"


def test_sparkline_is_numbers_only():
    assert sparkline([0.1, 0.5, 0.3]) == "0.0,44.0 120.0,4.0 240.0,24.0"
    assert sparkline([0.2]) == "" and sparkline(["<script>", 1.0]) == ""


def test_episode_dir_without_config_or_metrics(tmp_path):
    """A `nestor episode run` directory: ledger only."""
    run = tmp_path / "ep"
    with Ledger(run) as ledger:
        ledger.start_episode("e1", task_id="add", family="x", difficulty=0, policy="composer",
                             policy_version=0, config={})
        ledger.finish_episode("e1", end_reason="not_trained", reward=0.5, components={})
    write_report(run)
    assert RunData.load(run).episodes and 'data-step="none"' in (
        run / "report" / "episodes.html").read_text()


def test_only_files_a_browser_shows_as_text_are_linked(tmp_path):
    # from file://, an agent's x.html or x.svg would open as a page, and a browser sniffs a
    # name it does not know (.toml, .jsonl) for HTML: those are shown inline only
    run = make_run(tmp_path / "run", steps=1)
    job = run / "episodes" / "ep-0-1" / "job"
    page_src = "<script>alert(1)</script>"
    for name in ("x.html", "x.SVG", "x.xhtml", "notes.txt", "env/pkg/__init__.py", "a.json"):
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text(page_src)
    write_report(run)
    page = (run / "report" / "episodes.html").read_text()
    hrefs = re.findall(r'<a href="\.\./episodes/ep-0-1/job/([^"]+)">open</a>', page)
    assert sorted(hrefs) == ["a.json", "env/pkg/__init__.py", "notes.txt"]
    for name in ("x.html", "x.SVG", "x.xhtml", "config.toml", "train.jsonl"):
        assert f"{name} <span" in page  # still listed, its text shown
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 6


def test_a_lone_surrogate_in_a_recorded_call_does_not_stop_the_report(tmp_path):
    run = make_run(tmp_path / "run", steps=1)
    with Ledger(run) as ledger:  # stored JSON-escaped, read back as a lone surrogate
        ledger.add_turn("ep-0-1", 99, {"role": "assistant", "content": "", "tool_calls": [
            {"name": "write_file\ud800", "arguments": {"path": "a", "content": "x\ud800"}}]})
    write_report(run)
    assert "write_file?" in (run / "report" / "episodes.html").read_text()


def test_invisible_characters_in_agent_text_are_named_on_the_page(tmp_path):
    # a browser applies bidi: "\u202eyp.evil" would read as "live.py"
    run = make_run(tmp_path / "run", steps=1)
    job = run / "episodes" / "ep-0-1" / "job"
    (job / "\u202eyp.evil").write_text("ok\u2028FAIL \x1b[2J")
    with Ledger(run) as ledger:
        ledger.add_turn("ep-0-1", 99, {"role": "assistant", "content": "see \u202eyp.evil",
                                       "tool_calls": []})
    write_report(run)
    page = (run / "report" / "episodes.html").read_text()
    assert "\u202e" not in page and "\u2028" not in page and "\x1b" not in page
    assert "⟨U+202E⟩yp.evil" in page and "ok⟨U+2028⟩FAIL ␛[2J" in page
    assert "see ⟨U+202E⟩yp.evil" in page
