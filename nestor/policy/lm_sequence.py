"""One token sequence per multi-turn episode, and the log-probabilities of its actions.

An episode of a token policy is turns of (context ids, action ids, sample logprobs). When each
turn's context starts with the previous turn's context + actions (a prefix extension: the
policy renders the next turn by appending to what it sampled, see `LMPolicy.context_for`), the
whole episode is one sequence, the last context + the last actions, with the actions of every
turn marked. The trainer then scores the episode in one forward pass instead of one re-score of
the whole context per turn (K turns of a C-token context: C tokens, not K·C). Where a context
is not a prefix extension (a chat template that re-renders or strips earlier turns, a context
cut to the window), `episode_sequence` answers None and the trainer scores turn by turn.

Supervised fine-tuning uses the same packing: the action mask is the loss mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from nestor.policy.base import Turn


class PackedSequence(NamedTuple):
    """A token sequence with its actions marked (a tuple: `ids, mask, logprobs = packed`)."""

    input_ids: list[int]  # [S] context and action tokens, in order
    action_mask: list[bool]  # [S] True where the token is an action (sampled by the policy)
    sample_logprobs: list[float]  # [A] logprob of each action under the sampler, A = sum(mask)


def turn_sequence(turn: Turn) -> PackedSequence:
    """One turn on its own: its context, then its actions."""
    ids = list(turn.context_ids) + list(turn.action_ids)
    mask = [False] * len(turn.context_ids) + [True] * len(turn.action_ids)
    return PackedSequence(ids, mask, list(turn.sample_logprobs))


def is_prefix_extension(previous: list[int], context: list[int]) -> bool:
    """Whether `context` starts with all of `previous` (what acting saw, token for token)."""
    return len(context) >= len(previous) and context[:len(previous)] == previous


def episode_sequence(turns: list[Turn]) -> PackedSequence | None:
    """The episode's turns as one sequence, or None when some turn's context does not start
    with the previous turn's context + actions (then score `turn_sequence` per turn).

    Turns without actions are skipped (they carry no loss); a turn's actions must come with one
    sample logprob each. Raises ValueError on a turn whose logprobs do not match its actions.
    """
    turns = [t for t in turns if t.action_ids]
    for t in turns:
        if len(t.sample_logprobs) != len(t.action_ids):
            raise ValueError(f"a turn has {len(t.action_ids)} actions but "
                             f"{len(t.sample_logprobs)} sample logprobs")
    if not turns:
        return None
    ids: list[int] = []
    mask: list[bool] = []
    logprobs: list[float] = []
    for turn in turns:
        if not is_prefix_extension(ids, turn.context_ids):
            return None
        new_context = turn.context_ids[len(ids):]
        ids += list(new_context) + list(turn.action_ids)
        mask += [False] * len(new_context) + [True] * len(turn.action_ids)
        logprobs += list(turn.sample_logprobs)
    return PackedSequence(ids, mask, logprobs)


HEAD_CHUNK = 512  # positions per LM-head chunk: the [chunk, V] logits are all backward keeps


def causal_parts(model):
    """(decoder, LM head) of a causal LM, peft-wrapped or not; None when its logits are more
    than `head(hidden)` (a logit softcap or scale), which only the whole model computes."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = causal.config
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    decoder, head = causal.get_decoder(), causal.get_output_embeddings()
    return (decoder, head) if decoder is not None and head is not None else None


def _head_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) under softmax(head(hidden) / T), and whether each target is the argmax."""
    logits = head(hidden).float()  # [C, V]
    logp = F.log_softmax(logits / temperature, dim=-1).gather(1, targets[:, None])[:, 0]  # [C]
    return logp, logits.argmax(-1) == targets


def target_logprobs(model, ids: torch.Tensor, predictors: torch.Tensor, targets: torch.Tensor,
                    temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """([A] log p(targets[a] | ids[:predictors[a] + 1]) at temperature T, [A] bool: is the
    target the model's argmax) — one forward over `ids` [1, S].

    Only the A predicting positions go through the LM head, in chunks of HEAD_CHUNK, each
    recomputed in backward: the [A, V] logits (V ~49k for SmolLM2, ~152k for Qwen3, A in the
    thousands for an episode) never exist at once, nor the log-softmax's copies of them.
    """
    parts = causal_parts(model)
    if parts is None:  # the whole model's logits at the predicting positions, unchunked
        logits = model(input_ids=ids, logits_to_keep=predictors, use_cache=False).logits[0]
        return _head_logprobs(lambda h: h, logits, targets, temperature)
    decoder, head = parts
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0, predictors]  # [A, H]
    chunks = []
    for i in range(0, len(targets), HEAD_CHUNK):
        args = (head, hidden[i:i + HEAD_CHUNK], targets[i:i + HEAD_CHUNK], temperature)
        chunks.append(checkpoint(_head_logprobs, *args, use_reentrant=False)
                      if torch.is_grad_enabled() else _head_logprobs(*args))
    return torch.cat([c[0] for c in chunks]), torch.cat([c[1] for c in chunks])


def action_logprobs(model, input_ids: list[int], action_mask: list[bool],
                    temperature: float) -> torch.Tensor:
    """log p(token | everything before it) of each action token, temperature-scaled: [A].

    One forward over the sequence; only the A positions that predict actions go through the LM
    head (`target_logprobs`): the [S, V] logits are never built.
    """
    device = next(model.parameters()).device
    positions = [i for i, m in enumerate(action_mask) if m]
    if not positions:
        return torch.zeros(0, device=device)
    if positions[0] == 0:
        raise ValueError("the first token of a sequence cannot be an action (nothing predicts it)")
    ids = torch.tensor([input_ids[:positions[-1]]], device=device)  # [1, S'] (last action fed never)
    predictors = torch.tensor(positions, device=device) - 1  # [A] positions predicting actions
    targets = torch.tensor([input_ids[p] for p in positions], device=device)  # [A]
    return target_logprobs(model, ids, predictors, targets, temperature)[0]


def token_logprobs(model, context_ids: list[int], action_ids: list[int],
                   temperature: float) -> torch.Tensor:
    """log p(action_t | context, action_<t) under the temperature-scaled distribution: [T].

    Only the T positions that predict actions go through the LM head (`logits_to_keep`): the
    context's [L, V] logits (L in the thousands, V ~150k for Qwen3) are never built.
    """
    return action_logprobs(model, list(context_ids) + list(action_ids),
                           [False] * len(context_ids) + [True] * len(action_ids), temperature)
