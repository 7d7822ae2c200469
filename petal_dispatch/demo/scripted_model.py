"""A loopback stand-in for the Anthropic Messages API that answers from a scenario.

The real `claude` CLI runs against it (ANTHROPIC_BASE_URL=http://127.0.0.1:PORT), so tests, benchmarks
and the demo exercise the real CLI's stream-json, MCP client, retries and exit codes with no account.

A scenario is a list of rules. For each request the first rule whose `role` matches the caller's role
(read from a `[petal-role: NAME]` marker in the system prompt; "*" matches any) and whose `match`
(if any) occurs in the conversation's first user text, and whose `match_last` (if any) occurs in
its latest user text, is chosen; its replies are indexed by the turn,
the number of tool results the conversation carries (the last reply repeats). A reply is one of:

    {"text": "..."}                                   a text answer
    {"text": "...", "delay_s": 0.05}                  slow text, one token at a time
    {"text": "...", "usage": {"output_tokens": 9000}} a reply the CLI prices as that many tokens
    {"tool_use": {"name": "...", "input": {...}}, "text": "optional preamble"}
    {"error": {"status": 429, "retry_after": 3, "headers": {...}, "message": "..."}}
    {"stall": {"seconds": 30, "text": "after the stall"}}  headers and message_start, then silence
    {"stall": {"seconds": null}}                      silence until the server stops

Run standalone: python -m petal_dispatch.demo.scripted_model --scenario FILE.json [--port 0]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "claude-scripted-1"
_ROLE = re.compile(r"\[petal-role: ([\w-]+)\]")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class Rule:
    replies: list[dict[str, Any]]
    role: str = "*"
    match: str | None = None
    # matched against the conversation's latest user text (a later turn of a resumed conversation)
    match_last: str | None = None
    # serve only the first N conversations (the CLI's session-id header) that reach this rule: e.g. a
    # worker that fails on its first run and succeeds when retried with the same brief
    sessions: int | None = None
    seen: set[str] = field(default_factory=set, repr=False, compare=False)


@dataclass
class Scenario:
    rules: list[Rule] = field(default_factory=list)
    default: dict[str, Any] = field(default_factory=lambda: {"text": "ok"})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def from_data(cls, data: dict[str, Any] | list[Any]) -> Scenario:
        """Accepts {"rules": [...], "default": {...}} or {"ROLE": [replies], ...} or a bare list of rules."""
        if isinstance(data, list):
            return cls(rules=[Rule(**r) for r in data])
        if "rules" in data:
            return cls(rules=[Rule(**r) for r in data["rules"]], default=data.get("default", {"text": "ok"}))
        return cls(rules=[Rule(replies=list(v), role=k) for k, v in data.items()])

    @classmethod
    def single(cls, *replies: dict[str, Any], role: str = "*") -> Scenario:
        return cls(rules=[Rule(replies=list(replies), role=role)])

    def choose(self, role: str | None, first_user_text: str, turn: int, last_user_text: str = "",
               session: str = "") -> dict[str, Any]:
        with self._lock:  # the server answers requests on threads; `sessions` counts must not race
            return self._choose(role, first_user_text, turn, last_user_text, session)

    def _choose(self, role: str | None, first_user_text: str, turn: int, last_user_text: str,
                session: str) -> dict[str, Any]:
        for rule in self.rules:
            if rule.role not in ("*", role):
                continue
            if rule.match is not None and rule.match not in first_user_text:
                continue
            if rule.match_last is not None and rule.match_last not in last_user_text:
                continue
            if rule.sessions is not None and session not in rule.seen:
                if len(rule.seen) >= rule.sessions:
                    continue
                rule.seen.add(session)
            if not rule.replies:
                break
            return rule.replies[min(turn, len(rule.replies) - 1)]
        return self.default


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    role: str | None
    turn: int

    @property
    def user_blocks(self) -> list[dict[str, Any]]:
        """The content blocks of the request's user messages, in order (a string content as one text block):
        what reached the model — images, documents, text, tool results."""
        blocks: list[dict[str, Any]] = []
        for message in self.body.get("messages", []):
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if isinstance(content, str):
                blocks.append({"type": "text", "text": content})
            elif isinstance(content, list):
                blocks.extend(b for b in content if isinstance(b, dict))
        return blocks


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the latest user message (empty when it carries only tool results)."""
    users = [m for m in body.get("messages", []) if m.get("role") == "user"]
    return _text_of(users[-1].get("content")) if users else ""


def analyse(body: dict[str, Any]) -> tuple[str | None, str, int]:
    """(role, first user text, turn) of a Messages request."""
    system = body.get("system", "")
    system_text = system if isinstance(system, str) else _text_of(system)
    m = _ROLE.search(system_text)
    messages = body.get("messages", [])
    first_user = next((_text_of(msg.get("content")) for msg in messages if msg.get("role") == "user"), "")
    turn = sum(
        1
        for msg in messages
        if msg.get("role") == "user" and isinstance(msg.get("content"), list)
        for block in msg["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    )
    return (m.group(1) if m else None), first_user, turn


def _blocks(reply: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.get("text"):
        blocks.append({"type": "text", "text": reply["text"]})
    if "tool_use" in reply:
        tu = reply["tool_use"]
        blocks.append(
            {"type": "tool_use", "id": tu.get("id") or f"toolu_{uuid.uuid4().hex[:20]}", "name": tu["name"],
             "input": tu.get("input", {})}
        )
    return blocks or [{"type": "text", "text": ""}]


def _message(blocks: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
    """An assistant message; `usage` (a reply's own, else a token's worth) is what the CLI prices it by."""
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5, **(usage or {})},
    }


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._json(200, {})

    def do_HEAD(self) -> None:  # noqa: N802
        self._json(200, {})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?", 1)[0]
        if path.endswith("/count_tokens"):
            self._json(200, {"input_tokens": 100})
            return
        if not path.endswith("/v1/messages"):
            self._json(200, {})
            return
        role, first_user, turn = analyse(body)
        self.server.record(Request(path, {k.lower(): v for k, v in self.headers.items()}, body, role, turn))
        reply = self.server.scenario.choose(role, first_user, turn, last_user_text(body),
                                            self.headers.get("x-claude-code-session-id", ""))
        if "error" in reply:
            self._error(reply["error"])
        elif body.get("stream"):
            self._stream(reply)
        else:
            self._nonstream(reply)

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("request-id", f"req_{uuid.uuid4().hex[:20]}")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, spec: dict[str, Any]) -> None:
        status = int(spec.get("status", 500))
        headers = {str(k): str(v) for k, v in spec.get("headers", {}).items()}
        if spec.get("retry_after") is not None:
            headers["retry-after"] = str(spec["retry_after"])
        etype = spec.get("type") or _ERROR_TYPES.get(status, "api_error")
        self._json(status, {"type": "error", "error": {"type": etype, "message": spec.get("message", etype)}}, headers)

    def _nonstream(self, reply: dict[str, Any]) -> None:
        stall = reply.get("stall")
        if stall is not None:
            self.server.wait(stall.get("seconds"))
            reply = {"text": stall.get("text", "")}
        self._json(200, _message(_blocks(reply), reply.get("usage")))

    def _event(self, name: str, data: dict[str, Any]) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _stream(self, reply: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.send_header("request-id", f"req_{uuid.uuid4().hex[:20]}")
        self.end_headers()
        self.close_connection = True
        stall = reply.get("stall")
        blocks = _blocks({"text": stall.get("text", "")} if stall is not None else reply)
        message = _message(blocks, reply.get("usage"))
        try:
            self._event("message_start", {"type": "message_start", "message": {**message, "content": [],
                                                                               "stop_reason": None}})
            if stall is not None:
                self.server.wait(stall.get("seconds"))
            delay = float(reply.get("delay_s", 0))
            for index, block in enumerate(blocks):
                self._stream_block(index, block, delay)
            self._event("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                          "usage": {"output_tokens": message["usage"]["output_tokens"]}})
            self._event("message_stop", {"type": "message_stop"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the CLI gave up on this stream (idle timeout, SIGTERM): nothing to finish

    def _stream_block(self, index: int, block: dict[str, Any], delay: float) -> None:
        if block["type"] == "text":
            self._event("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": {"type": "text", "text": ""}})
            pieces = re.findall(r"\S+\s*|\s+", block["text"]) if delay else [block["text"]]
            for piece in pieces:
                if delay:
                    time.sleep(delay)
                self._event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "text_delta", "text": piece}})
        else:
            self._event("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": {**block, "input": {}}})
            self._event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "input_json_delta",
                                                          "partial_json": json.dumps(block["input"])}})
        self._event("content_block_stop", {"type": "content_block_stop", "index": index})


class ScriptedModelServer(ThreadingHTTPServer):
    """Serve a scenario on 127.0.0.1 in a background thread. Use as a context manager."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, scenario: Scenario, port: int = 0, host: str = "127.0.0.1"):
        super().__init__((host, port), _Handler)
        self.scenario = scenario
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def wait(self, seconds: float | None) -> None:
        self._stopping.wait(seconds)

    def start(self) -> ScriptedModelServer:
        self._thread = threading.Thread(target=self.serve_forever, name="scripted-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.shutdown()
        self.server_close()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = ScriptedModelServer(Scenario.from_data(json.loads(args.scenario.read_text())), args.port)
    print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
