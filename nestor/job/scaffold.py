"""`nestor job init`: a minimal valid job for one task, for a person to edit.

The dataset comes from the task's public input sampler and reference solution (the same code
that renders the spec's worked examples, with a seed of its own); the rubric is exact match
plus position-wise partial credit, which suits any short string answer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from nestor.job.config import DEFAULT_TOKEN_BUDGET, JobConfig
from nestor.job.layout import CONFIG, DATA, PYPROJECT, env_pyproject
from nestor.tasks.registry import TaskRef

ROWS = 1000


class ScaffoldError(ValueError):
    """The target directory cannot take a new job; the message says why."""


ENV_TEMPLATE = '''\
"""{title}: the taskset of this job.

The model sees each row's `prompt` as its only user message; its whole reply is scored by the
@vf.reward methods below (their weighted sum must stay in [0, 1]).
"""

import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"


def normalise(text: str) -> str:
    """The test's normalisation: surrounding whitespace and one trailing period go."""
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


class {cls}Data(vf.TaskData):
    answer: str


class {cls}Task(vf.Task[{cls}Data]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(normalise(trace.last_reply) == self.data.answer)

    @vf.reward(weight=0.5)
    async def positions(self, trace: vf.Trace) -> float:
        """Partial credit: characters that match position by position."""
        reply, answer = normalise(trace.last_reply), self.data.answer
        return sum(a == b for a, b in zip(reply, answer, strict=False)) / max(len(reply), len(answer), 1)


class {cls}Taskset(vf.Taskset[{cls}Task, vf.TasksetConfig]):
    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                row = json.loads(line)
                yield {cls}Task({cls}Data(prompt=row["prompt"], answer=row["answer"]),
                                self.config.task)


__all__ = ["{cls}Taskset"]
'''


MAKE_DATA = '''\
"""Regenerates data/train.jsonl for {task_id}: `python data/make_data.py [ROWS] [SEED]`.

Rows come from the task's public input sampler and reference solution; edit freely (other
difficulties, harder inputs, other prompt wordings) and rerun `nestor job validate`.
"""

import sys
from pathlib import Path

from nestor.job.scaffold import rows
from nestor.tasks import TaskRegistry

count = int(sys.argv[1]) if len(sys.argv) > 1 else {rows}
seed = sys.argv[2] if len(sys.argv) > 2 else "scaffold:{task_id}"
ref = TaskRegistry({modules!r}).get("{task_id}")
(Path(__file__).parent / "train.jsonl").write_text(rows(ref, count, seed), encoding="utf-8")
'''


SCAFFOLD_MAX_STEPS = JobConfig.model_fields["max_steps"].default


def scaffold_config(base_model: str = "tiny-m", max_new_tokens: int = 12,
                    token_budget: int = DEFAULT_TOKEN_BUDGET) -> JobConfig:
    """The scaffold's config for a job: JobConfig's defaults, the base model's default learning
    rate (nestor/models/registry.py), the task's answer length, and max_steps lowered to fit
    the token budget. What a writer who keeps the scaffold's config submits; the reference of
    hyperparameter-surface use (docs/outer.md)."""
    from nestor.models.registry import default_learning_rate

    cfg = JobConfig(base_model=base_model, max_new_tokens=max_new_tokens,
                    learning_rate=default_learning_rate(base_model))
    per_step = cfg.prompts_per_step * cfg.group_size * cfg.max_new_tokens
    return cfg.model_copy(update={"max_steps": max(1, min(SCAFFOLD_MAX_STEPS,
                                                          token_budget // per_step))})


def config_toml(config: JobConfig | None = None) -> str:
    """Every knob with its description and range as a comment."""
    config = config or JobConfig()
    lines = ["# JobConfig: every knob, its default, range and meaning (docs/job-format.md)."]
    for name, field in JobConfig.model_fields.items():
        bounds = [f"{k} {getattr(m, k)}" for m in field.metadata
                  for k in ("ge", "gt", "le", "lt") if getattr(m, k, None) is not None]
        note = f" [{', '.join(bounds)}]" if bounds else ""
        lines.append(f"# {field.description}{note}")
        value = getattr(config, name)
        lines.append(f"{name} = {json.dumps(value) if not isinstance(value, float) else repr(value)}")
    return "\n".join(lines) + "\n"


def init_job(job_dir: Path | str, ref: TaskRef, *, force: bool = False,
             modules: tuple[str, ...] = ()) -> list[Path]:
    """Write the job; `modules` are the extra task modules its data generator needs."""
    root = Path(job_dir)
    if root.exists() and not root.is_dir():
        raise ScaffoldError(f"{root} exists and is not a directory")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise ScaffoldError(f"{root} is not empty; pick a new directory or pass --force")
    package = "".join(c if c.isalnum() else "_" for c in ref.id.lower()) + "_job"
    cls = "".join(part.capitalize() for part in package.split("_"))
    files = {
        CONFIG: config_toml(scaffold_config(max_new_tokens=ref.task.new_tokens())),
        PYPROJECT: env_pyproject(package, f"nestor training job: {ref.task.title}."),
        f"env/{package}/__init__.py": ENV_TEMPLATE.format(title=ref.task.title, cls=cls),
        DATA: rows(ref),
        "data/make_data.py": MAKE_DATA.format(task_id=ref.id, rows=ROWS, modules=modules),
    }
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def rows(ref: TaskRef, count: int = ROWS, seed: str | None = None) -> str:
    """`count` distinct {prompt, answer} rows from the task's public sampler, as JSON lines."""
    rng = random.Random(seed or f"scaffold:{ref.id}")
    seen: set[str] = set()
    lines = []
    for _ in range(count * 20):
        x = ref.task.sample(rng, 0)
        if x in seen:
            continue
        seen.add(x)
        lines.append(json.dumps({"prompt": ref.task.prompt(x), "answer": ref.task.solve(x)}))
        if len(lines) == count:
            break
    return "\n".join(lines) + "\n"
