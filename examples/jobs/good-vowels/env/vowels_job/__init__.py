"""Vowels in a string: `vowels abcde` -> `2` (a e i o u).

Half the reward is for the exact count; half is closeness, 1 - |reply - answer| / 3 (floored at
0), so an off-by-one count still earns something and a wild guess earns nothing.
"""

import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"


def normalise(text: str) -> str:
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


class VowelsData(vf.TaskData):
    answer: str


class VowelsTask(vf.Task[VowelsData]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(normalise(trace.last_reply) == self.data.answer)

    @vf.reward(weight=0.5)
    async def close(self, trace: vf.Trace) -> float:
        reply = normalise(trace.last_reply)
        if not reply.isdigit() or len(reply) > 3:
            return 0.0
        return max(0.0, 1.0 - abs(int(reply) - int(self.data.answer)) / 3)


class VowelsTaskset(vf.Taskset[VowelsTask, vf.TasksetConfig]):
    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                row = json.loads(line)
                yield VowelsTask(VowelsData(prompt=row["prompt"], answer=row["answer"]),
                                 self.config.task)


__all__ = ["VowelsTaskset"]
