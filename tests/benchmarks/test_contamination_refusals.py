"""benchmarks/contamination_refusals.py: the rule it measures against, and its last line."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import contamination_refusals  # noqa: E402


def test_the_rule_before_refused_from_its_documented_limit():
    # mean 2 of three draws: 2 + 4·√2 + 2 = 9.66, so 10 is the fewest refused
    assert contamination_refusals.least_refused(contamination_refusals.old_rule, [2, 2, 2]) == 10


def test_it_prints_both_rules_on_its_last_line():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "contamination_refusals.py"),
         "--tasks", "reverse", "--secrets", "3", "--rows", "500"],
        capture_output=True, text=True, check=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["jobs_per_kind"] == 3
    row = figures["tasks"]["reverse"]
    assert row["headroom_new_median"] > 0 and row["headroom_old_median"] > 0
    # 20 hidden items among 500 rows that are no task's input: today's rule refuses each
    assert row["padded_copier_refused_new"] == 3
