"""Numbers for people: the only way the report, `runs show` and `runs compare` print values."""

from __future__ import annotations

import math
from typing import Any

DASH = "–"


def num(value: Any, digits: int = 3) -> str:
    """0.365654465 -> '0.366'; large values get thousands separators; None -> '–'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def signed(value: float | None, digits: int = 3) -> str:
    return DASH if value is None else f"{value:+.{digits}f}"


def pct(value: float | None, digits: int = 0) -> str:
    return DASH if value is None else f"{value * 100:.{digits}f}%"


def usd(value: float | None) -> str:
    if value is None:
        return DASH
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.4f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def interval(lo: float | None, hi: float | None, digits: int = 3) -> str:
    return DASH if lo is None or hi is None else f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def arrow(*values: Any, digits: int = 3) -> str:
    """first → peak → last style chains."""
    return " → ".join(num(v, digits) for v in values)
