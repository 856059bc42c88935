"""How much memory the built-in GRPO trainer will need for a job, before it runs.

The token budget counts sampled tokens only; memory grows with the *prompt* tokens too. One
step holds, in float32 on CPU (the laptop trainer):

  resident   the interpreter with torch + transformers, the frozen base model and the
             trainable copy (2 × params), and for training: grads + AdamW's two moments
             (3 × the trainable params: all of them, or LoRA's r·(in+out) per linear layer)
  sampling   rollouts of B = prompts_per_step × group_size rows: the KV cache of every row,
             B × (prompt + max_new_tokens) × layers × 2 × kv_heads × head_dim, plus the
             prefill's activations and attention scores over the P distinct prompts
  update     the forward kept for the backward: the prompt prefix once per prompt, its KV
             cache gathered to all B rows (when max_new_tokens > 1), then B × max_new_tokens
             completion positions (activations, attention scores over prompt + completion)
             and their logits (vocab × positions, with the log-softmax's copies)

Sampling and the update do not overlap (the sampler's cache is freed first), so the peak is
runtime + SLACK × (weights + optimizer + max(sampling, update)). The terms are upper bounds of what the tensors hold; the
constants per hidden unit (ACT_PER_HIDDEN, ACT_PER_FFN) were measured against peak RSS on the
tiny models (benchmarks/memory_estimate.py prints estimate against measurement).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from nestor.job.config import JobConfig

GIB = 1 << 30
MIB = 1 << 20
DEFAULT_MEMORY_CAP_MB = 2048  # fits the tiny models' jobs with room; set per machine
RUNTIME_BYTES = 480 * MIB  # python + torch + transformers + tokenizers (370 MiB RSS measured)
#                            plus what the allocator keeps after the first steps
SLACK = 1.05  # the allocator's overhead on the tensors: the terms alone came out 3-4% low
ACT_PER_HIDDEN = 20  # floats per token per layer per hidden unit kept for the backward (norms'
#                     intermediates, q/k/v and their rotary and norm copies, residuals)
ACT_PER_FFN = 4  # ... per intermediate (MLP) unit: gate, up, silu(gate), their product
TEMPLATE_TOKENS = 16  # chat template around one user message (char tokenizer: ~10)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a causal LM's config.json (Qwen3 names)."""

    params: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
        per_layer = (hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
                     + 3 * hidden * inter + 2 * hidden + 2 * head_dim)
        embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", True) else 2)
        return cls(params=layers * per_layer + embed + hidden, hidden=hidden, layers=layers,
                   heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=inter,
                   vocab=vocab)

    def lora_params(self, rank: int) -> int:
        """LoRA's trainable parameters on every linear layer (peft's "all-linear")."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        in_out = (self.hidden + q) + 2 * (self.hidden + kv) + (q + self.hidden) \
            + 2 * (self.hidden + self.intermediate) + (self.intermediate + self.hidden)
        return rank * in_out * self.layers


def model_shape(name: str) -> ModelShape | None:
    """The registry model's shape from its config.json, or None where it is not here."""
    try:
        from nestor.models.registry import resolve_model_dir

        path = resolve_model_dir(name) / "config.json"
        return ModelShape.from_config(json.loads(path.read_text(encoding="utf-8")))
    except Exception:  # no weights here: the check says it skipped
        return None


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict[str, int]  # bytes per term; peak = resident + max(sampling, update)

    @property
    def peak(self) -> int:
        p = self.parts
        tensors = p["weights"] + p["optimizer"] + max(p["sampling"], p["update"])
        return p["runtime"] + int(SLACK * tensors)

    def biggest(self) -> tuple[str, int]:
        name = max(("sampling", "update", "weights", "optimizer"), key=self.parts.__getitem__)
        return name, self.parts[name]


def estimate(config: JobConfig, shape: ModelShape, prompt_tokens: int,
             dtype_bytes: int = 4) -> MemoryEstimate:
    """Peak bytes of one GRPO step of `config` on a model of `shape`, prompts of at most
    `prompt_tokens` tokens (chat template included: the sampler pads every row to the longest),
    weights and activations in `dtype_bytes` (4 float32 on a CPU, 2 bf16 on a GPU)."""
    f = dtype_bytes
    P, G, T = config.prompts_per_step, config.group_size, config.max_new_tokens
    Lp, s = prompt_tokens, shape
    sampling = _sampling_bytes(P, G, T, Lp, s, f)
    # The update runs micro_batch_prompts prompt groups at a time (gradients accumulated), so
    # only one micro-batch's activations are alive at once.
    Pm = min(config.micro_batch_prompts or P, P)
    update = _update_bytes(config, Pm, G, T, Lp, s, f)
    trainable = s.lora_params(config.lora_rank) if config.lora_rank else s.params
    # Low-precision weights train through float32 masters (inner/grpo.py): the masters, their
    # float32 gradients and AdamW's two float32 moments; LoRA's adapter weights are float32.
    masters = trainable * 4 if f != 4 and not config.lora_rank else 0
    return MemoryEstimate({
        "runtime": RUNTIME_BYTES,
        "weights": 2 * s.params * f + (trainable * 4 if config.lora_rank else 0) + masters,
        "optimizer": 3 * trainable * 4,
        "sampling": sampling,
        "update": update,
    })


def _sampling_bytes(P: int, G: int, T: int, Lp: int, s: ModelShape, f: int) -> int:
    B = P * G
    kv_per_token = s.layers * 2 * s.kv_heads * s.head_dim * f  # K and V, every layer
    # Sampling (no grad): prefill P prompts (one layer's activations and scores live at a
    # time), then every row's cache; the last cache growth copies one layer.
    prefill = P * Lp * (4 * s.hidden + 2 * s.intermediate) * f + P * s.heads * Lp * Lp * f
    cache = B * (Lp + T) * kv_per_token
    return cache + cache // s.layers + max(prefill, B * s.vocab * 3 * 4)  # float32 logits


def _update_bytes(config: JobConfig, P: int, G: int, T: int, Lp: int, s: ModelShape,
                  f: int) -> int:
    """One micro-batch of P prompt groups through the forward kept for the backward."""
    B = P * G
    kv_per_token = s.layers * 2 * s.kv_heads * s.head_dim * f
    act_per_token = s.layers * (ACT_PER_HIDDEN * s.hidden + ACT_PER_FFN * s.intermediate) * f
    # The update (grad): everything the backward needs stays until it runs.
    prompt_fwd = P * Lp * act_per_token + P * s.heads * Lp * Lp * s.layers * f
    # With max_new_tokens = 1 the prompt's last logits are all there is; otherwise the prompt
    # cache is gathered to the B rows and the other T-1 completion positions run on top.
    gathered = B * Lp * kv_per_token * 2 if T > 1 else 0  # gather + cat onto it, every layer
    completion = B * (T - 1) * act_per_token + B * s.heads * (T - 1) * (Lp + T) * s.layers * f
    # logits, /temperature, log_softmax (float32), its grad
    logits = B * T * s.vocab * (f + 3 * 4)
    update = prompt_fwd + gathered + completion + logits
    if config.kl_coef > 0:  # the reference forward (no grad) runs before, its output is small
        update += B * T * s.vocab * 4 * 2
    return update


# Exact token counts are taken for distinct prompts, longest bound first, within this many bytes
# and this wall time in all; past either, the bound stands (the work a job can cause the
# trusted process stays small, whatever its prompts).
MAX_EXACT_BYTES = 4 << 20
MAX_EXACT_S = 5.0
# Nor is one prompt over this measured: the time is checked only between prompts, and one
# 3 MB prompt takes ~17 s and 1.5 GB to tokenize. (A task's text is ≤ 16,384 characters.)
MAX_EXACT_PROMPT_BYTES = 64 << 10
JUNCTION_SLACK = 8  # tokens a BPE may re-split where the prompt meets the template's text


def _char_level(tokenizer) -> bool:
    """A token of a byte-level BPE (or a SentencePiece with byte fallback, or a WordPiece)
    covers at least one UTF-8 byte; one of the char tokenizer (a WordLevel model) at least one
    character."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    return type(model).__name__ == "WordLevel"


def prompt_tokens(prompts: list[str], tokenizer) -> tuple[int, int, bool]:
    """(tokens, index, exact) of the longest prompt as the model sees it (chat template
    included): an upper bound over every prompt, exact where it was measured.

    Every prompt gets a sound bound (template + its bytes, or characters for the char
    tokenizer, + JUNCTION_SLACK); prompts are then measured exactly in decreasing order of
    their bound until none left can exceed the worst measured, within MAX_EXACT_BYTES and
    MAX_EXACT_S, and none over MAX_EXACT_PROMPT_BYTES; past those the bound stands. Characters
    alone are no bound: a short non-Latin prompt can be more tokens than a long Latin one."""
    from nestor.job.dryrun import render_prompt

    if not prompts:
        return 0, 0, True
    if tokenizer is None:  # no tokenizer here: bytes bound every tokenizer we run
        size = [len(p.encode("utf-8", "surrogatepass")) for p in prompts]
        i = max(range(len(prompts)), key=size.__getitem__)
        return size[i] + TEMPLATE_TOKENS, i, False
    template = len(render_prompt(tokenizer, ""))
    first: dict[str, int] = {}  # each distinct prompt once
    for i, p in enumerate(prompts):
        first.setdefault(p, i)
    size = {i: len(p.encode("utf-8", "surrogatepass")) for p, i in first.items()}
    bound = {i: template + (len(prompts[i]) if _char_level(tokenizer) else size[i])
             + JUNCTION_SLACK for i in size}
    order = sorted(bound, key=lambda k: -bound[k])
    worst, worst_i, exact = 0, order[0], True
    budget, deadline = MAX_EXACT_BYTES, time.monotonic() + MAX_EXACT_S
    for i in order:
        if bound[i] <= worst:
            break  # no prompt left can be longer than the worst one measured
        budget -= size[i]
        if budget < 0 or size[i] > MAX_EXACT_PROMPT_BYTES or time.monotonic() > deadline:
            worst, worst_i, exact = bound[i], i, False  # out of budget: the bound stands
            break
        try:
            n = len(render_prompt(tokenizer, prompts[i]))
        except (TypeError, ValueError):  # text the tokenizer refuses (a lone surrogate)
            n, exact = bound[i], False
        if n > worst:
            worst, worst_i = n, i
    return worst, worst_i, exact


def longest_prompt(prompts: list[str], tokenizer) -> tuple[int, int]:
    """(tokens, index) of the longest prompt as the model sees it: `prompt_tokens` without
    saying whether it was measured."""
    tokens, index, _ = prompt_tokens(prompts, tokenizer)
    return tokens, index


def check(config: JobConfig, prompts: list[str], tokenizer,
          cap_mb: int = DEFAULT_MEMORY_CAP_MB, dtype_bytes: int = 4) -> str | None:
    """memory_error for a job's prompts, or None (also when the model's shape is unknown)."""
    shape = model_shape(config.base_model)
    if shape is None or not prompts:
        return None
    return memory_error(config, shape, longest_prompt(prompts, tokenizer)[0], cap_mb,
                        dtype_bytes)[1]


@dataclass(frozen=True)
class Target:
    """Where a job trains: the memory it may use and the bytes of its weights' dtype."""

    cap_mb: int
    dtype_bytes: int = 4
    device: str = "cpu"

    def describe(self) -> str:
        return f"{self.device}, {self.dtype_bytes * 8}-bit weights, cap {self.cap_mb:,} MiB"


def worker_target(device, dtype, cpu_cap_mb: int = DEFAULT_MEMORY_CAP_MB) -> Target:
    """The worker's own target: on a GPU its memory (the job's `memory_cap_mb` is a CPU cap),
    on a CPU that cap; in the dtype its base model is loaded in (torch.dtype)."""
    import torch

    device = torch.device(device)
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return Target(total // MIB, dtype_bytes, str(device))
    return Target(cpu_cap_mb, dtype_bytes, str(device))


def driver_can_size(model_dir) -> bool:
    """Whether the driver's CPU estimate holds for a model: not for one whose checkpoint is in a
    low-precision dtype (Qwen3's bf16), which trains on a GPU worker in that dtype, against that
    GPU's memory; the worker sizes such a job itself (inner/run.py)."""
    from nestor.models.registry import checkpoint_dtype

    return checkpoint_dtype(model_dir) == "float32"


def _fits(config: JobConfig, shape: ModelShape, prompt_tokens: int, cap: int,
          dtype_bytes: int = 4, **change) -> bool:
    return estimate(config.model_copy(update=change), shape, prompt_tokens,
                    dtype_bytes).peak <= cap


def _largest(config: JobConfig, shape: ModelShape, prompt_tokens: int, cap: int, knob: str,
             lo: int, dtype_bytes: int = 4) -> int | None:
    """The largest value of `knob` (≤ its current one) that fits, or None if even `lo` does not."""
    hi = getattr(config, knob)
    if not _fits(config, shape, prompt_tokens, cap, dtype_bytes, **{knob: lo}):
        return None
    while lo < hi:  # the estimate grows with each knob
        mid = (lo + hi + 1) // 2
        if _fits(config, shape, prompt_tokens, cap, dtype_bytes, **{knob: mid}):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _longest_prompt(config: JobConfig, shape: ModelShape, prompt_tokens: int,
                    cap: int, dtype_bytes: int = 4) -> int | None:
    lo, hi = 1, prompt_tokens
    if estimate(config, shape, lo, dtype_bytes).peak > cap:
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(config, shape, mid, dtype_bytes).peak <= cap:
            lo = mid
        else:
            hi = mid - 1
    return lo


def memory_error(config: JobConfig, shape: ModelShape, prompt_tokens: int,
                 cap_mb: int = DEFAULT_MEMORY_CAP_MB,
                 dtype_bytes: int = 4) -> tuple[MemoryEstimate, str | None]:
    """The estimate, and None if it fits under `cap_mb`, else one line naming the knobs to
    lower and to what."""
    est = estimate(config, shape, prompt_tokens, dtype_bytes)
    cap = cap_mb * MIB
    if est.peak <= cap:
        return est, None
    what, size = est.biggest()
    P, G, T = config.prompts_per_step, config.group_size, config.max_new_tokens
    why = {"sampling": f"the KV cache of {P}×{G} rollouts × {prompt_tokens + T:,} tokens",
           "update": f"the backward pass over {P}×{G} rollouts × {prompt_tokens + T:,} tokens",
           "weights": f"the weights of {config.base_model}",
           "optimizer": "the gradients and AdamW state of a full fine-tune"}[what]
    fixes = []
    if (config.micro_batch_prompts or P) > 1 and what == "update" and _fits(
            config, shape, prompt_tokens, cap, dtype_bytes, micro_batch_prompts=1):
        best = _largest(config.model_copy(update={"micro_batch_prompts": P}), shape,
                        prompt_tokens, cap, "micro_batch_prompts", 1, dtype_bytes)
        fixes.append(f"micro_batch_prompts to {best} (same result, less memory)")
    for knob, lo in (("prompts_per_step", 1), ("group_size", 2), ("max_new_tokens", 1)):
        best = _largest(config, shape, prompt_tokens, cap, knob, lo, dtype_bytes)
        if best is not None and best < getattr(config, knob):
            fixes.append(f"{knob} to {best}")
    longest = _longest_prompt(config, shape, prompt_tokens, cap, dtype_bytes)
    if longest is not None and longest < prompt_tokens:
        fixes.append(f"the longest prompt to {longest:,} tokens")
    if config.lora_rank == 0 and _fits(config, shape, prompt_tokens, cap, dtype_bytes,
                                       lora_rank=8):
        fixes.append("lora_rank to 8 (LoRA instead of a full fine-tune)")
    advice = ("lower " + " or ".join(fixes)) if fixes else \
        f"this model does not fit under {cap_mb:,} MiB at any batch; use a smaller base_model"
    return est, (f"the trainer would need about {_gib(est.peak)} at its peak ({why}: "
                 f"{_gib(size)}), over the cap of {_gib(cap)}; {advice}")


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{math.ceil(n / MIB)} MiB"
