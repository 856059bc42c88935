"""Tool-call formats by family: Qwen3's JSON and Qwen3.5/3.6's XML (tinker-cookbook's
`qwen3_5` renderer), chosen from the chat template or by name."""

import pytest

from nestor.policy.base import Message, ToolCall
from nestor.policy.chat import format_assistant, parse_assistant
from nestor.policy.tool_format import (
    JSON,
    QWEN3_5,
    detect_format,
    stop_token_ids,
    tool_format_for,
)

# What a Qwen3.5 model writes (the format its template declares and the cookbook parses).
XML_REPLY = """I will write the config first.

<tool_call>
<function=write_file>
<parameter=path>
config.toml
</parameter>
<parameter=content>
base_model = "tiny-s"
lr = 3e-4
</parameter>
</function>
</tool_call>
<tool_call>
<function=run_probe>
<parameter=limit>
3
</parameter>
<parameter=options>
{"verbose": true}
</parameter>
</function>
</tool_call>"""

# An excerpt of the Qwen3.5 chat template's tool declaration (tinker-cookbook 0.6.1 renders
# the same text in Qwen3_5Renderer.create_conversation_prefix_with_tools).
QWEN3_5_TEMPLATE = ("{%- if tools %}# Tools ... <tool_call>\n<function=example_function_name>\n"
                    "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n"
                    "</tool_call>{%- endif %}")
QWEN3_TEMPLATE = ('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
                  "</tool_call>")


def test_xml_calls_parse_with_values_as_json_or_text():
    msg, err = parse_assistant(XML_REPLY, fmt=QWEN3_5)
    assert err is None
    assert msg.content == "I will write the config first."
    assert msg.tool_calls == [
        ToolCall("write_file", {"path": "config.toml",
                                "content": 'base_model = "tiny-s"\nlr = 3e-4'}, "call_0"),
        ToolCall("run_probe", {"limit": 3, "options": {"verbose": True}}, "call_1")]


def test_the_json_parser_reads_xml_calls_as_malformed_and_vice_versa():
    _, err = parse_assistant(XML_REPLY)  # the default (Qwen3) family
    assert err is not None and "not valid JSON" in err
    _, err = parse_assistant('<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
                             fmt=QWEN3_5)
    assert err is not None and "<function=NAME>" in err and "<parameter=NAME>" in err


@pytest.mark.parametrize("body, needle", [
    ("<function=write_file>\n<parameter=path>\na\n</parameter>\nstray\n</function>", "outside"),
    ("<function=write_file>\nstray<parameter=path>\na\n</parameter>\n</function>", "outside"),
    ("<parameter=path>\na\n</parameter>", "<function=NAME>"),
])
def test_malformed_xml_says_what_is_wrong(body, needle):
    msg, err = parse_assistant(f"<tool_call>\n{body}\n</tool_call>", fmt=QWEN3_5)
    assert msg.tool_calls == [] and err is not None and needle in err


@pytest.mark.parametrize("fmt", [JSON, QWEN3_5])
def test_rendered_calls_parse_back(fmt):
    from nestor.sandbox.workspace import TOOL_SCHEMAS  # the episode's tools

    calls = [ToolCall("write_file", {"path": "data/train.jsonl",
                                     "content": '{"q": "é"}\n{"q": 2}\n'}),
             ToolCall("submit", {}), ToolCall("probe", {"n": 2, "tags": ["a", "b"]})]
    text = format_assistant(Message("assistant", "Writing.", calls), fmt)
    msg, err = parse_assistant(text, call_prefix="c", fmt=fmt, tools=TOOL_SCHEMAS)
    assert err is None and msg.content == "Writing."
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [(c.name, c.arguments)
                                                               for c in calls]


def test_string_typed_xml_values_stay_text():
    """A JSONL line is valid JSON: a string-typed parameter must not become an object."""
    from nestor.sandbox.workspace import TOOL_SCHEMAS

    text = ("<tool_call>\n<function=write_file>\n<parameter=path>\n7\n</parameter>\n"
            '<parameter=content>\n{"q": 1}\n</parameter>\n</function>\n</tool_call>')
    msg, err = parse_assistant(text, fmt=QWEN3_5, tools=TOOL_SCHEMAS)
    assert err is None and msg.tool_calls[0].arguments == {"path": "7", "content": '{"q": 1}'}
    untyped, _ = parse_assistant(text, fmt=QWEN3_5)  # no schema: the cookbook's JSON reading
    assert untyped.tool_calls[0].arguments == {"path": 7, "content": {"q": 1}}


def test_format_detected_from_the_chat_template():
    assert detect_format(QWEN3_5_TEMPLATE) is QWEN3_5
    assert detect_format(QWEN3_TEMPLATE) is JSON
    assert detect_format(None) is JSON

    class Tok:
        chat_template = QWEN3_5_TEMPLATE

    assert tool_format_for(Tok()) is QWEN3_5
    assert tool_format_for(Tok(), "json") is JSON  # [policy] tool_format overrides
    with pytest.raises(ValueError, match="qwen3_5"):
        tool_format_for(Tok(), "xml")


def test_stop_tokens_of_a_chatml_template_include_im_end():
    from nestor.models.registry import load_model

    _, tok = load_model("tiny-m")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(tok)[0] == im_end


def test_the_local_lm_policy_reads_and_clones_calls_in_its_format():
    """`[policy] tool_format` reaches the local LM policy: a Qwen3.5-style XML reply it samples
    parses into calls, and a warm start's demo turn is written in that format."""
    import torch

    from nestor.models.registry import load_model
    from nestor.policy.base import Observation
    from nestor.policy.lm import LMPolicy
    from nestor.sft.data import policy_encoders

    torch.set_num_threads(1)
    model, tok = load_model("tiny-m")
    agent = LMPolicy(model, tok, max_new_tokens=400, tool_format="qwen3_5")
    assert agent.tool_format is QWEN3_5
    reply = tok(XML_REPLY, add_special_tokens=False).input_ids + [agent.eos_id]
    agent.sample = lambda context: (reply, [0.0] * len(reply))
    turn = agent.act(Observation([Message("system", "s"), Message("user", "u")], []))
    assert turn.parse_error is None
    assert [c.name for c in turn.message.tool_calls] == ["write_file", "run_probe"]
    _, encode_action = policy_encoders(agent)
    call = ToolCall("write_file", {"path": "a.txt", "content": "hi"}, "call_0")
    ids = encode_action(Message("assistant", "", [call]))
    assert "<function=write_file>" in tok.decode(ids)


@pytest.mark.parametrize("fmt, reply", [
    (JSON, '<tool_call>{"name": "write_file\\ud800", "arguments": {"path\\udc00": "a", '
           '"content": ["x\\ud800", {"y": "\\udfff"}]}}</tool_call>'),
    (QWEN3_5, "<tool_call>\n<function=write_file\ud800>\n<parameter=path\udc00>\na\n</parameter>"
              '\n<parameter=content>\n["x\\ud800", {"y": "\\udfff"}]\n</parameter>\n</function>'
              "\n</tool_call>"),
])
def test_lone_surrogates_in_a_call_become_replacement_characters(fmt, reply):
    # JSON's "\ud800" parses to a lone surrogate, which no ledger, file or terminal can encode
    message, error = fmt.parse(reply)
    call = message.tool_calls[0]
    assert error is None and call.name == "write_file\ufffd"
    assert call.arguments == {"path\ufffd": "a", "content": ["x\ufffd", {"y": "\ufffd"}]}
