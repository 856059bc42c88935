"""A cheap real policy and episode function for the loop's tests (no jobs, no models).

`BanditPolicy` is a softmax over K arms trained with the same importance-sampling loss as the
LM policy; `make_episode_fn` pulls an arm, waits (as if on the pool), and pays 1 for the good
arm. Run as a script it trains a run directory (used by the kill-and-resume test).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import torch

from nestor.outer.groups import EpisodeSummary
from nestor.policy.base import Message, Observation, TrainItem, Turn
from nestor.policy.is_loss import importance_sampling_loss

GOOD_ARM = 2


class BanditPolicy:
    name = "bandit"

    def __init__(self, arms: int = 4, lr: float = 0.5, seed: int = 0, clip_ratio: float = 0.0):
        self.logits = torch.zeros(arms, requires_grad=True)
        self.opt = torch.optim.SGD([self.logits], lr=lr)
        self.gen = torch.Generator().manual_seed(seed)
        self.clip_ratio = clip_ratio
        self.version = 0
        self.trained = threading.Condition()  # notified at each new version

    def act(self, obs: Observation) -> Turn:
        with torch.no_grad():
            logp = torch.log_softmax(self.logits, -1)
            arm = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
        return Turn(message=Message("assistant", f"arm {arm}"), action_ids=[arm],
                    sample_logprobs=[float(logp[arm])], action_keys=["arm"])

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        self.opt.zero_grad()
        logp_all = torch.log_softmax(self.logits, -1)
        acts = torch.tensor([[t.action_ids[0] for t in it.turns] for it in batch])  # [N, 1]
        logp = logp_all[acts]  # [N, 1]
        sample = torch.tensor([[t.sample_logprobs[0] for t in it.turns] for it in batch])
        adv = torch.tensor([it.advantage for it in batch])
        loss, stats = importance_sampling_loss(logp, sample, adv, torch.ones_like(logp).bool(),
                                               self.clip_ratio)
        (loss / len(batch)).backward()
        self.opt.step()
        with self.trained:
            self.version += 1
            self.trained.notify_all()
        return {"loss": float(loss.detach()), **stats}

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"logits": self.logits.detach(), "opt": self.opt.state_dict(),
                    "version": self.version, "gen": self.gen.get_state()}, path / "bandit.pt")

    def load(self, path: Path) -> None:
        state = torch.load(path / "bandit.pt")
        with torch.no_grad():
            self.logits.copy_(state["logits"])
        self.opt.load_state_dict(state["opt"])
        self.version = state["version"]
        self.gen.set_state(state["gen"])


def make_episode_fn(delay: float = 0.02, slow: dict | None = None, reward_fn=None, calls=None,
                    hold: dict | None = None, held: dict | None = None):
    """slow: {(group_id, slot): factor}; calls: a list that gets (ticket, start version, time).
    hold: {(group_id, slot): version}: that episode ends only once the policy has reached the
    version (a straggler defined by the loop's progress, not by a clock); held gets, for each,
    whether it was released (False: the loop never got there in 60 s) and how many episodes
    had started by then."""
    slow, hold = slow or {}, hold or {}

    def episode(policy, ticket) -> EpisodeSummary:
        version = policy.version
        turn = policy.act(Observation(messages=[Message("user", ticket.task_id)], tools=[]))
        if calls is not None:
            calls.append((ticket, version, time.monotonic()))
        time.sleep(delay * slow.get((ticket.group_id, ticket.slot), 1.0))
        if (key := (ticket.group_id, ticket.slot)) in hold:
            with policy.trained:
                released = policy.trained.wait_for(lambda: policy.version >= hold[key], 60)
            if held is not None:
                held[key] = (released, len(calls) if calls is not None else None)
        arm = turn.action_ids[0]
        reward = reward_fn(arm, ticket) if reward_fn else float(arm == GOOD_ARM)
        return EpisodeSummary(ticket.group_id, ticket.slot, ticket.task_id, reward, version,
                              turns=[turn], components={"improvement": reward},
                              info={"attempts": 1, "validated": True, "job_status": "ok",
                                    "cost_usd": 0.01, "knobs_changed": arm % 2})
    return episode


if __name__ == "__main__":  # python bandit.py RUN_DIR STEPS [resume]
    from nestor.outer.config import RunConfig
    from nestor.outer.loop import OuterLoop

    run_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
    cfg = RunConfig(tasks=["a", "b"], group_size=2, groups_per_step=1, max_in_flight=4,
                    steps=steps, seed=3)
    random.seed(0)
    loop = OuterLoop(cfg, BanditPolicy(), make_episode_fn(delay=0.15), run_dir)
    if len(sys.argv) > 3:
        loop.resume()
    loop.run()
