"""The run ledger: records round-trip, writes are committed at once, readers see them."""

import sqlite3
import threading

import pytest

from nestor.ledger import Ledger, LedgerError
from nestor.policy.base import Message, ToolCall, Turn


def _start(ledger: Ledger, eid: str = "e1") -> None:
    ledger.start_episode(eid, task_id="reverse", family="strings", difficulty=0,
                         policy="composer", policy_version=3, config={"max_turns": 5})


def test_episode_round_trip(tmp_path):
    with Ledger(tmp_path) as ledger:
        _start(ledger)
        turn = Turn(Message("assistant", "plan", [ToolCall("submit", {}, "c0")]),
                    action_ids=[1, 2], sample_logprobs=[-0.5, -1.0], action_keys=["a", "b"])
        ledger.add_turn("e1", 0, turn.to_dict())
        ledger.add_turn("e1", 1, Message("tool", "ok", tool_call_id="c0").to_dict())
        ledger.add_attempt("e1", 1, tmp_path / "a1")
        ledger.add_report("e1", 1, passed=False, checks=[{"name": "x", "ok": False,
                                                          "message": "bad"}], elapsed_s=0.5)
        ledger.add_job("e1-job", "e1", {"task_id": "reverse"})
        assert [j["id"] for j in ledger.pending_jobs()] == ["e1-job"]
        ledger.add_result("e1-job", {"status": "ok", "pre_score": 0.1, "post_score": 0.3})
        ledger.finish_episode("e1", end_reason="ok", reward=0.3, components={"improvement": 0.2})
        assert ledger.pending_jobs() == []
    with Ledger(tmp_path, readonly=True) as ledger:
        ep = ledger.episode("e1")
    assert ep["status"] == "done" and ep["reward"] == 0.3 and ep["attempts"] == 1
    assert ep["components"] == {"improvement": 0.2}
    back = Turn.from_dict(ep["turns"][0])
    assert back == turn
    assert ep["turns"][1]["role"] == "tool"
    assert ep["reports"][0]["passed"] is False and ep["reports"][0]["checks"][0]["name"] == "x"
    assert ep["jobs"][0]["result"]["post_score"] == 0.3


def test_writes_are_visible_to_another_connection_immediately(tmp_path):
    ledger = Ledger(tmp_path)
    _start(ledger)
    # a second process-like reader, no close/flush on the writer side
    other = sqlite3.connect(tmp_path / "ledger.sqlite")
    assert other.execute("SELECT status FROM episodes").fetchall() == [("running",)]
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other.close()
    ledger.close()


def test_concurrent_episodes_share_one_ledger(tmp_path):
    ledger = Ledger(tmp_path)

    def work(i: int) -> None:
        _start(ledger, f"e{i}")
        for t in range(20):
            ledger.add_turn(f"e{i}", t, Message("user", str(t)).to_dict())
        ledger.finish_episode(f"e{i}", end_reason="no_submit", reward=0.0, components={})

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(ledger.episodes(status="done")) == 6
    assert all(len(ledger.turns(f"e{i}")) == 20 for i in range(6))
    ledger.close()


def test_duplicate_turn_index_is_rejected_and_rolled_back(tmp_path):
    with Ledger(tmp_path) as ledger:
        _start(ledger)
        ledger.add_turn("e1", 0, Message("user", "a").to_dict())
        with pytest.raises(sqlite3.IntegrityError):
            ledger.add_turn("e1", 0, Message("user", "b").to_dict())
        ledger.add_turn("e1", 1, Message("user", "c").to_dict())  # the ledger still works
        assert [t["content"] for t in ledger.turns("e1")] == ["a", "c"]


def test_missing_or_garbage_ledger_is_a_clear_error(tmp_path):
    with pytest.raises(LedgerError, match="no ledger"):
        Ledger(tmp_path / "nowhere", readonly=True)
    (tmp_path / "ledger.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="not a readable"):
        Ledger(tmp_path)


def test_policy_versions(tmp_path):
    with Ledger(tmp_path) as ledger:
        ledger.add_policy_version("composer", 0, metrics={})
        ledger.add_policy_version("composer", 1, path="ck/1.pt", metrics={"loss": 0.5})
        rows = ledger.policy_versions("composer")
    assert [r["version"] for r in rows] == [0, 1] and rows[1]["metrics"]["loss"] == 0.5


def test_a_closed_ledger_leaves_no_wal_or_shm(tmp_path):
    # a finished run's directory holds ledger.sqlite alone, also after a reader (runs show)
    from nestor.ledger import Ledger

    with Ledger(tmp_path) as ledger:
        ledger.start_episode("e1", task_id="add", family="arithmetic", difficulty=0,
                             policy="composer", policy_version=0, config={})
        assert (tmp_path / "ledger.sqlite-wal").exists()  # WAL while it runs
        ledger.finish_episode("e1", end_reason="no_submit", reward=0.0, components={})
    with Ledger(tmp_path, readonly=True) as reader:
        assert reader.episode("e1")["end_reason"] == "no_submit"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ledger")) == [
        "ledger.sqlite"]
    with Ledger(tmp_path) as again:  # a resume writes in WAL mode again
        again.start_episode("e2", task_id="add", family="arithmetic", difficulty=0,
                            policy="composer", policy_version=0, config={})
    assert not (tmp_path / "ledger.sqlite-wal").exists()


def test_text_with_a_lone_surrogate_is_stored_not_refused(tmp_path):
    # json.loads("\"\\ud800\"") is a lone surrogate: sqlite3 cannot encode it as UTF-8
    with Ledger(tmp_path) as ledger:
        _start(ledger, "e\ud800")
        ledger.add_turn("e\ud800", 0, Message("tool", "body \ud800", tool_call_id="c\udfff")
                        .to_dict())
        ledger.add_turn("e\ud800", 1, {"role": "assistant", "content": "",
                                       "parse_error": "bad \ud800", "tool_calls": [
                                           {"name": "x", "arguments": {"k": "v\ud800"}}]})
        turns = ledger.turns("e\ufffd")
    assert turns[0]["content"] == "body \ufffd" and turns[0]["tool_call_id"] == "c\ufffd"
    assert turns[1]["parse_error"] == "bad \ufffd"
