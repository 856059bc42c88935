"""The async scheduler: groups, staleness, stragglers, zero-variance groups, learning, resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bandit import GOOD_ARM, BanditPolicy, make_episode_fn

from nestor.outer.config import RunConfig
from nestor.outer.groups import EpisodeSummary, Group, build_batch, group_advantages
from nestor.outer.loop import OuterLoop, task_for_group
from nestor.outer.metrics import read_jsonl


def cfg(**kw) -> RunConfig:
    base = dict(tasks=["t1", "t2", "t3"], group_size=2, groups_per_step=1, max_in_flight=6,
                steps=4, seed=1)
    base.update(kw)
    return RunConfig(**base)


def test_advantages_and_zero_variance():
    assert group_advantages([1.0, 0.0, 0.5, 0.5]) == [0.5, -0.5, 0.0, 0.0]
    assert group_advantages([0.3, 0.3, 0.3]) is None
    g = Group(0, "t", 2, {0: EpisodeSummary(0, 0, "t", 1.0, 0), 1: EpisodeSummary(0, 1, "t", 1.0, 3)})
    items, stats = build_batch([g], 5, max_steps_off_policy=2, stale_groups="reweight")
    assert items == [] and stats.zero_variance == 1 and stats.stale_kept == 1
    assert stats.staleness == [5]


def test_token_policies_drop_groups_past_the_hard_staleness_cap():
    def group(version_b):
        return Group(0, "t", 2, {0: EpisodeSummary(0, 0, "t", 1.0, 9),
                                 1: EpisodeSummary(0, 1, "t", 0.0, version_b)})
    # stale by 4 (reweighted) and by 7: kept without a hard cap, dropped past a cap of 5
    items, stats = build_batch([group(6), group(3)], 10, max_steps_off_policy=2,
                               stale_groups="reweight")
    assert len(items) == 4 and stats.stale_kept == 2 and stats.stale_dropped == 0
    items, stats = build_batch([group(6), group(3)], 10, max_steps_off_policy=2,
                               stale_groups="reweight", hard_max_staleness=5)
    assert len(items) == 2 and stats.stale_kept == 1 and stats.stale_dropped == 1
    # the cap holds even when max_steps_off_policy is above it (stale by 7, cap 5, max 10)
    for mode in ("reweight", "drop"):
        items, stats = build_batch([group(6), group(3)], 10, max_steps_off_policy=10,
                                   stale_groups=mode, hard_max_staleness=5)
        assert len(items) == 2 and stats.stale_dropped == 1 and stats.stale_kept == 0


def test_task_order_is_balanced_and_pure():
    tasks = ["a", "b", "c"]
    first_round = [task_for_group(tasks, 7, g) for g in range(3)]
    assert sorted(first_round) == tasks
    assert [task_for_group(tasks, 7, g) for g in range(6)] == \
           [task_for_group(tasks, 7, g) for g in range(6)]


def test_straggler_does_not_stall_training(tmp_path):
    calls, held = [], {}
    # Group 0's first episode ends only once the policy has trained 3 steps without it: a loop
    # that waited for it would never get there. (Its wall-clock twin: benchmarks/outer_straggler.py.)
    fn = make_episode_fn(delay=0.01, hold={(0, 0): 3}, held=held, calls=calls,
                         reward_fn=lambda arm, t: float(t.slot))  # never zero-variance
    loop = OuterLoop(cfg(steps=30), BanditPolicy(), fn, tmp_path)
    rows = loop.run()
    assert [r["step"] for r in rows] == list(range(1, 31))
    released, started = held[(0, 0)]
    assert released, "training stalled behind the straggler"
    # The loop kept launching while the straggler ran: 3 steps of 2 episodes, and more
    assert started >= 1 + 6
    # Other groups were trained on while group 0 waited for its straggler ...
    step_of_group0 = next(r["step"] for r in rows if 0 in r["group_ids"])
    assert step_of_group0 >= 4
    # ... and group 0 was then trained on with its recorded (stale) sampling logprobs.
    assert rows[step_of_group0 - 1]["staleness_max"] >= 3
    assert rows[step_of_group0 - 1]["groups_used"] == 1
    # Episodes were started under several policy versions.
    assert len({v for _, v, _ in calls}) >= 3


def test_stale_groups_dropped_or_kept_are_counted(tmp_path):
    # group 0's straggler ends after 2 updates: its group is stale by at least 2 when complete
    for mode in ("drop", "reweight"):
        held = {}
        fn = make_episode_fn(delay=0.01, hold={(0, 0): 2}, held=held,
                             reward_fn=lambda arm, t: float(t.slot))
        rows = OuterLoop(cfg(steps=5, max_steps_off_policy=0, stale_groups=mode), BanditPolicy(),
                         fn, tmp_path / mode).run()
        assert held[(0, 0)][0], "training stalled behind the straggler"
        dropped = sum(r["stale_groups_dropped"] for r in rows)
        kept = sum(r["stale_groups_kept"] for r in rows)
        if mode == "drop":  # a dropped group fills no step: another group takes its place
            assert dropped >= 1 and kept == 0
            assert sum(r["groups_used"] for r in rows) == 5
        else:
            assert kept >= 1 and dropped == 0
            assert sum(r["groups_used"] for r in rows) == 5


def test_stale_dropped_groups_are_replaced_not_waited_for(tmp_path):
    # The first fill starts exactly the 3 groups 3 steps need, all at version 0. The first to
    # complete trains (v1); the other is then stale and dropped, and so is group 0, whose
    # straggler ends only at v2. The loop used to spend a step on each dropped group and count
    # group 0 as filling the last one: no group left could take the policy to v2, and the run
    # stalled behind a group it would throw away.
    calls, held = [], {}
    fn = make_episode_fn(delay=0.01, hold={(0, 0): 2}, held=held, calls=calls,
                         reward_fn=lambda arm, t: float(t.slot))  # never zero-variance
    policy = BanditPolicy()
    loop = OuterLoop(cfg(steps=3, max_steps_off_policy=0, stale_groups="drop"), policy, fn,
                     tmp_path)
    rows = loop.run()
    assert held[(0, 0)][0], "training stalled behind the straggler"
    assert [r["groups_used"] for r in rows] == [1, 1, 1] and policy.version == 3
    assert all(0 not in r["group_ids"] for r in rows)
    dropped = sum(r["stale_groups_dropped"] for r in rows)
    assert dropped >= 2 and loop.counters["groups_stale_dropped"] == dropped
    # no waste: every group started was trained on or dropped as stale, none left over
    assert loop.join(timeout_s=5.0) == 0
    assert len(calls) == 2 * (3 + dropped)


def test_zero_variance_groups_contribute_nothing(tmp_path):
    policy = BanditPolicy()
    rows = OuterLoop(cfg(steps=3), policy, make_episode_fn(delay=0.0, reward_fn=lambda a, t: 0.5),
                     tmp_path).run()
    assert all(r["zero_variance_groups"] == 1 and r["groups_used"] == 0 for r in rows)
    assert policy.version == 0  # nothing to train on: the policy did not move


def test_loop_learns_the_good_arm(tmp_path):
    config = cfg(steps=25, group_size=8, groups_per_step=2, max_in_flight=16)
    policy = BanditPolicy(lr=1.0)
    rows = OuterLoop(config, policy, make_episode_fn(delay=0.0), tmp_path).run()
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-3:]) / 3
    assert last > first + 0.3
    assert int(policy.logits.argmax()) == GOOD_ARM
    row = rows[-1]
    assert row["validation_pass_rate"] == 1.0 and row["job_failure_rate"] == 0.0
    assert 0.0 <= row["hyperparameter_surface_use"] <= 1.0 and row["cost_usd"] > 0


def test_kill_and_resume_loses_and_recounts_nothing(tmp_path):
    script = Path(__file__).with_name("bandit.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), "8"], env=env)
    journal = tmp_path / "outer" / "episodes.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:  # kill -9 after 3 steps
        if len(read_jsonl(tmp_path / "metrics.jsonl")) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before the kill"
    killed_at = len(read_jsonl(tmp_path / "metrics.jsonl"))
    assert 3 <= killed_at < 8, killed_at  # the kill landed mid-run
    before = read_jsonl(journal)
    assert before, "episodes were journaled before the kill"

    policy = BanditPolicy()
    loop = OuterLoop(cfg(tasks=["a", "b"], group_size=2, groups_per_step=1, max_in_flight=4,
                         steps=8, seed=3), policy, make_episode_fn(delay=0.01), tmp_path)
    assert loop.resume()
    resumed_at = loop.step
    ckpt = json.loads((tmp_path / "checkpoints" / f"step-{resumed_at:06d}" / "state.json")
                      .read_text())
    unconsumed = [e for e in before if e["group_id"] not in set(ckpt["consumed"])]
    assert loop.counters["episodes_reused"] == len(unconsumed)
    assert 2 <= resumed_at <= killed_at and policy.version == ckpt["version"]  # metrics may lead ckpt
    loop.run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    after = read_jsonl(journal)
    keys = [(e["group_id"], e["slot"]) for e in after]
    assert len(keys) == len(set(keys)), "an episode was run or recorded twice"
    assert after[: len(before)] == before  # nothing finished before the kill was lost
    state = json.loads((tmp_path / "checkpoints" / "step-000008" / "state.json").read_text())
    assert len(state["consumed"]) == 8
    # Every episode of a consumed group was trained once: groups are complete and distinct.
    finished_groups = {g for g, _ in keys}
    assert set(state["consumed"]) <= finished_groups


def test_resume_reuses_episodes_the_ledger_recorded(tmp_path):
    from nestor.ledger import Ledger
    from nestor.outer.episodes import ledger_episodes
    from nestor.policy.base import Message, Turn

    ledger = Ledger(tmp_path)
    turn = Turn(Message("assistant", "arm 2"), action_ids=[2], sample_logprobs=[-1.3],
                action_keys=["arm"])
    for slot, reward in ((0, 1.0), (1, 0.0)):
        eid = f"g00000-s0{slot}"
        ledger.start_episode(eid, task_id="t1", family="f", difficulty=0, policy="bandit",
                             policy_version=0, config={}, group_id=f"0:{slot}")
        ledger.add_turn(eid, 0, turn.to_dict())
        ledger.finish_episode(eid, end_reason="ok", reward=reward, components={"r": reward})
    ledger.start_episode("other", task_id="t1", family="f", difficulty=0, policy="bandit",
                         policy_version=0, config={})  # not the loop's: ignored
    ledger.start_episode("cut", task_id="t1", family="f", difficulty=0, policy="bandit",
                         policy_version=0, config={}, group_id="1:0")
    ledger.finish_episode("cut", end_reason="stopped", reward=0.0, components={})
    ledger.start_episode("killed", task_id="t1", family="f", difficulty=0, policy="bandit",
                         policy_version=0, config={}, group_id="1:1")
    assert ledger.close_orphans() == ["other", "killed"]  # both left running
    assert ledger.episode("killed")["end_reason"] == "orphaned"
    recorded = ledger_episodes(ledger, tmp_path)
    assert sorted((e.group_id, e.slot) for e in recorded) == [(0, 0), (0, 1)]
    assert recorded[0].turns[0].sample_logprobs == [-1.3]

    policy = BanditPolicy()
    loop = OuterLoop(cfg(steps=1), policy, make_episode_fn(delay=0.0), tmp_path)
    assert loop.resume(recorded)
    assert loop.counters["episodes_reused"] == 2
    rows = loop.run()  # group 0 is complete: trained at once, nothing re-run for it
    assert rows[0]["group_ids"] == [0] and rows[0]["groups_used"] == 1
    assert policy.version == 1
    assert len(read_jsonl(tmp_path / "outer" / "episodes.jsonl")) == 2


def test_policy_errors_trip_the_stop_rule_and_isolated_ones_do_not(tmp_path):
    import pytest

    from nestor.outer.loop import MAX_CONSECUTIVE_ERRORS, OuterLoopError
    from nestor.policy.base import Message, Observation

    # The episode returns normally (reward 0, end_reason policy_error), as it does when the
    # LM's sampler raises: the loop must stop instead of training on zeros forever.
    def broken(policy, ticket) -> EpisodeSummary:
        return EpisodeSummary(ticket.group_id, ticket.slot, ticket.task_id, 0.0, policy.version,
                              info={"end_reason": "policy_error",
                                    "error": "RuntimeError: Expected a 'cuda' device type"})

    loop = OuterLoop(cfg(steps=50), BanditPolicy(), broken, tmp_path / "broken")
    with pytest.raises(OuterLoopError, match="policy error: RuntimeError: .*cuda"):
        loop.run()
    loop.join()
    assert loop.counters["policy_errors"] == MAX_CONSECUTIVE_ERRORS
    assert len(read_jsonl(tmp_path / "broken" / "outer" / "episodes.jsonl")) == \
        MAX_CONSECUTIVE_ERRORS

    flaky_calls = []

    def flaky(policy, ticket) -> EpisodeSummary:  # every other episode is fine: no stop
        flaky_calls.append(ticket)
        reason = "policy_error" if len(flaky_calls) % 2 else "ok"
        turn = policy.act(Observation(messages=[Message("user", "t")], tools=[]))
        return EpisodeSummary(-1, -1, ticket.task_id, float(len(flaky_calls) % 3),
                              policy.version, [turn], {}, {"end_reason": reason})

    # as many errors as the stop rule's count, none of them in a row: the loop runs to its end
    loop = OuterLoop(cfg(steps=MAX_CONSECUTIVE_ERRORS), BanditPolicy(), flaky, tmp_path / "flaky")
    assert len(loop.run()) == MAX_CONSECUTIVE_ERRORS
    assert loop.counters["policy_errors"] >= MAX_CONSECUTIVE_ERRORS


def test_a_short_run_wastes_no_episode(tmp_path):
    # `nestor train configs/quickstart.toml --steps 2`'s shape (G = 4, B = 1, 8 in flight): the
    # loop used to start a window of extra groups that the run's end then threw away (16
    # episodes played, 8 trained on). docs/outer.md: no episode is wasted at the end of a run.
    from nestor.outer.run import summarize_run

    calls = []
    fn = make_episode_fn(delay=0.02, calls=calls, reward_fn=lambda arm, t: float(t.slot))
    loop = OuterLoop(cfg(steps=2, group_size=4, max_in_flight=8), BanditPolicy(), fn, tmp_path)
    rows = loop.run()
    assert loop.join(timeout_s=5.0) == 0
    assert len(calls) == 8 == sum(r["episodes"] for r in rows)
    summary = summarize_run(tmp_path)  # 2 steps: step 1 → step 2, never the same steps
    assert summary["compared_steps"] == 1
    assert summary["first2_reward"] == rows[0]["reward_mean"]
    assert summary["last2_reward"] == rows[1]["reward_mean"]


def test_first_last_never_share_a_step():
    from nestor.outer.metrics import first_last

    assert first_last([0.1]) == (None, None, 0)
    assert first_last([0.1, 0.3]) == (0.1, 0.3, 1)
    assert first_last([0.1, 0.2, 0.9]) == (0.1, 0.9, 1)
    assert first_last([0.0, 0.2, 0.4, 0.6, 1.0]) == (0.1, 0.8, 2)
