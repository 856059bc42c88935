"""Tool-call formats by model family: one parser (and renderer) per family.

* `json` (Qwen2.5/Qwen3, Hermes, our ChatML template):
  `<tool_call>{"name": "write_file", "arguments": {"path": "a.py"}}</tool_call>`
* `qwen3_5` (Qwen3.5/3.6, e.g. Qwen3.5-35B-A3B; tinker-cookbook's `qwen3_5` renderer):

      <tool_call>
      <function=write_file>
      <parameter=path>
      a.py
      </parameter>
      </function>
      </tool_call>

  A parameter's value is the text between the tag lines. A parameter the tool's schema types
  as a string stays text (a JSONL file's content is not an object); any other value is read
  as JSON when it parses (numbers, objects, lists), else kept as text, as the cookbook does.

`detect_format` picks the family from the model's chat template (the Qwen3.5 template spells
`<function=` and `<parameter=`); `[policy] tool_format` overrides it. Parsing never raises: a
malformed call becomes an error string that the episode shows the model as a tool error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from nestor.policy.base import Message, ToolCall
from nestor.text import no_surrogates

TOOL_FORMATS = ("auto", "json", "qwen3_5")
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION_RE = re.compile(r"^\s*<function=([^>\n]+)>\s*(.*?)\s*</function>\s*$", re.DOTALL)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _parse_json_call(body: str) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments), or an error message saying what is wrong with the call."""
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(obj, dict):
        return "expected a JSON object with keys name and arguments"
    name, args = obj.get("name"), obj.get("arguments", {})
    if not isinstance(name, str) or not name:
        return 'missing "name" (a string)'
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f'"arguments" of {name!r} is a string that is not JSON'
    if not isinstance(args, dict):
        return f'"arguments" of {name!r} must be a JSON object'
    return name, args


def string_params(tools: list[dict[str, Any]] | None) -> dict[str, set[str]]:
    """Tool name -> its parameters typed `string` in OpenAI-style function schemas."""
    out: dict[str, set[str]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k for k, v in props.items()
                                   if isinstance(v, dict) and v.get("type") == "string"}
    return out


def _parse_xml_call(body: str, strings: dict[str, set[str]] | None = None
                    ) -> tuple[str, dict[str, Any]] | str:
    match = _FUNCTION_RE.match(body)
    if not match:
        return "expected <function=NAME> ... </function> inside <tool_call>"
    name, inner = match.group(1).strip(), match.group(2)
    args: dict[str, Any] = {}
    pos = 0
    for param in _PARAM_RE.finditer(inner):
        if inner[pos:param.start()].strip():
            return f"text outside <parameter=...> blocks in {name!r}"
        key, text = param.group(1).strip(), param.group(2)
        if key in (strings or {}).get(name, ()):
            args[key] = text
            pos = param.end()
            continue
        try:
            args[key] = json.loads(text)
        except json.JSONDecodeError:
            args[key] = text
        pos = param.end()
    if inner[pos:].strip():
        return f"text outside <parameter=...> blocks in {name!r}"
    return name, args


def _xml_value(value: Any) -> str:
    """A parameter value as the Qwen3.5 template writes it: strings raw, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class ToolFormat:
    name: str
    hint: str  # how a call looks, appended to every malformed-call error

    def parse_call(self, body: str, strings: dict[str, set[str]] | None = None
                   ) -> tuple[str, dict[str, Any]] | str:
        """(name, arguments) or an error; `strings`: string-typed parameters per tool."""
        return _parse_xml_call(body, strings) if self.name == "qwen3_5" \
            else _parse_json_call(body)

    def render_call(self, call: ToolCall) -> str:
        """One call as the model writes it (what a demonstration's action text holds)."""
        if self.name == "qwen3_5":
            params = "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n"
                             for k, v in call.arguments.items())
            return f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>"
        return ("<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments},
                                           ensure_ascii=False) + "</tool_call>")

    def parse(self, text: str, call_prefix: str = "call",
              tools: list[dict[str, Any]] | None = None) -> tuple[Message, str | None]:
        """Split a sampled reply into prose and tool calls; the error (if any) says what to
        fix. `tools`: the episode's function schemas (typing of XML parameter values)."""
        calls: list[ToolCall] = []
        errors: list[str] = []
        strings = string_params(tools)
        for i, match in enumerate(TOOL_CALL_RE.finditer(text)):
            parsed = self.parse_call(match.group(1), strings)
            if isinstance(parsed, str):
                errors.append(f"tool call {i + 1}: {parsed}")
            else:
                calls.append(ToolCall(name=no_surrogates(parsed[0]),
                                      arguments=no_surrogates(parsed[1]), id=f"{call_prefix}_{i}"))
        rest = TOOL_CALL_RE.sub("", text)
        if "<tool_call>" in rest or "</tool_call>" in rest:
            errors.append("unbalanced <tool_call> tags")
            rest = rest.replace("<tool_call>", "").replace("</tool_call>", "")
        error = None
        if errors:
            error = "malformed tool call: " + "; ".join(errors) + f"; {self.hint}"
        return Message(role="assistant", content=rest.strip(), tool_calls=calls), error


JSON = ToolFormat("json", 'write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>')
QWEN3_5 = ToolFormat("qwen3_5", "write <tool_call>\n<function=TOOL>\n<parameter=NAME>\nVALUE\n"
                     "</parameter>\n</function>\n</tool_call>")
FORMATS = {f.name: f for f in (JSON, QWEN3_5)}


def detect_format(chat_template: str | None) -> ToolFormat:
    """The family a chat template writes tool calls in (JSON when it says nothing)."""
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return QWEN3_5
    return JSON


def tool_format_for(tokenizer, name: str = "auto") -> ToolFormat:
    """`name` from TOOL_FORMATS; `auto` reads the tokenizer's chat template."""
    if name == "auto":
        return detect_format(getattr(tokenizer, "chat_template", None))
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"tool_format {name!r}: choose one of {', '.join(TOOL_FORMATS)}") \
            from None


def stop_token_ids(tokenizer) -> list[int]:
    """The ids a turn ends at: the chat template's end-of-message token (`<|im_end|>` for
    ChatML/Qwen3-family templates, as tinker-cookbook's renderers send) and the eos token."""
    ids: list[int] = []
    template = getattr(tokenizer, "chat_template", None) or ""
    for token in (["<|im_end|>"] if "<|im_end|>" in template else []) + [tokenizer.eos_token]:
        if token is None:
            continue
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None) \
                and tid not in ids:
            ids.append(tid)
    return ids
