"""One token sequence per episode: packing, the one-pass scores, and where it falls back."""

import pytest
import torch

from nestor.policy.base import Message, Observation, TrainItem, Turn
from nestor.policy.lm_sequence import (
    action_logprobs,
    episode_sequence,
    token_logprobs,
    turn_sequence,
)
from tests.policy.test_lm import TOOLS, obs, tiny_agent


def turn(context, actions, logprobs=None) -> Turn:
    return Turn(message=Message("assistant", ""), action_ids=list(actions),
                sample_logprobs=list(logprobs or [-0.5] * len(actions)),
                context_ids=list(context))


def test_episode_sequence_concatenates_prefix_extending_turns():
    t1 = turn([1, 2, 3], [10, 11], [-0.1, -0.2])
    t2 = turn([1, 2, 3, 10, 11, 4, 5], [12], [-0.3])
    ids, mask, logprobs = episode_sequence([t1, t2])
    assert ids == [1, 2, 3, 10, 11, 4, 5, 12]
    assert mask == [False, False, False, True, True, False, False, True]
    assert logprobs == [-0.1, -0.2, -0.3]
    # a turn without actions carries no loss and does not break the chain
    assert episode_sequence([t1, turn([1, 2], []), t2]) == (ids, mask, logprobs)


def test_episode_sequence_is_none_where_a_context_is_not_an_extension():
    t1 = turn([1, 2, 3], [10, 11])
    rerendered = turn([1, 2, 3, 10, 99, 4], [12])  # the template re-rendered our reply
    cut = turn([2, 3, 10, 11, 4], [12])  # the context window dropped the first token
    assert episode_sequence([t1, rerendered]) is None
    assert episode_sequence([t1, cut]) is None
    assert episode_sequence([]) is None
    with pytest.raises(ValueError, match="sample logprobs"):
        episode_sequence([turn([1], [2, 3], [-0.1])])
    assert turn_sequence(t1) == ([1, 2, 3, 10, 11], [False, False, False, True, True],
                                 t1.sample_logprobs)


@pytest.fixture(scope="module")
def agent():
    torch.set_num_threads(1)
    return tiny_agent(learning_rate=1e-2, max_new_tokens=16)


def three_turns(agent):
    """A three-turn episode acted by the policy, tool results in between."""
    messages = list(obs().messages)
    turns = []
    for k in range(3):
        t = agent.act(Observation(list(messages), TOOLS))
        turns.append(t)
        messages += [t.message, Message("tool", f"result {k}: ok")]
    return turns


def test_acting_extends_contexts_and_one_pass_scores_equal_per_turn_ones(agent):
    turns = three_turns(agent)
    # each context is the previous context + its sampled tokens + the new messages
    packed = episode_sequence(turns)
    assert packed is not None
    assert packed.input_ids[:len(turns[-1].context_ids)] == turns[-1].context_ids
    with torch.no_grad():
        one_pass = action_logprobs(agent.model, packed.input_ids, packed.action_mask,
                                   agent.temperature)
        per_turn = torch.cat([token_logprobs(agent.model, t.context_ids, t.action_ids,
                                             agent.temperature) for t in turns])
    assert one_pass.shape == per_turn.shape == (sum(len(t.action_ids) for t in turns),)
    assert torch.allclose(one_pass, per_turn, atol=1e-5)
    # and both are what the sampler recorded: on-policy, every ratio is 1
    assert torch.allclose(one_pass, torch.tensor(packed.sample_logprobs), atol=1e-4)


def test_train_step_uses_one_pass_where_it_can_and_per_turn_where_it_cannot():
    agent = tiny_agent(learning_rate=1e-2, max_new_tokens=16)
    rerender = tiny_agent(learning_rate=1e-2, max_new_tokens=16, extend_contexts=False)
    extended, rendered = three_turns(agent), three_turns(rerender)
    assert episode_sequence(extended) is not None
    # re-rendered: the template writes our reply back its own way (stripped, calls re-encoded),
    # so at least one later context does not extend the previous context + sampled tokens
    assert episode_sequence(rendered) is None
    stats = agent.train_step([TrainItem(extended, 1.0, 0)])
    assert stats["episodes_one_pass"] == 1 and stats["ratio_mean"] == pytest.approx(1, abs=1e-4)
    assert stats["tokens"] == sum(len(t.action_ids) for t in extended)
    stats = rerender.train_step([TrainItem(rendered, 1.0, 0)])
    assert stats["episodes_one_pass"] == 0 and stats["ratio_mean"] == pytest.approx(1, abs=1e-4)
    assert stats["tokens"] == sum(len(t.action_ids) for t in rendered)


def test_one_pass_and_per_turn_training_give_the_same_gradient():
    # Same weights, same episode: the one-pass step and the per-turn step have one gradient.
    a = tiny_agent(seed=5, learning_rate=1e-2, max_new_tokens=12)
    turns = three_turns(a)
    b = tiny_agent(seed=5, learning_rate=1e-2, max_new_tokens=12)
    a.optimizer.step = b.optimizer.step = lambda: None  # keep the weights: compare gradients
    a.train_step([TrainItem(turns, 0.7, 0)])
    import nestor.policy.lm as lm

    real = lm.episode_sequence
    lm.episode_sequence = lambda ts: None  # the same turns, forced through the per-turn path
    try:
        stats = b.train_step([TrainItem(turns, 0.7, 0)])
    finally:
        lm.episode_sequence = real
    assert stats["episodes_one_pass"] == 0
    pa = dict(a.model.named_parameters())
    grads = [(p.grad, pa[name].grad) for name, p in b.model.named_parameters() if p.requires_grad]
    assert any(float(g.abs().max()) > 0 for g, _ in grads)
    for g_turns, g_one in grads:
        assert torch.allclose(g_turns, g_one, rtol=1e-4, atol=1e-7)


def test_each_episode_extends_its_own_tokens_when_two_replies_read_alike(agent):
    # Two episodes (seeds 1 and 2) reply "hello" and "hello  " (the same message once
    # stripped): each next context must carry that episode's own sampled tokens.
    replies = {1: "hello", 2: "hello  "}
    firsts = {}
    for seed, text in replies.items():
        ids = agent.tokenizer(text, add_special_tokens=False).input_ids + [agent.eos_id]
        agent.sample = lambda ctx, ids=ids: (ids, [-0.1] * len(ids))
        try:
            firsts[seed] = agent.act(Observation(obs().messages, TOOLS, seed=seed))
        finally:
            del agent.sample
    assert firsts[1].message.content == firsts[2].message.content == "hello"
    for seed, first in firsts.items():
        messages = [*obs().messages, first.message, Message("tool", "ok")]
        context = agent.context_for(Observation(messages, TOOLS, seed=seed))
        own = first.context_ids + first.action_ids
        assert context[:len(own)] == own
    # an episode this policy never saw (another seed) is rendered by the template instead
    messages = [*obs().messages, firsts[1].message, Message("tool", "ok")]
    other = agent.context_for(Observation(messages, TOOLS, seed=3))
    assert other == agent.render(Observation(messages, TOOLS, seed=3))


@pytest.mark.parametrize("bundled", [True, False])  # tiny-m, a random tiny Qwen3
def test_the_head_runs_in_chunks_with_the_whole_models_logprobs_and_gradients(monkeypatch,
                                                                           bundled):
    import nestor.policy.lm_sequence as seq

    agent = tiny_agent(bundled=bundled)
    agent.model.train(False)
    ids = torch.randint(10, len(agent.tokenizer) - 1, (40,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    mask = [False] * 12 + [True] * 28
    params = [p for p in agent.model.parameters() if p.requires_grad]
    with torch.no_grad():  # a LoRA that is not zero, so its gradients are
        for p in params:
            p.normal_(0, 0.05)

    def scored(chunk: int) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        monkeypatch.setattr(seq, "HEAD_CHUNK", chunk)
        rows = []
        head = agent.model.get_output_embeddings()
        hook = head.register_forward_hook(lambda m, i, o: rows.append(o.shape[-2]))
        lp = seq.action_logprobs(agent.model, ids, mask, 0.7)
        lp.sum().backward()
        hook.remove()
        grads = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return lp.detach(), grads, rows

    whole, whole_grads, _ = scored(10_000)
    chunked, chunked_grads, rows = scored(8)
    assert max(rows) == 8 and sum(rows) >= 28  # never more than a chunk (recomputed: ≥ once)
    assert torch.allclose(chunked, whole, atol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-5)
               for a, b in zip(chunked_grads, whole_grads, strict=True))
    with torch.no_grad():  # the whole model's own logits, where nothing is chunked
        logits = agent.model(input_ids=torch.tensor([ids[:-1]])).logits[0, 11:].float()
        ref = torch.log_softmax(logits / 0.7, -1).gather(1, torch.tensor(ids[12:])[:, None])[:, 0]
    assert torch.allclose(whole, ref, atol=1e-5)


def test_a_model_whose_logits_are_more_than_its_head_is_scored_whole():
    from nestor.policy.lm_sequence import causal_parts, target_logprobs

    agent = tiny_agent()
    assert causal_parts(agent.model) is not None
    agent.model.get_base_model().config.final_logit_softcapping = 30.0
    assert causal_parts(agent.model) is None
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        logp, hits = target_logprobs(agent.model, ids, torch.tensor([2, 3]),
                                     torch.tensor([8, 9]))
    assert logp.shape == (2,) and hits.dtype == torch.bool and bool((logp < 0).all())
