"""benchmarks/repair_eval.py: a repair counts only where the slip failed the probe and a later
submit passed; the slips' own repairs all pass and resubmitting unchanged never does."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # repair_eval imports lm_arc_report's statistics, as a script does
spec = importlib.util.spec_from_file_location("repair_eval", BENCH / "repair_eval.py")
repair_eval = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repair_eval)


def test_uncaught_slips_are_not_cases_and_kinds_are_counted():
    def row(kind, caught, repaired, first="edit_file"):
        return {"kind": kind, "caught": caught, "repaired": repaired, "first_call": first,
                "malformed": 0}

    s = repair_eval.summarize([row("toml_quote", True, True), row("toml_quote", True, False,
                                                                  "submit"),
                               row("wrong_path", True, True, "write_file"),
                               row("undefined_name", False, False, "none")])
    assert (s["cases"], s["repaired"], s["slips_not_caught"]) == (3, 2, 1)
    assert s["by_kind"] == {"toml_quote": [1, 2], "wrong_path": [1, 1]}
    assert s["first_call"] == {"edit_file": 1, "submit": 1, "write_file": 1}
    assert repair_eval.summarize([])["rate"] is None


@pytest.mark.slow
@pytest.mark.parametrize("agent,rate", [("scripted", 1.0), ("resubmit", 0.0)])
def test_the_scripted_repairs_pass_and_a_bare_resubmit_fails(tmp_path, monkeypatch, capsys,
                                                            agent, rate):
    monkeypatch.setattr("sys.argv", [
        "repair_eval.py", "--agent", agent, "--tasks", "dashes", "--kinds", "unterminated_string",
        "--out", str(tmp_path)])
    repair_eval.main()
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["cases"] == 1 and report["rate"] == rate
    assert set(report["by_kind"]) == {"unterminated_string"}
    assert report["first_call"] == ({"edit_file": 1} if agent == "scripted" else {"submit": 1})
    [row] = report["rows"]  # what repair_compare.py pairs on, and the outcome it pairs
    assert (row["task"], row["kind"], row["repaired"]) == ("dashes", "unterminated_string",
                                                           rate == 1.0)
    assert report["seed"] == 0 and isinstance(row["episode_seed"], int)
