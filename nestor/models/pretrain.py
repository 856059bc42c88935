"""Pretraining the tiny models: a char-level Qwen3 trained from scratch on the synthetic corpus.

Reads like nanoGPT: pack the corpus into one token stream, draw random windows, next-token
cross-entropy, AdamW with warmup + cosine decay, gradient clipping. Seeded end to end, so the
same command on the same machine and thread count writes the same weights.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field, NonNegativeFloat

from nestor.models.corpus import CorpusMix, build_corpus
from nestor.models.tokenizer import build_char_tokenizer

# Architecture of the tiny models (Qwen3 blocks: GQA, RMSNorm, SwiGLU, RoPE, q/k norm).
TINY_ARCH: dict[str, dict] = {
    "tiny-s": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=5,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    "tiny-m": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
MAX_POSITIONS = 4096  # RoPE: longer contexts than trained on still run (for an LM agent)


# Steps that produced the bundled weights (1 thread, seed 0): copying from the input appears
# in tiny-m after ~700-900 steps and then saturates quickly (docs/models.md).
BUNDLED_STEPS = {"tiny-s": 320, "tiny-m": 1100}


# Skills that tiny-m learns slowly get more of the corpus, quick ones less: without it,
# copying saturates the formatting family while arithmetic stays at 0 (docs/models.md).
DEFAULT_EMPHASIS: dict[str, float] = {
    "add": 4.0, "subtract": 3.0, "max": 2.0,
    "reverse": 1.6, "shift": 2.2, "sort": 1.2,
    "dashes": 0.8, "acronym": 0.4, "snake": 0.4,
}


class PretrainConfig(BaseModel):
    model: str = Field("tiny-m", description="Which tiny architecture: tiny-s or tiny-m.")
    steps: int = Field(320, ge=1, le=100_000, description="Optimizer steps.")
    schedule_steps: int | None = Field(
        None, ge=1, le=100_000, description="Length of the lr schedule (default: steps); "
        "steps < schedule_steps stops part-way, as a checkpoint of the longer run would.")
    batch_size: int = Field(24, ge=1, le=1024, description="Windows per step.")
    seq_len: int = Field(128, ge=16, le=MAX_POSITIONS, description="Tokens per window.")
    lr: float = Field(3e-3, gt=0, le=1e-1, description="Peak AdamW learning rate.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final lr as a share of the peak.")
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(0.1, ge=0, le=1, description="AdamW weight decay (matrices only).")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    n_docs: int = Field(20_000, ge=100, description="Corpus documents (sampled windows draw "
                                                     "from their packed stream).")
    test_format_share: float = Field(CorpusMix.test_format_share, ge=0, le=1,
                                     description="Corpus share of chat rows in the exact "
                                     "test format.")
    list_share: float = Field(CorpusMix.list_share, ge=0, le=1,
                              description="Corpus share of 3-6 row lists.")
    hard_share: float = Field(CorpusMix.hard_share, ge=0, le=1,
                              description="Share of inputs at difficulty 1.")
    emphasis: dict[str, NonNegativeFloat] = Field(
        default_factory=lambda: dict(DEFAULT_EMPHASIS),
        description="Per-task factor on a skill's share of the corpus (1 when absent).")
    seed: int = Field(0, description="Seeds the corpus, the init and the window order.")
    threads: int = Field(1, ge=1, le=256, description="torch CPU threads.")
    bf16: bool = Field(True, description="bf16 autocast for the forward pass (weights and "
                                         "optimizer stay float32); faster on CPUs with bf16.")


def model_config(name: str, vocab_size: int, pad_id: int, eos_id: int):
    from transformers import Qwen3Config

    if name not in TINY_ARCH:
        raise ValueError(f"unknown tiny model {name!r}; pretrainable: {', '.join(TINY_ARCH)}")
    return Qwen3Config(vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS,
                       tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id,
                       bos_token_id=None, **TINY_ARCH[name])


def lr_at(step: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    total = cfg.schedule_steps or cfg.steps
    progress = (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def token_stream(docs: list[str], tokenizer) -> torch.Tensor:
    """All documents back to back as one LongTensor [N]."""
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    return torch.tensor([t for doc in ids for t in doc], dtype=torch.long)


def pretrain(cfg: PretrainConfig, out_dir: Path,
             on_step: Callable[[int, float], None] | None = None) -> dict:
    """Train from scratch and save a loadable HF directory in `out_dir`; returns the figures."""
    from transformers import Qwen3ForCausalLM

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    tokenizer = build_char_tokenizer(model_max_length=MAX_POSITIONS)
    mix = CorpusMix(test_format_share=cfg.test_format_share, list_share=cfg.list_share,
                    hard_share=cfg.hard_share, emphasis=tuple(sorted(cfg.emphasis.items())))
    docs = build_corpus(cfg.n_docs, seed=cfg.seed, mix=mix)
    stream = token_stream(docs, tokenizer)  # [N]
    config = model_config(cfg.model, len(tokenizer), tokenizer.pad_token_id,
                          tokenizer.eos_token_id)
    model = Qwen3ForCausalLM(config)
    model.train()

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=cfg.lr, betas=(0.9, 0.95))
    windows = torch.Generator().manual_seed(cfg.seed + 1)
    offsets_arange = torch.arange(cfg.seq_len + 1)
    ema_loss = None
    for step in range(cfg.steps):
        starts = torch.randint(0, len(stream) - cfg.seq_len - 1, (cfg.batch_size,),
                               generator=windows)
        chunk = stream[starts[:, None] + offsets_arange]  # [B, L + 1]
        inputs, targets = chunk[:, :-1], chunk[:, 1:]  # [B, L] each
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=inputs).logits  # [B, L, V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        for group in optim.param_groups:
            group["lr"] = lr_at(step, cfg)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optim.step()
        ema_loss = loss.item() if ema_loss is None else 0.95 * ema_loss + 0.05 * loss.item()
        if on_step is not None:
            on_step(step, ema_loss)

    wall_s = time.perf_counter() - t0
    figures = {
        "model": cfg.model,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus_docs": len(docs),
        "corpus_tokens": len(stream),
        "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "final_loss": round(ema_loss, 4),
        "wall_s": round(wall_s, 1),
        "config": cfg.model_dump(),
    }
    save(model, tokenizer, out_dir, figures)
    return figures


def save(model, tokenizer, out_dir: Path, figures: dict) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "pretrain.json").write_text(json.dumps(figures, indent=2) + "\n")
