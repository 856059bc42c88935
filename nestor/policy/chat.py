"""Qwen3-style chat rendering and tool-call parsing for token policies.

The model writes tool calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(one or more per turn, after optional prose). Parsing never raises: a malformed call becomes
an error string that the episode shows the model as a tool error, and the policy counts it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nestor.policy.base import Message, ToolCall

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FORMAT_HINT = 'write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'


def to_hf_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our Messages as the dicts HF chat templates expect (OpenAI-style tool calls)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            d["tool_calls"] = [{"type": "function", "id": tc.id,
                                "function": {"name": tc.name, "arguments": tc.arguments}}
                               for tc in m.tool_calls]
        if m.role == "tool" and m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def format_assistant(message: Message) -> str:
    """An assistant turn as a token policy writes it: its prose, then one
    `<tool_call>{"name": ..., "arguments": ...}</tool_call>` per call — what `parse_assistant`
    reads back into the same calls (the text a demonstration is trained on)."""
    calls = [f'<tool_call>{json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)}'
             "</tool_call>" for c in message.tool_calls]
    return "\n".join(([message.content] if message.content else []) + calls)


def _parse_one(body: str) -> tuple[str, dict[str, Any]] | str:
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


def parse_assistant(text: str, call_prefix: str = "call") -> tuple[Message, str | None]:
    """Split a sampled reply into prose and tool calls; the error (if any) says what to fix."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, match in enumerate(TOOL_CALL_RE.finditer(text)):
        parsed = _parse_one(match.group(1))
        if isinstance(parsed, str):
            errors.append(f"tool call {i + 1}: {parsed}")
        else:
            calls.append(ToolCall(name=parsed[0], arguments=parsed[1], id=f"{call_prefix}_{i}"))
    rest = TOOL_CALL_RE.sub("", text)
    if "<tool_call>" in rest or "</tool_call>" in rest:
        errors.append("unbalanced <tool_call> tags")
        rest = rest.replace("<tool_call>", "").replace("</tool_call>", "")
    error = None
    if errors:
        error = "malformed tool call: " + "; ".join(errors) + f"; {FORMAT_HINT}"
    return Message(role="assistant", content=rest.strip(), tool_calls=calls), error
