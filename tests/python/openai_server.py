"""An OpenAI-compatible model server for the tests, on 127.0.0.1 in a thread of the test
process: ``/v1/embeddings`` and ``/v1/chat/completions`` with the failures a real endpoint
has, each switchable, and a log of every request with the answer it got.

    server = ModelServer(latency=0.01, poison="POISON", storm=(0.0, 1.0, 0.25))
    with server:                      # starts, and stops on exit
        client = openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0)
        ...
    server.log                        # [Request(at, route, inputs, status), ...]

- ``poison``: an input containing it is the request's fault: 400, with OpenAI's error body.
- ``unavailable``: an input containing it gets 503 (no ``Retry-After``), every time.
- ``storm=(start, seconds, retry_after)``: from ``start`` seconds after the first request,
  for ``seconds``, every request gets 429 with ``Retry-After: <retry_after>`` and the
  ``x-ratelimit-*`` headers of an exhausted request limit.
- ``requests_per_second``: a token bucket (a second's worth of burst) admits that many
  requests a second, the others get 429; with ``tell_wait``, their ``Retry-After`` is the
  time until the next token, else no header (as many servers do).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web


@dataclass
class Request:
    at: float  # seconds after the server started
    route: str
    inputs: tuple[str, ...]
    status: int


@dataclass
class ModelServer:
    latency: float = 0.0
    poison: str | None = None
    unavailable: str | None = None
    storm: tuple[float, float, float] | None = None
    requests_per_second: float | None = None
    tell_wait: bool = False
    log: list[Request] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._started = time.monotonic()
        self._first: float | None = None
        self._tokens = self.requests_per_second or 0.0
        self._refilled = time.monotonic()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._stop: asyncio.Event | None = None

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the test model server did not start")
        return self

    def __exit__(self, *_: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def statuses(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for r in self.log:
            counts[r.status] = counts.get(r.status, 0) + 1
        return counts

    # -- the server

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def _failure(self, inputs: tuple[str, ...]) -> web.Response | None:
        now = time.monotonic()
        if self._first is None:
            self._first = now
        if self.storm is not None:
            start, seconds, retry_after = self.storm
            if start <= now - self._first < start + seconds:
                return web.json_response(
                    _error("Rate limit reached for requests", "requests", "rate_limit_exceeded"),
                    status=429,
                    headers={
                        "retry-after": f"{retry_after:g}",
                        "x-ratelimit-limit-requests": "1000",
                        "x-ratelimit-remaining-requests": "0",
                        "x-ratelimit-reset-requests": f"{retry_after:g}s",
                    },
                )
        if self.requests_per_second is not None:
            rate = self.requests_per_second
            self._tokens = min(rate, self._tokens + (now - self._refilled) * rate)
            self._refilled = now
            if self._tokens < 1:
                headers = {"retry-after": f"{(1 - self._tokens) / rate:.3f}"}
                return web.json_response(
                    _error("Rate limit reached for requests", "requests", "rate_limit_exceeded"),
                    status=429,
                    headers=headers if self.tell_wait else None,
                )
            self._tokens -= 1
        if self.poison is not None and any(self.poison in text for text in inputs):
            return web.json_response(
                _error("This input is not allowed", "invalid_request_error", None), status=400
            )
        if self.unavailable is not None and any(self.unavailable in t for t in inputs):
            return web.json_response(
                _error("The server is overloaded", "server_error", None), status=503
            )
        return None

    def _record(self, route: str, inputs: tuple[str, ...], status: int) -> None:
        self.log.append(Request(time.monotonic() - self._started, route, inputs, status))

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        given = body["input"]
        inputs = tuple([given] if isinstance(given, str) else given)
        failure = self._failure(inputs)
        if failure is None and self.latency:
            await asyncio.sleep(self.latency)
        self._record("embeddings", inputs, 200 if failure is None else failure.status)
        if failure is not None:
            return failure
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(t)), float(i)]}
            for i, t in enumerate(inputs)
        ]
        tokens = sum(len(t.split()) for t in inputs)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", "test-embedding"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        inputs = (prompt,)
        failure = self._failure(inputs)
        if failure is None and self.latency:
            await asyncio.sleep(self.latency)
        self._record("chat", inputs, 200 if failure is None else failure.status)
        if failure is not None:
            return failure
        words = prompt.split()
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.log)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "test-chat"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": " ".join(reversed(words))},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": len(words),
                    "completion_tokens": len(words),
                    "total_tokens": 2 * len(words),
                },
            }
        )


def _error(message: str, kind: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
