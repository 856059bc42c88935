"""Marginal credit for a factored policy: which choice of each decision raised the reward.

The composer samples its decisions independently, so the reward's dependence on one decision
can be read off the episodes directly: for decision d and choice c, the mean advantage of the
episodes that chose c (advantage = reward − group mean) estimates E[A | d = c], the choice's
marginal effect under the current policy. Pooled over every episode seen (counts decayed by
`decay` per step, so the estimates follow the moving policy) and shrunk toward 0 by `prior`
pseudo-episodes, the estimates are steady after ~100 episodes where one episode's advantage
is mostly the noise of the other 25 decisions.

The update is the all-choice policy gradient of each decision with these estimates,

    loss = −Σ_d Σ_c softmax(logits_d)_c · est_{d,c},

taken with plain SGD: a decision whose estimates are all near 0 (it does not matter) barely
moves, where Adam would move every logit by ~lr per step whatever the evidence.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class MarginalCredit:
    def __init__(self, prior: float = 4.0, decay: float = 0.9):
        self.prior, self.decay = prior, decay
        self.sums: dict[str, torch.Tensor] = {}  # action key -> [n_choices] Σ advantage
        self.counts: dict[str, torch.Tensor] = {}  # action key -> [n_choices] episodes

    def update(self, actions: Iterable[tuple[str, int, int, float]]) -> None:
        """Decay the old evidence once, then add (action key, n_choices, choice, advantage)."""
        for key in self.sums:
            self.sums[key] *= self.decay
            self.counts[key] *= self.decay
        for key, n, idx, adv in actions:
            if key not in self.sums or self.sums[key].numel() != n:
                self.sums[key], self.counts[key] = torch.zeros(n), torch.zeros(n)
            self.sums[key][idx] += adv
            self.counts[key][idx] += 1.0

    def estimates(self, key: str) -> torch.Tensor | None:
        """[n_choices] shrunk mean advantage per choice, or None if never seen."""
        if key not in self.sums:
            return None
        return self.sums[key] / (self.counts[key] + self.prior)

    def keys(self) -> list[str]:
        return list(self.sums)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"sums": dict(self.sums), "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        self.sums = {k: v.clone() for k, v in state.get("sums", {}).items()}
        self.counts = {k: v.clone() for k, v in state.get("counts", {}).items()}
