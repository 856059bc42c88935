"""The trusted side of the job format: layout, dataset rows, prime-rl export, scaffold, CLI."""

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nestor.agent.prompt import doc_job_files
from nestor.cli import app
from nestor.job.export import to_prime_rl, to_prime_rl_toml
from nestor.job.file_checks import check_dataset
from nestor.job.layout import LayoutError, read_layout

GOOD = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
runner = CliRunner()


@pytest.fixture
def job(tmp_path) -> Path:
    return Path(shutil.copytree(GOOD, tmp_path / "job",
                                ignore=shutil.ignore_patterns("__pycache__")))


def test_layout_of_a_good_job(job):
    layout = read_layout(job)
    assert layout.package == "reverse_job" and layout.taskset_id == "reverse_job"


@pytest.mark.parametrize("breakage,needle", [
    (lambda j: (j / "config.toml").unlink(), "config.toml is missing"),
    (lambda j: shutil.rmtree(j / "env" / "reverse_job"), "no taskset package"),
    (lambda j: shutil.copytree(j / "env" / "reverse_job", j / "env" / "other_job"),
     "holds 2 packages"),
    (lambda j: (j / "env" / "reverse_job").rename(j / "env" / "json"), "shadow"),
    (lambda j: (j / "env" / "pyproject.toml").write_text('[project]\nname = "x"\n'),
     "must match the package"),
    (lambda j: (j / "env" / "pyproject.toml").write_text("[project\n"), "not valid TOML"),
])
def test_layout_errors_say_what_to_fix(job, breakage, needle):
    breakage(job)
    with pytest.raises(LayoutError, match=needle.replace("(", r"\(")):
        read_layout(job)


@pytest.mark.parametrize("lines,ok,needle", [
    (['{"prompt": "reverse ab", "answer": "ba"}', "", '{"prompt": "reverse c"}'], True, "2 rows"),
    (['{"prompt": "a"}', "{'prompt': 'b'}"], False, "line 2: not JSON"),
    (['{"question": "a"}'], False, 'string "prompt"'),
    (['["a"]'], False, "JSON object"),
    (['{"prompt": "a", "answer": [1]}'], False, "answer"),
    ([""], False, "empty"),
])
def test_dataset_rows(tmp_path, lines, ok, needle):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    got_ok, message = check_dataset(path)
    assert got_ok is ok and needle in message


def test_prime_rl_export_carries_the_config(job):
    text = (job / "config.toml").read_text().replace("max_steps = 40", "max_steps = 7")
    (job / "config.toml").write_text(text + "lora_rank = 8\nlora_alpha = 16\n")
    rl = to_prime_rl(job)
    assert rl["max_steps"] == 7 and rl["model"]["name"] == "tiny-m"  # a name, never a path
    assert rl["orchestrator"]["batch_size"] == 16 * 8 and rl["orchestrator"]["group_size"] == 8
    assert rl["orchestrator"]["train"]["sampling"] == {"temperature": 1.0,
                                                       "max_completion_tokens": 12}
    (source,) = rl["orchestrator"]["train"]["source"]
    assert source["env"]["taskset"]["id"] == "reverse_job"
    assert source["env"]["agent"] == {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
    assert rl["trainer"]["optim"]["lr"] == 3e-4
    assert rl["trainer"]["model"]["lora"] == {"rank": 8, "alpha": 16}
    assert rl["seq_len"] >= len("reverse abcdefgh") + 12
    assert tomllib.loads(to_prime_rl_toml(job)) == rl  # the text form is valid TOML


def test_cli_export_and_init(tmp_path, job):
    out = tmp_path / "rl.toml"
    result = runner.invoke(app, ["job", "export", str(job), "--prime-rl", str(out)])
    assert result.exit_code == 2 and "--task" in result.output  # the probe needs the task
    assert not out.exists()
    result = runner.invoke(app, ["job", "export", str(job), "--prime-rl", str(out),
                                 "--skip-validation"])
    assert result.exit_code == 0, result.output
    assert "validation skipped" in result.output
    assert tomllib.loads(out.read_text())["max_steps"] == 40
    text = out.read_text()
    assert "loss=token_is" in text and str(Path.cwd()) not in text.split("[model]")[1]
    result = runner.invoke(app, ["job", "export", str(tmp_path / "nope"), "--prime-rl", str(out)])
    assert result.exit_code == 2 and "no such job directory" in result.output
    result = runner.invoke(app, ["job", "export", str(job / "config.toml"), "--prime-rl", str(out)])
    assert result.exit_code == 2 and "is a file" in result.output
    # an unknown base model is refused as the probe refuses it, and nothing is written
    (job / "config.toml").write_text('base_model = "gpt-9"\n')
    out.unlink()
    result = runner.invoke(app, ["job", "export", str(job), "--prime-rl", str(out)])
    assert result.exit_code == 2 and "'gpt-9' is not a known model" in result.output
    assert not out.exists()

    result = runner.invoke(app, ["job", "init", str(tmp_path / "new"), "--task", "add"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (tmp_path / "new" / "data" / "train.jsonl").read_text().split("\n") if x]
    assert len(rows) == 1000 and len({r["prompt"] for r in rows}) == 1000
    assert all(r["prompt"].endswith("=") and int(r["answer"]) == sum(
        map(int, r["prompt"][:-1].split("+"))) for r in rows)
    assert read_layout(tmp_path / "new").package == "add_job"
    assert "next: edit it, then `nestor job validate" in result.output
    # the generator the docs describe sits beside the data and remakes it
    gen = tmp_path / "new" / "data" / "make_data.py"
    subprocess.run([sys.executable, str(gen), "50", "other-seed"], check=True, timeout=120)
    regenerated = (tmp_path / "new" / "data" / "train.jsonl").read_text().splitlines()
    assert len(regenerated) == 50 and json.loads(regenerated[0])["prompt"].endswith("=")
    again = runner.invoke(app, ["job", "init", str(tmp_path / "new"), "--task", "add"])
    assert again.exit_code == 2 and "not empty" in again.output
    unknown = runner.invoke(app, ["job", "init", str(tmp_path / "x"), "--task", "revrse"])
    assert unknown.exit_code == 2 and "reverse" in unknown.output


def test_cli_validate_exit_codes_and_json(tmp_path, job):
    """A scaffolded job passes; breaking its config makes it fail with exit code 1."""
    new = tmp_path / "new"
    assert runner.invoke(app, ["job", "init", str(new), "--task", "sort"]).exit_code == 0
    result = runner.invoke(app, ["job", "validate", str(new), "--task", "sort", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["passed"], report
    assert {"name", "ok", "message"} == set(report["checks"][0]) and report["elapsed_s"] > 0

    (new / "config.toml").write_text("max_steps = 0\n")
    result = runner.invoke(app, ["job", "validate", str(new), "--task", "sort", "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and not report["passed"]
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["config"]
    # an unknown model is named together with the schema errors, not after they are fixed
    (new / "config.toml").write_text('max_steps = 0\nbase_model = "gpt-9"\n')
    result = runner.invoke(app, ["job", "validate", str(new), "--task", "sort"])
    assert result.exit_code == 1
    assert "max_steps" in result.stdout and "'gpt-9' is not a known model" in result.stdout
    # progress: every check is printed as a line, then the verdict
    lines = result.stdout.splitlines()
    assert lines[0].startswith("validating") and lines[-1].startswith("failed in")
    assert any(line.startswith("FAIL config:") for line in lines)
    plain = runner.invoke(app, ["job", "validate", str(new / "config.toml"), "--task", "sort"])
    assert plain.exit_code == 2 and "is a file" in plain.output


DOC = Path(__file__).resolve().parents[2] / "docs" / "job-format.md"


def test_docs_list_every_config_knob_with_its_default():
    from nestor.job.config import JobConfig

    text = DOC.read_text()
    for name, field in JobConfig.model_fields.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/job-format.md lacks a row for {name}"
        default = field.default
        shown = row.split("|")[2].strip().strip("`").strip('"')
        assert shown.lower() == str(default).lower() or float(shown) == float(default), (name, shown)


def test_the_documented_short_job_passes_the_probe(tmp_path):
    """The doc's first job (the short form: no data file, load() makes the rows) is exact:
    written out as shown, it validates."""
    from nestor.job.validate import validate_job
    from nestor.tasks import TaskRegistry

    blocks = doc_job_files("A complete minimal job")
    assert set(blocks) == {"config.toml", "env/pyproject.toml", "env/reverse_job/__init__.py"}
    for rel, text in blocks.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    report = validate_job(tmp_path, TaskRegistry().get("reverse").spec())
    assert report.passed, report.summary()
    checks = {c.name: c.message for c in report.checks}
    assert "2,000 tasks" in checks["load"] and "load()" in checks["dataset"]


def test_the_documented_long_job_passes_the_probe(tmp_path):
    """The example in the docs is exact: written out as shown, it validates."""
    from nestor.job.validate import validate_job
    from nestor.tasks import TaskRegistry

    blocks = doc_job_files("The long form: rows in a data file")
    assert {"config.toml", "env/pyproject.toml", "env/reverse_job/__init__.py"} <= set(blocks)
    for rel in ("config.toml", "env/pyproject.toml", "env/reverse_job/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(blocks[rel])
    (tmp_path / "data").mkdir()
    shutil.copy(GOOD / "data" / "train.jsonl", tmp_path / "data" / "train.jsonl")
    for line in blocks["data/train.jsonl"].splitlines():  # the rows shown are real rows
        assert line in (tmp_path / "data" / "train.jsonl").read_text()
    report = validate_job(tmp_path, TaskRegistry().get("reverse").spec())
    assert report.passed, report.summary()


def test_trl_style_keys_get_the_nestor_name(tmp_path):
    # a TRL / prime-rl habit in config.toml: `job validate` (and a run config) names nestor's key
    new = tmp_path / "new"
    assert runner.invoke(app, ["job", "init", str(new), "--task", "sort"]).exit_code == 0
    text = (new / "config.toml").read_text()
    (new / "config.toml").write_text(text + "num_generations = 8\nlr = 1e-4\n")
    result = runner.invoke(app, ["job", "validate", str(new), "--task", "sort", "--json"])
    (config,) = [c for c in json.loads(result.stdout)["checks"] if c["name"] == "config"]
    assert not config["ok"]
    assert "num_generations" in config["message"] and "did you mean `group_size`?" in \
        config["message"] and "did you mean `learning_rate`?" in config["message"]
    run = tmp_path / "run.toml"
    run.write_text('tasks = ["add"]\nnum_generations = 4\n[policy]\nkind = "composer"\n')
    res = runner.invoke(app, ["train", str(run)])
    assert res.exit_code == 2 and "did you mean `group_size`?" in res.output
