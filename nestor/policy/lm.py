"""`lm`: any Hugging Face causal LM with a chat template as the job-writing agent.

A LoRA adapter (peft) is the only trained part. `act` renders the conversation and tool schemas
with the model's chat template, samples one assistant turn with its own KV-cache loop, records
the sampled token ids and their log-probabilities (under the temperature-scaled distribution)
and parses Qwen3-style tool calls. `train_step` re-scores exactly those tokens in their recorded
context and applies the importance-sampling policy-gradient loss (nestor/policy/is_loss.py):
an episode whose turns extend each other (see `context_for`) in one forward pass over its whole
token sequence (nestor/policy/lm_sequence.py), any other turn by turn.

Acting: episodes act from many threads; concurrent turns are gathered into one batched,
left-padded sampling call (`RequestBatcher`), so G episodes of a group cost one forward per
token, not G. The prompt prefix a batch shares (the system prompt; a lone episode's previous
context) comes from a KV cache of prefixes (nestor/models/prefix_cache.py). A turn's context is
the previous turn's context + its sampled tokens + the newly rendered messages: the model sees
its own tokens, never a re-rendering of them.

Memory: the model runs in its own dtype (bf16 for a Qwen3 checkpoint on a GPU; float32 on the
CPU), the LoRA parameters and their Adam state in float32; training recomputes activations
(gradient checkpointing); an out-of-memory error splits the work and retries, and what does
not fit alone is dropped and counted (nestor/policy/oom.py). `train_precision`: the learner's
forward in float32 (the default: on-policy the ratio is exactly 1) or in bf16 autocast
(nestor/models/precision.py: about half the time on a bf16-native CPU).
"""

from __future__ import annotations

import math
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from nestor.models.loops import LOOP_MIN_SPAN, repeat_period
from nestor.models.precision import autocast, autocast_dtype, model_dtype
from nestor.models.prefix_cache import PrefixCache
from nestor.models.sampler import sample
from nestor.policy.base import Observation, TrainItem, Turn
from nestor.policy.batching import RequestBatcher
from nestor.policy.chat import parse_assistant
from nestor.policy.is_loss import DEFAULT_TIS_CAP, importance_sampling_loss
from nestor.policy.lm_context import ContextRenderer
from nestor.policy.lm_sequence import (
    PackedSequence,
    action_logprobs,
    episode_sequence,
    turn_sequence,
)
from nestor.policy.oom import PolicyOutOfMemory, free_memory, is_oom
from nestor.policy.tool_format import tool_format_for

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def default_turn_tokens(max_context: int) -> int:
    """Token cap of one turn when none is set: a quarter of the context, within [256, 4096]
    (a turn that writes a dataset file needs thousands of tokens; the prompt needs the rest)."""
    return max(256, min(4096, max_context // 4))


def sampling_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """The sampler's generator, on the device of the logits it samples from: torch.multinomial
    refuses a CPU generator for CUDA probabilities."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


class _LockedDecoder:
    """The tokenizer's `decode` under a lock, for the sampler (other threads render prompts)."""

    def __init__(self, tokenizer, lock: threading.Lock):
        self.tokenizer, self.lock = tokenizer, lock

    def decode(self, ids: list[int], **kwargs) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, **kwargs)


class LMPolicy:
    name = "lm"
    concurrent_act = True  # act() may be called from several threads (SerializedPolicy)
    token_level = True  # per-token ratios: the loop's hard staleness cap applies

    def __init__(self, model, tokenizer, *, learning_rate: float = 1e-4, lora_rank: int = 8,
                 lora_alpha: int = 16, temperature: float = 1.0, max_new_tokens: int | None = None,
                 max_context: int | None = None, clip_ratio: float = 0.0,
                 tis_cap: float = DEFAULT_TIS_CAP, grad_clip: float = 1.0, seed: int = 0,
                 act_batch_size: int = 8, act_batch_window_s: float = 0.01,
                 response_prefix: str = "", gradient_checkpointing: bool = True,
                 prefix_cache_tokens: int = 8192, extend_contexts: bool = True,
                 merge_lora: bool = True, tool_format: str = "auto",
                 stop_repeats: int = LOOP_MIN_SPAN, train_precision: str = "float32"):
        from peft import LoraConfig, get_peft_model

        if tokenizer.chat_template is None:
            raise ValueError("the lm policy needs a tokenizer with a chat template")
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", 4096)
        self.max_new_tokens = max_new_tokens or default_turn_tokens(self.max_context)
        if self.max_new_tokens >= self.max_context:  # else no room is left for any context
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be below max_context "
                             f"({self.max_context}): a turn's context needs room too")
        targets = [t for t in LORA_TARGETS
                   if any(n.endswith(t) for n, _ in model.named_modules())]
        lora = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0,
                          target_modules=targets or None)
        self.gradient_checkpointing = gradient_checkpointing
        if gradient_checkpointing:  # activations recomputed in backward (train mode only)
            enable = (getattr(model, "activation_checkpointing_enable", None)  # transformers 5
                      or model.gradient_checkpointing_enable)
            enable({"use_reentrant": False})
        with warnings.catch_warnings():  # peft touches a deprecated transformers property
            warnings.simplefilter("ignore", FutureWarning)
            self._model = get_peft_model(model, lora)
        # Acting on float32 weights merges the LoRA into them (W + BA: one matmul per layer,
        # not three; ~20% of a SmolLM2 decode step on CPU); `self.model` unmerges, so whoever
        # trains or loads sees the adapter apart. Never for bf16/fp16 weights: a small BA
        # would round away in them.
        self.merge_lora = merge_lora and all(p.dtype == torch.float32
                                             for p in model.parameters())
        self._merged = False
        self._merge_lock = threading.Lock()
        for p in self.model.parameters():  # float32 master weights (and Adam state) for LoRA
            if p.requires_grad:
                p.data = p.data.float()
        self.model.eval()  # no dropout anywhere: sampler and trainer see the same function
        self.tokenizer = tokenizer
        self.tool_format = tool_format_for(tokenizer, tool_format)  # how replies call tools
        self.temperature = temperature
        self.stop_repeats = stop_repeats  # a reply stuck in a loop ends early (sampler.py)
        # Text every reply starts with, put in the context after the generation prompt (so it is
        # never an action and never trained on) and in front of the decoded reply: e.g.
        # '<tool_call>{"name": "' gets a small model that never calls a tool to at least try.
        self.response_prefix = response_prefix
        self._prefix_ids = (tokenizer(response_prefix, add_special_tokens=False).input_ids
                            if response_prefix else [])
        self.clip_ratio = clip_ratio
        self.tis_cap = tis_cap
        self.grad_clip = grad_clip
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
        self.device = next(self.model.parameters()).device
        # The learner's forward in bf16 autocast halves a step on a bf16-native CPU, at the
        # price of a sampler/learner mismatch the truncated IS ratio absorbs; float32 keeps the
        # on-policy ratio exactly 1 (benchmarks/lm_train_precision.py measures both).
        self.train_autocast = autocast_dtype(train_precision, str(self.device))
        self.generator = sampling_generator(self.device, seed)
        self.version = 0
        self.malformed_calls = 0
        self.turns_sampled = 0
        self.counters = {"oom_act_splits": 0, "oom_act_dropped": 0, "act_batch_retries": 0,
                         "oom_train_splits": 0, "oom_train_dropped_turns": 0}
        self.prefix_cache = PrefixCache(prefix_cache_tokens) if prefix_cache_tokens > 0 else None
        self.contexts = ContextRenderer(tokenizer, eos_id=self.eos_id, prefix_ids=self._prefix_ids,
                                        keep=self.max_context - self.max_new_tokens,
                                        extend=extend_contexts)
        # Episodes act from threads: concurrent turns share one batched sampling call. A fast
        # tokenizer is not safe to call from several threads at once: `_lock` guards it (and
        # the counters), never a forward pass, so turns queue up while a batch samples.
        self._batcher = RequestBatcher(self._sample_isolated, max_batch=act_batch_size,
                                       window_s=act_batch_window_s)
        self._lock = threading.Lock()

    @property
    def model(self):
        """The peft model with its LoRA apart from the base weights: the one to train, score,
        save or load (acting may have merged it, see `__init__`)."""
        self._set_merged(False)
        return self._model

    def _set_merged(self, merged: bool) -> None:
        with self._merge_lock:
            if merged != self._merged:
                (self._model.merge_adapter if merged else self._model.unmerge_adapter)()
                self._merged = merged

    def _weights_changed(self) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # cached keys and values were computed by the old weights

    @classmethod
    def from_pretrained(cls, name_or_path: str, *, device: str = "cpu", dtype: str = "auto",
                        **kwargs) -> LMPolicy:
        """Load by registry name (nestor.models) or any local HF directory, in `dtype` (see
        `model_dtype`); the LoRA is float32 whatever the model's dtype."""
        torch_dtype = model_dtype(dtype, device)
        try:
            from nestor.models.registry import load_model
        except ImportError:  # registry not installed: a plain HF directory
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype or "auto")
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        else:
            model, tokenizer = load_model(name_or_path, device=device, dtype=torch_dtype)
        return cls(model.to(device), tokenizer, **kwargs)

    # ---- acting -------------------------------------------------------------------------

    def render(self, obs: Observation) -> list[int]:
        """The conversation as the chat template renders it, ending with the generation prompt
        (and the response prefix), cut to the context window (the most recent tokens win)."""
        with self._lock:
            return self.contexts.render(obs)

    def context_for(self, obs: Observation) -> list[int]:
        """The next turn's context: the episode's last context + sampled tokens + the messages
        since, where this policy sampled its last turn; else `render` (lm_context.py)."""
        with self._lock:
            return self.contexts.context_for(obs)

    @torch.no_grad()
    def sample_batch(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """One turn per context in one left-padded, KV-cached call: for each, the sampled ids
        (ending in eos unless cut) and their logprobs. Raises the first row's error, if any."""
        out = self._sample_isolated(contexts)
        for r in out:
            if isinstance(r, BaseException):
                raise r
        return out

    def _sample_rows(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        self._set_merged(self.merge_lora)
        out = sample(self._model, contexts, self.max_new_tokens, eos_id=self.eos_id,
                     pad_id=self.tokenizer.pad_token_id, temperature=self.temperature,
                     generator=self.generator, tokenizer=_LockedDecoder(self.tokenizer, self._lock),
                     prefix_cache=self.prefix_cache, stop_repeats=self.stop_repeats)
        keep = out.completion_mask  # [B, T] True on sampled tokens, eos included
        return [(out.completion_ids[b][keep[b]].tolist(), out.logprobs[b][keep[b]].tolist())
                for b in range(len(contexts))]

    @torch.no_grad()
    def _sample_isolated(self, contexts: list[list[int]]) -> list[Any]:
        """`_sample_rows`, where one row's failure is that row's alone: an out-of-memory error
        halves the batch and retries; any other error retries each row by itself. A row that
        fails alone gets its exception in its place (its episode ends `policy_error`)."""
        try:
            return self._sample_rows(contexts)
        except Exception as exc:
            if is_oom(exc):
                free_memory(self.device)
                if len(contexts) == 1:
                    self.counters["oom_act_dropped"] += 1
                    return [PolicyOutOfMemory(
                        f"out of memory sampling one turn of a {len(contexts[0])}-token context "
                        f"on {self.device}: lower [policy] max_context or max_new_tokens "
                        f"({exc.__class__.__name__}: {str(exc)[:200]})")]
                self.counters["oom_act_splits"] += 1
                half = len(contexts) // 2
                return (self._sample_isolated(contexts[:half])
                        + self._sample_isolated(contexts[half:]))
            if len(contexts) == 1:
                return [exc]
            self.counters["act_batch_retries"] += 1
            return [r for c in contexts for r in self._sample_isolated([c])]

    def sample(self, context_ids: list[int]) -> tuple[list[int], list[float]]:
        """One turn, batched with whatever other turns are being sampled at the same time."""
        return self._batcher(context_ids)

    def act(self, obs: Observation) -> Turn:
        context = self.context_for(obs)
        actions, logprobs = self.sample(context)
        with self._lock:
            text = self.response_prefix + self.tokenizer.decode(
                [t for t in actions if t != self.eos_id], skip_special_tokens=False)
            call_prefix = f"call_{self.turns_sampled}"
            self.turns_sampled += 1
        cut = actions[-1:] != [self.eos_id]  # the sampler stops at eos, a loop or the cap
        looped = repeat_period(actions, self.stop_repeats) if cut and self.stop_repeats else None
        message, error = parse_assistant(text, call_prefix=call_prefix, fmt=self.tool_format,
                                         tools=obs.tools, cut_at=self.max_new_tokens if cut else None,
                                         repeated=looped)
        with self._lock:
            if error is not None:
                self.malformed_calls += 1
            self.contexts.remember(obs, message, context, actions)
        return Turn(message=message, action_ids=actions, sample_logprobs=logprobs,
                    context_ids=context, parse_error=error)

    # ---- training -----------------------------------------------------------------------

    def score(self, seq: PackedSequence) -> torch.Tensor:
        """[A] the learner's log-probabilities of the sequence's actions, in its training
        precision: what the IS ratio compares with the sampler's."""
        with autocast(self.train_autocast, self.device):
            return action_logprobs(self.model, seq.input_ids, seq.action_mask, self.temperature)

    def _backward(self, seq: PackedSequence, advantage: float, scale: float) -> dict[str, float]:
        """Loss of one packed sequence, backpropagated (scaled by `scale`); its figures."""
        logp = self.score(seq)[None]  # [1, A]
        logp_sample = torch.tensor([seq.sample_logprobs], device=self.device)  # [1, A]
        mask = torch.ones_like(logp, dtype=torch.bool)  # [1, A]: every scored token is an action
        loss, stats = importance_sampling_loss(
            logp, logp_sample, torch.tensor([advantage], device=self.device), mask,
            self.clip_ratio, self.tis_cap)
        (loss * scale).backward()
        return {**stats, "loss": float(loss.detach()) * scale, "tokens": float(logp.shape[1])}

    def _guarded(self, params: list[torch.Tensor], seq: PackedSequence, advantage: float,
                 scale: float) -> dict[str, float] | None:
        """`_backward`, or None after an out-of-memory error, with the gradients as before."""
        saved = [None if p.grad is None else p.grad.clone() for p in params]
        try:
            return self._backward(seq, advantage, scale)
        except Exception as exc:
            if not is_oom(exc):
                raise
            for p, g in zip(params, saved, strict=True):  # undo a partial backward
                p.grad = g
            free_memory(self.device)
            return None

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        """One optimizer step on (episode, advantage) pairs. An episode whose turns extend each
        other is one forward + backward over its whole sequence; any other is scored turn by
        turn; gradients accumulate across them, so memory is bounded by the longest sequence.
        Out of memory: a whole episode is retried turn by turn; a turn that does not fit alone
        is dropped (counted in `oom_train_dropped_turns`)."""
        self.optimizer.zero_grad(set_to_none=True)
        params = [p for p in self.model.parameters() if p.requires_grad]
        scale = 1.0 / max(1, len(batch))
        figures: list[dict[str, float]] = []
        one_pass = dropped = 0
        self.model.train(self.gradient_checkpointing)  # checkpointing acts in train mode only
        try:
            for item in batch:
                packed = episode_sequence(item.turns)
                if packed is not None and len(item.turns) > 1:
                    done = self._guarded(params, packed, item.advantage, scale)
                    if done is not None:
                        figures.append(done)
                        one_pass += 1
                        continue
                    self.counters["oom_train_splits"] += 1
                for turn in item.turns:
                    if not turn.action_ids:
                        continue
                    done = self._guarded(params, turn_sequence(turn), item.advantage, scale)
                    if done is None:
                        dropped += 1
                        self.counters["oom_train_dropped_turns"] += 1
                    else:
                        figures.append(done)
        finally:
            self.model.eval()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(
            params, self.grad_clip if self.grad_clip > 0 else math.inf))
        self.optimizer.step()
        self.version += 1
        self._weights_changed()
        tokens = sum(f["tokens"] for f in figures)

        def weighted(key: str) -> float:
            return sum(f[key] * f["tokens"] for f in figures) / max(1.0, tokens)

        return {"loss": sum(f["loss"] for f in figures), "tokens": tokens,
                "grad_norm": grad_norm, "ratio_mean": weighted("ratio_mean"),
                "ratio_max": max((f["ratio_max"] for f in figures), default=0.0),
                "clipped_frac": weighted("clipped_frac"),
                "truncated_frac": weighted("truncated_frac"),
                "episodes_one_pass": float(one_pass), "oom_dropped_turns": float(dropped),
                "malformed_calls_total": float(self.malformed_calls),
                "contexts_extended_total": float(self.contexts.extended),
                "contexts_rerendered_total": float(self.contexts.rerendered),
                **{f"{k}_total": float(v) for k, v in self.counters.items()}}

    # ---- persistence --------------------------------------------------------------------

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path / "adapter")  # adapter weights only (safetensors)
        torch.save({"optimizer": self.optimizer.state_dict(), "version": self.version,
                    "generator": self.generator.get_state(),
                    "malformed_calls": self.malformed_calls,
                    "turns_sampled": self.turns_sampled}, path / "state.pt")

    def load(self, path: Path) -> None:
        self.load_adapter(path / "adapter")
        state = torch.load(path / "state.pt", weights_only=True)  # tensors and numbers: no pickle
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        try:
            self.generator.set_state(state["generator"])
        except RuntimeError:  # saved on another device (a CPU run resumed on a GPU): reseed
            self.generator.manual_seed(int(state["generator"].sum()) + self.version)
        self.malformed_calls = state["malformed_calls"]
        self.turns_sampled = state["turns_sampled"]

    def load_adapter(self, path: Path | str) -> None:
        """Start from a saved LoRA adapter: a `nestor sft` warm start (its --out DIR, or
        DIR/adapter). Weights only; the optimizer and version stay this policy's."""
        import json

        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = Path(path)
        if (path / "adapter").is_dir():
            path = path / "adapter"
        weights = path / "adapter_model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"{path}: no adapter_model.safetensors; pass the --out "
                                    "directory of `nestor sft`")
        saved = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        mine = self._model.peft_config["default"]
        if (saved.get("r"), saved.get("lora_alpha")) != (mine.r, mine.lora_alpha):
            raise ValueError(f"{path}: the adapter has LoRA rank {saved.get('r')}, alpha "
                             f"{saved.get('lora_alpha')}; this policy has {mine.r}, "
                             f"{mine.lora_alpha}: set lora_rank and lora_alpha to match")
        result = set_peft_model_state_dict(self.model, load_file(str(weights),
                                                                  device=str(self.device)))
        unexpected = getattr(result, "unexpected_keys", None) or []
        if unexpected:
            raise ValueError(f"{path}: {len(unexpected)} adapter weights fit no layer of this "
                             f"model (e.g. {unexpected[0]}): was it trained on another model?")
        self._weights_changed()

    def info(self) -> dict[str, Any]:
        trainable = sum(p.numel() for p in self._model.parameters() if p.requires_grad)
        return {"version": self.version, "trainable_params": trainable,
                "malformed_calls": self.malformed_calls}
