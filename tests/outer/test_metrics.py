"""Per-step metrics: the first rung's first-try pass rate against the any-attempt pass rate."""

from types import SimpleNamespace

from nestor.outer.episodes import summarize
from nestor.outer.groups import BatchStats
from nestor.outer.metrics import step_metrics


def _rec(i: int, passes: list[bool]):
    return SimpleNamespace(id=f"ep{i}", task_id="length", reward=0.1, policy_version=0,
                           attempts=len(passes), reports=[SimpleNamespace(passed=p)
                                                          for p in passes],
                           end_reason="ok" if any(passes) else "invalid", turns=[],
                           components={}, result=None)


def test_first_try_pass_rate_counts_only_first_submits(tmp_path):
    recs = [_rec(0, [True]), _rec(1, [False, True]), _rec(2, [False, False, False]),
            _rec(3, [True]), _rec(4, [])]  # 4: the policy never submitted
    eps = [summarize(r, tmp_path, 12, 3000) for r in recs]
    assert [e.info["first_try"] for e in eps] == [True, False, False, True, False]
    row = step_metrics(step=1, version=1, episodes=eps, batch=BatchStats(), train={},
                       elapsed_s=1.0, extra={})
    assert row["first_try_pass_rate"] == 2 / 5
    assert row["validation_pass_rate"] == 3 / 5  # a retry that passed counts here, not above
