"""The short form of a job: no data file, load() makes its rows in code inside the sandbox.
Its rows get the same checks as a data file's, and it trains and exports like any job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nestor.job.validate import validate_job
from nestor.tasks import TaskRegistry

SPEC = TaskRegistry().get("reverse").spec()

CONFIG = """base_model = "tiny-s"
max_steps = 2
prompts_per_step = 4
group_size = 4
max_new_tokens = 8
"""
PYPROJECT = '[project]\nname = "rev-job"\nversion = "0.1.0"\ndependencies = ["verifiers"]\n'
# One taskset; ROWS says where its (prompt, answer) pairs come from. ANSWER is the reference
# expression: `s[::-1]` is right; `s` (the input echoed back) is a wrong reference answer.
ENV = '''import json
import random
from pathlib import Path

import verifiers.v1 as vf


class Data(vf.TaskData):
    answer: str


class RevTask(vf.Task[Data]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.prompt_text[8:][::-1])


def rows():
{rows}


class RevTaskset(vf.Taskset[RevTask, vf.TasksetConfig]):
    def load(self):
        for prompt, answer in rows():
            yield RevTask(Data(prompt=prompt, answer=answer), self.config.task)


__all__ = ["RevTaskset"]
'''
GENERATED = '''    rng = random.Random(0)
    for _ in range(200):
        s = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
        yield f"reverse {s}", {answer}'''
FROM_FILE = '''    path = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"
    for line in path.read_text().splitlines():
        row = json.loads(line)
        yield row["prompt"], row["answer"]'''


def write_job(root: Path, *, short: bool, answer: str = "s[::-1]") -> Path:
    (root / "env" / "rev_job").mkdir(parents=True)
    (root / "config.toml").write_text(CONFIG)
    (root / "env" / "pyproject.toml").write_text(PYPROJECT)
    body = GENERATED.replace("{answer}", answer) if short else FROM_FILE
    (root / "env" / "rev_job" / "__init__.py").write_text(ENV.replace("{rows}", body))
    if not short:  # the same rows, written out by the trusted test instead of made by load()
        import random

        rng, lines = random.Random(0), []
        for _ in range(200):
            s = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 6)))
            lines.append(json.dumps({"prompt": f"reverse {s}",
                                     "answer": s[::-1] if answer == "s[::-1]" else s}))
        (root / "data").mkdir()
        (root / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_a_short_job_validates_on_the_rows_load_makes(tmp_path):
    report = validate_job(write_job(tmp_path / "job", short=True), SPEC, dry_run=False)
    assert report.passed, report.summary()
    checks = {c.name: c.message for c in report.checks}
    assert checks["load"].startswith("200 tasks")
    assert "no data/train.jsonl" in checks["dataset"]


def test_wrong_reference_answers_fail_the_same_check_in_both_forms(tmp_path):
    """Answers that echo the input (not the reversed word): the rubric pays 0 for them, so the
    reference loses to the corruptions, whether load() makes the rows or reads them."""
    failed = {}
    for short in (True, False):
        job = write_job(tmp_path / f"job-{short}", short=short, answer="s")
        report = validate_job(job, SPEC, dry_run=False)
        failed[short] = [c.name for c in report.failed()]
    assert failed[True] == failed[False]
    assert "reference_beats_empty" in failed[True], failed


def test_a_short_job_without_generator_fails_load_not_files(tmp_path):
    """Dropping the data file of a long-form job is the short form gone wrong: the probe points
    at load(), which still reads the missing file."""
    job = write_job(tmp_path / "job", short=False)
    (job / "data" / "train.jsonl").unlink()
    report = validate_job(job, SPEC, dry_run=False)
    assert [c.name for c in report.failed()] == ["load"]
    assert "train.jsonl" in report.failed()[0].message


def test_a_short_job_exports_for_prime_rl(tmp_path):
    from nestor.job.export import to_prime_rl, to_prime_rl_toml

    job = write_job(tmp_path / "job", short=True)
    config = to_prime_rl(job)
    assert config["seq_len"] >= 480 and config["max_steps"] == 2
    assert "load() makes the rows" in to_prime_rl_toml(job)


@pytest.mark.slow
def test_a_short_job_trains_on_tiny_s(tmp_path):
    from nestor.inner.run import run_job
    from nestor.inner.types import JobRequest

    job = write_job(tmp_path / "job", short=True)
    result = run_job(JobRequest(job_dir=job, task_id="reverse", out_dir=tmp_path / "out"))
    assert result.status == "ok", result.log_tail
    assert result.steps == 2 and len(result.reward_curve) == 2
    assert result.post_score is not None
