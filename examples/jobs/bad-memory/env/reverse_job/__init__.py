"""Reverse a string: `reverse abc` -> `cba`.

The rubric gives half the reward for an exact answer and half for the fraction of positions
that match, so a reply that is nearly right still beats one that is far off: early in
training few replies are exact, and partial credit gives GRPO a gradient to follow.
"""

import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"


def normalise(text: str) -> str:
    """The test's normalisation: surrounding whitespace and one trailing period go."""
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(normalise(trace.last_reply) == self.data.answer)

    @vf.reward(weight=0.5)
    async def positions(self, trace: vf.Trace) -> float:
        """Matching characters position by position, over the longer of reply and answer
        (so padding the reply with extra letters costs credit)."""
        reply, answer = normalise(trace.last_reply), self.data.answer
        same = sum(a == b for a, b in zip(reply, answer, strict=False))
        return same / max(len(reply), len(answer))


class ReverseTaskset(vf.Taskset[ReverseTask, vf.TasksetConfig]):
    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                row = json.loads(line)
                yield ReverseTask(ReverseData(prompt=row["prompt"], answer=row["answer"]),
                                  self.config.task)


__all__ = ["ReverseTaskset"]
