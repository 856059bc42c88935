"""Untrusted text made safe to store and to show (nestor/text.py)."""

from nestor.text import inert, no_surrogates


def test_inert_shows_what_a_reader_would_not_see():
    assert inert("t\x1b]0;PWNED\x07\x1b[2J") == "t␛]0;PWNED␇␛[2J"  # escapes as pictures
    assert inert("env/\u202eyp.evil\u202c") == "env/⟨U+202E⟩yp.evil⟨U+202C⟩"  # not "live.py"
    assert inert("ok\u2028FAIL") == "ok⟨U+2028⟩FAIL"  # no line the reader takes for a new one
    assert inert("co\u200bnfig\ufeff") == "co⟨U+200B⟩nfig⟨U+FEFF⟩"
    assert inert("r\ud800") == "r\ufffd" and inert("\x7f\x85") == "\u2421\ufffd"
    visible = "naïve Ünïcode ✓ 名前 مرحبا\tcol\nline"  # right-to-left script itself stays
    assert inert(visible) == visible


def test_no_surrogates_reaches_keys_and_nested_values():
    value = {"pa\ud800th": ["x\udfff", {"k": "\ud83d"}], "n": 3}
    assert no_surrogates(value) == {"pa\ufffdth": ["x\ufffd", {"k": "\ufffd"}], "n": 3}
    ("\n".join(str(v) for v in no_surrogates(value).values())).encode("utf-8")  # encodable
