"""Untrusted text (what an agent or its job wrote) made safe to store and to show.

Two hazards, each handled once here: a lone surrogate (json.loads makes one of "\\ud800", as in
an agent's tool call) cannot be encoded as UTF-8, so sqlite3, a terminal or a file it reaches
fails on it; and characters a reader does not see change what is read — terminal escapes (an
ESC can set the title, clear the screen, write the clipboard with OSC 52), bidi overrides
("env/\u202eyp.evil" shows as "env/live.py"), line separators and zero-width characters.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 (but \t and \n), DEL and C1: shown as pictures, never sent to a terminal
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# bidi embeddings, overrides, isolates and marks; line and paragraph separators; zero-width,
# word-joiner and soft-hyphen characters: named
_INVISIBLE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def no_surrogates(value: Any) -> Any:
    """`value` with every lone surrogate made U+FFFD, in keys and nested values: agent text is
    never refused for one."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {no_surrogates(k): no_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_surrogates(v) for v in value]
    return value


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode control picture: ESC shows as ␛
    return "\u2421" if code == 0x7f else "\ufffd"


def inert(text: Any) -> str:
    """`text` as a reader should see it: control characters as visible pictures, invisible
    ones that reorder or disguise text named (⟨U+202E⟩), lone surrogates U+FFFD; tabs, new
    lines and every visible character as they were."""
    text = no_surrogates(_CONTROL.sub(_picture, str(text)))
    return _INVISIBLE.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", text)
