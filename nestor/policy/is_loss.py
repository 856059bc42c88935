"""The importance-sampling policy-gradient loss, in one place: the LM policy and the tinker
policy (any policy that records per-action sample logprobs) train with it.

    loss = -(1/N) Σ_episodes Σ_{policy tokens t} exp(logp_θ(t) - logp_sample(t)) · A_episode

N is the number of episodes in the batch (a constant per step, so the learning rate does not
depend on batch size). Prompts, user text and tool results are never actions, so they carry no
loss. Off-policy turns (sampled several versions ago, or by a sampler whose numerics differ from
the trainer's, e.g. bf16 on a GPU) can have huge per-token ratios, so each ratio is truncated at
`tis_cap` C (truncated importance sampling): above C the term is C·A with the gradient
C·A·∇logp_θ, not ratio·A·∇logp_θ. With `clip_ratio` c > 0 each term is then the PPO pessimistic
min of the plain and the clipped ratio (clipped to [1-c, 1+c]).
"""

from __future__ import annotations

import torch

DEFAULT_TIS_CAP = 2.0


def importance_sampling_loss(logp: torch.Tensor, logp_sample: torch.Tensor,
                             advantages: torch.Tensor, mask: torch.Tensor,
                             clip_ratio: float = 0.0,
                             tis_cap: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Sum over masked actions of -min(ratio, C)·A (C = tis_cap; 0 = no cap), PPO-clipped.

    logp, logp_sample, mask: [N, T] (mask True on policy-produced actions); advantages: [N].
    Returns the summed loss (caller normalises) and ratio statistics over the masked actions.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - logp_sample)  # [N, T]
    weight = ratio  # [N, T]: the ratio as the loss uses it
    truncated = torch.zeros_like(ratio, dtype=torch.bool)
    if tis_cap > 0:
        truncated = ratio.detach() > tis_cap
        # value C, gradient C·∇logp (the ratio's direction kept, its size capped)
        weight = torch.where(truncated, ratio * (tis_cap / ratio.detach()), ratio)
    adv = advantages.to(logp.dtype)[:, None]  # [N, 1]
    objective = weight * adv  # [N, T]
    clipped_frac = 0.0
    if clip_ratio > 0:
        clipped = torch.clamp(weight, 1.0 - clip_ratio, 1.0 + clip_ratio) * adv
        objective = torch.minimum(objective, clipped)
        was_clipped = (clipped < weight * adv).to(logp.dtype)
        clipped_frac = float((was_clipped * mask).sum() / mask.sum().clamp(min=1))
    loss = -(objective * mask).sum()
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {"ratio_mean": float((ratio * mask).sum() / n),
                 "ratio_max": float((ratio * mask).max()) if mask.any() else 1.0,
                 "clipped_frac": clipped_frac,
                 "truncated_frac": float((truncated.to(logp.dtype) * mask).sum() / n)}
    return loss, stats
