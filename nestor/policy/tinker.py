"""`tinker`: the agent is a large model LoRA-trained through Tinker's managed API.

Acting: the conversation is rendered with the model's chat template and sampled by a Tinker
sampling client, which returns token ids and logprobs. Each turn samples with its own seed,
derived from the episode's seed, the turn's index and the policy version (so the G episodes of
a group differ, and a rerun of an episode repeats it); `max_tokens` is capped so that prompt +
turn fit the model's context window; the template's end-of-message token is sent as the stop
sequence (`<|im_end|>` for ChatML/Qwen templates, as tinker-cookbook's renderers do). Tool
calls are parsed in the model family's format (`nestor.policy.tool_format`).

Training: each episode's turns become `tinker.types.Datum`s (advantage 0 on prompt and
tool-result tokens, A/N on the turn's own tokens, N = episodes in the batch) and one
`forward_backward` + `optim_step(AdamParams)` is one policy version. The loss is the LM
policy's (`nestor.policy.is_loss`: per-token ratio truncated at `tis_cap`, optionally
PPO-clipped), run through the SDK's `forward_backward_custom` (one extra forward pass on the
service); with tis_cap = clip_ratio = 0 it is the service's own
`importance_sampling` loss, which is the same sum untruncated. The loop's hard staleness cap
applies (`token_level`).

Warm start: `warm_start(examples)` is supervised learning on (context ids, action ids)
sequences through the service's `cross_entropy` loss, as tinker-cookbook's supervised recipes
do; only action tokens carry weight.

`service` may be any object with the SDK's ServiceClient surface; by default a real
`tinker.ServiceClient` from $TINKER_API_KEY (and an optional base URL).
`nestor.policy.tinker_local.LocalService` is one backed by a local model, for offline runs
and tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tinker import types

from nestor.models.loops import LOOP_MIN_SPAN, repeat_period
from nestor.policy.base import Observation, TrainItem, Turn
from nestor.policy.chat import parse_assistant, to_hf_messages
from nestor.policy.is_loss import DEFAULT_TIS_CAP, importance_sampling_loss
from nestor.policy.lm import default_turn_tokens
from nestor.policy.tool_format import stop_token_ids, tool_format_for

DEFAULT_CONTEXT = 32768  # when neither the config nor the service says
MIN_TURN_TOKENS = 64  # a prompt longer than context - this is cut from the left


class TinkerPolicyError(RuntimeError):
    """Tinker cannot be used as configured (no key, unknown checkpoint)."""


def turn_datum(turn: Turn, advantage: float, *, with_mask: bool = False) -> types.Datum | None:
    """One sampled turn as a Datum: the model reads context + actions[:-1] and is scored on
    the next token everywhere; only the turn's own tokens carry logprobs and the advantage.
    `with_mask` adds a client-side `mask` (1 on the turn's tokens) for the custom loss."""
    if not turn.action_ids:
        return None
    tokens = turn.context_ids + turn.action_ids  # [L + T]
    n_ctx, n_act = len(turn.context_ids), len(turn.action_ids)
    zeros = [0.0] * (n_ctx - 1)  # targets 1..L-1 are prompt tokens: no loss
    inputs = {
        "target_tokens": torch.tensor(tokens[1:], dtype=torch.int64),
        "logprobs": torch.tensor(zeros + list(turn.sample_logprobs), dtype=torch.float32),
        "advantages": torch.tensor(zeros + [float(advantage)] * n_act, dtype=torch.float32),
    }
    if with_mask:
        inputs["mask"] = torch.tensor(zeros + [1.0] * n_act, dtype=torch.float32)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs=inputs)


def sequence_datum(ids: Sequence[int], weights: Sequence[float]) -> types.Datum:
    """A token sequence as a `cross_entropy` Datum (tinker-cookbook's supervised form): the
    model reads ids[:-1] and is scored on ids[1:] with weights[1:] (1 on action tokens)."""
    if len(ids) < 2 or len(weights) != len(ids):
        raise ValueError(f"a demonstration needs ≥ 2 tokens and one weight per token "
                         f"({len(ids)} tokens, {len(weights)} weights)")
    return types.Datum(model_input=types.ModelInput.from_ints(list(ids[:-1])), loss_fn_inputs={
        "target_tokens": torch.tensor(list(ids[1:]), dtype=torch.int64),
        "weights": torch.tensor([float(w) for w in weights[1:]], dtype=torch.float32)})


def sft_datum(context_ids: Sequence[int], action_ids: Sequence[int],
              action_mask: Sequence[float] | None = None) -> types.Datum:
    """One demonstrated turn: weight 1 on the action tokens (or `action_mask`), 0 on the
    context."""
    if not context_ids or not action_ids:
        raise ValueError("a demonstration needs context and action tokens")
    mask = [1.0] * len(action_ids) if action_mask is None else [float(m) for m in action_mask]
    if len(mask) != len(action_ids):
        raise ValueError(f"action_mask has {len(mask)} entries for {len(action_ids)} actions")
    return sequence_datum(list(context_ids) + list(action_ids), [0.0] * len(context_ids) + mask)


def demo_datum(example: Any) -> types.Datum:
    """A demonstration in any of the shapes nestor makes as a Datum: nestor.sft's
    `SFTSequence` (.ids, .mask), lm_sequence's `PackedSequence` (.input_ids, .action_mask), a
    Turn-like object (.context_ids, .action_ids), a dict with either pair of keys, or a tuple
    (context ids, action ids[, action mask])."""
    get = example.get if isinstance(example, dict) else \
        (lambda key, default=None: getattr(example, key, default))
    for ids_key, mask_key in (("ids", "mask"), ("input_ids", "action_mask")):
        if get(ids_key) is not None and get(mask_key) is not None:
            return sequence_datum(get(ids_key), [float(m) for m in get(mask_key)])
    if get("context_ids") is not None:
        return sft_datum(get("context_ids"), get("action_ids"), get("action_mask"))
    context, actions, *mask = example
    return sft_datum(context, actions, mask[0] if mask else None)


def turn_seed(base: int, turn_index: int, version: int) -> int:
    """A 31-bit sampling seed, distinct per (episode seed, turn, policy version)."""
    digest = hashlib.blake2b(f"{base}:{turn_index}:{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


def make_service(kind: str = "remote", *, api_key_env: str = "TINKER_API_KEY",
                 base_url: str | None = None, local_root: Path | None = None) -> Any:
    """The Tinker service: `remote` (the real API, from $api_key_env) or `local` (the
    in-process stand-in on a local model)."""
    if kind == "local":
        from nestor.policy.tinker_local import LocalService

        return LocalService(local_root)
    key = os.environ.get(api_key_env)
    if not key:
        raise TinkerPolicyError(f"set ${api_key_env} to use Tinker's API, or run the offline "
                                "stand-in on a local model ([policy] tinker_service = 'local'; "
                                "--policy tinker-local)")
    import tinker

    return tinker.ServiceClient(api_key=key, base_url=base_url)


def make_tinker_policy(model: str, *, local: bool = False, checkpoint: Path | None = None,
                       api_key_env: str = "TINKER_API_KEY", **kwargs: Any) -> TinkerPolicy:
    """A tinker policy for `episode run` and `bench agents`: the real service or the local
    stand-in, optionally resumed from a run's checkpoint directory."""
    policy = TinkerPolicy(model, service=make_service("local" if local else "remote",
                                                      api_key_env=api_key_env), **kwargs)
    if checkpoint is not None:
        policy.load(checkpoint)
    return policy


class TinkerPolicy:
    name = "tinker"
    concurrent_act = True  # sampling requests go out in parallel (SerializedPolicy)
    token_level = True  # per-token ratios: the loop's hard staleness cap applies

    def __init__(self, base_model: str, *, service: Any = None, lora_rank: int = 32,
                 learning_rate: float = 4e-5, temperature: float = 1.0,
                 max_new_tokens: int | None = None, max_context: int | None = None,
                 clip_ratio: float = 0.0, tis_cap: float = DEFAULT_TIS_CAP,
                 grad_clip: float = 1.0, seed: int = 0, tool_format: str = "auto",
                 api_key_env: str = "TINKER_API_KEY", base_url: str | None = None):
        if service is None:
            service = make_service("remote", api_key_env=api_key_env, base_url=base_url)
        self.service = service
        self.base_model = base_model
        self.learning_rate = learning_rate
        self.temperature = temperature
        self.clip_ratio = clip_ratio
        self.tis_cap = tis_cap
        self.grad_clip = grad_clip
        self._rng = random.Random(seed)  # episode seeds for observations that carry none
        self._lock = threading.Lock()  # tokenizer and counters (acts run in threads)
        self._attach(service.create_lora_training_client(
            base_model=base_model, rank=lora_rank, seed=seed).result())
        self.max_context = max_context or self._service_context()
        self.max_new_tokens = max_new_tokens or default_turn_tokens(self.max_context)
        self.tool_format = tool_format_for(self.tokenizer, tool_format)
        self.stop = stop_token_ids(self.tokenizer)
        self.version = 0
        self.malformed_calls = 0
        self.turns_sampled = 0
        self.saves = 0  # checkpoint names are unique: a step without data saves a new one

    def _attach(self, training: Any) -> None:
        self.training = training
        self.tokenizer = training.get_tokenizer()
        self.sampler = training.save_weights_and_get_sampling_client().result()

    def _service_context(self) -> int:
        """The model's context length as the service reports it, else the tokenizer's."""
        try:
            models = self.service.get_server_capabilities().supported_models
            found = [m.max_context_length for m in models
                     if m.model_name == self.base_model and m.max_context_length]
            if found:
                return int(found[0])
        except Exception:  # noqa: BLE001 - an older service without capabilities: fall back
            pass
        n = getattr(self.tokenizer, "model_max_length", None)
        return int(n) if isinstance(n, int) and 0 < n < 10**7 else DEFAULT_CONTEXT

    # ---- acting -------------------------------------------------------------------------

    def render(self, obs: Observation) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            to_hf_messages(obs.messages), tools=obs.tools or None, add_generation_prompt=True,
            tokenize=False)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def fit(self, context: list[int]) -> tuple[list[int], int]:
        """(context, max_tokens) with len(context) + max_tokens ≤ max_context: the turn gets
        what room is left, at least MIN_TURN_TOKENS (the oldest context is cut for it)."""
        floor = min(self.max_new_tokens, MIN_TURN_TOKENS)
        if len(context) > self.max_context - floor:
            context = context[-(self.max_context - floor):]
        return context, min(self.max_new_tokens, self.max_context - len(context))

    def act(self, obs: Observation) -> Turn:
        turn_index = sum(m.role == "assistant" for m in obs.messages)
        with self._lock:
            context, max_tokens = self.fit(self.render(obs))
            base = obs.seed if obs.seed is not None else self._rng.getrandbits(31)
            version = self.version
            call_prefix = f"call_{self.turns_sampled}"
            self.turns_sampled += 1
        params = types.SamplingParams(max_tokens=max_tokens, temperature=self.temperature,
                                      seed=turn_seed(base, turn_index, version), stop=self.stop)
        reply = self.sampler.sample(prompt=types.ModelInput.from_ints(context), num_samples=1,
                                    sampling_params=params).result()
        seq = reply.sequences[0]
        if seq.logprobs is None:
            raise TinkerPolicyError("the sampling client returned no logprobs")
        with self._lock:
            text = self.tokenizer.decode([t for t in seq.tokens if t not in self.stop],
                                         skip_special_tokens=False)
        cut = seq.stop_reason == "length"  # the service cannot stop a loop early: say so after
        message, error = parse_assistant(
            text, call_prefix=call_prefix, fmt=self.tool_format, tools=obs.tools,
            cut_at=max_tokens if cut else None,
            repeated=repeat_period(seq.tokens, LOOP_MIN_SPAN) if cut else None)
        if error is not None:
            with self._lock:
                self.malformed_calls += 1
        return Turn(message=message, action_ids=list(seq.tokens),
                    sample_logprobs=list(seq.logprobs), context_ids=context, parse_error=error)

    # ---- training -----------------------------------------------------------------------

    def _custom_loss(self, data: list[types.Datum], logprobs: list[torch.Tensor]
                     ) -> tuple[torch.Tensor, dict[str, float]]:
        """The LM policy's truncated-IS loss on the service's logprobs (client side)."""
        total = torch.zeros(())
        tokens, ratio_sum, ratio_max, clipped, truncated = 0.0, 0.0, 0.0, 0.0, 0.0
        for datum, logp in zip(data, logprobs, strict=True):  # logp: [L]
            inputs = datum.loss_fn_inputs
            mask = inputs["mask"].to_torch() > 0  # [L]
            adv = inputs["advantages"].to_torch()[mask][:1]  # [1]: one advantage per turn
            loss, stats = importance_sampling_loss(
                logp[None], inputs["logprobs"].to_torch()[None], adv, mask[None],
                self.clip_ratio, self.tis_cap)
            total = total + loss
            n = float(mask.sum())
            tokens += n
            ratio_sum += stats["ratio_mean"] * n
            ratio_max = max(ratio_max, stats["ratio_max"])
            clipped += stats["clipped_frac"] * n
            truncated += stats["truncated_frac"] * n
        n = max(tokens, 1.0)
        return total, {"ratio_mean": ratio_sum / n, "ratio_max": ratio_max,
                       "clipped_frac": clipped / n, "truncated_frac": truncated / n}

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        """One optimizer step; a batch without tokens changes nothing (no version bump)."""
        custom = self.tis_cap > 0 or self.clip_ratio > 0
        n_items = max(1, len(batch))
        datums = [d for item in batch for turn in item.turns
                  if (d := turn_datum(turn, item.advantage / n_items, with_mask=custom))
                  is not None]
        if not datums:
            return {"datums": 0.0}
        if custom:
            out = self.training.forward_backward_custom(datums, self._custom_loss).result()
        else:
            out = self.training.forward_backward(datums, loss_fn="importance_sampling").result()
        optim = self.training.optim_step(types.AdamParams(
            learning_rate=self.learning_rate, grad_clip_norm=self.grad_clip)).result()
        self.sampler = self.training.save_weights_and_get_sampling_client().result()
        self.version += 1
        metrics = {"datums": float(len(datums)),
                   "tokens": float(sum(len(t.action_ids) for i in batch for t in i.turns)),
                   "malformed_calls_total": float(self.malformed_calls)}
        metrics.update({k: float(v) for k, v in out.metrics.items()})
        metrics.update({k: float(v) for k, v in (getattr(optim, "metrics", None) or {}).items()})
        if "loss:sum" in metrics:
            metrics["loss"] = metrics["loss:sum"]
        return metrics

    def warm_start(self, examples: Iterable[Any], *, epochs: int = 1, batch_size: int = 8,
                   learning_rate: float | None = None,
                   progress: Callable[[dict[str, float]], None] | None = None
                   ) -> list[dict[str, float]]:
        """Supervised steps on demonstrations through the service's `cross_entropy` loss.

        An example is any shape `demo_datum` reads (nestor sft's `SFTSequence` built with
        this policy's `render`, or (context ids, action ids)): the tokens the policy renders
        and samples at act time. Returns one row per step (mean NLL per weighted token,
        tokens). Does not bump `version` (no RL
        update happened); the sampler serves the warm-started weights afterwards.
        """
        datums = [demo_datum(e) for e in examples]
        if not datums:
            raise ValueError("warm_start needs at least one demonstration")
        rows = []
        order = random.Random(len(datums))
        for epoch in range(epochs):
            batch_order = list(range(len(datums)))
            order.shuffle(batch_order)
            for start in range(0, len(batch_order), batch_size):
                batch = [datums[i] for i in batch_order[start:start + batch_size]]
                out = self.training.forward_backward(batch, loss_fn="cross_entropy").result()
                self.training.optim_step(types.AdamParams(
                    learning_rate=learning_rate or self.learning_rate,
                    grad_clip_norm=self.grad_clip)).result()
                weights = [d.loss_fn_inputs["weights"].to_torch() for d in batch]
                logps = [o["logprobs"].to_torch() for o in out.loss_fn_outputs]
                n = float(sum(w.sum() for w in weights))
                nll = -float(sum((lp * w).sum() for lp, w in zip(logps, weights, strict=True)))
                row = {"epoch": float(epoch), "nll": nll / max(n, 1.0), "tokens": n}
                rows.append(row)
                if progress is not None:
                    progress(row)
        self.sampler = self.training.save_weights_and_get_sampling_client().result()
        return rows

    # ---- persistence: a Tinker checkpoint path, recorded in a small JSON file ------------

    def save(self, path: Path) -> None:
        self.saves += 1
        saved = self.training.save_state(name=f"nestor-v{self.version}-{self.saves}").result()
        path.mkdir(parents=True, exist_ok=True)
        (path / "tinker.json").write_text(json.dumps({
            "tinker_path": saved.path, "base_model": self.base_model, "version": self.version,
            "malformed_calls": self.malformed_calls, "turns_sampled": self.turns_sampled,
            "saves": self.saves, "rng": list(self._rng.getstate()[1]),
            "rng_gauss": self._rng.getstate()[2]}))

    def load(self, path: Path, *, weights_only: bool = False) -> None:
        """Resume from a saved checkpoint (weights, optimizer and counters), or with
        `weights_only` start from its weights (e.g. a warm start) with a fresh optimizer."""
        if not (path / "tinker.json").is_file() and (path / "policy" / "tinker.json").is_file():
            path = path / "policy"  # a run's checkpoint directory (checkpoints/step-N)
        file = path / "tinker.json"
        if not file.is_file():
            raise TinkerPolicyError(f"{path}: no tinker.json; not a tinker policy checkpoint")
        info = json.loads(file.read_text())
        if info["base_model"] != self.base_model:
            raise TinkerPolicyError(f"{path}: checkpoint of {info['base_model']}, "
                                    f"not {self.base_model}")
        if weights_only:
            self._attach(self.service.create_training_client_from_state(
                info["tinker_path"]).result())
            return
        self._attach(self.service.create_training_client_from_state_with_optimizer(
            info["tinker_path"]).result())
        self.version = info["version"]
        self.malformed_calls = info["malformed_calls"]
        self.turns_sampled = info.get("turns_sampled", 0)
        self.saves = info.get("saves", 0)
        if "rng" in info:
            self._rng.setstate((3, tuple(info["rng"]), info.get("rng_gauss")))

    def info(self) -> dict[str, Any]:
        return {"version": self.version, "malformed_calls": self.malformed_calls,
                "base_model": self.base_model, "tool_format": self.tool_format.name}
