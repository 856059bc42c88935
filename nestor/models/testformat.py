"""The test format, in one place: exactly one user message through the model's chat template,
no system prompt, the assistant turn opened. The hidden eval, the GRPO trainer and the probe's
dry run all render prompts here, so what is trained is what is tested.

Some chat templates inject a default system prompt when the conversation has none (SmolLM2's
"You are a helpful AI assistant named SmolLM...", Qwen2.5's "You are Qwen..."). That would make
the test depend on a sentence nobody chose, so it is detected once per tokenizer and, for
ChatML templates, the injected turn is cut; any other template that injects one is refused with
a one-line error rather than silently tested in a different format.
"""

from __future__ import annotations

import re

_PROBE = "\x00nestor-probe\x00"
_CHATML_SYSTEM = re.compile(r"^(?:<\|begin_of_text\|>)?<\|im_start\|>system\n.*?<\|im_end\|>\n",
                            re.DOTALL)


class ChatFormatError(ValueError):
    """A chat template that cannot render the test format."""


def _render(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)


def injected_system_prompt(tokenizer) -> str | None:
    """The text a template puts before the user turn when no system message is given, if it is
    a system turn; None when the template adds none. Cached on the tokenizer."""
    cached = getattr(tokenizer, "_nestor_injected_system", False)
    if cached is not False:
        return cached
    text = _render(tokenizer, _PROBE)
    prefix = text[:text.index(_PROBE)] if _PROBE in text else text
    user_at = prefix.rfind("user")  # the user turn's own header starts here
    head = prefix[:user_at] if user_at >= 0 else prefix
    found = head if "system" in head.lower() else None
    try:
        tokenizer._nestor_injected_system = found
    except AttributeError:  # a tokenizer that refuses new attributes: recompute next time
        pass
    return found


def test_format_text(tokenizer, prompt: str) -> str:
    """The rendered test-format prompt for `prompt` (a string, special tokens as text)."""
    text = _render(tokenizer, prompt)
    injected = injected_system_prompt(tokenizer)
    if injected is None:
        return text
    stripped = _CHATML_SYSTEM.sub("", text, count=1)
    if stripped == text:
        raise ChatFormatError(
            "this model's chat template injects a default system prompt and is not ChatML, so "
            "the test format (one user message, no system prompt) cannot be rendered; give the "
            "tokenizer a chat_template without the default system turn")
    return stripped


def test_format_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of the test-format prompt (no BOS or other tokens added beyond the template)."""
    return list(tokenizer(test_format_text(tokenizer, prompt), add_special_tokens=False,
                          verbose=False)["input_ids"])


test_format_text.__test__ = False  # not pytest tests, despite the name
test_format_ids.__test__ = False
