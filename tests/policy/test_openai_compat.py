"""The OpenAI-compatible policy against a real `nestor serve` and a misbehaving endpoint."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from nestor.policy.base import Message, Observation
from nestor.policy.openai_compat import OpenAICompatPolicy, PolicyError, parse_openai_message
from nestor.serve import openai_reply
from tests.conftest import free_port

TOOLS = [{"type": "function", "function": {"name": "list_files", "description": "List files.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_policy_talks_to_nestor_serve(served_tiny_s):
    server = served_tiny_s
    policy = OpenAICompatPolicy(model="tiny-s", base_url=server, temperature=0, max_tokens=24)
    obs = Observation(messages=[Message("system", "You write jobs."),
                                Message("user", "reverse abc")], tools=TOOLS)
    first = policy.act(obs)
    again = policy.act(obs)
    assert first.message.role == "assistant"
    assert first.message.content == again.message.content  # temperature 0 is greedy
    assert policy.usage.prompt_tokens > 20 and 0 < policy.usage.completion_tokens <= 48
    with pytest.raises(PolicyError, match="eval-only"):
        policy.train_step([])


def test_server_rejects_prompt_over_context(served_tiny_s):
    server = served_tiny_s
    resp = httpx.post(f"{server}/chat/completions", json={
        "messages": [{"role": "user", "content": "x" * 20_000}]}, timeout=30)
    assert resp.status_code == 400 and "context" in resp.text


def test_server_turns_tool_call_text_into_tool_calls():
    reply, finish = openai_reply('ok <tool_call>{"name": "read_file", "arguments": '
                                 '{"path": "a.txt"}}</tool_call>', ended=True)
    assert finish == "tool_calls" and reply["content"] == "ok"
    call = reply["tool_calls"][0]["function"]
    assert call["name"] == "read_file" and json.loads(call["arguments"]) == {"path": "a.txt"}
    message, error = parse_openai_message(reply)
    assert error is None and message.tool_calls[0].arguments == {"path": "a.txt"}


def test_malformed_tool_call_arguments_become_a_parse_error():
    raw = {"content": "", "tool_calls": [{"id": "1", "function": {"name": "write_file",
                                                                   "arguments": "{not json"}}]}
    message, error = parse_openai_message(raw)
    assert not message.tool_calls and "write_file" in error


def test_replies_of_odd_but_legal_or_wrong_shapes_are_the_policys_problem():
    """The endpoint writes the reply: content as a list of parts is joined; a call id or name
    of the wrong type, or a call that is not an object, is a parse error or a PolicyError,
    never an exception the harness records as its own (it did, and lost the turn)."""
    parts = {"content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"text": "b"}],
             "tool_calls": [{"id": {"x": 1}, "function": {"name": "submit", "arguments": {}}}]}
    message, error = parse_openai_message(parts)
    assert message.content == "ab" and error is None
    assert message.tool_calls[0].name == "submit" and message.tool_calls[0].id == ""
    message, error = parse_openai_message({"content": 7, "tool_calls": ["read_file",
                                                                        {"function": {"name": 3}}]})
    assert message.content == "" and not message.tool_calls and "tool call 1" in error
    assert "tool call 2" in error
    assert parse_openai_message({"tool_calls": "read_file"})[1] == "tool_calls is not a list"
    with pytest.raises(PolicyError):
        parse_openai_message(["not", "an", "object"])


class _Flaky(BaseHTTPRequestHandler):
    calls = 0

    def do_POST(self):  # noqa: N802 (http.server's naming)
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls <= 2:
            self.send_response(429)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hi"}}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_retries_429_then_succeeds():
    httpd = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        policy = OpenAICompatPolicy(model="m", base_url=f"http://127.0.0.1:{httpd.server_port}/v1",
                                    backoff_s=0.01)
        turn = policy.act(Observation(messages=[Message("user", "hello")], tools=[]))
        assert turn.message.content == "hi" and policy.usage.retries == 2
    finally:
        httpd.shutdown()


def test_unreachable_endpoint_and_missing_key(monkeypatch):
    port = free_port()  # nothing listens here
    policy = OpenAICompatPolicy(model="m", base_url=f"http://127.0.0.1:{port}/v1",
                                max_retries=2, backoff_s=0.01)
    with pytest.raises(PolicyError, match="cannot reach"):
        policy.act(Observation(messages=[Message("user", "hi")], tools=[]))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(PolicyError, match=r"\$OPENAI_API_KEY"):
        OpenAICompatPolicy(model="gpt", base_url="https://api.example.invalid/v1")


@pytest.fixture(scope="module")
def served_in_process():
    """`nestor serve`'s app for tiny-m, in this process (TestClient), and its request log."""
    from fastapi.testclient import TestClient

    from nestor.serve import create_app

    log: list[str] = []
    client = TestClient(create_app("tiny-m", max_tokens=8, log=log.append),
                        raise_server_exceptions=False)
    return client, log


_CALLS = {"role": "assistant", "content": ""}
_HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("body", "status", "said"), [
    ({"messages": [{**_CALLS, "tool_calls": ["x"]}]}, 400, "tool call 0"),
    ({"messages": [{**_CALLS, "tool_calls": [{"function": "x"}]}]}, 400, "tool call 0"),
    ({"messages": [{**_CALLS, "tool_calls": [{"function": {
        "name": "a", "arguments": "[" * 100_000 + "]" * 100_000}}]}]}, 400, "nested too deeply"),
    ({"messages": [{**_CALLS, "tool_calls": [{"function": {"name": "a", "arguments": "[1]"}}]}]},
     400, "JSON object"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ({"messages": _HI, "seed": 2**80}, 422, "seed"),
    ('{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 422, "temperature"),
    # refused by its length in characters, before it is tokenized (4.3 s before; now ~0.02 s)
    ({"messages": [{"role": "user", "content": "a" * 2_000_000}]}, 400, "characters"),
], ids=["call-str", "function-str", "deep-args", "args-list", "role", "content-int", "seed-huge",
        "nan-temperature", "2MB-message"])
def test_serve_answers_a_malformed_request_with_a_4xx_it_logs(served_in_process, body, status,
                                                             said):
    client, log = served_in_process
    raw = body if isinstance(body, str) else json.dumps(body)
    resp = client.post("/v1/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
    assert resp.status_code == status and said in resp.text
    assert f"HTTP {status}" in log[-1] and said in log[-1]


def test_serve_replaces_a_lone_surrogate_and_still_answers(served_in_process):
    client, _ = served_in_process
    resp = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", '
                       b'"content": "x\\ud800"}], "seed": 1}',
                       headers={"content-type": "application/json"})
    assert resp.status_code == 200 and resp.json()["usage"]["prompt_tokens"] > 0
