"""The LM policy under memory pressure and partial failure: out-of-memory errors split and
retry, what does not fit alone is dropped and counted, one bad row fails only its episode;
the model's dtype with float32 LoRA; the context window's edge case."""

import threading

import pytest
import torch

import nestor.policy.lm as lm
from nestor.policy.base import Message, TrainItem
from nestor.policy.oom import PolicyOutOfMemory, is_oom
from tests.policy.test_lm import _random_tiny_model, obs, tiny_agent
from tests.policy.test_lm_sequence import three_turns


def failing_sample(monkeypatch, should_fail):
    """Make the sampler raise `should_fail(contexts)` (an exception or None) before sampling."""
    real = lm.sample
    calls = []

    def sample(model, contexts, *args, **kwargs):
        calls.append(len(contexts))
        exc = should_fail(contexts)
        if exc is not None:
            raise exc
        return real(model, contexts, *args, **kwargs)

    monkeypatch.setattr(lm, "sample", sample)
    return calls


def test_is_oom_recognises_the_allocators_errors():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried ..."))
    assert not is_oom(RuntimeError("Expected all tensors to be on the same device"))


def test_act_out_of_memory_halves_the_batch_and_drops_what_does_not_fit(monkeypatch):
    agent = tiny_agent(bundled=False, max_new_tokens=4)
    contexts = [agent.render(obs(Message("user", "x" * i))) for i in range(4)]
    long = max(len(c) for c in contexts)
    calls = failing_sample(monkeypatch, lambda cs: torch.OutOfMemoryError("out of memory")
                           if len(cs) > 1 or len(cs[0]) == long else None)
    out = agent._sample_isolated(contexts)
    assert calls[0] == 4 and agent.counters["oom_act_splits"] >= 1
    assert agent.counters["oom_act_dropped"] == 1  # only the longest failed alone too
    for ctx, r in zip(contexts, out, strict=True):
        if len(ctx) == long:
            assert isinstance(r, PolicyOutOfMemory) and "max_context" in str(r)
        else:
            assert len(r[0]) == len(r[1]) >= 1


def test_a_failing_row_fails_its_own_episode_only(monkeypatch):
    # Four episodes act at once; one context breaks the sampler (not a memory error). The
    # batch is retried row by row: three turns come back, the fourth caller gets the error.
    agent = tiny_agent(bundled=False, max_new_tokens=4, act_batch_size=4,
                       act_batch_window_s=5.0)
    poison = agent.render(obs(Message("user", "POISON")))
    failing_sample(monkeypatch, lambda cs: ValueError("bad row") if poison in cs else None)
    results: list = [None] * 4

    def run(i):
        try:
            results[i] = agent.act(obs(Message("user", "POISON" if i == 2 else "x" * i)))
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert agent._batcher.batch_sizes == [4] and agent.counters["act_batch_retries"] == 1
    assert isinstance(results[2], ValueError)
    assert all(len(results[i].action_ids) >= 1 for i in (0, 1, 3))


def test_train_out_of_memory_falls_back_per_turn_then_drops_and_counts(monkeypatch):
    agent = tiny_agent(learning_rate=1e-2, max_new_tokens=16)
    turns = three_turns(agent)
    # What one pass adds over the last turn alone is the LM head's [actions, vocab] logits
    # (150k columns for Qwen3): the fake allocator fails on too many action rows.
    most_actions = max(len(t.action_ids) for t in turns)
    real = lm.action_logprobs

    def limited(limit):
        def scored(model, ids, mask, temperature):
            if sum(mask) > limit:
                raise torch.OutOfMemoryError("CUDA out of memory")
            return real(model, ids, mask, temperature)
        return scored

    # the whole episode does not fit, each turn does: scored turn by turn, nothing dropped
    monkeypatch.setattr(lm, "action_logprobs", limited(most_actions))
    stats = agent.train_step([TrainItem(turns, 1.0, agent.version)])
    assert stats["episodes_one_pass"] == 0 and stats["oom_dropped_turns"] == 0
    assert stats["tokens"] == sum(len(t.action_ids) for t in turns)
    assert agent.counters["oom_train_splits"] == 1
    # nothing fits: every turn dropped and counted, the step still completes, weights unchanged
    monkeypatch.setattr(lm, "action_logprobs", limited(0))
    before = {n: p.detach().clone() for n, p in agent.model.named_parameters()}
    version = agent.version
    stats = agent.train_step([TrainItem(turns, 1.0, version)])
    assert agent.version == version + 1 and stats["oom_dropped_turns"] == 3
    assert stats["tokens"] == 0 and stats["oom_train_dropped_turns_total"] == 3
    assert all(torch.equal(p, before[n]) for n, p in agent.model.named_parameters())


def test_other_training_errors_still_raise(monkeypatch):
    agent = tiny_agent(learning_rate=1e-2, max_new_tokens=8)
    turns = three_turns(agent)
    monkeypatch.setattr(lm, "action_logprobs",
                        lambda *a: (_ for _ in ()).throw(ValueError("a real bug")))
    with pytest.raises(ValueError, match="a real bug"):
        agent.train_step([TrainItem(turns, 1.0, 0)])
    assert not agent.model.training  # back in eval mode for acting


def test_model_dtype_with_float32_lora():
    model, tok = _random_tiny_model()
    agent = lm.LMPolicy(model.to(torch.bfloat16), tok, max_new_tokens=4)
    lora = [p for n, p in agent.model.named_parameters() if "lora_" in n]
    base = [p for n, p in agent.model.named_parameters() if "lora_" not in n]
    assert lora and all(p.dtype == torch.float32 and p.requires_grad for p in lora)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in base)
    turn = agent.act(obs())  # acts and trains in bf16 with float32 LoRA
    stats = agent.train_step([TrainItem([turn], 1.0, 0)])
    assert stats["tokens"] == len(turn.action_ids) and abs(stats["ratio_mean"] - 1) < 0.05


def test_the_turn_cap_must_leave_room_for_a_context():
    model, tok = _random_tiny_model()
    with pytest.raises(ValueError, match="must be below max_context"):
        lm.LMPolicy(model, tok, max_new_tokens=512, max_context=512)
    agent = lm.LMPolicy(model, tok, max_new_tokens=500, max_context=512)
    ids = agent.render(obs(Message("user", "y" * 2000)))
    assert len(ids) == 12  # the most recent 512 - 500 tokens, not the whole context


@pytest.mark.parametrize("checkpointing", [True, False])
def test_gradient_checkpointing_recomputes_layers_in_the_backward_pass(checkpointing):
    agent = tiny_agent(learning_rate=1e-2, max_new_tokens=8,
                       gradient_checkpointing=checkpointing)
    turn = agent.act(obs())
    # the decoder layer is what is checkpointed; its MLP runs again in the backward replay
    # (module hooks are off during the replay, so count calls of the MLP's forward itself)
    mlp = agent.model.get_base_model().model.layers[0].mlp
    calls = []
    real = mlp.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    mlp.forward = counted
    stats = agent.train_step([TrainItem([turn], 1.0, 0)])
    # one forward, plus its recomputation in backward when checkpointing
    assert len(calls) == (2 if checkpointing else 1)
    assert stats["ratio_mean"] == pytest.approx(1, abs=1e-4) and not agent.model.training
