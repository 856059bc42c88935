"""The importance-sampling loss: masking, PPO clipping, truncation (value and gradient)."""

import pytest
import torch

from nestor.policy.is_loss import importance_sampling_loss


def test_masked_positions_carry_no_loss_or_gradient():
    # Prompts and tool results are masked out: neither their value nor their gradient counts.
    logp = torch.randn(2, 5, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    loss, _ = importance_sampling_loss(logp, torch.zeros(2, 5), torch.tensor([1.0, -0.5]), mask)
    loss.backward()
    assert torch.all(logp.grad[0, 2:] == 0) and torch.all(logp.grad[0, :2] != 0)


def test_clipping_is_pessimistic():
    logp = torch.log(torch.tensor([[2.0, 0.5]]))
    loss, stats = importance_sampling_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]),
                                           torch.ones(1, 2, dtype=torch.bool), clip_ratio=0.2)
    # A > 0: ratio 2 is clipped to 1.2, ratio 0.5 keeps its (lower) value.
    assert float(loss) == pytest.approx(-(1.2 + 0.5))
    assert stats["clipped_frac"] == pytest.approx(0.5)


def test_truncated_importance_ratio_caps_value_and_gradient():
    logp = torch.log(torch.tensor([[50.0, 0.5]])).requires_grad_()
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool)
    loss, stats = importance_sampling_loss(logp, torch.zeros(1, 2), adv, mask, tis_cap=2.0)
    loss.backward()
    # ratio 50 counts as 2 (value and gradient 2·∇logp); ratio 0.5 is untouched
    assert float(loss.detach()) == pytest.approx(-(2.0 + 0.5))
    assert logp.grad.tolist()[0] == pytest.approx([-2.0, -0.5])
    assert stats["truncated_frac"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(50)
    uncapped, _ = importance_sampling_loss(logp, torch.zeros(1, 2), adv, mask, tis_cap=0.0)
    assert float(uncapped.detach()) == pytest.approx(-50.5)
