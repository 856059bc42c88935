"""A KV cache that writes each new token in place instead of re-concatenating the whole cache.

transformers' DynamicLayer grows by `torch.cat([keys, new])`: every decoded token copies every
layer's whole K and V (at 1,400 tokens of context, ~16% of a SmolLM2 decode step on CPU). Here
each layer holds a buffer with room for `reserve` more tokens, and `keys`/`values` are views of
its filled part; a token is one slice write. Numerically identical: the same K and V, the same
attention.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    def __init__(self, reserve: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.reserve = reserve  # tokens of room made past each (re)allocation

    def _adopt(self, extra: int) -> None:
        """Move the filled K/V into a buffer with room for `extra` + `reserve` more tokens."""
        keys, values = self.keys, self.values  # [B, H, n, D]
        n = keys.shape[-2]
        shape = (*keys.shape[:2], n + extra + self.reserve, keys.shape[-1])
        self._k_buf, self._v_buf = keys.new_empty(shape), values.new_empty(shape)
        self._k_buf[..., :n, :] = keys
        self._v_buf[..., :n, :] = values
        self._view(n)

    def _view(self, n: int) -> None:
        self.keys, self.values = self._k_buf[..., :n, :], self._v_buf[..., :n, :]
        self._mine = self.keys

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.keys.numel() == 0:  # first write: an empty [B, H, 0, D] to adopt
            self.keys = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[-1]))
            self.values = value_states.new_empty(self.keys.shape)
        n, new = self.keys.shape[-2], key_states.shape[-2]
        # Adopt when someone else replaced keys (crop, batch_repeat_interleave, a copied
        # prefix) or the buffer is full; otherwise write in place.
        if getattr(self, "_mine", None) is not self.keys or n + new > self._k_buf.shape[-2]:
            self._adopt(new)
        self._k_buf[..., n:n + new, :] = key_states
        self._v_buf[..., n:n + new, :] = value_states
        self._view(n + new)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            n = self.keys.shape[-2]
            self._k_buf, self._v_buf = self._k_buf[indices], self._v_buf[indices]
            self._view(n)

    def reset(self) -> None:
        self._mine = self._k_buf = self._v_buf = None
        super().reset()


class GrowingCache(DynamicCache):
    """A DynamicCache of GrowingLayers, each with room for `reserve` tokens past its first
    write. `GrowingCache.of(cache, reserve)` takes over a DynamicCache's filled layers."""

    def __init__(self, reserve: int = 256):
        Cache.__init__(self, layer_class_to_replicate=partial(GrowingLayer, reserve))

    @classmethod
    def of(cls, cache: DynamicCache, reserve: int) -> GrowingCache:
        grown = cls(reserve)
        for layer in cache.layers:
            mine = grown.layer_class_to_replicate()
            if layer.is_initialized:
                mine.lazy_initialization(layer.keys, layer.values)
                mine.keys, mine.values = layer.keys, layer.values  # adopted on first update
            grown.layers.append(mine)
        return grown
