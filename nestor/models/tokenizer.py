"""The character-level tokenizer of the tiny models, as a standard `PreTrainedTokenizerFast`.

One token per character: printable ASCII, newline and tab; anything else maps to `<|unk|>`.
Chat control strings (`<|im_start|>`, `<tool_call>`, ...) are single special tokens, so a chat
costs a handful of tokens of overhead. The chat template renders Qwen3-style turns and tool calls
(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), so code written against Qwen3 chat
rendering works unchanged on the tiny models.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD = "<|pad|>"
UNK = "<|unk|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"  # end of every turn; the eos of generation
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = (PAD, UNK, IM_START, IM_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE,
                  TOOL_RESPONSE_END)
# Printable ASCII (space..~) plus newline and tab, in a fixed order: the ids are part of the
# bundled weights, so this list may only ever grow at the end.
CHARS = tuple(c for c in string.printable if c not in "\r\x0b\x0c")

# Qwen3-style chat rendering, minus the <think> machinery (the tiny models never think).
# Consecutive tool results share one user turn, as in Qwen's own template.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}"
    "{% if not loop.first %}<|im_start|>system\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{% elif message.role == 'user' %}"
    "<|im_start|>user\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}"
    "<|im_start|>assistant\n"
    "{% generation %}"
    "{{ message.content if message.content is string else '' }}"
    "{% for tc in message.tool_calls or [] %}"
    "{% set fn = tc.function if tc.function is defined else tc %}"
    "{% if (message.content is string and message.content) or not loop.first %}{{ '\\n' }}"
    "{% endif %}"
    "<tool_call>{\"name\": {{ fn.name | tojson }}, \"arguments\":"
    "{% if fn.arguments is string %} {{ fn.arguments }}{% else %} {{ fn.arguments | tojson }}"
    "{% endif %}}</tool_call>"
    "{% endfor %}"
    "<|im_end|>"
    "{% endgeneration %}{{ '\\n' }}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_char_tokenizer(model_max_length: int = 4096) -> PreTrainedTokenizerFast:
    """A fresh char tokenizer. Ids: specials first (pad = 0), then `CHARS` in order."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for c in CHARS:
        vocab[c] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every single character is its own "word"; specials are split off before this runs.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # concatenate, no spaces between tokens
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        bos_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS[2:]),
        model_max_length=model_max_length,
        padding_side="left",  # generation pads on the left
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
