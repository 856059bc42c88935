"""`tinker`: the agent is a large model LoRA-trained through Tinker's managed API.

Sampling goes through a Tinker sampling client (token ids and logprobs come back with every
turn); training sends each episode's turns as `tinker.types.Datum`s to
`forward_backward(..., loss_fn="importance_sampling")` — per token, the loss is
-exp(logp_θ - logp_sample)·A, with advantage 0 on prompt and tool-result tokens — then
`optim_step(AdamParams)`, and takes a fresh sampling client of the new weights.

`service` may be any object with the SDK's ServiceClient surface; by default a real
`tinker.ServiceClient` from $TINKER_API_KEY (and an optional base URL).
`nestor.policy.tinker_local.LocalService` is one backed by nestor's own LM policy, for offline
runs and tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from tinker import types

from nestor.policy.base import Observation, TrainItem, Turn
from nestor.policy.chat import parse_assistant, to_hf_messages


class TinkerPolicyError(RuntimeError):
    """Tinker cannot be used as configured (no key, unknown checkpoint)."""


def turn_datum(turn: Turn, advantage: float) -> types.Datum | None:
    """One sampled turn as a Datum: the model reads context + actions[:-1] and is scored on
    the next token everywhere; only the turn's own tokens carry logprobs and the advantage."""
    if not turn.action_ids:
        return None
    tokens = turn.context_ids + turn.action_ids  # [L + T]
    n_ctx, n_act = len(turn.context_ids), len(turn.action_ids)
    zeros = [0.0] * (n_ctx - 1)  # targets 1..L-1 are prompt tokens: no loss
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": torch.tensor(tokens[1:], dtype=torch.int64),
            "logprobs": torch.tensor(zeros + list(turn.sample_logprobs), dtype=torch.float32),
            "advantages": torch.tensor(zeros + [float(advantage)] * n_act, dtype=torch.float32),
        },
    )


class TinkerPolicy:
    name = "tinker"

    def __init__(self, base_model: str, *, service: Any = None, lora_rank: int = 32,
                 learning_rate: float = 4e-5, temperature: float = 1.0,
                 max_new_tokens: int = 1024, grad_clip: float = 1.0, seed: int = 0,
                 api_key_env: str = "TINKER_API_KEY", base_url: str | None = None):
        if service is None:
            key = os.environ.get(api_key_env)
            if not key:
                raise TinkerPolicyError(f"set ${api_key_env} to use the tinker policy "
                                        "(or policy.kind = 'lm' to train a local model)")
            import tinker

            service = tinker.ServiceClient(api_key=key, base_url=base_url)
        self.service = service
        self.base_model = base_model
        self.learning_rate = learning_rate
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.grad_clip = grad_clip
        self.seed = seed
        self._attach(service.create_lora_training_client(
            base_model=base_model, rank=lora_rank, seed=seed).result())
        self.version = 0
        self.malformed_calls = 0

    def _attach(self, training: Any) -> None:
        self.training = training
        self.tokenizer = training.get_tokenizer()
        self.sampler = training.save_weights_and_get_sampling_client().result()

    # ---- acting -------------------------------------------------------------------------

    def render(self, obs: Observation) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            to_hf_messages(obs.messages), tools=obs.tools or None, add_generation_prompt=True,
            tokenize=False)
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def act(self, obs: Observation) -> Turn:
        context = self.render(obs)
        params = types.SamplingParams(max_tokens=self.max_new_tokens,
                                      temperature=self.temperature, seed=self.seed + self.version)
        reply = self.sampler.sample(prompt=types.ModelInput.from_ints(context), num_samples=1,
                                    sampling_params=params).result()
        seq = reply.sequences[0]
        if seq.logprobs is None:
            raise TinkerPolicyError("the sampling client returned no logprobs")
        eos = self.tokenizer.eos_token_id
        text = self.tokenizer.decode([t for t in seq.tokens if t != eos],
                                     skip_special_tokens=False)
        message, error = parse_assistant(text, call_prefix=f"call_v{self.version}")
        self.malformed_calls += error is not None
        return Turn(message=message, action_ids=list(seq.tokens),
                    sample_logprobs=list(seq.logprobs), context_ids=context, parse_error=error)

    # ---- training -----------------------------------------------------------------------

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        datums = [d for item in batch for turn in item.turns
                  if (d := turn_datum(turn, item.advantage)) is not None]
        if not datums:
            return {"datums": 0.0}
        out = self.training.forward_backward(datums, loss_fn="importance_sampling").result()
        self.training.optim_step(types.AdamParams(
            learning_rate=self.learning_rate, grad_clip_norm=self.grad_clip)).result()
        self.sampler = self.training.save_weights_and_get_sampling_client().result()
        self.version += 1
        return {"datums": float(len(datums)), **{k: float(v) for k, v in out.metrics.items()}}

    # ---- persistence: a Tinker checkpoint path, recorded in a small JSON file ------------

    def save(self, path: Path) -> None:
        saved = self.training.save_state(name=f"nestor-v{self.version}").result()
        path.mkdir(parents=True, exist_ok=True)
        (path / "tinker.json").write_text(json.dumps({
            "tinker_path": saved.path, "base_model": self.base_model, "version": self.version,
            "malformed_calls": self.malformed_calls}))

    def load(self, path: Path) -> None:
        info = json.loads((path / "tinker.json").read_text())
        if info["base_model"] != self.base_model:
            raise TinkerPolicyError(f"{path}: checkpoint of {info['base_model']}, "
                                    f"not {self.base_model}")
        self._attach(self.service.create_training_client_from_state_with_optimizer(
            info["tinker_path"]).result())
        self.version = info["version"]
        self.malformed_calls = info["malformed_calls"]
