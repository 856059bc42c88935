import json
import re
from pathlib import Path

from typer.testing import CliRunner

from nestor.cli import app
from nestor.report.data import RunData
from nestor.report.figures import FIGURES
from nestor.report.html import write_report
from tests.report.run_fixture import make_run

runner = CliRunner()


def test_report_writes_every_figure(tmp_path):
    run = make_run(tmp_path / "run")
    page = write_report(run)  # its speed: benchmarks/report_speed.py
    html = page.read_text()
    for key in FIGURES:
        png = run / "report" / f"{key}.png"
        assert png.stat().st_size > 5_000, key
        assert f'src="{key}.png"' in html
    assert "No data yet" not in html
    # numbers for people: no JSON, no long floats, no quoted paths
    assert "{" not in html.split("<body>")[1] and '"runs/' not in html
    assert not re.search(r"\d\.\d{5,}", html)
    assert "Content-Security-Policy" in html


def test_figures_share_the_step_axis_and_smooth_noisy_series(tmp_path):
    from nestor.report.figures import rolling, window_for

    data = RunData.load(make_run(tmp_path / "run", steps=12))
    spans = set()
    for key, (_, make) in FIGURES.items():
        fig = make(data)
        ax = fig.axes[0]
        if key not in ("pre_post",) and ax.get_xlabel() == "outer step":
            spans.add(tuple(round(x, 2) for x in ax.get_xlim()))
    assert spans == {(-0.5, 11.5)}, spans  # every per-step figure: the same span
    assert window_for(5) == 1 and window_for(12) == 3 and window_for(100) == 10
    assert rolling([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    labels = [t.get_text() for t in FIGURES["reward"][1](data).axes[0].get_legend().get_texts()]
    assert "reward (mean), 3-step rolling mean" in labels


def test_heldout_is_two_bars_for_one_evaluation_and_lines_for_many(tmp_path):
    import matplotlib.pyplot as plt

    from nestor.report.figures import heldout

    data = RunData.load(make_run(tmp_path / "run", steps=4))
    many = heldout(data)
    assert many.axes[0].get_xlabel() == "outer step" and len(many.axes[0].lines) == 2
    one = RunData.load(make_run(tmp_path / "one", steps=4))
    one.heldout = [r for r in one.heldout if r["step"] == 3]
    fig = heldout(one)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["untrained policy", "trained policy"]
    assert len(ax.patches) == 2 and "after step 3" in fig._suptitle.get_text()
    points = one.heldout_by_step()["trained"][0]
    assert points["n"] == 4 and points["ci95"][0] < points["mean"] < points["ci95"][1]
    plt.close("all")


def test_pre_post_by_base_model(tmp_path):
    data = RunData.load(make_run(tmp_path / "run", steps=3))
    by = data.pre_post_by_model()
    assert set(by) == {"reverse", "add", "length"}
    assert {m for t in by.values() for m in t} == {"tiny-m", "tiny-s"}
    legend = [t.get_text() for t in FIGURES["pre_post"][1](data).axes[0].get_legend().get_texts()]
    assert legend == ["tiny-m before", "tiny-m after", "tiny-s before", "tiny-s after"]


def test_report_of_crashed_run(tmp_path):
    run = make_run(tmp_path / "run", steps=3, crashed=True)
    data = RunData.load(run)
    assert len(data.steps) == 3  # the torn line is skipped
    assert data.status().startswith("in progress")
    write_report(run)
    assert (run / "report" / "reward.png").is_file()


def test_report_of_empty_run_says_what_is_missing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    html = write_report(run).read_text()
    assert "No data yet for" in html


def test_report_cli_and_bad_dir(tmp_path):
    run = make_run(tmp_path / "run", steps=2)
    out = runner.invoke(app, ["report", str(run), "--json"])
    assert out.exit_code == 0, out.output
    assert "reward.png" in json.loads(out.stdout)["figures"]
    bad = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "not a run directory" in bad.output


def test_runs_list_and_show(tmp_path):
    make_run(tmp_path / "runs" / "a", steps=4)
    make_run(tmp_path / "runs" / "b", steps=2, crashed=True)
    rows = json.loads(runner.invoke(app, ["runs", "list", str(tmp_path / "runs"), "--json"]).stdout)
    assert [r["steps"] for r in rows] == [4, 2]
    assert rows[0]["reward_last_2_steps"] > rows[0]["reward_first_2_steps"]
    shown = json.loads(runner.invoke(app, ["runs", "show", str(tmp_path / "runs" / "a"),
                                           "--json"]).stdout)
    assert shown["jobs"] == 16 and shown["jobs_ok"] == 12
    assert shown["heldout"]["trained"]["step"] == 3
    text = runner.invoke(app, ["runs", "show", str(tmp_path / "runs" / "a")],
                         env={"COLUMNS": "160"}).stdout
    assert "12 of 16 (12 finished ok)" in text and "0.260 (n = 4, step 3)" in text  # held-out trained at step 3
    assert not re.search(r"\d\.\d{5,}", text) and "{" not in text


def test_runs_compare_table_plot_and_json(tmp_path):
    a = make_run(tmp_path / "a", steps=4)
    b = make_run(tmp_path / "b", steps=2)
    out = runner.invoke(app, ["runs", "compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "reward curve" in out.stdout and "▁▃▅█" in out.stdout  # a's rising curve
    assert "12 of 16 (12 finished ok)" in out.stdout and "6 of 8 (6 finished ok)" in out.stdout
    plot = a / "report" / "compare-with-b.png"
    assert plot.stat().st_size > 5_000
    shown = json.loads(runner.invoke(app, ["runs", "compare", str(a), str(b), "--json",
                                           "--plot", str(tmp_path / "c.png")]).stdout)
    assert [len(c) for c in shown["reward_curves"].values()] == [4, 2]
    assert shown["plot"] == str(tmp_path / "c.png") and (tmp_path / "c.png").is_file()
    bad = runner.invoke(app, ["runs", "compare", str(a), str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "not a run directory" in bad.output


def test_headline_renders_the_findings(tmp_path):
    from nestor.report.findings import compute_findings
    from nestor.report.headline import headline

    run = make_run(tmp_path / "run", steps=9)
    data = RunData.load(run)
    found = compute_findings(data.steps, data.heldout)
    rows = {r["key"]: r for r in headline(data)}
    assert list(rows) == ["reward", "rungs", "strong_model", "hp_use", "transfer"]
    assert rows["reward"]["numbers"] == (f"{found.reward['first']:.3f} → "
                                         f"{found.reward['peak']:.3f} (step 8) → "
                                         f"{found.reward['last']:.3f}")
    assert rows["reward"]["met"] is True and rows["reward"]["verdict"] == found.verdicts["reward"]
    assert rows["strong_model"]["numbers"].startswith("tiny-m: ")
    t = found.transfer
    assert f"(n = {t.trained.n})" in rows["transfer"]["numbers"] and "step 8" in \
        rows["transfer"]["numbers"]
    html = write_report(run).read_text()
    body = html.split('id="headline"')[1].split("</table>")[0]
    assert body.count("<tr id=\"finding-") == 5 and "target met" in body
    assert html.index('id="headline"') < html.index('id="summary"') < html.index('id="reward"')
    shown = runner.invoke(app, ["runs", "show", str(run)], env={"COLUMNS": "200"}).stdout
    assert "The five questions" in shown and "Does it transfer" in shown
    js = json.loads(runner.invoke(app, ["runs", "show", str(run), "--json"]).stdout)
    assert js["findings"]["verdicts"] == found.verdicts


def test_headline_says_not_enough_data(tmp_path):
    from nestor.report.headline import headline

    run = make_run(tmp_path / "run", steps=2)
    rows = {r["key"]: r for r in headline(RunData.load(run))}
    assert rows["reward"]["mark"] == "not enough data" and rows["reward"]["verdict"] == ""
    assert "not enough data" in write_report(run).read_text()


def test_runs_list_tells_each_kind_apart(tmp_path):
    # a training run, a `bench agents` dir, an `episode run` dir and a job checkpoint side by
    # side: each gets its kind; none is "no steps yet"; the checkpoint is no 20-step run
    from nestor.ledger import Ledger

    root = tmp_path / "runs"
    make_run(root / "train-20261203-101010", steps=3)
    for name, group in (("bench-20261203-101010", "bench:openai:m"),
                        ("bench-20261203-101011", "bench:openai:m"),
                        ("episode-20261203-101010", None)):
        with Ledger(root / name) as ledger:
            ledger.start_episode("e1", task_id="add", family="arithmetic", difficulty=0,
                                 policy="openai:m", policy_version=0, config={}, group_id=group)
            ledger.finish_episode("e1", end_reason="policy_error", reward=0.0, components={})
    job = root / "job-20261203-101010"
    job.mkdir()
    (job / "nestor_job.json").write_text(json.dumps({"task_id": "add", "steps": 20}))
    (job / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward_mean": 0.1}) + "\n"
                                               for i in range(20)))
    rows = {Path(r["run_dir"]).name: r for r in json.loads(runner.invoke(app, ["runs", "list", str(root),
                                                                 "--json"]).stdout)}
    assert {n: (r["kind"], r["status"]) for n, r in rows.items()} == {
        "train-20261203-101010": ("train", "finished"),
        "bench-20261203-101010": ("bench", "finished"),
        "bench-20261203-101011": ("bench", "finished"),
        "episode-20261203-101010": ("episodes", "finished"),
        "job-20261203-101010": ("job", "checkpoint")}
    text = runner.invoke(app, ["runs", "list", str(root)]).stdout  # piped: the 80-col default
    assert "bench-20261203-101010" in text and "bench-20261203-101011" in text
    assert "train-20261203-101010" in text  # the directory, not the config's name
    shown = runner.invoke(app, ["runs", "show", str(job)])
    assert shown.exit_code == 2 and "job checkpoint" in shown.output


def test_runs_show_counts_jobs_trained_as_the_reward_does(tmp_path):
    from nestor.ledger import Ledger

    run = tmp_path / "episode-1"
    with Ledger(run) as ledger:
        ledger.start_episode("e1", task_id="add", family="arithmetic", difficulty=0,
                             policy="composer", policy_version=0, config={})
        ledger.add_job("e1-job", "e1", {})
        ledger.add_result("e1-job", {"status": "ok", "pre_score": 0.1, "post_score": 0.1,
                                     "steps": 2})
        # ok, but no step trained a group with reward variance: the reward says trained 0
        ledger.finish_episode("e1", end_reason="ok", reward=0.0, components={"trained": 0.0})
    shown = json.loads(runner.invoke(app, ["runs", "show", str(run), "--json"]).stdout)
    assert shown["jobs_ok"] == 1 and shown["jobs_trained"] == 0
    text = runner.invoke(app, ["runs", "show", str(run)]).stdout
    assert "0 of 1 (1 finished ok)" in text
