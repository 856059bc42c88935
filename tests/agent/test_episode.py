"""The episode tool loop: tools, submit and its report, caps, end reasons, the ledger."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nestor.agent.episode import EpisodeConfig, run_episode
from nestor.ledger import Ledger
from nestor.policy.base import Message, Observation, ToolCall, Turn
from nestor.tasks import TaskRegistry

SPEC = TaskRegistry().get("reverse").spec()


class Scripted:
    """A policy that plays a fixed script of turns and keeps what it observed."""

    name = "scripted"
    version = 7

    def __init__(self, script: list[Callable[[Observation], Turn]], repeat_last: bool = False):
        self.script, self.repeat_last, self.seen = script, repeat_last, []

    def act(self, obs: Observation) -> Turn:
        self.seen.append(obs)
        i = len(self.seen) - 1
        step = self.script[min(i, len(self.script) - 1)] if self.repeat_last or \
            i < len(self.script) else (lambda o: Turn(Message("assistant", "done")))
        return step(obs)

    def train_step(self, batch):  # not exercised here
        raise NotImplementedError

    def save(self, path):
        raise NotImplementedError

    def load(self, path):
        raise NotImplementedError


def calls(*cs: tuple[str, dict]) -> Callable[[Observation], Turn]:
    return lambda obs: Turn(Message("assistant", "", [ToolCall(n, a, f"c{i}")
                                                      for i, (n, a) in enumerate(cs)]),
                            action_ids=[1, 2], sample_logprobs=[-0.1, -0.2])


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "run") as led:
        yield led


def test_file_tools_act_on_the_episode_workspace(ledger):
    pol = Scripted([calls(("write_file", {"path": "notes/a.txt", "content": "hello"}),
                          ("read_file", {"path": "notes/a.txt"}),
                          ("read_file", {"path": "../../escape"}),
                          ("frobnicate", {}))])
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig())
    tool_texts = [m.content for m in rec.messages if m.role == "tool"]
    assert tool_texts[1] == "hello"
    assert tool_texts[2].startswith("error:") and tool_texts[3].startswith("error:")
    assert (ledger.run_dir / "episodes" / rec.id / "workspace" / "notes" / "a.txt").read_text() \
        == "hello"
    assert rec.end_reason == "no_submit" and rec.reward == 0.0
    # the policy saw the system prompt with the spec, then its own tool results
    first = pol.seen[0]
    assert first.spec == SPEC and SPEC.instructions in first.messages[0].content
    assert [m.role for m in pol.seen[1].messages][-4:] == ["tool"] * 4


def test_failed_submits_report_back_and_are_capped(ledger):
    pol = Scripted([calls(("submit", {}))], repeat_last=True)
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig(max_attempts=3))
    assert rec.end_reason == "invalid" and rec.attempts == 3 and rec.result is None
    assert rec.components["validation_efficiency"] == 0.0 and rec.reward == 0.0
    # after each failed submit the policy kept working and saw the report naming the checks
    report = pol.seen[1].messages[-1]
    assert report.role == "tool" and report.content.startswith("validation failed (attempt 1 of 3)")
    assert "FAIL files:" in report.content
    assert "No attempts left." in rec.messages[-1].content
    ep = ledger.episode(rec.id)
    assert ep["status"] == "done" and ep["attempts"] == 3
    assert [r["passed"] for r in ep["reports"]] == [False] * 3
    assert len(ep["turns"]) == len(rec.messages)  # every message is in the ledger
    assert ep["turns"][2]["action_ids"] == [1, 2]  # with the policy's action data
    for n in (1, 2, 3):
        assert (ledger.run_dir / "episodes" / rec.id / f"attempt-{n}").is_dir()
    assert (ledger.run_dir / "episodes" / rec.id / "transcript.json").is_file()


@pytest.mark.parametrize("cfg,script,repeat,reason", [
    (EpisodeConfig(max_turns=4), [calls(("list_files", {}))], True, "turn_limit"),
    (EpisodeConfig(max_tokens=100), [lambda o: Turn(Message("assistant", "x" * 800, [
        ToolCall("list_files", {}, "c0")]))], True, "token_limit"),
    (EpisodeConfig(), [lambda o: Turn(Message("assistant", "I am done."))], False, "no_submit"),
    (EpisodeConfig(), [lambda o: 1 / 0], False, "policy_error"),
])
def test_end_reasons(ledger, cfg, script, repeat, reason):
    rec = run_episode(Scripted(script, repeat), SPEC, None, ledger, cfg)
    assert rec.end_reason == reason
    assert ledger.episode(rec.id)["end_reason"] == reason
    if reason == "policy_error":
        assert "ZeroDivisionError" in rec.components["error"]


def test_parse_errors_are_reported_back_and_the_episode_goes_on(ledger):
    bad = lambda o: Turn(Message("assistant", "<tool_call>{oops"), parse_error="not JSON")  # noqa: E731
    pol = Scripted([bad, calls(("list_files", {}))])
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig())
    assert "malformed tool call: not JSON" in pol.seen[1].messages[-1].content
    assert rec.end_reason == "no_submit" and len(pol.seen) == 3


def test_first_rung_signals_are_recorded_and_weighted_only_when_asked(ledger):
    from nestor.agent.reward import RewardConfig

    bad = lambda o: Turn(Message("assistant", "<tool_call>{oops"), parse_error="not JSON")  # noqa: E731
    script = [bad, calls(("write_file", {"path": "config.toml", "content": "x = 1"}),
                         ("write_file", {"path": "data/train.jsonl", "content": ""}),
                         ("write_file", {"path": "../out", "content": ""}),  # refused: not counted
                         ("submit", {}))]
    rec = run_episode(Scripted(script), SPEC, None, ledger, EpisodeConfig(max_attempts=1))
    c = rec.components
    assert c["wellformed_rate"] == pytest.approx(0.5)  # 1 of 2 turns
    assert c["files_written"] == 2.0 and c["files_score"] == pytest.approx(0.5)
    assert c["probe_fraction"] == 0.0 and rec.reward == 0.0  # weights 0 by default
    cfg = EpisodeConfig(max_attempts=1, reward=RewardConfig(w_files=1.0, w_wellformed=1.0))
    rec = run_episode(Scripted(script), SPEC, None, ledger, cfg)
    assert rec.reward == pytest.approx(0.5 + 0.5)
    assert ledger.episode(rec.id)["components"]["weighted_files"] == pytest.approx(0.5)


def test_probe_fraction_of_a_job_that_passes(ledger):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
    files = [p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    writes = [("write_file", {"path": str(p.relative_to(root)), "content": p.read_text()})
              for p in files]
    rec = run_episode(Scripted([calls(*writes, ("submit", {}))]), SPEC, None, ledger,
                      EpisodeConfig())
    assert rec.end_reason == "not_trained"
    assert rec.components["probe_fraction"] == 1.0
    assert rec.components["files_written"] == len(files)


def test_concurrent_episodes_share_a_policy_and_a_ledger(ledger):
    from concurrent.futures import ThreadPoolExecutor

    pol = Scripted([calls(("write_file", {"path": "config.toml", "content": "x = 1"}),
                          ("submit", {}))], repeat_last=True)
    specs = [TaskRegistry().get(t).spec() for t in ("sort", "max", "vowels", "add")]
    cfg = EpisodeConfig(max_attempts=2)
    with ThreadPoolExecutor(4) as ex:
        recs = list(ex.map(lambda s: run_episode(pol, s, None, ledger, cfg), specs))
    assert len({r.id for r in recs}) == 4
    for rec in recs:
        assert rec.end_reason == "invalid" and rec.attempts == 2
        ep = ledger.episode(rec.id)
        assert ep["status"] == "done" and len(ep["turns"]) == len(rec.messages)
        ws = ledger.run_dir / "episodes" / rec.id / "workspace" / "config.toml"
        assert ws.read_text() == "x = 1"  # each episode has its own workspace


GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
LAYOUT = {str(p.relative_to(GOOD)): p.read_text() for p in sorted(GOOD.rglob("*"))
          if p.is_file() and "__pycache__" not in p.parts}


def _slow_to_start(monkeypatch, first: int | None = None) -> list[int]:
    """The real probe, whose sandbox is given 10 ms to start (the first `first` probes, or all):
    a real harness failure. Returns the list that counts the probes."""
    import functools

    import nestor.job.validate as validate
    from nestor.job.tasksource import Timeouts

    real, made = validate.validate_job, []
    cold = functools.partial(real, warm=False, timeouts=Timeouts(start_s=0.01))

    def probe(*args, **kwargs):
        made.append(1)
        return (cold if first is None or len(made) <= first else real)(*args, **kwargs)

    monkeypatch.setattr(validate, "validate_job", probe)
    return made


def _write_layout_and_submit(obs: Observation) -> Turn:
    return calls(*[("write_file", {"path": p, "content": c}) for p, c in LAYOUT.items()],
                 ("submit", {}))(obs)


def test_a_probe_that_could_not_run_does_not_cost_an_attempt(ledger, monkeypatch):
    made = _slow_to_start(monkeypatch, first=2)
    pol = Scripted([_write_layout_and_submit, calls(("submit", {})),
                    # a second package: the third probe's verdict is the job's own
                    calls(("write_file", {"path": "env/other/__init__.py", "content": ""}),
                          ("submit", {}))])
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig(max_attempts=1))
    texts = [m.content for m in rec.messages if m.role == "tool" and "validation" in m.content]
    assert all("the sandbox" in t and "does not count as an attempt" in t for t in texts[:2])
    # the third probe (full strength) is the one counted attempt
    assert texts[2].startswith("validation failed (attempt 1 of 1)") and "FAIL files:" in texts[2]
    assert "2 packages" in texts[2]
    assert rec.end_reason == "invalid" and len(made) == 3


def test_harness_failures_are_capped(ledger, monkeypatch):
    made = _slow_to_start(monkeypatch)
    pol = Scripted([_write_layout_and_submit, calls(("submit", {}))], repeat_last=True)
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig(max_attempts=2))
    # two free probes, then two counted attempts: no episode loops for ever on our trouble
    assert rec.end_reason == "invalid" and rec.attempts == 4 and len(made) == 4
    assert all(r.harness_failure for r in rec.reports)


@pytest.mark.parametrize("plant", ["fifo", "link"])
def test_a_submitted_workspace_is_copied_without_following_or_opening_anything(ledger,
                                                                               tmp_path, plant):
    """The snapshot is the same safe copy as the sandbox's staging: a FIFO in the workspace is
    never opened (no hang), a link never followed; the submit is a failed `files` check."""
    import os

    outside = tmp_path / "secret.txt"
    outside.write_text("TOP-SECRET")
    ws = ledger.run_dir / "episodes" / "e1" / "workspace"

    def booby_trap(obs):
        if plant == "fifo":
            os.mkfifo(ws / "config.toml")
        else:
            (ws / "config.toml").symlink_to(outside)
        return calls(("submit", {}))(obs)

    pol = Scripted([booby_trap])
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig(max_attempts=1), episode_id="e1")
    report = [m.content for m in rec.messages if m.role == "tool"][0]
    assert "FAIL files:" in report and "config.toml is a" in report, report
    assert "TOP-SECRET" not in report and rec.end_reason == "invalid"
    snap = ledger.run_dir / "episodes" / "e1" / "attempt-1"
    assert not (snap / "config.toml").is_symlink()


def test_tool_calls_past_the_per_turn_cap_are_answered_not_run(ledger):
    reads = [("read_file", {"path": "a.txt"})] * 5
    pol = Scripted([calls(("write_file", {"path": "a.txt", "content": "hi"}), *reads)])
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig(max_calls_per_turn=3))
    tools = [m.content for m in rec.messages if m.role == "tool"]
    assert len(tools) == 6  # every call is answered...
    assert tools[1] == tools[2] == "hi"  # ...the first three run...
    assert all(t == "error: at most 3 tool calls a turn; this one was not run" for t in tools[3:])


def test_tool_results_are_cut_past_the_episode_cap(ledger):
    big = "é" * 4_000  # 8,000 UTF-8 bytes
    pol = Scripted([calls(("write_file", {"path": "a.txt", "content": big})),
                    calls(("read_file", {"path": "a.txt"})), calls(("read_file", {"path": "a.txt"})),
                    calls(("read_file", {"path": "a.txt"}))])
    rec = run_episode(pol, SPEC, None, ledger, EpisodeConfig(max_tool_bytes=10_000))
    tools = [m.content for m in rec.messages if m.role == "tool"]
    assert tools[1] == big  # under the cap: whole
    assert tools[2].startswith("é" * 100) and "cap of 10,000 bytes" in tools[2]
    assert tools[3].startswith("\n… cut: 8,000 more bytes not shown")  # nothing left
    kept = sum(len(t.split("\n… cut")[0].encode()) for t in tools)
    assert kept <= 10_000
    stored = [t["content"] for t in ledger.turns(rec.id) if t["role"] == "tool"]
    assert stored == tools  # the ledger holds what the agent saw, no more


def test_a_lone_surrogate_from_any_policy_is_recorded_not_raised(ledger):
    # an API policy parses its own calls: json.loads("\"\\ud800\"") is a lone surrogate
    pol = Scripted([lambda obs: Turn(Message("assistant", "x\ud800", [
        ToolCall("write_file", {"path": "a\ud800.txt", "content": "y\ud800"}, "c0")]))])
    rec = run_episode(pol, SPEC, None, ledger)
    assert rec.end_reason == "no_submit"
    turn = ledger.turns(rec.id)[2]
    assert turn["content"] == "x\ufffd"
    assert turn["tool_calls"][0]["arguments"] == {"path": "a\ufffd.txt", "content": "y\ufffd"}
    assert ledger.episode(rec.id)["status"] == "done"


def test_an_episode_whose_logging_fails_ends_recorded(tmp_path):
    class Refusing(Ledger):
        def add_turn(self, episode_id, idx, turn):
            if turn["role"] == "tool":
                raise OSError("disk full")
            super().add_turn(episode_id, idx, turn)

    with Refusing(tmp_path / "run") as led:
        pol = Scripted([calls(("read_file", {"path": "a.txt"}))])
        rec = run_episode(pol, SPEC, None, led)
        assert rec.end_reason == "harness_error" and "disk full" in rec.components["error"]
        ep = led.episode(rec.id)
        assert ep["status"] == "done" and ep["end_reason"] == "harness_error"
        assert ep["reward"] == rec.reward
