"""A loopback chat-completions server with scripted replies, for testing the LLM proposer
against the real ``openai`` client.

    with ChatServer(["```diff\\n...```", Fail(500)]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ...
        server.requests[0].body["model"]
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["ChatServer", "Reply", "Fail", "Request"]

PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass(frozen=True)
class Reply:
    """One scripted answer; ``usage=False`` leaves the usage object out of the response."""

    content: str
    prompt_tokens: int = 100
    completion_tokens: int = 23
    usage: bool = True
    delay_s: float = 0.0


@dataclass(frozen=True)
class Fail:
    """Answer this request with an HTTP error in the OpenAI error shape."""

    status: int = 500
    message: str = "scripted failure"


@dataclass(frozen=True)
class Request:
    path: str
    body: dict | None  # the parsed JSON body (None if it was not JSON)
    authorization: str | None  # the Authorization header as received
    headers: dict[str, str]


class ChatServer:
    """Serves ``script`` (one item per request: str, Reply or Fail) on 127.0.0.1; records requests."""

    def __init__(self, script: list[str | Reply | Fail] | None = None, model: str = "scripted-model") -> None:
        self.script = [Reply(s) if isinstance(s, str) else s for s in (script or [])]
        self.model = model
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="chat-server", daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ChatServer:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _next(self, request: Request) -> Reply | Fail:
        with self._lock:
            index = len(self.requests)
            self.requests.append(request)
            if index < len(self.script):
                return self.script[index]
        return Fail(500, f"no scripted reply for request {index + 1}")

    def _completion(self, reply: Reply, index: int) -> dict:
        out = {
            "id": f"chatcmpl-test-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}
            ],
        }
        if reply.usage:
            out["usage"] = {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            }
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args) -> None:  # quiet under pytest
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.split("?", 1)[0] not in PATHS:
                    self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                request = Request(self.path, body, self.headers.get("Authorization"), dict(self.headers.items()))
                answer = server._next(request)
                if isinstance(answer, Fail):
                    self._send(
                        answer.status,
                        {"error": {"message": answer.message, "type": "scripted", "code": str(answer.status)}},
                    )
                    return
                if answer.delay_s:
                    time.sleep(answer.delay_s)
                try:
                    self._send(200, server._completion(answer, len(server.requests)))
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        return Handler
