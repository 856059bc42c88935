"""Root-level CLI behaviour a new user meets first: --version, one-line usage errors, overrides,
episode and run listings."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nestor.cli import app
from tests.report.run_fixture import make_run

runner = CliRunner()


def test_version():
    out = runner.invoke(app, ["--version"])
    assert out.exit_code == 0 and out.stdout.startswith("nestor 0.")


@pytest.mark.parametrize("argv, needle", [
    (["job", "validate", "--bogus"], "No such option: --bogus"),
    (["runs", "show"], "Missing argument"),
    (["episode", "list"], "Missing option '--run-dir'"),
    (["train", "configs/quickstart.toml", "--steps", "0"], "--steps"),
])
def test_click_errors_are_one_line(argv, needle):
    out = runner.invoke(app, argv)
    assert out.exit_code == 2
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], out.output
    assert "╭" not in out.output and "--help`" in lines[0]


def test_help_says_run_dir_is_required():
    out = runner.invoke(app, ["episode", "show", "--help"], terminal_width=200)
    assert "required" in out.stdout.lower()


def test_steps_override_is_validated_like_the_toml():
    from nestor.cli.train import _override
    from nestor.outer.config import load_run_config

    cfg = load_run_config(Path("configs/quickstart.toml"))
    assert _override(cfg, seed=None, steps=2).steps == 2
    assert _override(cfg, seed=7, steps=None).seed == 7
    assert _override(cfg, seed=None, steps=None) is cfg
    for cmd in (["train", "--help"], ["quickstart", "--help"], ["job", "train", "--help"]):
        shown = runner.invoke(app, cmd, terminal_width=200).stdout
        assert ("--max-steps" if cmd[0] == "job" else "--steps") in shown


def test_job_train_max_steps_is_an_override_not_a_copy(tmp_path):
    """Changed deliberately (issue 25): `--max-steps` no longer copies and rewrites the job; the
    trainer gets it as `JobRequest.max_steps` and the budget rule counts the steps it sets."""
    from nestor.inner.run import run_job
    from nestor.inner.types import JobRequest

    job = tmp_path / "job"
    assert runner.invoke(app, ["job", "init", str(job), "--task", "add"]).exit_code == 0
    before = (job / "config.toml").read_text()
    result = run_job(JobRequest(job_dir=job, task_id="add", max_steps=2000))
    assert result.status == "invalid" and "max_steps × prompts_per_step" in result.log_tail
    assert result.log_tail.split("= ")[1].startswith("2000×")  # the override, not the file's
    assert (job / "config.toml").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job"]


def test_runs_list_shows_policy_and_reward_of_an_episode_dir(tmp_path):
    from nestor.ledger import Ledger

    run = tmp_path / "runs" / "episode-1"
    with Ledger(run) as ledger:
        ledger.start_episode("e1", task_id="add", family="arithmetic", difficulty=0,
                             policy="composer", policy_version=0, config={})
        ledger.finish_episode("e1", end_reason="not_trained", reward=0.25, components={})
    rows = json.loads(runner.invoke(app, ["runs", "list", str(tmp_path / "runs"), "--json"]).stdout)
    assert rows[0]["policy"] == "composer" and rows[0]["reward_mean"] == 0.25
    table = runner.invoke(app, ["runs", "list", str(tmp_path / "runs")], env={"COLUMNS": "200"})
    assert "composer" in table.stdout and "0.250 (episodes)" in table.stdout


def test_episode_progress_lines_when_not_a_terminal(capsys):
    from nestor.cli.episode import _Narrated
    from nestor.policy.base import Message, Observation, ToolCall, Turn

    class Policy:
        name, version = "fake", 3

        def act(self, obs):
            return Turn(message=Message("assistant", "", tool_calls=[
                ToolCall(id="1", name="submit", arguments={})]))

    narrated = _Narrated(Policy(), status=None, max_turns=5)
    assert narrated.name == "fake" and narrated.version == 3
    obs = Observation([Message("tool", "validation failed (attempt 1 of 3): 1 of 9 checks")], [])
    narrated.act(obs)
    err = capsys.readouterr().err
    assert "validation failed (attempt 1 of 3)" in err and "turn 1/5: submit (validating…)" in err


def test_episode_show_and_list_read_the_fixture(tmp_path):
    run = make_run(tmp_path / "run", steps=1)
    listed = runner.invoke(app, ["episode", "list", "--run-dir", str(run)], terminal_width=50)
    assert "ep-0-1" in listed.stdout
    shown = runner.invoke(app, ["episode", "show", "ep-0-1", "--run-dir", str(run)])
    assert shown.exit_code == 0, shown.output
    assert "write_file(path=config.toml" in shown.stdout and "pre 0." in shown.stdout
    assert f"job:       {run / 'episodes' / 'ep-0-1' / 'job'}" in shown.stdout


def test_pre_post_come_with_wilson_intervals():
    import re

    from nestor.cli.common import pre_post

    text = pre_post(0.445, 0.455)  # 89 → 91 of 200: a change well inside the noise
    pre, post = (tuple(map(float, m)) for m in
                 re.findall(r"(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]", text))
    for score, lo, hi in (pre, post):
        assert lo < score < hi and 0.05 < hi - lo < 0.2  # ±~0.07 at n = 200
    assert "n = 200" in text and "+0.010, within noise" in text
    assert "intervals apart" in pre_post(0.1, 0.5)
    assert pre_post(None, 0.5).startswith("pre – → post 0.500 [")


EVIL = ("t\x1b]0;PWNED\x07\x1b[2J\x1b]52;c;ZWNobyBwd25lZA==\x1b\\\x1b]8;;http://evil/\x1b\\"
        "click\rfake\x9b31m\x7f\ud800 [/bold] [link=http://x]y[/link]")


def test_shown_makes_agent_text_inert(capsys):
    import io

    import typer
    from rich.console import Console

    from nestor.cli.common import fail, shown

    text = shown(EVIL + "\tcol\nline")
    assert text.startswith("t␛]0;PWNED␇␛[2J␛]52;c;") and "click␍fake\ufffd31m␡\ufffd" in text
    assert "\tcol\nline" in text  # tab and newline are layout, not controls
    buf = io.StringIO()
    Console(file=buf, force_terminal=True).print(f"[red]x[/red] {text}", highlight=False)
    out = buf.getvalue()
    assert out.count("\x1b") == 2  # rich's own colour on and off; none of the agent's
    assert "[/bold] [link=http://x]y[/link]" in out  # markup shown as text, never applied
    with pytest.raises(typer.Exit):
        fail(f"job says {EVIL}")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "␛]0;PWNED" in err


def test_shown_names_invisible_characters_that_disguise_text():
    from nestor.cli.common import shown

    # "env/‮yp.evil‬" reads as "env/live.py" where a terminal applies bidi
    assert shown("env/\u202eyp.evil\u202c") == "env/⟨U+202E⟩yp.evil⟨U+202C⟩"
    assert shown("ok\u2028FAIL") == "ok⟨U+2028⟩FAIL"  # no fake line
    assert shown("co\u200bnfig.toml\u00ad") == "co⟨U+200B⟩nfig.toml⟨U+00AD⟩"
    assert shown("naïve Ünïcode ✓ 名前") == "naïve Ünïcode ✓ 名前"  # visible text untouched


def test_episode_show_and_list_print_agent_text_inert(tmp_path):
    from nestor.ledger import Ledger

    with Ledger(tmp_path) as ledger:
        ledger.start_episode("ep1", task_id="reverse", family="f", difficulty=0,
                             policy=f"lm{EVIL}", policy_version=0, config={})
        ledger.add_turn("ep1", 0, {"role": "assistant", "content": f"hello {EVIL}",
                                   "tool_calls": [{"name": f"read_file{EVIL}", "arguments": {
                                       "path": EVIL[:30], f"k{EVIL}": "v\ud800"}}]})
        ledger.add_turn("ep1", 1, {"role": "tool", "content": f"{EVIL} file body"})
        ledger.finish_episode("ep1", end_reason="ok", reward=0.1, components={})
    for argv in (["episode", "show", "ep1"], ["episode", "list"]):
        res = runner.invoke(app, [*argv, "--run-dir", str(tmp_path)])
        assert res.exit_code == 0, res.output
        assert "\x1b" not in res.output and "\r" not in res.output
        assert "␛]0;PWNED" in res.output


def test_episode_progress_line_is_inert(capsys):
    from nestor.cli.episode import _Narrated
    from nestor.policy.base import Message, Observation, ToolCall, Turn

    class Policy:
        name, version = "fake", 3

        def act(self, obs):
            return Turn(message=Message("assistant", "", tool_calls=[
                ToolCall(id="1", name=f"submit{EVIL}", arguments={})]))

    _Narrated(Policy(), status=None, max_turns=5).act(
        Observation([Message("tool", f"validation failed {EVIL}")], []))
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("␛]0;PWNED") == 2
