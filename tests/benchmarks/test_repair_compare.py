"""benchmarks/repair_compare.py: two arms' repair_eval runs paired case by case (exact McNemar);
a case counts only where both arms' probes caught the slip."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # repair_compare imports lm_arc_report's statistics, as a script does
spec = importlib.util.spec_from_file_location("repair_compare", BENCH / "repair_compare.py")
repair_compare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(repair_compare)


def row(i, repaired, caught=True, kind="toml_quote"):
    return {"episode_seed": i, "task": "dashes", "kind": kind, "caught": caught,
            "repaired": caught and repaired}


def write(path, rows, **extra):
    path.write_text("stderr noise\n" + json.dumps({"agent": "lm", **extra, "rows": rows}) + "\n")
    return path


def test_mcnemar_counts_only_the_discordant_pairs():
    assert repair_compare.mcnemar_p(6, 0) == pytest.approx(2 / 64)
    assert repair_compare.mcnemar_p(0, 6) == pytest.approx(2 / 64)
    assert repair_compare.mcnemar_p(3, 3) == 1.0 and repair_compare.mcnemar_p(0, 0) == 1.0
    assert repair_compare.mcnemar_p(15, 8) == pytest.approx(0.2100, abs=1e-4)


def test_cases_pair_by_seed_task_and_kind_and_an_uncaught_slip_is_left_out(tmp_path, capsys,
                                                                         monkeypatch):
    # A repairs 0-5 and 6-7; B repairs 6-7 and 8; case 9 B's probe did not catch; A has case 10.
    a = [row(i, i < 8) for i in range(10)] + [row(10, True)]
    b = [row(i, i in (6, 7, 8)) for i in range(9)] + [row(9, True, caught=False)]
    pa, pb = write(tmp_path / "a.json", a), write(tmp_path / "b.json", b)
    monkeypatch.setattr("sys.argv", ["repair_compare.py", "--a", str(pa), "--b", str(pb)])
    repair_compare.main()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (out["cases"], out["repaired_a"], out["repaired_b"]) == (9, 8, 3)
    assert (out["only_a"], out["only_b"], out["unpaired_cases"]) == (6, 1, 1)
    assert out["mcnemar_p"] == pytest.approx(repair_compare.mcnemar_p(6, 1))


@pytest.mark.parametrize("arm_a,arm_b,needle", [
    ([None], [[row(0, True)]], "no repair_eval rows"),  # an output from before rows were kept
    ([[row(0, True)], [row(0, False)]], [[row(0, True)]], "already read"),  # one draw twice
    ([[row(0, True)]], [[row(1, True)]], "share no caught case"),
])
def test_what_cannot_be_paired_is_refused_with_the_reason(tmp_path, arm_a, arm_b, needle):
    def files(arm, name):
        paths = [tmp_path / f"{name}{i}.json" for i in range(len(arm))]
        for path, rows in zip(paths, arm, strict=True):
            if rows is None:
                path.write_text('{"agent": "lm"}\n')
            else:
                write(path, rows)
        return paths

    with pytest.raises(SystemExit, match=needle):
        repair_compare.compare(repair_compare.load_rows(files(arm_a, "a")),
                               repair_compare.load_rows(files(arm_b, "b")))
