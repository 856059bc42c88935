"""Prompt lengths in the model's own tokens, for every prompt the trainer will see: a short
non-Latin prompt is longer in a byte-level BPE's tokens than a long Latin one, and the work the
measure costs the trusted process stays bounded."""

import pytest

from nestor.job import memory
from nestor.job.config import JobConfig
from nestor.job.dryrun import render_prompt
from nestor.job.memory import prompt_tokens

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE (SmolLM2's kind) that learnt English words and no CJK."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 50] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>")
    tok.chat_template = CHATML
    return tok


LATIN = "the quick brown fox jumps over the lazy dog " * 60  # 2,640 chars, ~550 tokens
CJK = "漢字" * 400  # 800 chars, 2,400 bytes: a token each


def test_a_short_non_latin_prompt_is_the_longest(bpe):
    prompts = [LATIN] * 40 + [CJK]
    tokens, index, exact = prompt_tokens(prompts, bpe)
    assert index == 40 and exact
    assert tokens == len(render_prompt(bpe, CJK)) > 4 * len(render_prompt(bpe, LATIN))


def test_the_context_check_refuses_it(bpe, monkeypatch):
    """SmolLM2's case, scaled down: the 16 prompts longest in characters are Latin and fit; a
    shorter CJK prompt does not."""
    from nestor.job import validate
    from nestor.job.report import CheckLog

    monkeypatch.setattr(validate, "_context_length", lambda name: 2048)
    tasks = [{"prompt": LATIN + str(i)} for i in range(40)] + [{"prompt": CJK}]
    report = CheckLog()
    config = JobConfig(base_model="smollm2-135m", max_new_tokens=16)
    assert not validate.check_context(tasks, config, bpe, report)
    assert "task 40's prompt" in report.checks[-1].message
    assert validate.check_context(tasks[:40], config, bpe, CheckLog())


def test_the_work_is_bounded_and_the_bound_is_sound(bpe, monkeypatch):
    calls = []
    real = render_prompt

    def counting(tokenizer, prompt):
        calls.append(len(prompt.encode()))
        return real(tokenizer, prompt)

    monkeypatch.setattr("nestor.job.dryrun.render_prompt", counting)
    monkeypatch.setattr(memory, "MAX_EXACT_BYTES", 256 << 10)
    # 1,000 distinct 16,000-byte Latin prompts: 16 MB to tokenize
    prompts = [f"{i} " + "the quick brown fox " * 800 for i in range(1000)]
    tokens, index, exact = prompt_tokens(prompts, bpe)
    assert sum(calls) <= 256 << 10  # what was measured (the template's own: 0)
    assert not exact  # the budget ran out: the bound stands for the rest
    assert tokens >= max(len(real(bpe, p)) for p in prompts[::47])


def test_one_huge_prompt_is_never_tokenized(bpe, monkeypatch):
    """The time budget is checked between prompts: one 3 MB prompt would take seconds and GBs."""
    calls = []
    monkeypatch.setattr("nestor.job.dryrun.render_prompt",
                        lambda tok, p: calls.append(len(p)) or render_prompt(tok, p))
    huge = "the quick brown fox " * 5000  # 100 KB: within MAX_EXACT_BYTES, over one prompt's
    tokens, index, exact = prompt_tokens([LATIN] * 40 + [huge], bpe)
    assert index == 40 and not exact and tokens >= len(huge.encode())  # the bytes bound
    assert len(huge) not in calls


def test_char_tokenizer_counts_are_exact_without_measuring_them_all():
    from nestor.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    prompts = [f"reverse {'ab' * (i % 50)}" for i in range(5000)] + ["ü" * 300]
    tokens, index, exact = prompt_tokens(prompts, tok)
    assert exact and index == 5000 and tokens == len(render_prompt(tok, "ü" * 300))
    assert memory.longest_prompt(prompts, tok) == (tokens, index)
