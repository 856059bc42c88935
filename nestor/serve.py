"""`nestor serve`: an OpenAI-compatible chat-completions server for a local model or checkpoint.

It renders the conversation and tools with the model's own chat template, samples with nestor's
KV-cache sampler, and returns Qwen3-style `<tool_call>` blocks as OpenAI `tool_calls`. Useful
to benchmark trained checkpoints with other tools (`vf-eval`, any OpenAI client) and to test
`nestor.policy.openai_compat` against a real server.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field

from nestor.models.registry import load_model
from nestor.models.sampler import sample
from nestor.policy.base import Message, ToolCall
from nestor.policy.chat import content_text, parse_assistant, to_hf_messages
from nestor.text import inert, no_surrogates

ROLES = ("system", "user", "assistant", "tool")


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send more than we use

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    max_tokens: int | None = Field(None, ge=1, le=32768)
    seed: int | None = Field(None, ge=0, lt=2**63)  # torch's generator takes a 64-bit seed


def _message(d: dict[str, Any], n: int) -> Message:
    """Message `n` of a request; ValueError (an HTTP 400) saying what is wrong with it."""
    role, content = d.get("role"), content_text(d.get("content") or "")
    if role not in ROLES:
        raise ValueError(f"message {n}: role {inert(role)!r:.60} is not {', '.join(ROLES)}")
    if not isinstance(content, str):
        raise ValueError(f"message {n}: content must be a string, a list of text parts or null")
    if not isinstance(d.get("tool_call_id"), str | None):
        raise ValueError(f"message {n}: tool_call_id must be a string")
    if not isinstance(d.get("tool_calls") or [], list):
        raise ValueError(f"message {n}: tool_calls must be a list")
    calls = []
    for i, c in enumerate(d.get("tool_calls") or []):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not isinstance(c.get("id", ""), str):
            raise ValueError(f"message {n}, tool call {i}: needs an id (a string) and a "
                             'function {"name": "...", "arguments": {...}}')
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            args = no_surrogates(json.loads(args))  # a JSONDecodeError is a ValueError
        if not isinstance(args, dict):
            raise ValueError(f"message {n}, tool call {i}: arguments must be a JSON object")
        calls.append(ToolCall(name=fn["name"], id=c.get("id", ""), arguments=args))
    return Message(role=role, content=content, tool_calls=calls,
                   tool_call_id=d.get("tool_call_id"))


def openai_reply(text: str, *, ended: bool) -> tuple[dict[str, Any], str]:
    """A sampled reply as an OpenAI assistant message, and its finish reason."""
    message, _ = parse_assistant(text, call_prefix=f"call_{uuid.uuid4().hex[:8]}")
    reply: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    if message.tool_calls:
        reply["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.name, "arguments": json.dumps(c.arguments)}} for c in message.tool_calls]
    return reply, "tool_calls" if message.tool_calls else ("stop" if ended else "length")


def create_app(model_name: str, *, max_tokens: int = 256, device: str = "cpu",
               log: Callable[[str], None] | None = None) -> FastAPI:
    """The app; `log` (e.g. the CLI's console) gets one line per request: what was asked, what
    was answered or the error returned, and how long it took."""
    model, tokenizer = load_model(model_name, device=device)
    model.eval()
    lock = threading.Lock()  # one forward at a time: the model is not shared across threads
    app = FastAPI(title="nestor serve", version="1")
    context = getattr(model.config, "max_position_embeddings", 4096)
    # A prompt longer than this cannot fit, refused before tokenizing it (a 2 MB message took
    # 4 s to tokenize): no token stands for more characters than the longest string in the
    # vocabulary (special tokens included; a byte-level BPE string has one character a byte,
    # at least as many as the text it decodes to), and ×4 leaves room for a normalizer that
    # merges characters (NFC composes up to 3 code points, e.g. Hangul jamo, into one).
    longest = max((len(t) for t in tokenizer.get_vocab()), default=0) or 32
    max_chars = context * longest * 4

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        # what was wrong and where, without the input: FastAPI's own handler echoes it, and a
        # NaN or a lone surrogate there cannot be encoded (an HTTP 500 instead of this 422)
        errors = [{"type": e.get("type", ""), "loc": [inert(x) if isinstance(x, str) else x
                                                      for x in e.get("loc", [])],
                   "msg": inert(e.get("msg", "invalid request"))} for e in exc.errors()]
        if log is not None:  # e.g. a body sent without `Content-Type: application/json`
            first = errors[0] if errors else {}
            log(f"{request.method} {request.url.path} -> HTTP 422: "
                f"{first.get('msg', 'invalid request')} at {first.get('loc', [])}")
        return JSONResponse({"detail": errors}, status_code=422)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "owned_by": "nestor"}]}

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> dict[str, Any]:
        t0 = time.monotonic()
        asked = f"chat: {len(req.messages)} message(s), {len(req.tools or [])} tool(s)"
        try:
            reply = answer(req)
        except HTTPException as exc:
            if log is not None:
                log(f"{asked} -> HTTP {exc.status_code}: {exc.detail}")
            raise
        if log is not None:
            usage = reply["usage"]
            log(f"{asked}, prompt {usage['prompt_tokens']} tokens -> "
                f"{usage['completion_tokens']} tokens "
                f"({reply['choices'][0]['finish_reason']}) in {time.monotonic() - t0:.1f} s")
        return reply

    def answer(req: ChatRequest) -> dict[str, Any]:
        try:
            # a lone "\ud800" (JSON can carry one) would stop the tokenizer: U+FFFD instead
            messages = [_message(m, n) for n, m in enumerate(no_surrogates(req.messages))]
            text = tokenizer.apply_chat_template(
                to_hf_messages(messages), tools=no_surrogates(req.tools) or None,
                add_generation_prompt=True, tokenize=False)
        except RecursionError:
            raise HTTPException(400, "malformed messages: a value (e.g. tool arguments) is "
                                     "nested too deeply") from None
        except (KeyError, TypeError, ValueError, AttributeError, TemplateError) as exc:
            raise HTTPException(400, f"malformed messages: {inert(exc)}"[:500]) from None
        if len(text) > max_chars:
            raise HTTPException(400, f"prompt of {len(text)} characters cannot fit the "
                                     f"model's context of {context} tokens: send a shorter "
                                     "conversation")
        prompt = tokenizer(text, add_special_tokens=False).input_ids
        budget = min(req.max_tokens or max_tokens, max_tokens)
        if len(prompt) + budget > context:
            raise HTTPException(400, f"prompt of {len(prompt)} tokens + max_tokens {budget} "
                                     f"exceeds the model's context of {context}: send a "
                                     f"shorter conversation (a nestor agent: --prompt-style "
                                     f"compact) or serve a model with a longer context")
        generator = torch.Generator().manual_seed(req.seed) if req.seed is not None else None
        with lock, torch.no_grad():
            out = sample(model, [prompt], budget, eos_id=tokenizer.eos_token_id,
                         pad_id=tokenizer.pad_token_id, temperature=max(req.temperature, 1e-3),
                         greedy=req.temperature == 0, generator=generator, tokenizer=tokenizer)
        n_new = int(out.completion_mask[0].sum())
        ended = bool((out.completion_ids[0] == tokenizer.eos_token_id).any())
        reply, finish = openai_reply(out.texts[0], ended=ended)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                "created": int(time.time()), "model": model_name,
                "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": n_new,
                          "total_tokens": len(prompt) + n_new}}

    return app
