"""Chat rendering and tool-call parsing for token policies.

By default the model writes Qwen3-style tool calls,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one or more per turn, after
optional prose); other families (Qwen3.5's XML form) are in `nestor.policy.tool_format`.
Parsing never raises: a malformed call becomes an error string that the episode shows the
model as a tool error, and the policy counts it.
"""

from __future__ import annotations

from typing import Any

from nestor.policy.base import Message
from nestor.policy.tool_format import JSON, ToolFormat

FORMAT_HINT = JSON.hint


def content_text(content: Any) -> Any:
    """An OpenAI message's content as text where it is a list of parts (the text parts
    joined); anything else as it came (the caller says whether it is a string)."""
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content


def to_hf_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our Messages as the dicts HF chat templates expect (OpenAI-style tool calls; the
    arguments as a mapping, which both the Qwen3 and the Qwen3.5 templates render)."""
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


def format_assistant(message: Message, fmt: ToolFormat = JSON) -> str:
    """An assistant turn as a token policy writes it: its prose, then one call per line in the
    family's format — what `parse_assistant` reads back into the same calls (the text a
    demonstration is trained on)."""
    calls = [fmt.render_call(c) for c in message.tool_calls]
    return "\n".join(([message.content] if message.content else []) + calls)


def parse_assistant(text: str, call_prefix: str = "call", fmt: ToolFormat = JSON,
                    tools: list[dict[str, Any]] | None = None,
                    cut_at: int | None = None,
                    repeated: int | None = None) -> tuple[Message, str | None]:
    """Split a sampled reply into prose and tool calls; the error (if any) says what to fix.
    `tools` (the function schemas) types XML parameter values; JSON calls carry their own.
    `cut_at`: the turn's token cap, when the reply stopped unfinished — there, or (`repeated`:
    the loop's period) in a loop of one piece, before or at the cap. Its error then says so:
    a reply cut mid-call is most often a loop or a file too long for one turn, and "unbalanced
    tags" alone does not tell the agent that (docs/lm-arc.md, RL from warm start 5)."""
    message, error = fmt.parse(text, call_prefix, tools)
    if error is not None and cut_at:
        why = (f"the reply was stopped unfinished: it repeated one {repeated}-token piece over "
               "and over" if repeated else
               f"the reply reached the {cut_at}-token cap of one turn before it ended")
        error = f"{why} (write each file once, shorter; do not repeat text): {error}"
    return message, error
