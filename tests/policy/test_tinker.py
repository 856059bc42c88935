"""The Tinker policy: datums checked against the SDK's own types, and a whole training step on
the local service (real tensors on tiny-m through the SDK's client surface)."""

import math

import pytest
import torch
from tinker import types

from nestor.policy.base import Message, Observation, TrainItem, Turn
from nestor.policy.tinker import TinkerPolicy, TinkerPolicyError, turn_datum
from nestor.policy.tinker_local import LocalService


def test_datum_shapes_and_masks_use_sdk_types():
    turn = Turn(message=Message("assistant", "x"), context_ids=[5, 6, 7],
                action_ids=[8, 9], sample_logprobs=[-0.5, -1.5])
    d = turn_datum(turn, advantage=0.25)
    assert isinstance(d, types.Datum) and isinstance(d.model_input, types.ModelInput)
    assert d.model_input.to_ints() == [5, 6, 7, 8]
    inputs = {k: v.tolist() for k, v in d.loss_fn_inputs.items()}
    assert inputs["target_tokens"] == [6, 7, 8, 9]
    assert inputs["logprobs"] == [0.0, 0.0, -0.5, -1.5]
    assert inputs["advantages"] == [0.0, 0.0, 0.25, 0.25]
    assert d.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert turn_datum(Turn(message=Message("assistant", "")), 1.0) is None


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(TinkerPolicyError, match=r"\$TINKER_API_KEY"):
        TinkerPolicy("Qwen/Qwen3-8B")


@pytest.mark.slow
def test_training_step_on_local_service(tmp_path):
    policy = TinkerPolicy("tiny-m", service=LocalService(), lora_rank=4, learning_rate=1e-2,
                          max_new_tokens=16)
    obs = Observation(messages=[Message("system", "You write jobs."), Message("user", "go")],
                      tools=[])
    turn = policy.act(obs)
    assert len(turn.action_ids) == len(turn.sample_logprobs) > 0
    assert all(lp <= 0 for lp in turn.sample_logprobs)

    # on-policy, the sampled logprobs are what the trainer computes: ratio 1
    d = turn_datum(turn, 1.0)
    model = policy.training.policy.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([d.model_input.to_ints()])).logits[0]
    target = d.loss_fn_inputs["target_tokens"].to_torch()
    logp = torch.log_softmax(logits.float(), -1).gather(-1, target[:, None])[:, 0]
    n = len(turn.action_ids)
    assert torch.allclose(logp[-n:], torch.tensor(turn.sample_logprobs), atol=1e-4)

    before = policy.sampler.model
    lora_before = {k: v.clone() for k, v in model.named_parameters() if v.requires_grad}
    base_before = {k: v.clone() for k, v in model.named_parameters() if not v.requires_grad}
    metrics = policy.train_step([TrainItem(turns=[turn], advantage=1.0, policy_version=0)])
    assert policy.version == 1 and metrics["datums"] == 1 and math.isfinite(metrics["loss:sum"])
    changed = [k for k, v in model.named_parameters() if v.requires_grad
               and not torch.equal(v, lora_before[k])]
    assert changed and all("lora_" in k for k in changed)
    assert all(torch.equal(v, base_before[k]) for k, v in model.named_parameters()
               if not v.requires_grad)
    assert policy.sampler.model is not before  # a fresh sampling client after the step

    # a positive advantage made the sampled turn more likely
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([d.model_input.to_ints()])).logits[0]
    after = torch.log_softmax(logits.float(), -1).gather(-1, target[:, None])[:, 0][-n:].sum()
    assert after > sum(turn.sample_logprobs)

    policy.save(tmp_path / "ckpt")
    again = TinkerPolicy("tiny-m", service=policy.service, lora_rank=4)
    again.load(tmp_path / "ckpt")
    assert again.version == 1
    state = dict(again.training.policy.model.named_parameters())
    assert all(torch.equal(state[k], v) for k, v in model.named_parameters() if v.requires_grad)
