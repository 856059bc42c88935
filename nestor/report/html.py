"""Writes RUN_DIR/report/index.html and one PNG per figure that has data."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt

from nestor.report.data import RunData
from nestor.report.figures import FIGURES


def write_report(run_dir: Path) -> Path:
    data = RunData.load(run_dir)
    out = Path(run_dir) / "report"
    out.mkdir(exist_ok=True)
    sections, missing = [], []
    for key, (title, make) in FIGURES.items():
        fig = make(data)
        if fig is None:
            missing.append(title)
            continue
        fig.savefig(out / f"{key}.png")
        plt.close(fig)
        sections.append(f'<section><h2>{html.escape(title)}</h2>'
                        f'<img src="{key}.png" alt="{html.escape(title)}" width="1200"></section>')
    summary = data.summary()
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v, default=str))}"
                   f"</td></tr>" for k, v in summary.items())
    note = (f"<p class=note>No data yet for: {html.escape(', '.join(missing))}.</p>"
            if missing else "")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>nestor run {html.escape(summary['name'])}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1240px;margin:2em auto;color:#222}}
table{{border-collapse:collapse}}th,td{{text-align:left;padding:2px 12px;border-bottom:1px solid #ddd}}
img{{max-width:100%;height:auto}}.note{{color:#777}}</style></head>
<body><h1>nestor run: {html.escape(summary['name'])}</h1>
<p>{html.escape(str(run_dir))} · {html.escape(summary['status'])} · written {time.strftime('%Y-%m-%d %H:%M:%S')}</p>
<table>{rows}</table>{note}
{''.join(sections)}
</body></html>
"""
    (out / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"
