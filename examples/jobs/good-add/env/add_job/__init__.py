"""Add two numbers: `37+45=` -> `82`.

Half the reward is for the exact sum; half for digits that match aligned from the right (ones
with ones, tens with tens), since a sum with the right ones digit is closer to right than one
with the right first digit. Replies that are not all digits get no partial credit.
"""

import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"


def normalise(text: str) -> str:
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


class AddData(vf.TaskData):
    answer: str


class AddTask(vf.Task[AddData]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(normalise(trace.last_reply) == self.data.answer)

    @vf.reward(weight=0.5)
    async def digits(self, trace: vf.Trace) -> float:
        reply, answer = normalise(trace.last_reply), self.data.answer
        if not reply.isdigit():
            return 0.0
        same = sum(a == b for a, b in zip(reversed(reply), reversed(answer), strict=False))
        return same / max(len(reply), len(answer))


class AddTaskset(vf.Taskset[AddTask, vf.TasksetConfig]):
    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                row = json.loads(line)
                yield AddTask(AddData(prompt=row["prompt"], answer=row["answer"]),
                              self.config.task)


__all__ = ["AddTaskset"]
