"""Rubric sanity: which replies to score, and what their rewards must look like.

For a sample of tasks the probe scores the task's own reference answer, an empty reply, and
corruptions of the reference that are certainly wrong (one character changed, the characters
reordered, one dropped, one added, another task's answer); plus a few unrelated replies. A
sensible rubric gives finite rewards in [0, 1], the same ones twice, quickly, ranks the
reference above the empty reply and above (nearly) every corruption, and does not give every
reply the same reward.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nestor.tasks import TaskSpec
from nestor.tasks.base import normalise

if TYPE_CHECKING:
    from nestor.job.tasksource import ScoreBatch

BEATS_CORRUPTED_MIN = 0.9  # share of (task, corruption) pairs the reference must win
N_UNRELATED = 8


@dataclass(frozen=True)
class Reply:
    task: int
    kind: str  # reference | empty | corrupt:<how> | unrelated
    text: str


def _bump(c: str) -> str:
    if "0" <= c <= "9":  # not isdigit(): '²' is a digit that int() refuses
        return str((int(c) + 1) % 10)
    if c.islower():
        return chr((ord(c) - 97 + 1) % 26 + 97)
    if c.isupper():
        return chr((ord(c) - 65 + 1) % 26 + 65)
    return "x" if c != "x" else "y"


def corruptions(answer: str, other: str | None) -> dict[str, str]:
    """Replies that are certainly not `answer` after the test's normalisation."""
    a = normalise(answer)
    out: dict[str, str] = {}
    if a:
        mid = len(a) // 2
        out["one_char_changed"] = a[:mid] + _bump(a[mid]) + a[mid + 1:]
        if a[::-1] != a:
            out["reversed"] = a[::-1]
        elif len(set(a)) > 1:
            out["rotated"] = a[1:] + a[0]
        if len(a) > 1:
            out["last_char_dropped"] = a[:-1]
        out["char_appended"] = a + a[-1]
    if other is not None and normalise(other) != a and normalise(other):
        out["another_task's_answer"] = other
    return {k: v for k, v in out.items() if normalise(v) != a}


def probe_replies(tasks: list[dict], picks: list[int], spec: TaskSpec) -> list[Reply]:
    rng = random.Random(0)
    replies: list[Reply] = []
    answers = [tasks[i].get("answer") for i in picks]
    for n, i in enumerate(picks):
        answer = tasks[i].get("answer")
        replies.append(Reply(i, "empty", ""))
        if answer is None or not normalise(answer):
            continue
        replies.append(Reply(i, "reference", answer))
        other = next((a for a in answers[n + 1:] + answers[:n] if a is not None
                      and normalise(a) != normalise(answer)), None)
        for how, text in corruptions(answer, other).items():
            replies.append(Reply(i, f"corrupt:{how}", text))
    alphabet = string.ascii_lowercase + string.digits + " "
    pool = [e.answer for e in spec.examples] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(4)]
    for k in range(N_UNRELATED):
        replies.append(Reply(picks[k % len(picks)], "unrelated", pool[k % len(pool)]))
    return replies


def _show(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


class RubricProbe:
    def __init__(self, replies: list[Reply], batch: ScoreBatch):
        self.replies, self.batch = replies, batch
        self.rewards = batch.rewards
        self.by_task: dict[int, dict[str, float]] = {}
        for reply, r in zip(replies, batch.rewards, strict=True):
            if reply.kind != "unrelated" and r is not None:
                self.by_task.setdefault(reply.task, {})[reply.kind] = r

    def valid(self) -> tuple[bool, str]:
        for reply, r, err in zip(self.replies, self.rewards, self.batch.errors, strict=True):
            where = f"task {reply.task}, reply {_show(reply.text)}"
            if r is None:
                return False, f"{where}: {err}"
            if not 0.0 <= r <= 1.0:
                return False, (f"{where}: reward {r:g} is outside [0, 1]; the weighted sum of "
                               "the @vf.reward methods must stay within [0, 1]")
        return True, f"{len(self.rewards)} probe replies scored in [0, 1]"

    def deterministic(self, again: ScoreBatch) -> tuple[bool, str]:
        for reply, a, b in zip(self.replies, self.rewards, again.rewards, strict=True):
            if a is None or b is None or abs(a - b) > 1e-9:
                return False, (f"task {reply.task}, reply {_show(reply.text)} scored {a} then "
                               f"{b}; rewards must depend only on the task and the reply (no "
                               "randomness, clock or state kept between calls)")
        return True, "the same rewards on a second pass"

    def speed(self, max_s: float) -> tuple[bool, str]:
        per = self.batch.elapsed_s / max(1, len(self.replies))
        if per > max_s:
            return False, (f"the rubric takes {per * 1000:.1f} ms per reply (limit "
                           f"{max_s * 1000:.0f} ms); training scores hundreds per step, so "
                           "drop slow work (sleeps, big loops, file reads) from the rewards")
        return True, f"{per * 1000:.2f} ms per reply"

    def _with_reference(self) -> dict[int, dict[str, float]]:
        return {t: s for t, s in self.by_task.items() if "reference" in s}

    def beats_empty(self) -> tuple[bool, str]:
        tasks = self._with_reference()
        if not tasks:
            return True, "skipped: the tasks carry no reference `answer`"
        for t, s in tasks.items():
            if not s["reference"] > s["empty"]:
                ref = next(r.text for r in self.replies if r.task == t and r.kind == "reference")
                return False, (f"task {t}: the reference answer {_show(ref)} scored "
                               f"{s['reference']:g}, no more than an empty reply "
                               f"({s['empty']:g}); reward the right answer")
        return True, f"reference beats an empty reply on all {len(tasks)} probed tasks"

    def beats_corrupted(self) -> tuple[bool, str]:
        tasks = self._with_reference()
        pairs = [(t, kind, s["reference"], v) for t, s in tasks.items()
                 for kind, v in s.items() if kind.startswith("corrupt:")]
        if not pairs:
            return True, "skipped: the tasks carry no reference `answer`"
        lost = [p for p in pairs if not p[2] > p[3]]
        share = 1 - len(lost) / len(pairs)
        if share < BEATS_CORRUPTED_MIN:
            t, kind, ref, v = lost[0]
            text = next(r.text for r in self.replies if r.task == t and r.kind == kind)
            answer = next(r.text for r in self.replies if r.task == t and r.kind == "reference")
            return False, (f"the reference answer beat only {share:.0%} of wrong replies (need "
                           f"{BEATS_CORRUPTED_MIN:.0%}); e.g. task {t}: {_show(text)} "
                           f"({kind.split(':')[1].replace('_', ' ')}) scored {v:g}, the "
                           f"reference {_show(answer)} {ref:g}")
        return True, f"reference beats {share:.0%} of {len(pairs)} corrupted replies"

    def not_constant(self) -> tuple[bool, str]:
        values = {round(r, 9) for r in self.rewards if r is not None}
        if len(values) < 2:
            return False, (f"all {len(self.rewards)} probe replies (references, empty, corrupted, "
                           f"unrelated) scored {values.pop() if values else None}; a constant "
                           "reward teaches nothing")
        return True, f"{len(values)} distinct reward values"
