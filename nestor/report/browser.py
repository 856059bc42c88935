"""The episode browser: RUN_DIR/report/episodes.html, one static page (no server) with every
episode's transcript, the job files it wrote, its validation reports, job result and reward
terms, filterable by step, task, end reason and base model.

Everything the agent wrote is data, never markup: the template is autoescaped, long texts are
cut to a bound, and the page's Content-Security-Policy allows exactly one script, the filter
below, by its hash, so no script from agent content can run even if escaping were bypassed."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nestor.ledger import Ledger, LedgerError
from nestor.report import fmt
from nestor.report.data import RunData
from nestor.text import inert

TEXT_LIMIT = 20_000  # characters of one turn or log shown inline
FILE_TEXT_LIMIT = 8_000  # of one job file (the link, where there is one, opens all of it)
ARG_LIMIT = 2_000  # of one tool-call argument (a written file's text is under "Job files")
SYSTEM_LIMIT = 4_000  # the system prompt is the same long text in every episode
FILE_LIMIT = 40  # files listed per job
FILTERS = ("step", "task", "end", "model")
# Job files linked ("open"): suffixes every browser maps to a text type by name alone, so a
# file:// link shows them as text. Any other name (x.html, x.svg, a .toml or .jsonl a browser
# does not know and so sniffs) could open as a page of the agent's making: preview only.
TEXT_SUFFIXES = (".txt", ".py", ".json")

FILTER_SCRIPT = """
(() => {
  const selects = [...document.querySelectorAll('select[data-filter]')];
  const episodes = [...document.querySelectorAll('details.episode')];
  const shown = document.getElementById('shown');
  function apply() {
    let n = 0;
    for (const ep of episodes) {
      const ok = selects.every(s => s.value === '' || ep.dataset[s.dataset.filter] === s.value);
      ep.hidden = !ok;
      if (ok) n++;
    }
    shown.textContent = n;
  }
  selects.forEach(s => s.addEventListener('change', apply));
  apply();
  // a link to #ep-ID (from the report, or shared) opens that episode and everything in it
  const id = decodeURIComponent(location.hash.slice(1));
  const target = id ? document.getElementById(id) : null;
  if (target && target.matches('details.episode')) {
    target.open = true;
    target.querySelectorAll('details').forEach(d => { d.open = true; });
    target.scrollIntoView();
  }
  document.body.dataset.filters = 'ready';
})();
"""


def script_hash(script: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()


CSP = ("default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
       f"script-src '{script_hash(FILTER_SCRIPT)}'")


def cut(text: Any, limit: int = TEXT_LIMIT) -> str:
    """Agent text for the page, `inert` (a browser applies bidi and shows no controls) and cut."""
    text = "" if text is None else inert(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… {len(text) - limit:,} more characters not shown here"


def _step_of_group(data: RunData) -> dict[str, int]:
    """group number -> the outer step that trained on it (metrics rows list their groups)."""
    out = {}
    for row in data.steps:
        for g in row.get("group_ids") or []:
            out[str(g)] = row["step"]
    return out


def _step_label(group_id: str | None, steps: dict[str, int]) -> str:
    if not group_id:
        return "none"
    if group_id.startswith("heldout:"):
        return "held-out"
    step = steps.get(group_id.split(":")[0])
    return f"step {step}" if step is not None else "not trained on"


def _files(folder: Path, report_dir: Path) -> list[dict[str, Any]]:
    """The job's files (text, cut), each with a link relative to the report page."""
    if not folder.is_dir():
        return []
    out = []
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in paths[:FILE_LIMIT]:
        rel = path.relative_to(folder).as_posix()
        try:
            with path.open("rb") as fh:
                raw = fh.read(FILE_TEXT_LIMIT + 1)
            text = raw.decode("utf-8", errors="replace")
            size = path.stat().st_size
        except OSError as exc:
            text, size = f"(unreadable: {exc.strerror})", 0
        href = quote(os.path.relpath(path, report_dir).replace(os.sep, "/")) \
            if path.suffix.lower() in TEXT_SUFFIXES else None
        if size > FILE_TEXT_LIMIT:
            text = text[:FILE_TEXT_LIMIT] + f"\n… {size - FILE_TEXT_LIMIT:,} more bytes: " + (
                "open the file" if href else f"the whole file is {path}")
        out.append({"name": inert(rel), "href": href, "size": f"{size:,} bytes",
                    "text": inert(text)})
    if len(paths) > FILE_LIMIT:
        out.append({"name": f"… and {len(paths) - FILE_LIMIT} more files", "href": None,
                    "size": "", "text": None})
    return out


def sparkline(values: list[float], width: int = 240, height: int = 48) -> str:
    """SVG polyline points for a reward curve (numbers only: nothing the agent wrote)."""
    nums = [float(v) for v in values if isinstance(v, (int, float))]
    if len(nums) < 2:
        return ""
    lo, hi = min(nums), max(nums)
    span = (hi - lo) or 1.0
    step = width / (len(nums) - 1)
    return " ".join(f"{i * step:.1f},{height - 4 - (v - lo) / span * (height - 8):.1f}"
                    for i, v in enumerate(nums))


def _turn(turn: dict[str, Any]) -> dict[str, Any]:
    limit = SYSTEM_LIMIT if turn["role"] == "system" else TEXT_LIMIT
    calls = []
    for call in turn.get("tool_calls") or []:
        args = call.get("arguments")
        items = args.items() if isinstance(args, dict) else [("arguments", args)]
        calls.append({"name": str(call.get("name", "?")),
                      "args": [(str(k), cut(v, ARG_LIMIT)) for k, v in items]})
    return {"role": turn["role"], "content": cut(turn.get("content"), limit), "calls": calls,
            "parse_error": turn.get("parse_error")}


def _result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if not result:
        return None
    return {"status": result.get("status", "?"), "pre": fmt.num(result.get("pre_score")),
            "post": fmt.num(result.get("post_score")),
            "improvement": fmt.signed(result.get("improvement")),
            "wall": fmt.duration(result.get("wall_s")), "steps": fmt.num(result.get("steps")),
            "cost": fmt.usd(result.get("cost_usd")), "model": result.get("base_model") or "–",
            "curve": sparkline(result.get("reward_curve") or []),
            "curve_range": (f"{fmt.num(min(result['reward_curve']))} … "
                            f"{fmt.num(max(result['reward_curve']))}")
            if result.get("reward_curve") else "",
            "log": cut(result.get("log_tail"))}


def _scalar(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return fmt.num(value, 4)
    return cut(value, 200)


def _components(components: dict[str, Any] | None) -> list[tuple[str, str]]:
    out = []
    for key, value in sorted((components or {}).items()):
        if isinstance(value, bool):
            out.append((key, "yes" if value else "no"))
        elif isinstance(value, (int, float)):
            out.append((key, fmt.num(value, 4)))
        elif isinstance(value, dict):  # e.g. the reward weights: one readable line
            out.append((key, " · ".join(f"{k} {_scalar(v)}" for k, v in value.items())))
        else:
            out.append((key, cut(value, 2_000)))
    return out


def episodes(data: RunData, report_dir: Path) -> list[dict[str, Any]]:
    """Every episode of the run, ready for the template (all text still raw: the template
    escapes it)."""
    steps = _step_of_group(data)
    rows = []
    try:
        ledger = Ledger(data.run_dir, readonly=True)
    except LedgerError:
        return rows
    with ledger:
        for ep in data.episodes:
            full = ledger.episode(ep["id"])
            folder = data.run_dir / "episodes" / ep["id"]
            job_folder = folder / "job"
            if not job_folder.is_dir():  # not validated: show the last attempt instead
                attempts = sorted(folder.glob("attempt-*"),
                                  key=lambda p: int(p.name.split("-")[-1]) if
                                  p.name.split("-")[-1].isdigit() else 0)
                job_folder = attempts[-1] if attempts else folder / "workspace"
            jobs = [{"id": j["id"], "result": _result(j["result"])} for j in full["jobs"]]
            model = next((j["result"]["model"] for j in jobs if j["result"]
                          and j["result"]["model"] != "–"), "–")
            rows.append({
                "id": ep["id"], "task": ep["task_id"], "family": ep["family"],
                "policy": f"{ep['policy']} v{ep['policy_version']}",
                "status": ep["status"], "end": ep["end_reason"] or ep["status"],
                "reward": fmt.num(ep["reward"], 4), "attempts": ep["attempts"],
                "step": _step_label(ep.get("group_id"), steps), "model": model,
                "components": _components(ep.get("components")),
                "turns": [_turn(t) for t in full["turns"]],
                "reports": [{"attempt": r["attempt"], "passed": r["passed"],
                             "elapsed": fmt.duration(r["elapsed_s"]),
                             "checks": [{"name": str(c.get("name")), "ok": bool(c.get("ok")),
                                         "message": cut(c.get("message"), 4_000)}
                                        for c in r["checks"]]} for r in full["reports"]],
                "jobs": jobs,
                "files_from": job_folder.name,
                "files": _files(job_folder, report_dir),
            })
    return rows


def _options(rows: list[dict[str, Any]], key: str) -> list[str]:
    values = {r[key] for r in rows}

    def order(v: str):  # steps numerically, the rest alphabetically
        tail = v.split(" ")[-1]
        return (0, int(tail), v) if v.startswith("step ") and tail.isdigit() else (1, 0, v)

    return sorted(values, key=order)


def write_browser(data: RunData, report_dir: Path) -> Path:
    from nestor.report.html import render

    rows = episodes(data, report_dir)
    filters = [{"key": key, "label": label, "options": _options(rows, key)} for key, label in
               (("step", "step"), ("task", "task"), ("end", "end reason"),
                ("model", "base model"))]
    page = render("episodes.html.jinja", csp=CSP, script=FILTER_SCRIPT,
                  name=data.config.get("name", data.run_dir.name), run_dir=str(data.run_dir),
                  episodes=rows, filters=filters)
    path = report_dir / "episodes.html"
    # a lone surrogate (json.loads of "\ud800" in a recorded tool call) cannot be UTF-8
    path.write_text(page, encoding="utf-8", errors="replace")
    return path
