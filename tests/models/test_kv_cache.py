"""The in-place KV cache: the same keys and values as transformers' DynamicCache, written into
one buffer per layer instead of re-concatenated every token."""

import pytest
import torch
from transformers import DynamicCache

from nestor.models.kv_cache import GrowingCache
from nestor.models.registry import load_model


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny-m")


def decode(model, cache, prompt: torch.Tensor, steps: int, drop_after: int | None = None):
    """Greedy-decode `steps` tokens for a [B, P] prompt; at `drop_after`, keep row 0 only."""
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True)
    tok, pos, logits = out.logits[:, -1].argmax(-1), prompt.shape[1], [out.logits[:, -1]]
    for t in range(steps):
        if t == drop_after:
            cache.batch_select_indices(torch.tensor([0]))
            tok = tok[:1]
        out = model(input_ids=tok[:, None], past_key_values=cache, use_cache=True,
                    position_ids=torch.full((tok.shape[0], 1), pos))
        tok, pos = out.logits[:, -1].argmax(-1), pos + 1
        logits.append(out.logits[:, -1])
    return logits


def test_growing_cache_decodes_as_the_dynamic_one_and_writes_in_place(tiny):
    model, _ = tiny
    prompt = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = decode(model, DynamicCache(), prompt, 6, drop_after=3)
        grown = GrowingCache(reserve=8)
        got = decode(model, grown, prompt, 6, drop_after=3)
        for e, g in zip(expected, got, strict=True):
            assert torch.equal(e, g)
        layer = grown.layers[0]
        assert layer.keys.shape[-2] == 12 + 6
        buffer = layer._k_buf.data_ptr()
        model(input_ids=torch.tensor([[5]]), past_key_values=grown, use_cache=True,
              position_ids=torch.tensor([[18]]))
        assert layer._k_buf.data_ptr() == buffer  # within its reserve: no new allocation
        assert layer.keys.data_ptr() == buffer  # keys are a view of the buffer


def test_growing_cache_takes_over_a_filled_cache_and_grows_past_its_reserve(tiny):
    model, _ = tiny
    prompt = torch.randint(3, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        prefix = DynamicCache()
        model(input_ids=prompt[:, :6], past_key_values=prefix, use_cache=True)
        grown = GrowingCache.of(prefix, reserve=1)
        out = model(input_ids=prompt[:, 6:], past_key_values=grown, use_cache=True,
                    position_ids=torch.arange(6, 10)[None])
        more = model(input_ids=torch.tensor([[7, 8]]), past_key_values=grown, use_cache=True,
                     position_ids=torch.tensor([[10, 11]]))  # 2 tokens past a reserve of 1
        whole = model(input_ids=torch.cat([prompt, torch.tensor([[7, 8]])], 1))
    assert grown.get_seq_length() == 12
    assert torch.allclose(out.logits[0, -1], whole.logits[0, 9], atol=1e-5)
    assert torch.allclose(more.logits[0], whole.logits[0, 10:], atol=1e-5)
