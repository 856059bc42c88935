"""The warm start on tiny-m: demos become exactly the tokens the LM policy acts with, behaviour
cloning lowers their loss and only their loss, a run resumes where it stopped, and the adapter
loads into a fresh policy that then writes the demo's tool call."""

from __future__ import annotations

import json

import pytest
import torch

from nestor.policy.base import Message, Observation, ToolCall
from nestor.policy.chat import parse_assistant
from nestor.policy.lm import LMPolicy
from nestor.sft.data import EncodeStats, encode_demo, policy_encoders, turn_pairs
from nestor.sft.demos import Demo, from_openai_jsonl, read_demos, select, write_demos
from nestor.sft.run import split_demos
from nestor.sft.trainer import SFTConfig, Trainer, bc_loss

# one short tool: sequences of ~300 tokens keep each step well under a second
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string"}}}}}]
CONFIG = 'max_steps = 4\n'


def conversation() -> list[Message]:
    return [Message("system", "You write jobs."), Message("user", "Teach reverse."),
            Message("assistant", "", [ToolCall("write_file", {"path": "config.toml",
                                                              "content": "max_steps = 0"}, "a")]),
            Message("tool", "FAIL config: max_steps must be >= 1", tool_call_id="a"),
            # the repair of a failed submit: kept, it teaches reading the report
            Message("assistant", "", [ToolCall("write_file", {"path": "config.toml",
                                                              "content": CONFIG}, "b")]),
            Message("tool", "ok", tool_call_id="b")]


def policy(**kw) -> LMPolicy:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    return LMPolicy.from_pretrained("tiny-m", max_new_tokens=96, lora_rank=8, lora_alpha=16, **kw)


@pytest.fixture(scope="module")
def agent() -> LMPolicy:
    return policy()


def test_sft_tokens_are_the_tokens_the_policy_acts_with(agent):
    demo = Demo(conversation(), TOOLS, passed=True, id="d")
    render, encode_action = policy_encoders(agent)
    for pack in (False, True):
        stats = EncodeStats()
        seqs = encode_demo(demo, render, encode_action, stats, pack=pack)
        pairs = [p for s in seqs for p in turn_pairs(s)]
        assert stats.turns == 2 and len(pairs) == 2
        for (context, action), k in zip(pairs, (2, 4), strict=True):
            # the context is what the policy renders at act time for the same conversation
            assert context == agent.render(Observation(conversation()[:k], TOOLS))
            assert action[-1] == agent.eos_id
            message, error = parse_assistant(agent.tokenizer.decode(action[:-1]))
            want = conversation()[k].tool_calls[0]
            assert error is None
            assert [(c.name, c.arguments) for c in message.tool_calls] == [(want.name,
                                                                            want.arguments)]
        if pack:  # this template re-renders earlier turns unchanged: one sequence per episode
            assert len(seqs) == 1 and seqs[0].n_targets == sum(len(a) for _, a in pairs)


def repaired() -> list[Message]:
    """An attempt whose submit failed, then its repair, which passed."""
    def turn(call_id: str, name: str, args: dict) -> Message:
        return Message("assistant", "", [ToolCall(name, args, call_id)])

    write = {"path": "config.toml", "content": "max_steps = 0"}
    return [Message("system", "You write jobs."), Message("user", "Teach reverse."),
            turn("a", "write_file", write), Message("tool", "ok", tool_call_id="a"),
            turn("b", "submit", {}),
            Message("tool", "validation failed (attempt 1 of 2): 1 of 9 checks failed.\n"
                    "FAIL config: max_steps must be >= 1", tool_call_id="b"),
            turn("c", "write_file", {**write, "content": CONFIG}),
            Message("tool", "ok", tool_call_id="c"), turn("d", "submit", {}),
            Message("tool", "validation passed (attempt 2 of 2)", tool_call_id="d")]


def test_a_failed_attempt_is_the_repairs_context_not_a_target(agent):
    render, encode_action = policy_encoders(agent)
    demo = Demo(repaired(), TOOLS, passed=True, id="d")
    stats = EncodeStats()
    pairs = [p for s in encode_demo(demo, render, encode_action, stats) for p in turn_pairs(s)]
    assert stats.context_only == 2 and len(pairs) == 2
    # the repair is trained in the context of the failed attempt and the probe's report
    assert pairs[0][0] == agent.render(Observation(repaired()[:6], TOOLS))
    assert '"max_steps = 0"' not in agent.tokenizer.decode(pairs[0][1])
    every = [p for s in encode_demo(demo, render, encode_action, train_failed=True)
             for p in turn_pairs(s)]
    assert len(every) == 4 and every[2:] == pairs


def test_a_response_prefix_stays_in_the_context_not_in_the_targets():
    prefix = '<tool_call>{"name": "'
    agent = policy(response_prefix=prefix)
    render, encode_action = policy_encoders(agent)
    (seq,) = encode_demo(Demo(conversation()[:3], TOOLS, id="d"), render, encode_action)
    ((context, action),) = turn_pairs(seq)
    assert context == agent.render(Observation(conversation()[:2], TOOLS))
    text = prefix + agent.tokenizer.decode(action[:-1])
    assert parse_assistant(text)[0].tool_calls[0].arguments["content"] == "max_steps = 0"


def test_masked_tokens_carry_no_gradient(agent):
    """The loss is the mean -log p over action tokens only: it equals that sum computed from
    the full logits in the test, and only the action positions ever reach the LM head."""
    import torch.nn.functional as F

    render, encode_action = policy_encoders(agent)
    (seq,) = encode_demo(Demo(conversation(), TOOLS, id="d"), render, encode_action)
    rows = []
    head = agent.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[-2]))
    try:
        loss, n, correct = bc_loss(agent.model, seq)
    finally:
        hook.remove()
    assert rows == [n] and n == seq.n_targets < len(seq.ids) // 3
    with torch.no_grad():
        logp = F.log_softmax(agent.model(input_ids=torch.tensor([seq.ids])).logits[0].float(), -1)
    targets = [t for t in range(1, len(seq.ids)) if seq.mask[t]]
    want = -sum(float(logp[t - 1, seq.ids[t]]) for t in targets)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-4)
    # token accuracy: the targets that are the argmax of the full logits
    assert correct == sum(int(logp[t - 1].argmax()) == seq.ids[t] for t in targets)


def test_held_out_demos_are_scored_without_a_gradient_and_never_trained(tmp_path):
    demos = [Demo(conversation(), TOOLS, passed=True, id=f"d{i}") for i in range(8)]
    train, held = split_demos(demos, 0.25, seed=3)
    assert len(held) == 2 and {d.id for d in train}.isdisjoint(d.id for d in held)
    assert len(train) + len(held) == 8
    assert split_demos(demos, 0.25, seed=3) == (train, held)  # a resume holds out the same
    assert split_demos(demos, 0.0, seed=3) == (demos, [])
    assert len(split_demos(demos[:1], 0.5, seed=3)[0]) == 1  # never every demo held out

    agent = policy()
    render, encode_action = policy_encoders(agent)
    seqs = encode_demo(demos[0], render, encode_action)
    trainer = Trainer(agent, SFTConfig(model="tiny-m", steps=3, batch_sequences=1, eval_every=2,
                                       precision="float32", gradient_checkpointing=False),
                      tmp_path)
    before = [p.detach().clone() for p in trainer.params]
    scored = trainer.evaluate(seqs)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))
    assert all(p.grad is None for p in trainer.params)
    loss, n, correct = bc_loss(agent.model, seqs[0])
    assert scored == pytest.approx({"val_loss": float(loss.detach()) / n, "val_token_accuracy": correct / n})
    history = trainer.train(seqs, val=seqs)
    assert ["val_loss" in h for h in history] == [False, True, True]  # every 2 steps and the last
    assert all(0 <= h["token_accuracy"] <= 1 for h in history)


def test_bfloat16_autocast_steps_as_float32_does_and_keeps_the_adapter_float32(tmp_path):
    steps = {}
    for precision in ("float32", "bfloat16"):
        agent = policy()
        render, encode_action = policy_encoders(agent)
        seqs = encode_demo(Demo(conversation(), TOOLS, id="d"), render, encode_action)
        trainer = Trainer(agent, SFTConfig(model="tiny-m", steps=1, batch_sequences=1,
                                           precision=precision, gradient_checkpointing=False),
                          tmp_path / precision)
        (step,) = trainer.train(seqs)
        grads = torch.cat([p.grad.flatten() for p in trainer.params])
        assert {p.dtype for p in trainer.params} == {torch.float32}
        steps[precision] = (step, grads)
    (f32, g32), (b16, g16) = steps["float32"], steps["bfloat16"]
    assert b16["loss"] == pytest.approx(f32["loss"], rel=0.02)
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.98


def test_gradient_checkpointing_is_what_the_config_says_whatever_the_policy_had(tmp_path):
    """Checkpointing keeps only each layer's input for backward: count what the step saves."""
    saved: dict[tuple[bool, bool], int] = {}
    for policy_on in (True, False):
        for sft_on in (True, False):
            agent = policy(gradient_checkpointing=policy_on)
            render, encode_action = policy_encoders(agent)
            seqs = encode_demo(Demo(conversation(), TOOLS, id="d"), render, encode_action)
            tensors: list = []

            def pack(t, kept=tensors):
                kept.append(t)
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                Trainer(agent, SFTConfig(model="tiny-m", steps=1, batch_sequences=1,
                                         gradient_checkpointing=sft_on), tmp_path).train(seqs)
            saved[policy_on, sft_on] = len(tensors)
            assert agent.gradient_checkpointing == policy_on  # the policy's own, as it was
    for policy_on in (True, False):
        assert saved[policy_on, True] * 5 < saved[policy_on, False], saved


@pytest.mark.slow
def test_behaviour_cloning_lowers_the_loss_resumes_and_the_adapter_acts(tmp_path):
    agent = policy()
    render, encode_action = policy_encoders(agent)
    seqs = encode_demo(Demo(conversation(), TOOLS, id="d"), render, encode_action)
    cfg = SFTConfig(model="tiny-m", steps=24, batch_sequences=1, learning_rate=3e-3,
                    warmup_steps=0, checkpoint_every=12)
    # a run that stops at step 12 (its checkpoint), then resumes in a fresh process's stead
    first = Trainer(agent, cfg.model_copy(update={"steps": 12}), tmp_path)
    first.train(seqs)
    fresh = policy()
    resumed = Trainer(fresh, cfg, tmp_path)
    assert resumed.resume() and resumed.step == 12 and len(resumed.history) == 12
    history = resumed.train(seqs)
    assert [h["step"] for h in history] == list(range(1, 25))
    losses = [h["loss"] for h in history]
    assert sum(losses[-4:]) / 4 < 0.3 * sum(losses[:4]) / 4
    # the adapter loads into a new policy, whose greedy turn is the demo's tool call
    actor = policy(temperature=0.05)
    actor.load_adapter(tmp_path)
    turn = actor.act(Observation(conversation()[:2], TOOLS))
    assert turn.parse_error is None
    assert [(c.name, c.arguments) for c in turn.message.tool_calls] == [
        ("write_file", {"path": "config.toml", "content": "max_steps = 0"})]


def test_adapter_of_another_rank_is_refused_with_the_fix(tmp_path):
    agent = policy()
    agent.model.save_pretrained(tmp_path / "adapter")
    other = LMPolicy.from_pretrained("tiny-m", lora_rank=4, lora_alpha=16)
    with pytest.raises(ValueError, match="lora_rank"):
        other.load_adapter(tmp_path)
    with pytest.raises(FileNotFoundError, match="nestor sft"):
        other.load_adapter(tmp_path / "nowhere")


def test_openai_transcripts_and_outcome_filters(tmp_path):
    line = {"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function",
             "function": {"name": "write_file", "arguments": json.dumps({"path": "a"})}}]},
        {"role": "tool", "tool_call_id": "x", "content": "ok"}],
        "reward": 0.7, "task": "reverse"}
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({**line, "reward": r, "passed": p})
                              for r, p in ((0.7, True), (0.2, True), (0.9, False))) + "\n")
    demos = from_openai_jsonl(path)
    assert demos[0].messages[2].tool_calls[0].arguments == {"path": "a"}
    assert [d.reward for d in select(demos)] == [0.7, 0.2]
    assert [d.reward for d in select(demos, min_reward=0.5)] == [0.7]
    assert [d.reward for d in select(demos, passed=False, best_of_group=True)] == [0.9]
    path.write_text('{"messages": [{"role": "assistant", "tool_calls": [{"function": '
                    '{"name": "w", "arguments": "{oops"}}]}]}\n')
    from nestor.sft.demos import DemoError

    with pytest.raises(DemoError, match="line 1.*not JSON"):
        from_openai_jsonl(path)


def test_demos_with_a_lone_surrogate_are_written(tmp_path):
    # a transcript's "\ud800" (JSON-escaped, so it round-trips) cannot be UTF-8: it must not
    # stop write_demos, nor cost the demos after it
    bad = Demo([Message("assistant", "", [ToolCall("write_file", {"path": "a",
                                                                  "content": "x\ud800"}, "a")])],
               TOOLS, id="bad")
    assert write_demos(tmp_path / "d.jsonl", [bad, Demo(conversation(), TOOLS, id="ok")]) == 2
    back = read_demos(tmp_path / "d.jsonl")
    assert [d.id for d in back] == ["bad", "ok"]
    assert back[0].messages[0].tool_calls[0].arguments["content"] == "x?"


_U = {"role": "user", "content": "u"}
_OK = {"role": "assistant", "content": "ok"}


def _call(args, **kw):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "submit", "arguments": args}, **kw}]}


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("line", "error"), [
    (json.dumps({"messages": [_U, _call(json.dumps({"a": 1}).replace("1", _DEEP))]}),
     "nested too deeply"),
    ('{"messages": [{"role": "user", "content": "u"}], "x": ' + _DEEP + "}", "nested too deeply"),
    (json.dumps({"messages": [_U, _call("{}"), {"role": "tool", "content": "x",
                                               "tool_call_id": [1]}]}), "tool_call_id"),
    (json.dumps({"messages": [_U, _OK], "reward": [1]}), "reward"),
    (json.dumps({"messages": [_U, _OK], "reward": "abc"}), "reward"),
    (json.dumps({"messages": [_U, _OK], "tools": "abc"}), "tools"),
    (json.dumps({"messages": [_U, _OK], "tools": [1, 2]}), "tools"),
    (json.dumps({"messages": [_U, _OK], "passed": "false"}), "passed"),
    (json.dumps({"messages": [_U, {"role": "assistant", "tool_calls": ["x"]}]}), "function"),
    (json.dumps({"messages": [{"role": "user", "content": {"a": 1}}]}), "content"),
], ids=["deep-args", "deep-line", "tool-call-id-list", "reward-list", "reward-str",
        "tools-str", "tools-ints", "passed-str", "call-str", "content-dict"])
def test_a_bad_transcript_row_is_a_demo_error_naming_its_line(tmp_path, line, error):
    from nestor.sft.demos import DemoError, load_source

    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"messages": [_U, _OK]}) + "\n" + line + "\n")
    with pytest.raises(DemoError, match=f"line 2: .*{error}"):
        load_source(str(path), tmp_path)


def test_a_lone_surrogate_in_a_transcript_is_replaced_before_tokenizing(tmp_path, agent):
    path = tmp_path / "t.jsonl"
    line = json.dumps({"messages": [{"role": "user", "content": "a\ud800"}, _call(
        json.dumps({"path": "x\ud800"}))], "tools": TOOLS})
    path.write_text(line + "\n", encoding="utf-8")
    demo, = from_openai_jsonl(path)
    assert demo.messages[0].content == "a\ufffd"
    assert demo.messages[1].tool_calls[0].arguments == {"path": "x\ufffd"}
    render, encode = policy_encoders(agent)
    assert encode_demo(demo, render, encode, EncodeStats())  # the fast tokenizer takes it
