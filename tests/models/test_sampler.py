import pytest
import torch

from nestor.models.registry import load_model
from nestor.models.sampler import positions, sample


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    model, tok = load_model("tiny-s")
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}],
                                       add_generation_prompt=True)["input_ids"]
               for p in ("reverse abc", "max 12 345", "len qwertyuiop", "x")]
    return model, tok, prompts


def full_forward_logprobs(model, out, temperature):
    """Log-probs of the sampled tokens from one forward pass over prompt + completion."""
    ids = torch.cat([out.prompt_ids, out.completion_ids], 1)
    mask = torch.cat([out.prompt_mask, out.completion_mask], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask.long(),
                       position_ids=positions(mask)).logits.float()
    width = out.prompt_ids.shape[1]
    logp = torch.log_softmax(logits[:, width - 1:-1] / temperature, -1)
    return logp.gather(-1, out.completion_ids[..., None]).squeeze(-1)


def test_greedy_is_deterministic_and_matches_unbatched(tiny):
    model, tok, prompts = tiny
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, greedy=True)
    a = sample(model, prompts, 8, **kw)
    b = sample(model, prompts, 8, **kw)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts
    for row, prompt in enumerate(prompts):  # left padding must not change any row's reply
        alone = sample(model, [prompt], 8, **kw)
        assert alone.texts[0] == a.texts[row]


def test_logprobs_match_a_full_forward_pass(tiny):
    model, tok, prompts = tiny
    gen = torch.Generator().manual_seed(3)
    out = sample(model, prompts, 10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                 temperature=0.7, generator=gen)
    expected = full_forward_logprobs(model, out, 0.7)
    diff = (expected - out.logprobs)[out.completion_mask].abs().max()
    assert diff < 1e-4
    assert (out.logprobs[~out.completion_mask] == 0).all()
    again = sample(model, prompts, 10, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                   temperature=0.7, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again.completion_ids, out.completion_ids)


def test_rows_stop_at_eos_and_are_masked_after(tiny):
    model, tok, prompts = tiny
    greedy = sample(model, prompts, 6, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                    greedy=True)
    # Declare row 0's second greedy token the eos: row 0 must stop there, the others go on.
    eos = int(greedy.completion_ids[0, 1])
    out = sample(model, prompts, 6, eos_id=eos, pad_id=tok.pad_token_id, greedy=True)
    first = int((out.completion_ids[0] == eos).nonzero()[0])
    assert first <= 1
    assert out.completion_mask[0, :first + 1].all()
    assert not out.completion_mask[0, first + 1:].any()
    assert (out.completion_ids[0, first + 1:] == tok.pad_token_id).all()
    assert out.texts[0] == tok.decode(out.completion_ids[0, :first].tolist())  # eos stripped
    for row in range(len(prompts)):
        ids = out.completion_ids[row][out.completion_mask[row]].tolist()
        if eos in ids:
            assert ids.index(eos) == len(ids) - 1
        else:
            assert len(ids) == out.completion_ids.shape[1]


def test_bad_arguments(tiny):
    model, tok, prompts = tiny
    with pytest.raises(ValueError, match="temperature"):
        sample(model, prompts, 4, eos_id=tok.eos_token_id, pad_id=0, temperature=0)
    with pytest.raises(ValueError, match="non-empty"):
        sample(model, [[]], 4, eos_id=tok.eos_token_id, pad_id=0)
