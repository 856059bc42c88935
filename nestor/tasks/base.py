"""The public half of a task: what the agent may read.

A `TaskDef` is the code of one skill (an input sampler, the reference solution and the exact
test prompt); a `Family` groups TaskDefs; a `TaskSpec` is the rendered, public description the
agent reads. Nothing here knows the hidden-eval seeds: those live in `nestor.tasks.hidden`, which
only the trusted scorer imports.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

EXAMPLES_SEED = 1234  # public: the worked examples are part of the spec
N_EXAMPLES = 6


def normalise(text: str) -> str:
    """The scoring normalisation: strip surrounding whitespace and one trailing period."""
    text = text.strip()
    if text.endswith("."):
        text = text[:-1].rstrip()
    return text


@dataclass(frozen=True)
class TaskDef:
    """One skill: how inputs are drawn, the right answer, and the exact test prompt."""

    id: str
    title: str
    skill: str  # one sentence: what the model must do
    sample: Callable[[random.Random, int], str]  # (rng, difficulty) -> input
    solve: Callable[[str], str]  # input -> reference answer
    prompt: Callable[[str], str]  # input -> the exact user message of the test
    input_ranges: Callable[[int], str]  # difficulty -> human description of the inputs
    max_new_tokens: int = 12  # at difficulty 0; each level above adds as many again

    def new_tokens(self, difficulty: int = 0) -> int:
        return self.max_new_tokens * (1 + difficulty)

    def examples(self, difficulty: int = 0, n: int = N_EXAMPLES) -> list[Example]:
        rng = random.Random(f"{EXAMPLES_SEED}:{self.id}:{difficulty}")
        seen: set[str] = set()
        out: list[Example] = []
        while len(out) < n:
            x = self.sample(rng, difficulty)
            if x in seen:
                continue
            seen.add(x)
            out.append(Example(input=x, prompt=self.prompt(x), answer=self.solve(x)))
        return out


@dataclass(frozen=True)
class Family:
    """A plugin's unit: named tasks that share a theme. One built-in family is held out."""

    name: str
    description: str
    tasks: tuple[TaskDef, ...]
    heldout: bool = False
    # Salt for the hidden-eval generator. Built-in families leave it None: their salts live in
    # nestor.tasks.hidden. A plugin family supplies its own. Public, like any source: what keeps
    # the items secret is the installation's secret mixed into every seed (tasks/secret.py).
    hidden_salt: str | None = field(default=None, repr=False)


class Example(BaseModel):
    input: str
    prompt: str = Field(description="the exact user message the model sees")
    answer: str = Field(description="the exact reply that scores 1")


class TaskSpec(BaseModel):
    """The public spec of a task: everything the agent is allowed to see."""

    id: str
    family: str
    title: str
    heldout: bool
    difficulty: int = 0
    max_new_tokens: int
    instructions: str = Field(description="Markdown: skill, exact formats, input ranges, scoring")
    examples: list[Example]


def render_spec(task: TaskDef, family: Family, difficulty: int = 0) -> TaskSpec:
    examples = task.examples(difficulty)
    shown = "\n".join(f"| `{e.prompt}` | `{e.answer}` |" for e in examples)
    instructions = f"""# {task.title}

**Skill.** {task.skill}

**Test format.** The model is tested in a chat with no system prompt and exactly one user
message, the prompt below; its whole reply is the answer. The reply is scored 1 when it equals
the reference answer after normalisation (surrounding whitespace and one trailing period are
stripped), else 0. Replies are cut at {task.new_tokens(difficulty)} tokens of the base model's own
tokenizer: one token per character for the tiny models; a BPE model such as SmolLM2 or Qwen3
packs one to several characters into a token, so every reference answer fits with room to
spare, but a chatty reply is cut short and scores 0.

**Inputs.** {task.input_ranges(difficulty)}

**Worked examples** (prompt → answer):

| prompt | answer |
|---|---|
{shown}
"""
    return TaskSpec(
        id=task.id,
        family=family.name,
        title=task.title,
        heldout=family.heldout,
        difficulty=difficulty,
        max_new_tokens=task.new_tokens(difficulty),
        instructions=instructions,
        examples=examples,
    )
