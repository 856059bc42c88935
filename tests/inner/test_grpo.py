"""The GRPO trainer's math and mechanics on a small random Qwen3 (fast, CPU, float32)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nestor.inner.grpo import (
    GRPOTrainer,
    RewardError,
    accumulate_grads,
    completion_logits,
    group_advantages,
    policy_loss,
    token_logprobs,
)
from nestor.job.config import JobConfig
from nestor.models.sampler import left_pad
from nestor.models.tokenizer import build_char_tokenizer

PROMPTS = ["reverse abc", "reverse hello", "sort dcba", "reverse xy", "sort qwerty", "reverse k"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def tiny_model(tok, seed: int = 0) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).float()


def lowercase_share(tasks: list[int], texts: list[str]) -> list[float]:
    """A reward with variance on a random model: fraction of lowercase letters."""
    return [sum(c.islower() for c in t) / max(len(t), 1) for t in texts]


def config(**kw) -> JobConfig:
    base = dict(max_steps=2, prompts_per_step=3, group_size=4, max_new_tokens=6,
                learning_rate=1e-3, seed=7)
    return JobConfig(**{**base, **kw})


def params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_group_advantages_centre_and_flag_zero_variance():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3]])
    adv, zero = group_advantages(rewards, scale=False)
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, 0.0, 0.0]))
    assert torch.equal(zero, torch.tensor([False, True]))
    scaled, _ = group_advantages(rewards, scale=True)
    assert scaled[0, 0] == pytest.approx(0.5 / (0.125 ** 0.5 + 1e-4), rel=1e-3)
    assert torch.all(scaled[1] == 0)


def test_loss_gradient_only_on_completion_tokens():
    logp = torch.randn(3, 5).clamp(max=-0.1).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0, 0.5])
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, int(mask.sum()), clip_ratio=0.2)
    loss.backward()
    assert torch.all(logp.grad[~mask] == 0)
    assert torch.all(logp.grad[mask] != 0)
    # On-policy the gradient is -adv / n_tokens per token: the plain policy gradient.
    expected = (-adv[:, None] / mask.sum()).expand(3, 5)
    assert torch.allclose(logp.grad[mask], expected[mask])


def test_pad_tokens_after_eos_do_not_change_the_loss(tok):
    model = tiny_model(tok)
    ids, pmask = left_pad([[5, 6, 7, 8], [9, 10]], tok.pad_token_id, 'cpu')
    comp = torch.tensor([[20, 21, 3, 0, 0], [22, 3, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    rows = torch.arange(2)

    def loss_and_grad(completion):
        model.zero_grad()
        logp = token_logprobs(completion_logits(model, ids, pmask, completion, rows), completion, 1.0)
        loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), mask, 5, 0.2)
        loss.backward()
        return float(loss.detach()), model.model.embed_tokens.weight.grad.clone()

    l1, g1 = loss_and_grad(comp)
    garbage = comp.clone()
    garbage[~mask] = 40  # anything may sit after eos
    l2, g2 = loss_and_grad(garbage)
    assert l1 == pytest.approx(l2, abs=1e-6)
    assert torch.allclose(g1, g2, atol=1e-6)


def test_trainer_logprobs_match_sampler_and_ratio_is_one(tok):
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lowercase_share, config(temperature=0.8))
    ro = trainer.rollout()
    prompt_ids, prompt_mask = left_pad([trainer.prompt_tokens[t] for t in ro.task_indices],
                                       trainer.pad_id, "cpu")
    rows = torch.arange(3).repeat_interleave(4)
    with torch.no_grad():
        logits = completion_logits(trainer.model, prompt_ids, prompt_mask, ro.completion_ids, rows)
    logp = token_logprobs(logits, ro.completion_ids, 0.8)
    m = ro.completion_mask
    assert m.any(1).all()
    assert (logp - ro.old_logprobs)[m].abs().max() < 1e-4
    ratio = torch.exp(logp - ro.old_logprobs)[m]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4)


def test_clipping_zeroes_gradient_outside_the_trust_region():
    old = torch.full((2, 3), -1.0)
    mask = torch.ones(2, 3, dtype=torch.bool)
    # Ratio e^0.5 ≈ 1.65 > 1.2: a positive advantage is clipped (no push further up) ...
    logp = (old + 0.5).requires_grad_(True)
    loss, stats = policy_loss(logp, old, torch.tensor([1.0, 1.0]), mask, 6, clip_ratio=0.2)
    loss.backward()
    assert torch.all(logp.grad == 0) and stats["clip_tokens"] == 6
    # ... a negative advantage still pulls it back down.
    logp2 = (old + 0.5).requires_grad_(True)
    loss, stats = policy_loss(logp2, old, torch.tensor([-1.0, -1.0]), mask, 6, clip_ratio=0.2)
    loss.backward()
    assert torch.all(logp2.grad > 0) and stats["clip_tokens"] == 0
    # Without clipping the positive case has a gradient.
    logp3 = (old + 0.5).requires_grad_(True)
    policy_loss(logp3, old, torch.tensor([1.0, 1.0]), mask, 6, clip_ratio=0.0)[0].backward()
    assert torch.all(logp3.grad < 0)


def test_second_update_pass_is_off_policy_and_clips(tok):
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lowercase_share,
                          config(updates_per_step=3, learning_rate=1e-2, clip_ratio=0.02))
    m = trainer.step()
    assert m["kl_sampler"] < 1e-6  # first pass: on-policy
    assert m["kl_old"] > 1e-6 and m["clip_frac"] > 0  # last pass: moved, and clipping bit


def test_zero_variance_groups_are_skipped(tok):
    model = tiny_model(tok)
    before = params(model)
    trainer = GRPOTrainer(model, tok, PROMPTS, lambda t, c: [0.5] * len(c), config(max_steps=1))
    m = trainer.step()
    assert m["zero_var_frac"] == 1.0 and m["groups_trained"] == 0
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())

    # Only the groups with signal are trained on: one of three here.
    def one_group(tasks, texts):
        return [float(i % 2) if i < 4 else 1.0 for i in range(len(texts))]

    m = GRPOTrainer(tiny_model(tok), tok, PROMPTS, one_group, config(max_steps=1)).step()
    assert m["groups_trained"] == 1 and m["zero_var_frac"] == pytest.approx(2 / 3)


def test_kept_zero_variance_groups_do_not_count_as_trained(tok):
    """skip_zero_variance=false keeps constant-reward groups in the update, but their advantage
    is 0: such a job learned nothing and must not pass the reward's `trained` gate (a job
    writer found this: weight decay alone then moved the weights)."""
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lambda t, c: [0.5] * len(c),
                          config(max_steps=1, skip_zero_variance=False, weight_decay=0.01))
    m = trainer.step()
    assert m["zero_var_frac"] == 1.0 and m["groups_trained"] == 0


def test_lora_updates_only_adapter_weights(tok):
    model = tiny_model(tok)
    trainer = GRPOTrainer(model, tok, PROMPTS, lowercase_share,
                          config(lora_rank=4, learning_rate=1e-2, kl_coef=0.1))
    before = params(trainer.model)
    m = trainer.step()
    assert m["groups_trained"] > 0 and "kl_ref" in m
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)


def test_full_finetune_with_kl_keeps_reference_frozen(tok):
    base = tiny_model(tok)
    ref = tiny_model(tok)
    ref_before = params(ref)
    trainer = GRPOTrainer(base, tok, PROMPTS, lowercase_share, config(kl_coef=0.5, max_steps=2),
                          ref_model=ref)
    hist = trainer.train()
    assert hist[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # starts at the reference
    assert hist[1]["kl_ref"] > 0
    assert all(torch.equal(ref_before[n], p) for n, p in ref.named_parameters())


def test_same_seed_same_run(tok):
    def run():
        trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lowercase_share, config(max_steps=3))
        hist = trainer.train()
        return [h["reward_mean"] for h in hist], params(trainer.model)

    r1, p1 = run()
    r2, p2 = run()
    assert r1 == r2
    assert all(torch.equal(p1[n], p2[n]) for n in p1)
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lowercase_share, config(max_steps=3, seed=8))
    assert [h["reward_mean"] for h in trainer.train()] != r1


def test_bad_rewards_raise_a_clear_error(tok):
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lambda t, c: [1.0], config())
    with pytest.raises(RewardError, match="1 rewards for 12"):
        trainer.step()
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS,
                          lambda t, c: [float("nan")] * len(c), config())
    with pytest.raises(RewardError, match="NaN"):
        trainer.step()


def test_stop_between_steps(tok):
    trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lowercase_share, config(max_steps=5))
    hist = trainer.train(should_stop=lambda: trainer.step_count >= 2)
    assert len(hist) == 2


@pytest.mark.slow
def test_training_raises_the_reward_and_its_negation_lowers_it(tok):
    """The whole loop has the right sign: GRPO climbs a reward a random model can reach."""
    def curve(reward):
        trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, reward,
                              config(max_steps=15, learning_rate=1e-2, prompts_per_step=4,
                                     group_size=8, max_new_tokens=6))
        return [m["reward_mean"] for m in trainer.train()]

    up = curve(lowercase_share)
    assert sum(up[-3:]) / 3 > up[0] + 0.2
    down = curve(lambda t, c: [1.0 - r for r in lowercase_share(t, c)])
    assert sum(down[-3:]) / 3 > down[0] + 0.2  # 1 - lowercase share rises: lowercase falls


def test_bf16_full_finetune_keeps_float32_master_weights(tok):
    # The GPU path: Qwen3 weights are bf16. AdamW's ~lr-sized steps are below a bf16 weight's
    # rounding step, so plain AdamW on the bf16 weights leaves most of them where they were.
    model = tiny_model(tok).to(torch.bfloat16)
    trainer = GRPOTrainer(model, tok, PROMPTS, lowercase_share, config(learning_rate=1e-5))
    assert all(m.dtype == torch.float32 for m in trainer.master)
    m = trainer.step()  # a real step runs end to end in bf16 on the CPU
    assert m["groups_trained"] > 0
    assert all(torch.equal(p, mw.to(torch.bfloat16)) for p, mw in
               zip(trainer.params, trainer.master, strict=True))

    def changed_share(step_fn, params) -> float:
        before = [p.detach().clone() for p in params]
        for _ in range(30):  # 30 steps of lr 1e-5 with one constant gradient: ~3e-4 each
            for p in params:
                p.grad = torch.ones_like(p)
            step_fn()
        total = sum(p.numel() for p in params)
        return sum(int((p != b).sum()) for p, b in zip(params, before, strict=True)) / total

    with_master = changed_share(lambda: (accumulate_grads(trainer.params, trainer.master),
                                         trainer._optimizer_step()), trainer.params)
    plain_model = tiny_model(tok).to(torch.bfloat16)
    plain_params = list(plain_model.parameters())
    plain = torch.optim.AdamW(plain_params, lr=1e-5, weight_decay=0.0, betas=(0.9, 0.99))
    without = changed_share(plain.step, plain_params)
    assert with_master > 0.5 and without < 0.2, (with_master, without)


def test_micro_batch_knob_gives_the_full_batch_loss(tok):
    # JobConfig.micro_batch_prompts splits a step into gradient-accumulated passes: the loss
    # and the update are those of the whole batch (up to float rounding).
    def run(micro):
        trainer = GRPOTrainer(tiny_model(tok), tok, PROMPTS, lowercase_share,
                              config(max_steps=1, micro_batch_prompts=micro))
        calls, grads = [], {}
        trainer.model.register_forward_hook(lambda mod, args, kw, out: calls.append(1),
                                            with_kwargs=True)
        step = trainer.opt.step
        trainer.opt.step = lambda: (grads.update(
            {n: p.grad.clone() for n, p in trainer.model.named_parameters()}), step())
        hist = trainer.train()
        return hist[0], grads, len(calls)

    full, g_full, n_full = run(0)
    micro, g_micro, n_micro = run(1)
    assert full["groups_trained"] == micro["groups_trained"] >= 2
    assert micro["loss"] == pytest.approx(full["loss"], abs=1e-6)
    assert g_full and all(torch.allclose(g_full[n], g_micro[n], atol=1e-6) for n in g_full)
    assert n_micro > n_full  # it really went through in more, smaller passes


def test_bf16_micro_batch_gradients_accumulate_in_float32():
    # Two micro-batches of a bf16 weight: a small gradient after a large one must survive the
    # sum (in bf16, 1 + 2**-9 rounds back to 1: the second micro-batch would count for nothing).
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    master = p.detach().float()
    small = 2.0 ** -9
    for g in (1.0, small):
        p.grad = torch.full((3,), g, dtype=torch.bfloat16)
        accumulate_grads([p], [master])
        assert p.grad is None  # moved out, so the next backward starts from zero
    assert torch.equal(master.grad, torch.full((3,), 1.0 + small))
    assert float(torch.tensor(1.0, dtype=torch.bfloat16) + small) == 1.0  # what bf16 would keep
    f32 = torch.nn.Parameter(torch.zeros(2))  # a float32 param is its own master: untouched
    f32.grad = torch.ones(2)
    accumulate_grads([f32], [f32])
    assert torch.equal(f32.grad, torch.ones(2))

