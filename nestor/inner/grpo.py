"""GRPO on a causal LM, as one job's JobConfig says.

One step:
  1. pick P = prompts_per_step prompts; render each with the model's chat template
  2. sample G = group_size completions per prompt in ONE batched, KV-cached call (B = P*G)
  3. score the B completions with `reward_fn` (the job's sandboxed reward server)
  4. advantage = reward - group mean (optionally / group std); groups whose rewards are all
     equal carry no signal and are dropped (optionally)
  5. `updates_per_step` AdamW steps on the token-level importance-ratio loss, PPO-clipped,
     masked to completion tokens, normalised by the number of completion tokens, plus an
     optional k3 KL penalty to the frozen base model. The batch goes through in micro-batches
     of `micro_batch_prompts` prompt groups, gradients accumulated (same loss, less memory).

Weights in bf16/fp16 (Qwen3 on a GPU) are trained through float32 master copies: AdamW's
step (~lr per weight) is below a bf16 weight's rounding step (~weight/256) at sane learning
rates, so updating the bf16 weights in place would mostly round away. The optimizer updates
the float32 masters; the model's weights are their rounded copies.

Row b of a step's batch is completion g of prompt p with b = p*G + g. All the math is in
`policy_loss` and `group_advantages`; the rest is bookkeeping.
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache

from nestor.job.config import JobConfig
from nestor.models.sampler import left_pad, sample
from nestor.models.testformat import test_format_ids

RewardFn = Callable[[list[int], list[str]], list[float]]  # (task indices, completions) -> rewards


class RewardError(RuntimeError):
    """The reward function returned something that is not one finite float per completion."""


# ----------------------------------------------------------------------------- the math

def group_advantages(rewards: Tensor, scale: bool) -> tuple[Tensor, Tensor]:
    """rewards [P, G] -> (advantages [P, G], zero_variance [P] bool)."""
    mean = rewards.mean(dim=1, keepdim=True)  # [P, 1]
    std = rewards.std(dim=1, keepdim=True, unbiased=False)  # [P, 1]
    adv = rewards - mean
    if scale:
        adv = adv / (std + 1e-4)
    zero_variance = std.squeeze(1) < 1e-6  # [P]
    return adv, zero_variance


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || ref) on tokens sampled from pi: e^d - d - 1, d = ref - pi.
    Non-negative, unbiased, low variance (Schulman's 'Approximating KL divergence')."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def policy_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, n_tokens: int,
                clip_ratio: float, kl_coef: float = 0.0,
                ref_logp: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Token-level importance-ratio policy gradient with PPO clipping.

    logp, old_logp, ref_logp: [B, T] log-probs of the sampled tokens under the current policy
    (with grad), the policy that sampled them, and the frozen base; adv: [B]; mask: [B, T] bool
    (completion tokens only: prompt and pad carry no loss); n_tokens: completion tokens in the
    whole step's batch (micro-batches share one normaliser).
    """
    adv = adv[:, None]  # [B, 1]
    ratio = torch.exp(logp - old_logp)  # [B, T]; 1 on-policy
    per_token = -adv * ratio  # [B, T]
    clipped = torch.zeros_like(ratio, dtype=torch.bool)
    if clip_ratio > 0:
        per_token_clipped = -adv * ratio.clamp(1 - clip_ratio, 1 + clip_ratio)
        clipped = per_token_clipped > per_token  # the pessimistic term wins: no gradient
        per_token = torch.maximum(per_token, per_token_clipped)
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)  # [B, T]
        if kl_coef > 0:
            per_token = per_token + kl_coef * kl
    m = mask.to(per_token.dtype)
    loss = (per_token * m).sum() / max(n_tokens, 1)
    with torch.no_grad():
        stats = {"clip_tokens": float((clipped & mask).sum()),
                 "kl_old_sum": float((k3_kl(logp, old_logp) * m).sum())}
        if kl is not None:
            stats["kl_ref_sum"] = float((kl * m).sum())
    return loss, stats


# ----------------------------------------------------------------------------- forward pass

def accumulate_grads(params: list[Tensor], masters: list[Tensor]) -> None:
    """Move each low-precision param's gradient of one micro-batch into its float32 master's,
    summed there in float32: summed in bf16, a micro-batch's gradient below 1/256 of the running
    sum would round away. float32 params are their own masters and accumulate in place."""
    for p, m in zip(params, masters, strict=True):
        if m is p or p.grad is None:
            continue
        g = p.grad.float()
        m.grad = g if m.grad is None else m.grad.add_(g)
        p.grad = None


def completion_logits(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                      rows: Tensor) -> Tensor:
    """Logits predicting each completion token, with the prompt prefix computed once per prompt.

    prompt_ids, prompt_mask: [P, Lp] left-padded; completion_ids: [B, T]; rows: [B] index of
    each completion's prompt. The P prompts are run once and their KV cache is gathered to the
    B rows (autograd flows through the gather), so a group of G completions pays for its prompt
    once, in the forward and the backward pass. Returns [B, T, V].
    """
    B, T = completion_ids.shape
    pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)  # [P, Lp]; pads sit at 0
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompt_ids, attention_mask=prompt_mask.long(), position_ids=pos,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    first = out.logits[rows]  # [B, 1, V]: predicts completion token 0
    if T == 1:
        return first
    cache.batch_select_indices(rows)  # [P, ...] -> [B, ...]
    attn = torch.cat([prompt_mask[rows].long(),
                      torch.ones(B, T - 1, dtype=torch.long, device=completion_ids.device)], 1)
    cpos = prompt_mask[rows].long().sum(-1, keepdim=True) + torch.arange(
        T - 1, device=completion_ids.device)  # [B, T-1]
    out = model(input_ids=completion_ids[:, :-1], attention_mask=attn, position_ids=cpos,
                past_key_values=cache, use_cache=True)
    return torch.cat([first, out.logits], dim=1)  # [B, T, V]


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """logits [B, T, V], tokens [B, T] -> log-prob of each token under softmax(logits / temp)."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # [B, T]


def render_prompt(tokenizer, prompt: str) -> list[int]:
    """The token ids the base model sees: one user message, then the assistant turn opening."""
    return test_format_ids(tokenizer, prompt)


# ----------------------------------------------------------------------------- the trainer

@dataclass
class Rollouts:
    """One step's sampled and scored batch, before zero-variance groups are dropped."""

    task_indices: list[int]  # [P] which job task each prompt is
    completion_ids: Tensor  # [B, T], B = P*G, pad after eos
    completion_mask: Tensor  # [B, T] bool, True on sampled tokens incl. eos
    old_logprobs: Tensor  # [B, T] sampler's log-probs (the behaviour policy)
    rewards: Tensor  # [P, G]
    texts: list[str]  # [B]


class GRPOTrainer:
    """Trains `model` in place (wrapped in a LoRA adapter when config.lora_rank > 0).

    prompts: the job's task prompts (plain user messages); reward_fn(task_indices, texts)
    scores completions. ref_model: the frozen base for the KL term of a full fine-tune (LoRA
    uses the adapter-disabled model instead); only used when config.kl_coef > 0.
    micro_batch_groups: how many prompt groups go through one forward/backward (memory knob;
    None = config.micro_batch_prompts, 0 there = all at once); results do not depend on it
    beyond float rounding.
    """

    def __init__(self, model, tokenizer, prompts: list[str], reward_fn: RewardFn,
                 config: JobConfig, *, ref_model=None, micro_batch_groups: int | None = None):
        if not prompts:
            raise ValueError("the job has no prompts to train on")
        self.config = config
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.micro = micro_batch_groups or config.micro_batch_prompts or None
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.prompt_tokens = [render_prompt(tokenizer, p) for p in prompts]
        torch.manual_seed(config.seed)  # LoRA init
        if config.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(
                r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0,
                target_modules="all-linear", task_type="CAUSAL_LM"))
        else:
            for p in model.parameters():
                p.requires_grad_(True)
        self.model = model
        self.ref_model = None
        if config.kl_coef > 0 and config.lora_rank == 0:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.eval().requires_grad_(False)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]  # inner/change.py matches them to the base's
        self.params = [p for _, p in named]
        # float32 master weights for low-precision trainables (the optimizer's view of them)
        self.master = [p if p.dtype == torch.float32 else p.detach().float()
                       for p in self.params]
        # LoRA's starting adapter (small): inner/change.py measures how far training moved it
        self.initial_params = [m.detach().clone() for m in self.master] \
            if config.lora_rank > 0 else []
        self.opt = torch.optim.AdamW(self.master, lr=config.learning_rate,
                                     weight_decay=config.weight_decay, betas=(0.9, 0.99))
        self.generator = torch.Generator(next(model.parameters()).device).manual_seed(config.seed)
        self._rng = random.Random(config.seed)
        self._order: list[int] = []
        self.step_count = 0
        self.optimizer_steps = 0  # AdamW steps taken (inner/change.py removes their decay)

    # -- rollouts

    def _next_tasks(self, n: int) -> list[int]:
        """Epochs over a seeded shuffle of the tasks, like a data loader."""
        out = []
        while len(out) < n:
            if not self._order:
                self._order = list(range(len(self.prompt_tokens)))
                self._rng.shuffle(self._order)
            out.append(self._order.pop())
        return out

    @torch.no_grad()
    def rollout(self) -> Rollouts:
        cfg = self.config
        P, G = cfg.prompts_per_step, cfg.group_size
        tasks = self._next_tasks(P)
        prompts = [self.prompt_tokens[t] for t in tasks for _ in range(G)]  # [B]
        self.model.eval()
        s = sample(self.model, prompts, cfg.max_new_tokens, eos_id=self.eos_id,
                   pad_id=self.pad_id, temperature=cfg.temperature, generator=self.generator,
                   tokenizer=self.tokenizer)
        rewards = self.reward_fn([t for t in tasks for _ in range(G)], list(s.texts))
        if len(rewards) != P * G:
            raise RewardError(f"reward function returned {len(rewards)} rewards for {P * G} "
                              "completions")
        try:
            r = torch.tensor([float(x) for x in rewards], dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise RewardError(f"reward function returned a non-number: {exc}") from None
        if not torch.isfinite(r).all():
            raise RewardError("reward function returned NaN or infinity")
        return Rollouts(tasks, s.completion_ids, s.completion_mask.bool(), s.logprobs.float(),
                        r.view(P, G), list(s.texts))

    # -- one step

    def _ref_logprobs(self, prompt_ids, prompt_mask, comp_ids, rows) -> Tensor:
        with torch.no_grad():
            if self.config.lora_rank > 0:
                with self.model.disable_adapter():
                    logits = completion_logits(self.model, prompt_ids, prompt_mask, comp_ids,
                                               rows)
            else:
                logits = completion_logits(self.ref_model, prompt_ids, prompt_mask, comp_ids,
                                           rows)
            return token_logprobs(logits, comp_ids, self.config.temperature)

    def step(self) -> dict:
        cfg = self.config
        t0 = time.perf_counter()
        ro = self.rollout()
        t_sampled = time.perf_counter()

        adv, zero_var = group_advantages(ro.rewards, cfg.scale_rewards)  # [P, G], [P]
        keep = (~zero_var).nonzero().squeeze(1) if cfg.skip_zero_variance \
            else torch.arange(len(ro.task_indices))  # [K] kept prompt groups
        metrics = {
            "step": self.step_count + 1,
            "reward_mean": float(ro.rewards.mean()),
            "reward_std": float(ro.rewards.std(unbiased=False)),
            "zero_var_frac": float(zero_var.float().mean()),
            "completion_len": float(ro.completion_mask.sum(1).float().mean()),
            # Monte Carlo estimate of the sampling distribution's entropy: E[-log p(token)].
            "entropy": float(-ro.old_logprobs[ro.completion_mask].mean()),
        }
        stats = self._update(ro, adv, keep) if len(keep) else {}
        self.step_count += 1
        t_end = time.perf_counter()
        n_sampled = int(ro.completion_mask.sum())
        metrics.update(stats)
        metrics.update({"sample_s": t_sampled - t0, "update_s": t_end - t_sampled,
                        "step_s": t_end - t0, "tokens_per_s": n_sampled / max(t_end - t0, 1e-9),
                        # groups learned from: kept *and* with reward variance (a kept
                        # zero-variance group has advantage 0; the reward's `trained` reads this)
                        "groups_trained": int((~zero_var)[keep].sum())})
        return metrics

    def _update(self, ro: Rollouts, adv: Tensor, keep: Tensor) -> dict:
        cfg = self.config
        G = cfg.group_size
        dev = next(self.model.parameters()).device
        prompt_ids, prompt_mask = left_pad([self.prompt_tokens[ro.task_indices[k]]
                                            for k in keep.tolist()], self.pad_id, dev)  # [K, Lp]
        rows_all = (keep[:, None] * G + torch.arange(G)).reshape(-1)  # [K*G] batch rows kept
        comp_ids = ro.completion_ids.to(dev)[rows_all.to(dev)]  # [K*G, T]
        mask = ro.completion_mask.to(dev)[rows_all.to(dev)]  # [K*G, T]
        old_logp = ro.old_logprobs.to(dev)[rows_all.to(dev)]  # [K*G, T]
        advantages = adv[keep].reshape(-1).to(dev)  # [K*G]
        T = int(mask.any(0).nonzero().max()) + 1  # the kept rows may all end early
        comp_ids, mask, old_logp = comp_ids[:, :T], mask[:, :T], old_logp[:, :T]
        n_tokens = int(mask.sum())
        K = len(keep)
        chunk = self.micro or K
        ref_logp = None
        if cfg.kl_coef > 0:
            ref_logp = torch.cat([self._ref_logprobs(
                prompt_ids[i:i + chunk], prompt_mask[i:i + chunk], comp_ids[i * G:(i + chunk) * G],
                torch.arange(min(chunk, K - i), device=dev).repeat_interleave(G))
                for i in range(0, K, chunk)])

        self.model.eval()  # no dropout: the trainer's log-probs must equal the sampler's
        out: dict = {}
        for update in range(cfg.updates_per_step):
            totals = {"loss": 0.0, "clip_tokens": 0.0, "kl_old_sum": 0.0, "kl_ref_sum": 0.0}
            self.opt.zero_grad(set_to_none=True)
            for p in self.params:
                p.grad = None
            for i in range(0, K, chunk):
                k = min(chunk, K - i)
                rows = torch.arange(k, device=dev).repeat_interleave(G)  # [k*G] -> prompt in chunk
                sl = slice(i * G, (i + k) * G)
                logits = completion_logits(self.model, prompt_ids[i:i + k],
                                           prompt_mask[i:i + k], comp_ids[sl], rows)  # [k*G,T,V]
                logp = token_logprobs(logits, comp_ids[sl], cfg.temperature)  # [k*G, T]
                loss, st = policy_loss(logp, old_logp[sl], advantages[sl], mask[sl], n_tokens,
                                       cfg.clip_ratio, cfg.kl_coef,
                                       None if ref_logp is None else ref_logp[sl])
                loss.backward()
                accumulate_grads(self.params, self.master)
                totals["loss"] += float(loss.detach())
                for key, v in st.items():
                    totals[key] += v
            grad_norm = self._optimizer_step()
            if update == 0:
                # On the first pass the trainer's policy is the sampler's: kl_old measures
                # their mismatch (0 up to float error on CPU float32).
                out["kl_sampler"] = totals["kl_old_sum"] / max(n_tokens, 1)
            out.update(loss=totals["loss"], grad_norm=float(grad_norm),
                       clip_frac=totals["clip_tokens"] / max(n_tokens, 1),
                       kl_old=totals["kl_old_sum"] / max(n_tokens, 1))
            if ref_logp is not None:
                out["kl_ref"] = totals["kl_ref_sum"] / max(n_tokens, 1)
        self.opt.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None
        return out

    def _optimizer_step(self) -> Tensor:
        """Clip and step on the float32 masters (their grads summed by accumulate_grads), then
        copy them into the model's weights."""
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.master, self.config.grad_clip if self.config.grad_clip > 0 else math.inf)
        self.opt.step()
        self.optimizer_steps += 1
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                if m is not p:
                    p.copy_(m)  # rounded to the model's dtype; the master keeps the rest
        return grad_norm

    def train(self, *, should_stop: Callable[[], bool] | None = None,
              on_step: Callable[[dict], None] | None = None) -> list[dict]:
        """Run up to config.max_steps steps; `should_stop` is checked between steps."""
        history = []
        while self.step_count < self.config.max_steps:
            if should_stop is not None and should_stop():
                break
            m = self.step()
            history.append(m)
            if on_step is not None:
                on_step(m)
        return history
