import string

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from nestor.models.registry import load_tokenizer
from nestor.models.tokenizer import CHARS, IM_END, SPECIAL_TOKENS, build_char_tokenizer


def test_round_trip_printable_ascii_one_token_per_char():
    tok = build_char_tokenizer()
    text = string.printable.replace("\r", "").replace("\x0b", "").replace("\x0c", "") + " end"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert len(tok) == len(SPECIAL_TOKENS) + len(CHARS)


def test_specials_are_single_tokens_and_unknown_chars_map_to_unk():
    tok = build_char_tokenizer()
    ids = tok.encode(f"a{IM_END}<tool_call>é", add_special_tokens=False)
    assert len(ids) == 4
    assert ids[1] == tok.eos_token_id
    assert ids[3] == tok.unk_token_id
    assert tok.pad_token_id not in tok.encode("x y\tz\n", add_special_tokens=False)


def test_test_format_chat_template():
    tok = build_char_tokenizer()
    text = tok.apply_chat_template([{"role": "user", "content": "reverse abc"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nreverse abc<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_tool_calls_and_results():
    tok = build_char_tokenizer()
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {
             "name": "write_file", "arguments": {"path": "a.py", "content": "x = 1\n"}}}]},
        {"role": "tool", "content": "wrote 6 bytes"},
        {"role": "tool", "content": "second"},
        {"role": "assistant", "content": "done"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwrite it")
    assert ('<|im_start|>assistant\n<tool_call>{"name": "write_file", "arguments": '
            '{"path": "a.py", "content": "x = 1\\n"}}</tool_call><|im_end|>\n') in text
    # consecutive tool results share one user turn, as in Qwen3's template
    assert ("<|im_start|>user\n<tool_response>\nwrote 6 bytes\n</tool_response>\n"
            "<tool_response>\nsecond\n</tool_response><|im_end|>\n") in text
    assert text.endswith("<|im_start|>assistant\ndone<|im_end|>\n")
    tools = [{"type": "function", "function": {"name": "submit", "parameters": {}}}]
    with_tools = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert with_tools.startswith("<|im_start|>system\nbe brief\n\n# Tools")
    assert '"name": "submit"' in with_tools


def test_assistant_mask_covers_replies_and_eos():
    tok = build_char_tokenizer()
    out = tok.apply_chat_template([{"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "yo"}],
                                  return_assistant_tokens_mask=True, return_dict=True)
    ids = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(ids) == "yo<|im_end|>"


def test_bundled_tokenizer_loads_as_fast_tokenizer(tmp_path):
    tok = load_tokenizer("tiny-m")
    assert isinstance(tok, PreTrainedTokenizerFast)
    fresh = build_char_tokenizer()
    assert tok.encode("sort dcba", add_special_tokens=False) == \
        fresh.encode("sort dcba", add_special_tokens=False)
    assert tok.eos_token == IM_END and tok.padding_side == "left"
    fresh.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.chat_template == fresh.chat_template
