"""A local, in-process service with the tinker SDK's client surface, backed by a local HF model
with a peft LoRA adapter (nestor's LM policy holds model, adapter and optimizer). It takes and
returns the SDK's real types (`Datum`, `ModelInput`, `SamplingParams`, `SampleResponse`,
`AdamParams`, `ForwardBackwardOutput`), so `nestor.policy.tinker.TinkerPolicy` runs unchanged
offline and its tests compute real tensors.

Faithful to the service where a test could tell the difference:
* losses on plain logits: `cross_entropy` (-Σ w·logp) and `importance_sampling`
  (-Σ exp(logp - logp_sample)·A); no temperature enters training;
* `forward_backward_custom` runs the SDK's own client-side step
  (`TrainingClient._compute_custom_loss`) between a forward and a `cross_entropy` backward,
  as the SDK does against the service;
* sampling honours `seed` (None: a fresh random draw), `max_tokens` (a prompt plus
  max_tokens past the context window is refused, as by the service) and `stop` (token ids,
  one-token strings; None: the tokenizer's eos);
* `save_state` refuses a name the training run already saved unless `overwrite=True`;
  each training client (`create_*`) is a new training run with its own names.

Only the calls TinkerPolicy makes exist here.
"""

from __future__ import annotations

import copy
import json
import tempfile
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from tinker import types
from tinker.lib.public_interfaces.training_client import TrainingClient

from nestor.models.sampler import sample
from nestor.policy.lm import LMPolicy


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _stop_ids(stop: Any, tokenizer) -> list[int]:
    """SamplingParams.stop as token ids (None: the eos token; []: no stop at all)."""
    if stop is None:
        return [tokenizer.eos_token_id]
    if isinstance(stop, str):
        stop = [stop]
    ids = []
    for s in stop:
        if isinstance(s, int):
            ids.append(s)
            continue
        enc = tokenizer(s, add_special_tokens=False).input_ids
        if len(enc) != 1:
            raise ValueError(f"the local service takes one-token stop strings; {s!r} is "
                             f"{len(enc)} tokens (send token ids)")
        ids.append(enc[0])
    return ids


class LocalSamplingClient:
    """Samples from a frozen snapshot of the weights, like a Tinker sampler."""

    def __init__(self, model, tokenizer, max_context: int):
        self.model, self.tokenizer, self.max_context = model, tokenizer, max_context
        self._lock = threading.Lock()  # one forward at a time on this CPU model

    def get_tokenizer(self):
        return self.tokenizer

    def sample(self, prompt: types.ModelInput, num_samples: int,
               sampling_params: types.SamplingParams, **_: Any) -> Future:
        ids = prompt.to_ints()
        max_tokens = sampling_params.max_tokens or 256
        if len(ids) + max_tokens > self.max_context:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds "
                             f"the model's context length {self.max_context}")
        stops = _stop_ids(sampling_params.stop, self.tokenizer)
        seed = sampling_params.seed
        gen = torch.Generator().manual_seed(
            seed if seed is not None else int(torch.randint(0, 2**62, (1,))))
        with self._lock, torch.no_grad():
            # the sampler stops a row at one id; other stop ids are cut below (same tokens)
            out = sample(self.model, [ids] * num_samples, max_tokens,
                         eos_id=stops[0] if stops else -1, pad_id=self.tokenizer.pad_token_id,
                         temperature=sampling_params.temperature, generator=gen,
                         tokenizer=self.tokenizer)
        seqs = []
        for i in range(num_samples):
            keep = out.completion_mask[i]
            tokens = out.completion_ids[i][keep].tolist()
            logprobs = out.logprobs[i][keep].tolist()
            end = next((j + 1 for j, t in enumerate(tokens) if t in stops), None)
            if end is not None:
                tokens, logprobs = tokens[:end], logprobs[:end]
            seqs.append(types.SampledSequence(
                stop_reason="stop" if end is not None else "length",
                sequence_id=f"seq-{uuid.uuid4().hex[:8]}", _tokens_list=tokens,
                _logprobs_list=logprobs))
        return _done(types.SampleResponse(sequences=seqs))


def _datum_logprobs(model, datum: types.Datum) -> torch.Tensor:
    """log p(target_t | input_≤t) on plain logits: [L]."""
    ids = torch.tensor([datum.model_input.to_ints()])  # [1, L]
    target = datum.loss_fn_inputs["target_tokens"].to_torch().long()  # [L]
    logits = model(input_ids=ids).logits[0].float()  # [L, V]
    return torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]


class LocalTrainingClient:
    def __init__(self, policy: LMPolicy, base_model: str, rank: int, root: Path,
                 max_context: int):
        self.policy = policy
        self.spec = {"base_model": base_model, "rank": rank}
        self.max_context = max_context
        self.run_id = uuid.uuid4().hex[:12]  # a new training run, like the service's model_id
        self._states = root / self.run_id
        self._lock = threading.Lock()

    def get_tokenizer(self):
        return self.policy.tokenizer

    def _loss(self, datum: types.Datum, loss_fn: str, logp: torch.Tensor) -> torch.Tensor:
        inputs = datum.loss_fn_inputs
        if loss_fn == "cross_entropy":
            return -(logp * inputs["weights"].to_torch()).sum()
        if loss_fn == "importance_sampling":  # prompt positions carry A = 0
            ratio = torch.exp(logp - inputs["logprobs"].to_torch())
            return -(ratio * inputs["advantages"].to_torch()).sum()
        raise ValueError(f"the local service implements cross_entropy and importance_sampling "
                         f"(and forward_backward_custom), not {loss_fn}")

    def _run(self, data: list[types.Datum], loss_fn: str, backward: bool
             ) -> types.ForwardBackwardOutput:
        total, outputs = 0.0, []
        with self._lock, torch.set_grad_enabled(backward):
            for datum in data:
                logp = _datum_logprobs(self.policy.model, datum)  # [L]
                loss = self._loss(datum, loss_fn, logp)
                if backward:
                    loss.backward()
                total += float(loss.detach())
                outputs.append({"logprobs": types.TensorData.from_torch(logp.detach())})
        return types.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord",
                                           loss_fn_outputs=outputs, metrics={"loss:sum": total})

    def forward(self, data: list[types.Datum], loss_fn: str, **_: Any) -> Future:
        return _done(self._run(data, loss_fn, backward=False))

    def forward_backward(self, data: list[types.Datum], loss_fn: str, **_: Any) -> Future:
        return _done(self._run(data, loss_fn, backward=True))

    def forward_backward_custom(self, data: list[types.Datum], loss_fn, **_: Any) -> Future:
        """The SDK's custom-loss protocol: a cross_entropy forward for logprobs, the SDK's own
        client-side differentiation of `loss_fn`, then a cross_entropy backward with
        weights = -dloss/dlogprobs."""
        fwd = [types.Datum(model_input=d.model_input, loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"],
            "weights": torch.zeros(len(d.loss_fn_inputs["target_tokens"].data))})
            for d in data]
        custom = TrainingClient._compute_custom_loss(data, loss_fn, self._run(
            fwd, "cross_entropy", backward=False))
        out = self._run(custom.data, "cross_entropy", backward=True)
        surrogate = out.metrics.pop("loss:sum")
        out.metrics.update(custom.metrics)
        out.metrics.update({"loss:sum": custom.loss_sum, "surrogate_loss:sum": surrogate})
        return _done(out)

    def optim_step(self, params: types.AdamParams) -> Future:
        opt = self.policy.optimizer
        with self._lock:
            for group in opt.param_groups:
                group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2),
                             eps=params.eps, weight_decay=params.weight_decay)
            trainable = [p for p in self.policy.model.parameters() if p.requires_grad]
            norm = torch.nn.utils.clip_grad_norm_(
                trainable, params.grad_clip_norm if params.grad_clip_norm > 0 else float("inf"))
            opt.step()
            opt.zero_grad(set_to_none=True)
        return _done(types.OptimStepResponse(metrics={"grad_norm": float(norm)}))

    def save_weights_and_get_sampling_client(self, **_: Any) -> Future:
        with self._lock:
            snapshot = copy.deepcopy(self.policy.model).eval()
        return _done(LocalSamplingClient(snapshot, self.policy.tokenizer, self.max_context))

    def save_state(self, name: str, overwrite: bool = False, **_: Any) -> Future:
        path = self._states / name
        if path.exists() and not overwrite:
            raise ValueError(f"checkpoint {name!r} already exists in training run "
                             f"{self.run_id} (pass overwrite=True to replace it)")
        with self._lock:
            self.policy.save(path)
        (path / "local_service.json").write_text(json.dumps(self.spec))
        return _done(types.SaveWeightsResponse(path=str(path)))


class LocalService:
    """`create_lora_training_client(base_model, rank)` on a local model (e.g. tiny-m).

    `root`: where saved states live (the service's storage); default a temp directory.
    """

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else \
            Path(tempfile.mkdtemp(prefix="nestor-tinker-local-"))
        self._context: dict[str, int] = {}

    def create_lora_training_client(self, base_model: str, rank: int = 32,
                                    seed: int | None = None, **_: Any) -> Future:
        if seed is not None:
            torch.manual_seed(seed)
        policy = LMPolicy.from_pretrained(base_model, lora_rank=rank, lora_alpha=2 * rank)
        self._context[base_model] = policy.max_context
        return _done(LocalTrainingClient(policy, base_model, rank, self.root,
                                         policy.max_context))

    def _from_state(self, path: str, with_optimizer: bool) -> Future:
        spec = json.loads((Path(path) / "local_service.json").read_text())
        client = self.create_lora_training_client(spec["base_model"], spec["rank"]).result()
        if with_optimizer:
            client.policy.load(Path(path))  # its state.pt: tensors and numbers, no pickle
        else:  # the weights only, as the service's own call says: nothing else is read
            client.policy.load_adapter(Path(path) / "adapter")
        return _done(client)

    def create_training_client_from_state(self, path: str, **_: Any) -> Future:
        return self._from_state(path, with_optimizer=False)

    def create_training_client_from_state_with_optimizer(self, path: str, **_: Any) -> Future:
        return self._from_state(path, with_optimizer=True)

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        return types.GetServerCapabilitiesResponse(supported_models=[
            types.SupportedModel(model_name=name, max_context_length=n, trainable=True,
                                 sampleable=True) for name, n in self._context.items()])
