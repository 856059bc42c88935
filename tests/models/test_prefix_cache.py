"""The sampler's KV cache of shared prompt prefixes: same numbers, fewer tokens computed."""

import pytest
import torch

from nestor.models.prefix_cache import PrefixCache, common_prefix_length
from nestor.models.registry import load_model
from nestor.models.sampler import sample


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return load_model("tiny-m")


def full_forward(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion[:-1]])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [1]]) == 0


def test_cached_prefix_samples_what_the_full_prompt_would(tiny):
    model, tok = tiny
    shared = tok("a shared system prompt, long enough to be worth caching: " * 3,
                 add_special_tokens=False).input_ids
    prompts = [shared + tok(s, add_special_tokens=False).input_ids for s in ("ab", "cdefg", "h")]
    kwargs = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, tokenizer=tok)
    plain = sample(model, prompts, 8, greedy=True, **kwargs)
    cache = PrefixCache(max_tokens=4096)
    cached = sample(model, prompts, 8, greedy=True, prefix_cache=cache, **kwargs)
    assert torch.equal(plain.completion_ids, cached.completion_ids)
    assert torch.allclose(plain.logprobs, cached.logprobs, atol=1e-5)
    assert cache.tokens_computed == len(shared) and cache.tokens_reused == 0
    # a second call (a later turn) reuses the prefix; its sampled tokens' logprobs are what
    # the trainer's full forward computes
    gen = torch.Generator().manual_seed(0)
    again = sample(model, prompts, 8, prefix_cache=cache, generator=gen, **kwargs)
    assert cache.tokens_reused == len(shared)
    with torch.no_grad():
        for b, prompt in enumerate(prompts):
            keep = again.completion_mask[b]
            ids = again.completion_ids[b][keep].tolist()
            ref = full_forward(model, prompt, ids, 1.0)
            assert torch.allclose(again.logprobs[b][keep], ref, atol=1e-4)


def test_entries_are_evicted_past_the_token_cap(tiny):
    model, tok = tiny
    cache = PrefixCache(max_tokens=100, min_tokens=4)
    for word in ("alpha ", "beta ", "gamma "):
        ids = tok(word * 12, add_special_tokens=False).input_ids
        shared, kv = cache.prefill(model, [ids + [1], ids + [2]])
        assert shared == len(ids) and kv.get_seq_length() == len(ids)
    assert sum(len(k) for k in cache._entries) <= 100 and len(cache) < 3
    assert cache.prefill(model, [[1, 2, 3], [1, 2, 4]]) == (0, None)  # below min_tokens
    cache.clear()
    assert len(cache) == 0
