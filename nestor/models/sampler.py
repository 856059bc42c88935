"""Batched sampling with our own KV-cache loop (no `generate`): one prefill, then one forward
per new token on the last token only. Returns token ids, a mask of sampled tokens and their
log-probabilities under the (temperature-scaled) sampling distribution, as RL needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nestor.models.kv_cache import GrowingCache
from nestor.models.loops import check_window, is_check_point, repeat_period
from nestor.models.prefix_cache import PrefixCache


@dataclass
class Samples:
    completion_ids: torch.Tensor  # [B, T] long; pad after eos
    completion_mask: torch.Tensor  # [B, T] bool; True on sampled tokens, eos included
    logprobs: torch.Tensor  # [B, T] float; log p(token) under the sampling distribution, 0 on pads
    texts: list[str]  # decoded completions, eos stripped
    prompt_ids: torch.Tensor  # [B, P] long; the left-padded prompts
    prompt_mask: torch.Tensor  # [B, P] bool; False on left padding


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack prompts right-aligned: ([B, P] ids, [B, P] bool mask)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, p in enumerate(prompts):
        if p:
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p):] = True
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token (left padding gets 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def distinct_rows(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """([U] index of each distinct prompt's first row, [B] index into those for every row)."""
    index: dict[tuple[int, ...], int] = {}
    first, rows = [], []
    for i, p in enumerate(prompts):
        key = tuple(p)
        if key not in index:
            index[key] = len(first)
            first.append(i)
        rows.append(index[key])
    return torch.tensor(first, dtype=torch.long), torch.tensor(rows, dtype=torch.long)


def decode(tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
           eos_id: int) -> list[str]:
    texts = []
    for ids, keep in zip(completion_ids.tolist(), completion_mask.tolist(), strict=True):
        toks = [t for t, k in zip(ids, keep, strict=True) if k and t != eos_id]
        texts.append(tokenizer.decode(toks, skip_special_tokens=False))
    return texts


@torch.no_grad()
def sample(model, prompts: list[list[int]], max_new_tokens: int, *, eos_id: int, pad_id: int,
           temperature: float = 1.0, greedy: bool = False,
           generator: torch.Generator | None = None, tokenizer=None,
           prefix_cache: PrefixCache | None = None, stop_repeats: int = 0) -> Samples:
    """Sample up to `max_new_tokens` per prompt; a row stops at its first `eos_id`.

    `stop_repeats` > 0: a row also stops, without eos, once its last `stop_repeats` tokens or
    more are one piece repeated (`repeat_period`) — a loop that would run to the cap.
    Stopping depends only on tokens already sampled, so the logprobs stay those of the
    sampling distribution, as at the cap.

    `tokenizer` decodes `texts`; by default the one `load_model` attached to the model.
    `prefix_cache`: the prefix all prompts share is taken from (and added to) it; only the
    rest of each prompt is prefilled here.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("sample() needs a non-empty list of non-empty prompts")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}); use greedy=True instead")
    tokenizer = tokenizer or getattr(model, "nestor_tokenizer", None)
    if tokenizer is None:
        raise ValueError("sample() needs tokenizer= (or a model from nestor.models.load_model)")
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = left_pad(prompts, pad_id, device)
    batch = prompt_ids.shape[0]

    # A shared prefix of P0 tokens comes from the prefix cache, as the first P0 columns of the
    # KV cache; each row's own rest follows, left-padded: [prefix | pad | rest]. The padding
    # columns are masked and the positions given explicitly, so every row sees its own prompt.
    shared, cache = (prefix_cache.prefill(model, prompts) if prefix_cache is not None
                     else (0, None))
    # Room for every token this call may add, so decoding writes K/V in place (kv_cache.py).
    cache = (GrowingCache.of(cache, max_new_tokens) if cache is not None
             else GrowingCache(max_new_tokens))
    rest_ids, rest_mask = left_pad([p[shared:] for p in prompts], pad_id, device)  # [B, R]
    attn = torch.cat([torch.ones((batch, shared), dtype=torch.long, device=device),
                      rest_mask.long()], dim=1)  # [B, P0 + R + t], one column more per step
    # Prefill each distinct prompt once (a GRPO group repeats its prompt G times), then gather
    # its KV cache and last logits to every row that shares it: the prefill costs P, not P*G.
    first, rows = distinct_rows(prompts)
    if shared and len(first) > 1:
        cache.batch_repeat_interleave(len(first))
    out = model(input_ids=rest_ids[first], attention_mask=attn[first],
                position_ids=shared + positions(rest_mask[first]), past_key_values=cache,
                use_cache=True, logits_to_keep=1)
    if len(first) < batch:
        cache.batch_select_indices(rows.to(device))
    last_logits = out.logits[rows.to(device), -1, :]  # [B, V]
    next_pos = shared + rest_mask.long().sum(-1, keepdim=True)  # [B, 1] position of next token

    # Rows leave the batch (and the KV cache) at their eos, so late steps only pay for the rows
    # still generating; results go to their original row in the [B, T] outputs.
    completion_ids = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    completion_mask = torch.zeros((batch, max_new_tokens), dtype=torch.bool, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
    active = torch.arange(batch, device=device)  # [A] original row of each running row
    steps = 0
    for t in range(max_new_tokens):
        logits = last_logits.float()  # [A, V]
        logp_all = torch.log_softmax(logits / temperature, dim=-1)  # [A, V]
        if greedy:
            tok = logits.argmax(-1)  # [A]
        else:
            tok = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
        completion_ids[active, t] = tok
        completion_mask[active, t] = True
        logprobs[active, t] = logp_all.gather(-1, tok[:, None]).squeeze(-1)
        steps = t + 1
        running = tok != eos_id  # [A]
        if stop_repeats and is_check_point(steps, stop_repeats):
            window = check_window(stop_repeats)
            tails = completion_ids[active, max(0, steps - window):steps].tolist()  # A lists
            looped = [repeat_period(tail, stop_repeats) is not None for tail in tails]
            running &= ~torch.tensor(looped, device=device)
        if t == max_new_tokens - 1 or not bool(running.any()):
            break
        if not bool(running.all()):
            keep = running.nonzero().squeeze(1)
            active, tok, attn, next_pos = active[keep], tok[keep], attn[keep], next_pos[keep]
            cache.batch_select_indices(keep)
        attn = torch.cat([attn, torch.ones((len(active), 1), dtype=attn.dtype, device=device)],
                         dim=1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        last_logits = out.logits[:, -1, :]
        next_pos = next_pos + 1

    completion_ids = completion_ids[:, :steps]  # [B, T]
    completion_mask = completion_mask[:, :steps]  # [B, T]
    logprobs = logprobs[:, :steps]  # [B, T]
    texts = decode(tokenizer, completion_ids, completion_mask, eos_id)
    return Samples(completion_ids, completion_mask, logprobs, texts, prompt_ids, prompt_mask)
