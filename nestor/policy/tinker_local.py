"""A local, in-process service with the tinker SDK's client surface, backed by nestor's own
LM policy (HF model + peft LoRA on this machine). It takes and returns the SDK's real types
(`Datum`, `ModelInput`, `SamplingParams`, `SampleResponse`, `AdamParams`), so
`nestor.policy.tinker.TinkerPolicy` runs unchanged offline, and its tests compute real tensors.
Only the calls TinkerPolicy makes exist here.
"""

from __future__ import annotations

import copy
import itertools
import json
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tinker import types

from nestor.models.sampler import sample
from nestor.policy.lm import LMPolicy


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


@dataclass
class _Saved:
    path: str


class LocalSamplingClient:
    """Samples from a frozen snapshot of the weights, like a Tinker sampler."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def sample(self, prompt: types.ModelInput, num_samples: int,
               sampling_params: types.SamplingParams, **_: Any) -> Future:
        gen = torch.Generator().manual_seed(sampling_params.seed or 0)
        with torch.no_grad():
            out = sample(self.model, [prompt.to_ints()] * num_samples,
                         sampling_params.max_tokens or 256, eos_id=self.tokenizer.eos_token_id,
                         pad_id=self.tokenizer.pad_token_id,
                         temperature=sampling_params.temperature, generator=gen,
                         tokenizer=self.tokenizer)
        seqs = []
        for i in range(num_samples):
            keep = out.completion_mask[i]
            tokens = out.completion_ids[i][keep].tolist()
            stop = "stop" if tokens and tokens[-1] == self.tokenizer.eos_token_id else "length"
            seqs.append(types.SampledSequence(stop_reason=stop, sequence_id=f"seq-{i}",
                                              _tokens_list=tokens,
                                              _logprobs_list=out.logprobs[i][keep].tolist()))
        return _done(types.SampleResponse(sequences=seqs))


class LocalTrainingClient:
    def __init__(self, policy: LMPolicy, temperature: float, base_model: str, rank: int):
        self.policy = policy
        self.temperature = temperature
        self.spec = {"base_model": base_model, "rank": rank}
        self._states = Path(tempfile.mkdtemp(prefix="nestor-tinker-local-"))
        self._saves = itertools.count()

    def get_tokenizer(self):
        return self.policy.tokenizer

    def forward_backward(self, data: list[types.Datum], loss_fn: str, **_: Any) -> Future:
        if loss_fn != "importance_sampling":
            raise ValueError(f"the local service implements importance_sampling, not {loss_fn}")
        model = self.policy.model
        total = 0.0
        for datum in data:
            ids = torch.tensor([datum.model_input.to_ints()])  # [1, L]
            target = datum.loss_fn_inputs["target_tokens"].to_torch()[None]  # [1, L]
            logp_sample = datum.loss_fn_inputs["logprobs"].to_torch()[None]  # [1, L]
            adv = datum.loss_fn_inputs["advantages"].to_torch()[None]  # [1, L]
            logits = model(input_ids=ids).logits.float() / self.temperature  # [1, L, V]
            logp = torch.log_softmax(logits, -1).gather(-1, target[..., None])[..., 0]  # [1, L]
            # Tinker's importance_sampling loss, per token: prompt positions carry A = 0
            loss = -(torch.exp(logp - logp_sample) * adv).sum()
            loss.backward()
            total += float(loss.detach())
        return _done(types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord",
                                                 loss_fn_outputs=[], metrics={"loss:sum": total}))

    def optim_step(self, params: types.AdamParams) -> Future:
        opt = self.policy.optimizer
        for group in opt.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2),
                         eps=params.eps, weight_decay=params.weight_decay)
        trainable = [p for p in self.policy.model.parameters() if p.requires_grad]
        if params.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(trainable, params.grad_clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return _done(types.OptimStepResponse())

    def save_weights_and_get_sampling_client(self, **_: Any) -> Future:
        snapshot = copy.deepcopy(self.policy.model).eval()
        return _done(LocalSamplingClient(snapshot, self.policy.tokenizer))

    def save_state(self, name: str, **_: Any) -> Future:
        path = self._states / f"{next(self._saves)}-{name}"
        self.policy.save(path)
        (path / "local_service.json").write_text(json.dumps(self.spec))
        return _done(_Saved(path=str(path)))


class LocalService:
    """`create_lora_training_client(base_model, rank)` on a local model (e.g. tiny-m)."""

    def __init__(self, temperature: float = 1.0):
        self.temperature = temperature

    def create_lora_training_client(self, base_model: str, rank: int = 32,
                                    seed: int | None = None, **_: Any) -> Future:
        torch.manual_seed(seed or 0)
        policy = LMPolicy.from_pretrained(base_model, lora_rank=rank, lora_alpha=2 * rank,
                                          temperature=self.temperature)
        return _done(LocalTrainingClient(policy, self.temperature, base_model, rank))

    def create_training_client_from_state_with_optimizer(self, path: str) -> Future:
        spec = json.loads((Path(path) / "local_service.json").read_text())
        client = self.create_lora_training_client(spec["base_model"], spec["rank"]).result()
        client.policy.load(Path(path))
        return _done(client)
