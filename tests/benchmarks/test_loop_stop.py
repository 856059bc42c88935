"""benchmarks/loop_stop.py: the replay stops looped replies where the sampler would, and counts
the tokens it would not have sampled."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import loop_stop  # noqa: E402

EOS = 2


def test_replay_stops_loops_at_the_samplers_check_points(tmp_path):
    words = list(range(100, 140))  # 40 distinct tokens, then one token 100 times: a loop
    turns = [{"action_ids": words + [7] * 100, "parse_error": "unbalanced"},  # cut at the cap
             {"action_ids": json.dumps(words + [EOS]), "parse_error": None},  # as stored: text
             {"action_ids": words + [9] * 30 + [EOS], "parse_error": "bad JSON"},
             {"action_ids": [], "parse_error": None}]  # a composer's turn: no tokens
    episode = tmp_path / "run" / "episodes" / "e1"
    episode.mkdir(parents=True)
    (episode / "transcript.json").write_text(json.dumps({"turns": turns}))
    kinds = loop_stop.replay([tmp_path / "run"], 48, EOS)
    # The loop spans 48 tokens at 88; 88 is a check point (every 8 tokens): 140 - 88 saved.
    assert kinds["malformed_cut"] == {"turns": 1, "stopped": 1, "tokens": 140, "saved": 52,
                                      "median_stop_at": 88}
    assert kinds["well_formed"]["turns"] == 1 and kinds["well_formed"]["stopped"] == 0
    assert kinds["malformed_ended"]["stopped"] == 0  # 30 repeats: under the span
    assert loop_stop.first_stop(words + [7] * 100, 0) == 48  # span 3: first check past it
