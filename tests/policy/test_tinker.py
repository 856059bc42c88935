"""The Tinker policy: datums checked against the SDK's own types, and sampling, training, the
warm start and checkpoints on the local service (real tensors on tiny-m through the SDK's
client surface)."""

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tinker import types

from nestor.policy.base import Message, Observation, ToolCall, TrainItem, Turn
from nestor.policy.tinker import (
    TinkerPolicy,
    TinkerPolicyError,
    demo_datum,
    sft_datum,
    turn_datum,
    turn_seed,
)
from nestor.policy.tinker_local import LocalService

SYSTEM = Message("system", "You write jobs.")


def obs(text: str = "go", seed: int | None = None, tools=()) -> Observation:
    return Observation([SYSTEM, Message("user", text)], list(tools), seed=seed)


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    return TinkerPolicy("tiny-m", service=LocalService(), lora_rank=4, learning_rate=1e-2,
                        max_new_tokens=24, seed=3)


def logprobs_now(policy, datum: types.Datum) -> torch.Tensor:
    """Plain-logit logprobs of a datum's targets under the trainer's current weights."""
    model = policy.training.policy.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([datum.model_input.to_ints()])).logits[0]
    target = datum.loss_fn_inputs["target_tokens"].to_torch()
    return torch.log_softmax(logits.float(), -1).gather(-1, target[:, None])[:, 0]


def test_datum_shapes_and_masks_use_sdk_types():
    turn = Turn(message=Message("assistant", "x"), context_ids=[5, 6, 7],
                action_ids=[8, 9], sample_logprobs=[-0.5, -1.5])
    d = turn_datum(turn, advantage=0.25, with_mask=True)
    assert isinstance(d, types.Datum) and isinstance(d.model_input, types.ModelInput)
    assert d.model_input.to_ints() == [5, 6, 7, 8]
    inputs = {k: v.tolist() for k, v in d.loss_fn_inputs.items()}
    assert inputs["target_tokens"] == [6, 7, 8, 9]
    assert inputs["logprobs"] == [0.0, 0.0, -0.5, -1.5]
    assert inputs["advantages"] == [0.0, 0.0, 0.25, 0.25]
    assert inputs["mask"] == [0.0, 0.0, 1.0, 1.0]
    assert d.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert "mask" not in turn_datum(turn, 1.0).loss_fn_inputs  # the service's own loss
    assert turn_datum(Turn(message=Message("assistant", "")), 1.0) is None

    s = sft_datum([5, 6, 7], [8, 9], action_mask=[1, 0])
    assert s.model_input.to_ints() == [5, 6, 7, 8]
    assert s.loss_fn_inputs["weights"].tolist() == [0.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="action_mask"):
        sft_datum([5], [8, 9], action_mask=[1])
    # nestor sft's SFTSequence (ids, mask) and lm_sequence's PackedSequence read the same
    for demo in ({"ids": [5, 6, 7, 8, 9], "mask": [False, False, False, True, False]},
                 SimpleNamespace(input_ids=[5, 6, 7, 8, 9], action_mask=[0, 0, 0, 1, 0]),
                 ([5, 6, 7], [8, 9], [1, 0])):
        d = demo_datum(demo)
        assert d.model_input.to_ints() == [5, 6, 7, 8]
        assert d.loss_fn_inputs["weights"].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_turn_seeds_differ_by_episode_turn_and_version():
    seeds = {turn_seed(b, t, v) for b in range(4) for t in range(3) for v in range(2)}
    assert len(seeds) == 24 and all(0 <= s < 2**31 for s in seeds)
    assert turn_seed(7, 1, 0) == turn_seed(7, 1, 0)


def test_missing_api_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(TinkerPolicyError, match=r"\$TINKER_API_KEY"):
        TinkerPolicy("Qwen/Qwen3-8B")


@pytest.mark.slow
def test_episodes_of_a_group_sample_differently_and_reproducibly(policy):
    turns = [policy.act(obs(seed=s)) for s in range(4)]
    assert len({tuple(t.action_ids) for t in turns}) == 4  # one group: four different replies
    assert policy.act(obs(seed=2)).action_ids == turns[2].action_ids  # a rerun repeats it
    unseeded = [policy.act(obs()).action_ids for _ in range(2)]  # `episode run`: own RNG
    assert unseeded[0] != unseeded[1]


@pytest.mark.slow
def test_local_sampler_is_seeded_like_the_service(policy):
    prompt = types.ModelInput.from_ints(policy.render(obs()))

    def draw(seed):
        params = types.SamplingParams(max_tokens=16, seed=seed, stop=[])
        return policy.sampler.sample(prompt, 1, params).result().sequences[0].tokens

    assert draw(11) == draw(11)
    assert draw(None) != draw(None)  # no seed: a fresh draw, as on the service


@pytest.mark.slow
def test_max_tokens_is_capped_by_the_context_window(policy):
    long = obs("x" * (policy.max_context - 40))  # char-level model: ~1 token per char
    context, max_tokens = policy.fit(policy.render(long))
    assert len(context) + max_tokens <= policy.max_context and max_tokens >= 16
    turn = policy.act(long)  # the service refuses prompt + max_tokens > context: no error
    assert len(turn.context_ids) + len(turn.action_ids) <= policy.max_context
    params = types.SamplingParams(max_tokens=policy.max_new_tokens)
    with pytest.raises(ValueError, match="context length"):
        policy.sampler.sample(types.ModelInput.from_ints(policy.render(long)), 1, params)


def test_a_reply_cut_at_the_turn_cap_is_told_so(policy, monkeypatch):
    """As the lm policy: the service's stop_reason "length" puts the cap, or the loop that ran
    into it, in the error."""
    ids = policy.tokenizer('<tool_call>{"name": "write_file", "arguments": {"content": "55',
                           add_special_tokens=False).input_ids

    def fixed(reason: str, tokens: list[int]):
        seq = types.SampledSequence(stop_reason=reason, sequence_id="s", _tokens_list=tokens,
                                    _logprobs_list=[0.0] * len(tokens))
        return SimpleNamespace(sample=lambda **kw: SimpleNamespace(
            result=lambda: types.SampleResponse(sequences=[seq])))

    monkeypatch.setattr(policy, "sampler", fixed("length", ids))
    cut = policy.act(obs())
    monkeypatch.setattr(policy, "sampler", fixed("stop", ids + policy.stop))
    ended = policy.act(obs())
    monkeypatch.setattr(policy, "sampler", fixed("length", ids + ids[-1:] * 60))
    looped = policy.act(obs())  # cut at the cap in a loop: the error names the loop
    assert cut.parse_error.startswith("the reply reached the") and "-token cap" in cut.parse_error
    assert ended.parse_error and "cap" not in ended.parse_error
    assert looped.parse_error.startswith("the reply was stopped unfinished: it repeated one")


@pytest.mark.slow
def test_turns_stop_at_the_templates_end_of_message(policy, monkeypatch):
    """A base model whose eos is not `<|im_end|>` (Qwen3 base: <|endoftext|>) runs past the
    end of its turn unless the stop sequence is sent."""
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert policy.stop == [im_end]
    base_tokenizer = copy.deepcopy(policy.tokenizer)
    base_tokenizer.eos_token = "a"  # the sampler's implicit stop is now another token
    monkeypatch.setattr(policy.sampler, "tokenizer", base_tokenizer)
    turns = [policy.act(obs(seed=s)) for s in range(6)]
    assert any(t.action_ids[-1] == im_end for t in turns)
    for t in turns:
        assert im_end not in t.action_ids[:-1]
        assert t.action_ids[-1] == im_end or len(t.action_ids) == policy.max_new_tokens


@pytest.mark.slow
def test_training_step_on_local_service(policy):
    policy.temperature = 0.5  # sampled at T=0.5; the service trains on plain logits
    try:
        turn = policy.act(obs(seed=1))
    finally:
        policy.temperature = 1.0
    d = sft_datum(turn.context_ids, turn.action_ids)
    out = policy.training.forward([d], "cross_entropy").result()
    assert torch.allclose(out.loss_fn_outputs[0]["logprobs"].to_torch(), logprobs_now(policy, d),
                          atol=1e-5)  # no temperature in training

    turn = policy.act(obs(seed=2))
    d = turn_datum(turn, 1.0)
    n = len(turn.action_ids)
    # on-policy at T=1, the sampled logprobs are what the trainer computes: ratio 1
    assert torch.allclose(logprobs_now(policy, d)[-n:], torch.tensor(turn.sample_logprobs),
                          atol=1e-4)
    model = policy.training.policy.model
    lora_before = {k: v.clone() for k, v in model.named_parameters() if v.requires_grad}
    base_before = {k: v.clone() for k, v in model.named_parameters() if not v.requires_grad}
    sampler_before, version = policy.sampler, policy.version
    metrics = policy.train_step([TrainItem(turns=[turn], advantage=1.0, policy_version=0)])
    assert policy.version == version + 1 and metrics["datums"] == 1
    assert math.isfinite(metrics["loss"]) and abs(metrics["ratio_mean"] - 1.0) < 1e-3
    changed = [k for k, v in model.named_parameters() if v.requires_grad
               and not torch.equal(v, lora_before[k])]
    assert changed and all("lora_" in k for k in changed)
    assert all(torch.equal(v, base_before[k]) for k, v in model.named_parameters()
               if not v.requires_grad)
    assert policy.sampler is not sampler_before  # a fresh sampling client after the step
    # a positive advantage made the sampled turn more likely
    assert logprobs_now(policy, d)[-n:].sum() > sum(turn.sample_logprobs)
    # a batch without tokens is no step
    assert policy.train_step([TrainItem(turns=[], advantage=1.0, policy_version=0)]) == \
        {"datums": 0.0} and policy.version == version + 1


def _lora_grads(policy) -> dict[str, torch.Tensor]:
    return {k: (v.grad.clone() if v.grad is not None else torch.zeros_like(v))
            for k, v in policy.training.policy.model.named_parameters() if v.requires_grad}


@pytest.mark.slow
@pytest.mark.parametrize("clip_ratio", [0.0, 0.2])
def test_truncated_and_clipped_ratios_as_the_lm_policy(policy, clip_ratio):
    """A turn sampled far off policy (ratio e² > tis_cap 2): the loss is 2·A per token with
    gradient 2·A·∇logp (truncated IS); a PPO clip at 0.2 (A > 0) leaves no gradient."""
    turn = policy.act(obs(seed=5))
    stale = Turn(message=turn.message, context_ids=turn.context_ids, action_ids=turn.action_ids,
                 sample_logprobs=[lp - 2.0 for lp in turn.sample_logprobs])
    d = turn_datum(stale, 1.0)
    n = len(stale.action_ids)
    # expected gradient by hand: -(cap · A/N) ∇ Σ logp, A/N = 1/2 (two episodes, A = 1)
    model = policy.training.policy.model
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=torch.tensor([d.model_input.to_ints()])).logits[0].float()
    target = d.loss_fn_inputs["target_tokens"].to_torch()
    logp = torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0][-n:]
    (-(2.0 * 0.5) * logp.sum()).backward()
    expected = _lora_grads(policy)
    model.zero_grad(set_to_none=True)

    policy.clip_ratio = clip_ratio
    datums = [turn_datum(stale, 0.5, with_mask=True)]  # A = 1 over N = 2 episodes
    try:
        out = policy.training.forward_backward_custom(datums, policy._custom_loss).result()
    finally:
        policy.clip_ratio = 0.0
    got = _lora_grads(policy)
    model.zero_grad(set_to_none=True)
    assert out.metrics["truncated_frac"] == 1.0
    assert math.isclose(out.metrics["loss:sum"], -2.0 * 0.5 * n if not clip_ratio
                        else -1.2 * 0.5 * n, rel_tol=1e-4)
    if clip_ratio:
        assert out.metrics["clipped_frac"] == 1.0
        assert all(float(g.abs().max()) == 0.0 for g in got.values())
    else:
        assert all(torch.allclose(got[k], expected[k], atol=1e-6) for k in expected)
        assert any(float(g.abs().max()) > 0 for g in got.values())


@pytest.mark.slow
def test_checkpoint_names_are_unique_and_resume_restores(policy, tmp_path):
    policy.save(tmp_path / "a")
    policy.save(tmp_path / "b")  # a step without data: no version bump, a new name
    paths = [(tmp_path / p / "tinker.json").read_text() for p in "ab"]
    assert paths[0] != paths[1]
    with pytest.raises(ValueError, match="already exists"):  # the service refuses a reuse
        policy.training.save_state(name=f"nestor-v{policy.version}-{policy.saves}").result()

    again = TinkerPolicy("tiny-m", service=policy.service, lora_rank=4, max_new_tokens=24)
    again.load(tmp_path / "b")
    assert again.version == policy.version and again.saves == policy.saves
    mine = dict(policy.training.policy.model.named_parameters())
    assert all(torch.equal(mine[k], v) for k, v in again.training.policy.model.named_parameters()
               if v.requires_grad)
    assert again.act(obs(seed=9)).action_ids == policy.act(obs(seed=9)).action_ids
    again.save(tmp_path / "c")  # a new training run: its own names
    # `[policy] init_checkpoint`: the weights (e.g. a warm start's), a fresh optimizer, version 0
    start = TinkerPolicy("tiny-m", service=policy.service, lora_rank=4, max_new_tokens=24)
    start.load(tmp_path / "b", weights_only=True)
    assert start.version == 0 and not start.training.policy.optimizer.state
    assert all(torch.equal(mine[k], v) for k, v in start.training.policy.model.named_parameters()
               if v.requires_grad)
    with pytest.raises(TinkerPolicyError, match="not tiny-s"):
        TinkerPolicy("tiny-s", service=policy.service, lora_rank=4).load(tmp_path / "b")


@pytest.mark.slow
def test_warm_start_clones_demonstrated_tool_calls(policy):
    """Supervised warm start through `cross_entropy`: on the tokens the policy renders at act
    time, the demonstrated call (one tiny-m rarely picks: it reads notes.md first) becomes
    likely and the policy then writes it."""
    call = ToolCall("list_files", {})
    o = obs("list the files")
    context = policy.render(o)
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    action = policy.tokenizer(policy.tool_format.render_call(call),
                              add_special_tokens=False).input_ids + [im_end]
    before = logprobs_now(policy, sft_datum(context, action))[-len(action):].sum()
    version = policy.version
    rows = policy.warm_start([(context, action)] * 4, epochs=8, batch_size=4,
                             learning_rate=1e-2)
    assert len(rows) == 8 and rows[-1]["nll"] < rows[0]["nll"] / 2
    after = logprobs_now(policy, sft_datum(context, action))[-len(action):].sum()
    assert after > before + 1.0
    assert policy.version == version  # a warm start is not an RL update
    policy.max_new_tokens = 64
    try:
        turns = [policy.act(Observation(o.messages, [], seed=s)) for s in range(3)]
    finally:
        policy.max_new_tokens = 24
    names = [t.message.tool_calls[0].name for t in turns if t.message.tool_calls]
    assert names.count("list_files") >= 2, names


class _Payload:
    """A pickle that writes a file when loaded: what a shared checkpoint's state.pt can hold."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_runs_no_pickle_from_its_state_file(policy, tmp_path):
    """`init_checkpoint` may be a warm start someone shared: loading its weights reads
    safetensors and JSON only, and a resume reads state.pt as tensors and numbers, never
    unpickling objects (the red-team's payload ran before the load failed)."""
    policy.save(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "tinker.json").read_text())["tinker_path"]
    pwned = tmp_path / "pwned"
    torch.save({"optimizer": _Payload(pwned)}, Path(saved) / "state.pt")
    start = TinkerPolicy("tiny-m", service=policy.service, lora_rank=4, max_new_tokens=24)
    start.load(tmp_path / "ckpt", weights_only=True)  # the weights: state.pt is not read
    assert not pwned.exists()
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported"):
        TinkerPolicy("tiny-m", service=policy.service, lora_rank=4).load(tmp_path / "ckpt")
    assert not pwned.exists()
