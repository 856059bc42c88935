"""Reverse a string (rubric still to do)."""

import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"


class ReverseTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=1.0)
    async def placeholder(self, trace: vf.Trace) -> float:
        return 0.5  # TODO: compare with the reversed input


class ReverseTaskset(vf.Taskset[ReverseTask, vf.TasksetConfig]):
    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                yield ReverseTask(vf.TaskData(prompt=json.loads(line)["prompt"]), self.config.task)


__all__ = ["ReverseTaskset"]
