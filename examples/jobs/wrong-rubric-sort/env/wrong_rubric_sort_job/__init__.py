"""Sort letters: `sort dbca` -> `abcd`.

Half the reward is for an exact answer, half for the fraction of positions that match, so a
nearly right reply beats a far-off one: early in training few replies are exact, and partial
credit gives GRPO a gradient to follow.
"""

import json
from pathlib import Path

import verifiers.v1 as vf

DATA = Path(__file__).resolve().parents[2] / "data" / "train.jsonl"


def normalise(text: str) -> str:
    """The test's normalisation: surrounding whitespace and one trailing period go."""
    text = text.strip()
    return text[:-1].rstrip() if text.endswith(".") else text


class SortData(vf.TaskData):
    answer: str
    letters: str  # the input string, as given in the prompt


class SortTask(vf.Task[SortData]):
    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(normalise(trace.last_reply) == self.data.answer)

    @vf.reward(weight=0.5)
    async def faithful(self, trace: vf.Trace) -> float:
        """WRONG: 'a faithful reply repeats the letters it was given', checked in their input
        order, so copying the input unsorted earns this half of the reward."""
        return float(normalise(trace.last_reply) == self.data.letters)


class SortTaskset(vf.Taskset[SortTask, vf.TasksetConfig]):
    def load(self):
        with DATA.open(encoding="utf-8") as rows:
            for line in rows:
                row = json.loads(line)
                yield SortTask(SortData(prompt=row["prompt"], answer=row["answer"],
                                         letters=row["prompt"].split()[-1]),
                                self.config.task)


__all__ = ["SortTaskset"]
