"""The LM policy on a tiny Qwen3 chat model: sampling with tools, parsing, training, LoRA."""

import pytest
import torch

from nestor.models.loops import repeat_period
from nestor.policy.base import Message, Observation, ToolCall, TrainItem, Turn
from nestor.policy.chat import parse_assistant
from nestor.policy.lm import LMPolicy
from nestor.policy.lm_sequence import token_logprobs

TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def tiny_agent(seed: int = 0, bundled: bool = True, **kwargs) -> LMPolicy:
    """tiny-m (its weights are bundled: failing to load them fails the test), or with
    `bundled=False` a random tiny Qwen3 with the same char tokenizer and chat template."""
    torch.manual_seed(seed)
    if bundled:
        from nestor.models.registry import load_model

        model, tok = load_model("tiny-m")
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        from nestor.models.tokenizer import build_char_tokenizer

        tok = build_char_tokenizer()
        cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        model = Qwen3ForCausalLM(cfg)
    kwargs.setdefault("max_new_tokens", 24)
    return LMPolicy(model.float(), tok, seed=seed, **kwargs)


@pytest.fixture(scope="module")
def agent():
    torch.set_num_threads(1)
    return tiny_agent(learning_rate=1e-2)


def obs(*extra: Message) -> Observation:
    return Observation(messages=[Message("system", "You write jobs."),
                                 Message("user", "Teach reversal."), *extra], tools=TOOLS)


def test_parse_tool_calls_and_malformed():
    msg, err = parse_assistant('ok <tool_call>{"name": "write_file", "arguments": '
                               '{"path": "a"}}</tool_call>')
    assert err is None and msg.content == "ok"
    assert msg.tool_calls == [ToolCall("write_file", {"path": "a"}, "call_0")]
    msg, err = parse_assistant('<tool_call>{"name": "write_file", "arguments": {"pa</tool_call>')
    assert msg.tool_calls == [] and "not valid JSON" in err and "<tool_call>" in err
    _, err = parse_assistant('<tool_call>{"arguments": {}}</tool_call>')
    assert 'missing "name"' in err
    _, err = parse_assistant('<tool_call>{"name": "x", "arguments": {}}')
    assert "unbalanced" in err


def test_act_records_tokens_and_counts_malformed(agent):
    turn = agent.act(obs())
    assert len(turn.action_ids) == len(turn.sample_logprobs) >= 1
    assert all(lp <= 0 for lp in turn.sample_logprobs)
    # The rendered context ends with the generation prompt; the tools are rendered in it.
    text = agent.tokenizer.decode(turn.context_ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n") and "write_file" in text
    before = agent.malformed_calls
    agent.sample = lambda ctx: (agent.tokenizer("<tool_call>{oops</tool_call>",
                                                add_special_tokens=False).input_ids, [0.0])
    try:
        bad = agent.act(obs())
    finally:
        del agent.sample
    assert bad.parse_error and agent.malformed_calls == before + 1


def test_a_reply_cut_at_the_turn_cap_is_told_so(agent):
    """The failure RL from warm start 5 showed: an env file looping until the turn's cap.
    The error the agent reads names the cap only when the reply did not end on its own."""
    ids = agent.tokenizer('<tool_call>{"name": "write_file", "arguments": {"content": "5555',
                          add_special_tokens=False).input_ids
    try:
        agent.sample = lambda ctx: (ids, [0.0] * len(ids))  # no eos: stopped by the cap
        cut = agent.act(obs())
        agent.sample = lambda ctx: (ids + [agent.eos_id], [0.0] * (len(ids) + 1))
        ended = agent.act(obs())
    finally:
        del agent.sample
    assert cut.parse_error.startswith(f"the reply reached the {agent.max_new_tokens}-token cap")
    assert "unbalanced" in cut.parse_error
    assert ended.parse_error and "cap" not in ended.parse_error


def test_a_looping_reply_stops_early_on_the_tokens_it_would_have_sampled():
    """A random tiny model, near-greedy, repeats one character inside an unclosed call. With
    `stop_repeats` the sampler ends the reply once the loop spans that many tokens, and the
    error names the loop; without, it runs to the cap. Stopping changes nothing sampled: the
    stopped reply is the uncapped one's start, token for token and logprob for logprob."""
    def agent_(stop_repeats: int) -> LMPolicy:
        return tiny_agent(bundled=False, max_new_tokens=200, temperature=0.05,
                          stop_repeats=stop_repeats, response_prefix='<tool_call>{"name": "')

    stopped, capped = agent_(16).act(obs()), agent_(0).act(obs())
    n = len(stopped.action_ids)
    assert len(capped.action_ids) == 200 and 16 <= n < 200
    assert repeat_period(stopped.action_ids, 16) is not None
    assert stopped.action_ids == capped.action_ids[:n]
    assert stopped.sample_logprobs == pytest.approx(capped.sample_logprobs[:n], abs=1e-6)
    assert stopped.parse_error.startswith("the reply was stopped unfinished: it repeated one")
    assert capped.parse_error.startswith("the reply reached the 200-token cap")
    assert "unbalanced" in stopped.parse_error and "unbalanced" in capped.parse_error


def test_masks_only_policy_tokens_carry_loss(agent):
    # A second turn: its context holds the first reply and a tool result; only the new
    # reply's tokens are actions, so the tool result's text is never scored.
    first = agent.act(obs())
    second = agent.act(obs(first.message, Message("tool", "error: SECRET-TOOL-OUTPUT")))
    ctx_text = agent.tokenizer.decode(second.context_ids, skip_special_tokens=False)
    act_text = agent.tokenizer.decode(second.action_ids, skip_special_tokens=False)
    assert "SECRET-TOOL-OUTPUT" in ctx_text and "SECRET-TOOL-OUTPUT" not in act_text


def test_ratio_is_one_on_policy(agent):
    turn = agent.act(obs())
    with torch.no_grad():
        logp = token_logprobs(agent.model, turn.context_ids, turn.action_ids, agent.temperature)
    diff = (logp - torch.tensor(turn.sample_logprobs)).abs().max()
    assert float(diff) < 1e-4
    ratio = torch.exp(logp - torch.tensor(turn.sample_logprobs))
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4)


def test_train_step_changes_only_lora_and_moves_logprobs(agent, tmp_path):
    # Two distinct replies in the same context (a sampled one may be near-deterministic), with
    # their logprobs recorded as the sampler would: one rewarded, one penalised.
    sampled = agent.act(obs())
    ctx = sampled.context_ids
    replies = ["<tool_call>", "hello"]
    turns = []
    for text in replies:
        ids = agent.tokenizer(text, add_special_tokens=False).input_ids + [agent.eos_id]
        with torch.no_grad():
            lp = token_logprobs(agent.model, ctx, ids, agent.temperature).tolist()
        turns.append(Turn(message=sampled.message, action_ids=ids, sample_logprobs=lp,
                          context_ids=ctx))
    before = {n: p.detach().clone() for n, p in agent.model.named_parameters()}
    act = turns[0].action_ids
    with torch.no_grad():
        lp0 = token_logprobs(agent.model, ctx, act, agent.temperature).sum()
    v0 = agent.version
    stats = agent.train_step([TrainItem([turns[0]], 1.0, v0), TrainItem([turns[1]], -1.0, v0)])
    assert agent.version == v0 + 1 and stats["tokens"] > 0
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    changed = {n for n, p in agent.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert all(p.requires_grad == ("lora_" in n) for n, p in agent.model.named_parameters())
    with torch.no_grad():
        lp1 = token_logprobs(agent.model, ctx, act, agent.temperature).sum()
    assert lp1 > lp0  # the positively advantaged turn became more likely

    # save/load round-trip restores adapter, optimizer and version.
    agent.save(tmp_path / "p")
    other = tiny_agent(learning_rate=1e-2)
    other.load(tmp_path / "p")
    assert other.version == agent.version
    with torch.no_grad():
        lp2 = token_logprobs(other.model, ctx, act, other.temperature).sum()
    assert float(lp2) == pytest.approx(float(lp1), abs=1e-4)


# ---- the GPU path, checked on CPU -------------------------------------------------------------

def _random_tiny_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from nestor.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return Qwen3ForCausalLM(cfg), tok


def test_sampling_generator_lives_on_the_models_device(monkeypatch):
    # torch.multinomial on CUDA logits refuses a CPU generator. A model on another device
    # (meta here: no CUDA on CI) must get its generator on that device, not on the CPU.
    model, tok = _random_tiny_model()
    made = []
    real = torch.Generator

    class Recorder:
        def __init__(self, device):
            made.append(torch.device(device))
            self._g = real("cpu")

        def manual_seed(self, seed):
            self._g.manual_seed(seed)
            return self

    monkeypatch.setattr(torch, "Generator", Recorder)
    policy = LMPolicy(model.to("meta"), tok)
    assert policy.device == torch.device("meta") and made == [torch.device("meta")]


def test_default_turn_cap_follows_the_context():
    from nestor.policy.lm import default_turn_tokens

    assert default_turn_tokens(2048) == 512 and default_turn_tokens(8192) == 2048
    assert default_turn_tokens(512) == 256 and default_turn_tokens(40960) == 4096
    model, tok = _random_tiny_model()
    assert LMPolicy(model, tok).max_new_tokens == 512  # 2048 positions


def test_token_logprobs_runs_the_lm_head_on_action_positions_only(agent):
    turn = agent.act(obs())
    rows = []
    head = agent.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, i, o: rows.append(o.shape[-2]))
    try:
        with torch.no_grad():
            lp = token_logprobs(agent.model, turn.context_ids, turn.action_ids, 0.7)
    finally:
        hook.remove()
    assert rows == [len(turn.action_ids)]  # not len(context) + len(actions) - 1
    with torch.no_grad():  # the same numbers as the full-vocabulary, full-context computation
        ids = torch.tensor([turn.context_ids + turn.action_ids[:-1]])
        full = torch.log_softmax(agent.model(input_ids=ids).logits[0].float() / 0.7, -1)
        ref = full[len(turn.context_ids) - 1:].gather(
            1, torch.tensor(turn.action_ids)[:, None])[:, 0]
    assert torch.allclose(lp, ref, atol=1e-5)


def test_batched_sampling_matches_per_item_logprobs(agent):
    # Contexts of different lengths go through one left-padded call; each row's recorded
    # logprobs must be what the trainer computes for that row alone.
    contexts = [agent.render(obs()),
                agent.render(obs(Message("user", "and a much longer follow-up question"))),
                agent.render(Observation([Message("user", "hi")], TOOLS))]
    assert len({len(c) for c in contexts}) == 3
    outs = agent.sample_batch(contexts)
    assert len(outs) == 3
    for ctx, (ids, lps) in zip(contexts, outs, strict=True):
        assert len(ids) == len(lps) >= 1
        with torch.no_grad():
            alone = token_logprobs(agent.model, ctx, ids, agent.temperature)
        assert torch.allclose(alone, torch.tensor(lps), atol=1e-4)


def test_concurrent_acts_share_one_sampling_call():
    import threading

    from nestor.outer.loop import SerializedPolicy

    # A long window and a batch of 4: the four threads' turns go through one call.
    policy = SerializedPolicy(tiny_agent(bundled=False, max_new_tokens=6,
                                         act_batch_size=4, act_batch_window_s=5.0))
    turns = [None] * 4

    def run(i):
        turns[i] = policy.act(obs(Message("user", "x" * i)))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert policy._batcher.batch_sizes == [4]
    assert all(t is not None and len(t.action_ids) == len(t.sample_logprobs) >= 1 for t in turns)
    assert policy.turns_sampled == 4


def test_response_prefix_is_context_not_action():
    prefix = '<tool_call>{"name": "'
    agent = tiny_agent(seed=3, response_prefix=prefix, max_new_tokens=12)
    turn = agent.act(obs())
    text = agent.tokenizer.decode(turn.context_ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n" + prefix)
    acted = agent.tokenizer.decode(turn.action_ids, skip_special_tokens=False)
    assert prefix not in acted  # the prefix is never an action, so never trained on
    # The reply is parsed with its prefix: a completion of the call is a tool call.
    agent.sample = lambda ctx: (agent.tokenizer('write_file", "arguments": {}}</tool_call>',
                                                add_special_tokens=False).input_ids, [0.0])
    call = agent.act(obs())
    assert call.parse_error is None and call.message.tool_calls[0].name == "write_file"
    del agent.sample
    with torch.no_grad():  # on-policy ratio 1 with the prefix in the context
        logp = token_logprobs(agent.model, turn.context_ids, turn.action_ids, agent.temperature)
    assert float((logp - torch.tensor(turn.sample_logprobs)).abs().max()) < 1e-4


def test_acting_merges_the_lora_and_training_sees_it_apart():
    """float32 weights: acting samples from W + BA merged (one matmul per layer), the same
    function as the unmerged adapter; training, saving and loading see it apart, and a cycle
    of act → train → act leaves the base weights where they were."""
    torch.set_num_threads(1)
    agent = tiny_agent(learning_rate=1e-2)
    assert agent.merge_lora
    base = {n: p.detach().clone() for n, p in agent._model.named_parameters() if "lora" not in n}
    with torch.no_grad():  # a nonzero adapter (peft starts B at 0, which merges to nothing)
        for n, p in agent._model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    context = agent.render(obs())
    ids, logp = agent.sample(context)
    assert agent._merged
    unmerged = token_logprobs(agent.model, context, ids, agent.temperature)  # property unmerges
    assert not agent._merged
    assert torch.allclose(unmerged, torch.tensor(logp), atol=1e-4)
    turn = Turn(message=Message("assistant", "x"), action_ids=ids, sample_logprobs=logp,
                context_ids=context)
    stats = agent.train_step([TrainItem(turns=[turn], advantage=1.0, policy_version=0)])
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    agent.sample(context)  # merged again, with the new BA
    agent.model  # noqa: B018 — unmerged
    for n, p in agent._model.named_parameters():
        if n in base:
            assert torch.allclose(p, base[n], atol=1e-6), n


def test_lower_precision_weights_are_never_merged():
    torch.set_num_threads(1)
    from nestor.models.registry import load_model

    model, tok = load_model("tiny-m")
    agent = LMPolicy(model.to(torch.bfloat16), tok, max_new_tokens=8)
    assert not agent.merge_lora
    agent.sample(agent.render(obs()))
    assert not agent._merged


def test_the_learner_runs_in_bf16_autocast_when_asked_and_keeps_the_lora_float32():
    # A matmul inside train_step is bf16 only under train_precision = "bfloat16"; the LoRA, its
    # gradients and Adam stay float32, and the on-policy ratio moves off 1 only by rounding.
    seen = {}
    for precision in ("float32", "bfloat16"):
        agent = tiny_agent(learning_rate=1e-2, train_precision=precision)
        turn = agent.act(obs())
        proj = next(m for n, m in agent.model.named_modules() if n.endswith("q_proj.base_layer"))
        seen[precision] = dtypes = set()
        hook = proj.register_forward_hook(lambda m, i, out, dtypes=dtypes: dtypes.add(out.dtype))
        stats = agent.train_step([TrainItem([turn], 1.0, agent.version)])
        hook.remove()
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
                   for p in agent.model.parameters() if p.requires_grad)
        assert stats["ratio_mean"] == pytest.approx(1.0, abs=0.05)
    assert seen == {"float32": {torch.float32}, "bfloat16": {torch.bfloat16}}
    with pytest.raises(ValueError, match="precision 'fp8'"):
        tiny_agent(train_precision="fp8")
