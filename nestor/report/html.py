"""Writes RUN_DIR/report/index.html (a jinja2 template, autoescaped) and one PNG per figure
that has data; the episode browser beside it (nestor/report/browser.py)."""

from __future__ import annotations

import time
from pathlib import Path

import jinja2
import matplotlib.pyplot as plt

from nestor.report.data import RunData
from nestor.report.figures import CAPTIONS, FIGURES

# Nothing on these pages loads from elsewhere or runs script, except what a page allows itself.
CSP = "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'"

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          autoescape=True, undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True)


def render(template: str, **context) -> str:
    return _ENV.get_template(template).render(**context)


def headline_rows(data: RunData) -> list[dict]:
    """The five questions (nestor/report/headline.py, from nestor/report/findings.py)."""
    from nestor.report.headline import headline

    return headline(data)


def write_report(run_dir: Path) -> Path:
    data = RunData.load(run_dir)
    out = Path(run_dir) / "report"
    out.mkdir(exist_ok=True)
    figures, missing = [], []
    for key, (title, make) in FIGURES.items():
        fig = make(data)
        if fig is None:
            missing.append(title)
            (out / f"{key}.png").unlink(missing_ok=True)  # a stale figure of an earlier report
            continue
        fig.savefig(out / f"{key}.png")
        plt.close(fig)
        figures.append({"key": key, "title": title, "caption": CAPTIONS.get(key, "")})
    summary = data.summary()
    from nestor.report.browser import write_browser

    write_browser(data, out)
    page = render("report.html.jinja", csp=CSP, name=summary["name"], run_dir=str(run_dir),
                  status=summary["status"], written=time.strftime("%Y-%m-%d %H:%M:%S"),
                  episodes_count=summary["episodes"], headline=headline_rows(data),
                  summary=data.summary_rows(), figures=figures, missing=missing)
    (out / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"
