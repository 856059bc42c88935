import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from nestor.models.corpus import CorpusMix, build_corpus
from nestor.models.pretrain import PretrainConfig, lr_at, pretrain
from nestor.models.registry import load_model
from nestor.tasks import TaskRegistry


def test_corpus_is_seeded_and_covers_every_skill():
    docs = build_corpus(3000, seed=7)
    assert docs == build_corpus(3000, seed=7)
    assert docs != build_corpus(3000, seed=8)
    text = "\n".join(docs)
    for ref in TaskRegistry().tasks(include_heldout=True):  # held-out family included
        assert f"{ref.task.title}" in text or ref.id in text, ref.id
    assert "<tool_call>" in text and "base_model = " in text


def test_only_a_small_share_is_in_the_exact_test_format():
    docs = build_corpus(4000, seed=0, mix=CorpusMix(test_format_share=0.08))
    # the built-in test prompts: "reverse abc", "12+3=", "max 4 5", "count a in abc", ...
    test_format = re.compile(r"<\|im_start\|>user\n((reverse|sort|dedupe|shift|len|vowels|count|"
                             r"dashes|acronym|snake|max) [a-z0-9 ]+|\d+[-+]\d+=)<\|im_end\|>")
    share = sum(bool(test_format.match(d)) for d in docs) / len(docs)
    assert 0.05 < share < 0.12


def test_emphasis_shifts_a_skills_share_and_rejects_unknown_tasks():
    def share(mix: CorpusMix) -> float:
        docs = build_corpus(3000, seed=1, mix=mix)
        return sum(bool(re.search(r"\d+[+]\d+=| plus |Add two numbers|add\(", d))
                   for d in docs) / len(docs)

    assert share(CorpusMix(emphasis=(("add", 4.0),))) > 2.5 * share(CorpusMix())
    with pytest.raises(ValueError, match="unknown tasks: nope"):
        build_corpus(10, mix=CorpusMix(emphasis=(("nope", 2.0),)))


def test_corpus_never_touches_hidden_evals():
    code = ("import sys, nestor.models.corpus, nestor.models.pretrain; "
            "sys.exit('nestor.tasks.hidden' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_lr_schedule_warms_up_then_decays():
    cfg = PretrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, cfg) < lr_at(9, cfg) == 1e-3
    assert abs(lr_at(99, cfg) - 1e-4) < 2e-5


def test_schedule_steps_stop_part_way_through_a_longer_schedule():
    short = PretrainConfig(steps=50, schedule_steps=100, warmup_steps=10)
    full = PretrainConfig(steps=100, warmup_steps=10)
    assert [lr_at(s, short) for s in range(50)] == [lr_at(s, full) for s in range(50)]
    assert lr_at(49, short) > lr_at(49, PretrainConfig(steps=50, warmup_steps=10))


def test_pretrain_is_reproducible_and_loadable(tmp_path):
    cfg = PretrainConfig(model="tiny-s", steps=3, batch_size=4, seq_len=32, n_docs=200,
                         threads=1, seed=5)
    figures = pretrain(cfg, tmp_path / "a")
    pretrain(cfg, tmp_path / "b")
    a = load_file(tmp_path / "a" / "model.safetensors")
    b = load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert figures["final_loss"] > 0 and (tmp_path / "a" / "pretrain.json").is_file()
    model, tok = load_model(tmp_path / "a")
    assert model.config.vocab_size == len(tok)
    assert tok.chat_template is not None


def test_pretrain_cli_rejects_bad_emphasis(tmp_path):
    from typer.testing import CliRunner

    from nestor.cli import app

    def run(*args: str):
        return CliRunner().invoke(app, ["models", "pretrain", "--model", "tiny-s", "--steps", "1",
                                        "--out", str(tmp_path / "m"), *args])

    malformed = run("--emphasis", "add:3")
    assert malformed.exit_code == 2 and "expected TASK=FACTOR" in malformed.output
    unknown = run("--emphasis", "nope=2")
    assert unknown.exit_code == 2 and "unknown tasks: nope" in unknown.output
    negative = run("--emphasis", "add=-1")
    assert negative.exit_code == 2 and "emphasis.add" in negative.output
    assert not (tmp_path / "m").exists()
