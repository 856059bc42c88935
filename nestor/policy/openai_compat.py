"""An eval-only policy for any OpenAI-compatible chat-completions endpoint with tool calling.

Benchmarks API models (or a local `nestor serve`) as job writers without training them.
Transient failures (connection errors, HTTP 429 and 5xx) are retried with exponential backoff,
honouring Retry-After; anything else becomes a `PolicyError` with a message a user can act on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from nestor.policy.base import Message, Observation, ToolCall, TrainItem, Turn
from nestor.policy.chat import content_text


class PolicyError(RuntimeError):
    """The endpoint cannot serve this policy (no key, unreachable, refused)."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0
    retries: int = 0
    malformed_tool_calls: int = 0


def to_openai_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        row: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            row["tool_calls"] = [
                {"id": c.id or f"call_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(m.tool_calls)]
        if m.role == "tool":
            row["tool_call_id"] = m.tool_call_id or ""
        out.append(row)
    return out


def parse_openai_message(msg: Any) -> tuple[Message, str | None]:
    """An API reply as our Message; malformed tool calls become a parse error. The reply is
    the endpoint's to write: content given as a list of parts is joined, and any field of
    the wrong type is the policy's error, never the harness's."""
    if not isinstance(msg, dict):
        raise PolicyError(f"the reply's message is a {type(msg).__name__}, not an object")
    calls: list[ToolCall] = []
    errors: list[str] = []
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raw_calls, errors = [], ["tool_calls is not a list"]
    for i, raw in enumerate(raw_calls):
        fn = raw.get("function") if isinstance(raw, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            errors.append(f"tool call {i + 1} has no function name")
            continue
        args = fn.get("arguments", "{}")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
            if not isinstance(parsed, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            errors.append(f"tool call {name!r}: arguments are not a JSON object ({exc})")
            continue
        call_id = raw.get("id")
        calls.append(ToolCall(name=name, arguments=parsed,
                              id=call_id if isinstance(call_id, str) else ""))
    content = content_text(msg.get("content"))
    message = Message(role="assistant", content=content if isinstance(content, str) else "",
                      tool_calls=calls)
    return message, "; ".join(errors) or None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass
class OpenAICompatPolicy:
    model: str
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.7
    max_tokens: int = 2048
    timeout_s: float = 120.0
    max_retries: int = 5
    backoff_s: float = 1.0
    name: str = "openai"
    version: int = 0
    usage: Usage = field(default_factory=Usage)

    def __post_init__(self) -> None:
        key = os.environ.get(self.api_key_env)
        local = httpx.URL(self.base_url).host in {"127.0.0.1", "localhost", "::1"}
        if not key and not local:
            raise PolicyError(f"set ${self.api_key_env} to an API key for {self.base_url} "
                              f"(or pass --api-key-env NAME)")
        headers = {"Authorization": f"Bearer {key or 'EMPTY'}"}
        self._client = httpx.Client(base_url=self.base_url.rstrip("/"), headers=headers,
                                    timeout=self.timeout_s)

    def act(self, obs: Observation) -> Turn:
        body = {"model": self.model, "messages": to_openai_messages(obs.messages),
                "temperature": self.temperature, "max_tokens": self.max_tokens}
        if obs.tools:
            body["tools"] = [t if "type" in t else {"type": "function", "function": t}
                             for t in obs.tools]
        reply = self._post("/chat/completions", body)
        usage = reply.get("usage") or {}
        usage = usage if isinstance(usage, dict) else {}
        self.usage.prompt_tokens += _count(usage.get("prompt_tokens"))
        self.usage.completion_tokens += _count(usage.get("completion_tokens"))
        try:
            raw = reply["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.base_url}: reply has no choices[0].message") from None
        message, error = parse_openai_message(raw)
        if error:
            self.usage.malformed_tool_calls += 1
        return Turn(message=message, parse_error=error)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        delay = self.backoff_s
        for attempt in range(self.max_retries + 1):
            self.usage.requests += 1
            try:
                resp = self._client.post(path, json=body)
            except httpx.TransportError as exc:
                problem, wait = f"cannot reach {self.base_url}: {exc}", delay
            else:
                if resp.status_code == 200:
                    try:
                        return resp.json()
                    except ValueError:
                        raise PolicyError(f"{self.base_url}: reply is not JSON") from None
                if resp.status_code != 429 and resp.status_code < 500:
                    raise PolicyError(f"{self.base_url}{path}: HTTP {resp.status_code}: "
                                      f"{resp.text[:300]}")
                problem = f"HTTP {resp.status_code} from {self.base_url}"
                wait = _retry_after(resp) or delay
            if attempt == self.max_retries:
                raise PolicyError(f"{problem} (gave up after {attempt + 1} tries)")
            self.usage.retries += 1
            time.sleep(wait)
            delay = min(delay * 2, 30.0)
        raise AssertionError("unreachable")

    def train_step(self, batch: list[TrainItem]) -> dict[str, float]:
        raise PolicyError("the openai policy is eval-only: use it with `nestor bench agents`")

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "openai_policy.json").write_text(json.dumps(
            {"model": self.model, "base_url": self.base_url, "version": self.version}))

    def load(self, path: Path) -> None:
        self.version = json.loads((path / "openai_policy.json").read_text())["version"]


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return min(float(resp.headers.get("retry-after", "")), 60.0)
    except ValueError:
        return None
