"""KV caches of shared prompt prefixes, reused across sampling calls.

Every turn of every episode starts with the same system prompt (one to two thousand tokens for
a small model), and a turn's context starts with the previous turn's context. The sampler asks
`prefill` for the longest prefix its whole batch shares: a cached prefix of it is copied, only
the rest is computed (batch 1), and that longer prefix is cached in turn. Entries are evicted
least-recently-used past `max_tokens` tokens in all. KV values depend on the weights: whoever
changes them (a training step, a checkpoint load) must call `clear()`.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict

import torch
from transformers import DynamicCache


def common_prefix_length(prompts: list[list[int]]) -> int:
    """Length of the longest token prefix all prompts share."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for p in prompts[1:]:
        i = 0
        while i < n and p[i] == first[i]:
            i += 1
        n = i
    return n


class PrefixCache:
    def __init__(self, max_tokens: int = 8192, min_tokens: int = 32):
        self.max_tokens, self.min_tokens = max_tokens, min_tokens
        self._entries: OrderedDict[tuple[int, ...], DynamicCache] = OrderedDict()
        self._lock = threading.Lock()
        self.tokens_reused = 0  # prefix tokens not recomputed thanks to the cache
        self.tokens_computed = 0  # prefix tokens computed (and cached) here

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _longest(self, ids: list[int]) -> tuple[int, ...] | None:
        best = None
        for key in self._entries:
            if len(key) <= len(ids) and (best is None or len(key) > len(best)) \
                    and tuple(ids[:len(key)]) == key:
                best = key
        return best

    @torch.no_grad()
    def prefill(self, model, prompts: list[list[int]]) -> tuple[int, DynamicCache | None]:
        """(P, the KV cache of the first P tokens every prompt shares, batch 1: the caller's
        own copy), or (0, None) when they share fewer than `min_tokens`. Every prompt keeps at
        least one token of its own (its last logits come from the caller's forward)."""
        shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1,
                     self.max_tokens)
        if shared < self.min_tokens:
            return 0, None
        ids = prompts[0][:shared]
        with self._lock:
            key = self._longest(ids)
            start = len(key) if key else 0
            cache = copy.deepcopy(self._entries[key]) if key else DynamicCache()
            if key:
                self._entries.move_to_end(key)
        self.tokens_reused += start
        if start < shared:
            device = next(model.parameters()).device
            model(input_ids=torch.tensor([ids[start:]], device=device),
                  attention_mask=torch.ones((1, shared), dtype=torch.long, device=device),
                  position_ids=torch.arange(start, shared, device=device)[None],
                  past_key_values=cache, use_cache=True, logits_to_keep=1)
            self.tokens_computed += shared - start
            with self._lock:
                self._entries[tuple(ids)] = copy.deepcopy(cache)
                while sum(len(k) for k in self._entries) > self.max_tokens:
                    self._entries.popitem(last=False)
        return shared, cache
