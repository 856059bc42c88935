"""Base-model rollouts for the probe's dry run, with the models kept loaded between probes."""

from __future__ import annotations

import functools

from nestor.job.config import JobConfig
from nestor.models.testformat import test_format_ids


def render_prompt(tokenizer, prompt: str) -> list[int]:
    """The test format: one user message, then the assistant turn opening."""
    return test_format_ids(tokenizer, prompt)


@functools.lru_cache(maxsize=2)
def _model(name: str):
    from nestor.models.registry import load_model

    return load_model(name)


@functools.lru_cache(maxsize=4)
def tokenizer_for(name: str):
    from nestor.models.registry import load_tokenizer

    return load_tokenizer(name)


def rollouts(config: JobConfig, prompts: list[str]) -> list[str]:
    """One sampled completion per prompt, as training would sample them (the test format,
    the job's temperature and max_new_tokens), seeded by the job's seed."""
    import torch

    from nestor.models.sampler import sample

    model, tokenizer = _model(config.base_model)
    ids = [render_prompt(tokenizer, p) for p in prompts]
    generator = torch.Generator().manual_seed(config.seed)
    # A batch of a few short rollouts gains nothing from intra-op threads, and on a busy
    # machine their spin-waits cost seconds.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = sample(model, ids, config.max_new_tokens, eos_id=tokenizer.eos_token_id,
                     pad_id=tokenizer.pad_token_id, temperature=config.temperature,
                     generator=generator, tokenizer=tokenizer)
    finally:
        torch.set_num_threads(threads)
    return list(out.texts)
