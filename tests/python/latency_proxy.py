"""An HTTP/1.1 proxy that makes a local S3 server (moto) behave like a remote one: latency,
bandwidth per connection, and faults on demand. Used by tests (fault injection) and by
``benches/python/remote.py`` (engines compared at 30-100 ms of latency).

    with LatencyProxy(upstream_endpoint, latency=0.03, bandwidth=200e6) as proxy:
        ... use proxy.endpoint instead of the upstream's ...
        proxy.stats()          # requests by method, bytes, peak requests in flight
        proxy.fail_next(3)     # the next 3 requests are answered 503 SlowDown
        proxy.reset_next()     # the next response is cut mid-body (connection reset)
        proxy.stall_next()     # the next response stops mid-body and never finishes

Latency is propagation delay: every byte is held ``latency / 2`` in each direction, so a
request waits one ``latency`` for its first response byte, and requests on different
connections overlap as they would on a real link. Bandwidth is a limit per connection and
direction (a token bucket of one chunk). The proxy reads the HTTP framing (request lines,
Content-Length, chunked bodies) to count requests and to cut or stall a response at a known
point; it does not change a byte it forwards unless told to inject a fault.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Self
from urllib.parse import urlparse

CHUNK = 64 << 10

SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n"
    b"Connection: keep-alive\r\n\r\n%s"
)
SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Stats:
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes_down: int = 0
    bytes_up: int = 0
    connections: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    injected: collections.Counter[str] = field(default_factory=collections.Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "requests": dict(self.requests),
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "connections": self.connections,
            "peak_in_flight": self.peak_in_flight,
            "injected": dict(self.injected),
        }


class _Link:
    """One direction of one connection: holds each chunk ``delay`` seconds and sends at most
    ``bandwidth`` bytes per second, preserving order."""

    def __init__(self, writer: asyncio.StreamWriter, delay: float, bandwidth: float | None):
        self.writer = writer
        self.delay = delay
        self.bandwidth = bandwidth
        self.queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        self.free_at = 0.0
        self.task = asyncio.ensure_future(self._run())

    def send(self, data: bytes | None) -> None:
        """Queue ``data`` (None: close the connection once what is queued is sent)."""
        self.queue.put_nowait((time.monotonic() + self.delay, data))

    async def _run(self) -> None:
        try:
            while True:
                due, data = await self.queue.get()
                if data is None:
                    break
                start = max(due, self.free_at)
                if self.bandwidth:
                    self.free_at = start + len(data) / self.bandwidth
                wait = start - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                self.writer.write(data)
                await self.writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                self.writer.close()


class _Framer:
    """Splits a byte stream into HTTP/1.1 messages: yields ``(event, data)`` where event is
    ``"head"`` (a start line and headers, complete) or ``"body"`` (body bytes, possibly a
    part) or ``"end"`` (the message is complete)."""

    def __init__(self, is_response: bool, methods: collections.deque[str] | None = None):
        self.is_response = is_response
        self.methods = methods  # requests' methods in order, to know HEAD responses
        self.buffer = b""
        self.remaining: int | None = None  # body bytes left; None: in a head
        self.chunked = False
        self.chunk_left = 0
        self.chunk_state = "size"

    def feed(self, data: bytes) -> list[tuple[str, bytes]]:
        self.buffer += data
        events: list[tuple[str, bytes]] = []
        while self.buffer:
            if self.remaining is None and not self.chunked:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    break
                head, self.buffer = self.buffer[: end + 4], self.buffer[end + 4 :]
                events.append(("head", head))
                length, chunked = self._body_of(head)
                if chunked:
                    self.chunked, self.chunk_state = True, "size"
                elif length:
                    self.remaining = length
                else:
                    events.append(("end", b""))
            elif self.chunked:
                if not self._feed_chunked(events):
                    break
            else:
                assert self.remaining is not None
                part, self.buffer = self.buffer[: self.remaining], self.buffer[self.remaining :]
                self.remaining -= len(part)
                events.append(("body", part))
                if self.remaining == 0:
                    self.remaining = None
                    events.append(("end", b""))
        return events

    def _feed_chunked(self, events: list[tuple[str, bytes]]) -> bool:
        if self.chunk_state == "size":
            end = self.buffer.find(b"\r\n")
            if end < 0:
                return False
            line, self.buffer = self.buffer[: end + 2], self.buffer[end + 2 :]
            size = int(line.split(b";")[0].strip() or b"0", 16)
            events.append(("body", line))
            if size == 0:
                self.chunk_state = "trailer"
            else:
                self.chunk_left, self.chunk_state = size + 2, "data"
            return True
        if self.chunk_state == "data":
            part, self.buffer = self.buffer[: self.chunk_left], self.buffer[self.chunk_left :]
            self.chunk_left -= len(part)
            events.append(("body", part))
            if self.chunk_left == 0:
                self.chunk_state = "size"
            return True
        end = self.buffer.find(b"\r\n")  # trailer lines, then an empty line
        if end < 0:
            return False
        line, self.buffer = self.buffer[: end + 2], self.buffer[end + 2 :]
        events.append(("body", line))
        if line == b"\r\n":
            self.chunked = False
            events.append(("end", b""))
        return True

    def _body_of(self, head: bytes) -> tuple[int, bool]:
        lines = head.split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            if b":" in line:
                name, value = line.split(b":", 1)
                headers[name.strip().lower()] = value.strip()
        if self.is_response:
            method = self.methods.popleft() if self.methods else "GET"
            status = int(lines[0].split()[1])
            if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                return 0, False
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            return 0, True
        return int(headers.get(b"content-length", b"0")), False


class LatencyProxy:
    """See the module's docstring. ``upstream``: the server's endpoint (``http://host:port``)."""

    def __init__(self, upstream: str, latency: float = 0.0, bandwidth: float | None = None):
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.latency = latency
        self.bandwidth = bandwidth
        self._stats = Stats()
        self._lock = threading.Lock()
        self._faults: collections.deque[str] = collections.deque()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self.endpoint = ""

    def __enter__(self) -> Self:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        self.endpoint = started.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # -- what the tests and benchmarks call ---------------------------------------------

    def stats(self) -> dict[str, object]:
        with self._lock:
            return self._stats.as_dict()

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = Stats()

    def fail_next(self, count: int = 1) -> None:
        """Answer the next ``count`` requests 503 SlowDown (S3's throttling) without
        forwarding them."""
        with self._lock:
            self._faults.extend(["503"] * count)

    def reset_next(self) -> None:
        """Forward the next request, then cut its response after half of the body (or of
        the head) and reset the connection."""
        with self._lock:
            self._faults.append("reset")

    def clear_faults(self) -> None:
        """Drop the faults not injected yet."""
        with self._lock:
            self._faults.clear()

    def stall_next(self) -> None:
        """Forward the next request, send half of its response's body, then send nothing
        more on that connection (it stays open)."""
        with self._lock:
            self._faults.append("stall")

    # -- the proxy ------------------------------------------------------------------------

    async def _start(self) -> str:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def _next_fault(self) -> str | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
        with self._lock:
            self._stats.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        half = self.latency / 2
        to_server = _Link(server_w, half, self.bandwidth)
        to_client = _Link(client_w, half, self.bandwidth)
        methods: collections.deque[str] = collections.deque()
        # Per request, in order: None (forward), or the fault for its response.
        plans: collections.deque[str | None] = collections.deque()
        requests = _Framer(is_response=False)
        responses = _Framer(is_response=True, methods=methods)
        # A 503 goes back at once, ahead of responses still outstanding on the connection:
        # right for HTTP/1.1 clients that send one request at a time per connection, as
        # object_store's, pyarrow's and polars' do.
        request_body_dropped = False
        upstream_task = asyncio.ensure_future(
            self._pump_responses(server_r, to_client, responses, plans)
        )
        try:
            while data := await client_r.read(CHUNK):
                for event, part in requests.feed(data):
                    if event == "head":
                        method = part.split(b" ", 1)[0].decode("ascii", "replace")
                        fault = self._next_fault()
                        with self._lock:
                            self._stats.requests[method] += 1
                            self._stats.bytes_up += len(part)
                            self._stats.in_flight += 1
                            self._stats.peak_in_flight = max(
                                self._stats.peak_in_flight, self._stats.in_flight
                            )
                            if fault:
                                self._stats.injected[fault] += 1
                        if fault == "503":
                            request_body_dropped = True
                            to_client.send(SLOW_DOWN % (len(SLOW_DOWN_BODY), SLOW_DOWN_BODY))
                            with self._lock:
                                self._stats.in_flight -= 1
                            continue
                        request_body_dropped = False
                        methods.append(method)
                        plans.append(fault)
                        to_server.send(part)
                    elif event == "body":
                        with self._lock:
                            self._stats.bytes_up += len(part)
                        if not request_body_dropped:
                            to_server.send(part)
        except (ConnectionError, OSError):
            pass
        finally:
            # The client is gone: nothing more to send it (a stalled response ends here).
            to_server.send(None)
            upstream_task.cancel()
            with contextlib.suppress(BaseException):
                await upstream_task

    async def _pump_responses(
        self,
        server_r: asyncio.StreamReader,
        to_client: _Link,
        framer: _Framer,
        plans: collections.deque[str | None],
    ) -> None:
        plan: str | None = None
        sent_of_body = 0
        body_length = 0
        try:
            while data := await server_r.read(CHUNK):
                for event, part in framer.feed(data):
                    if event == "head":
                        plan = plans.popleft() if plans else None
                        sent_of_body = 0
                        body_length = framer.remaining or 0
                        if plan == "reset" and not body_length:
                            to_client.send(part[: len(part) // 2])
                            to_client.send(None)
                            return
                        to_client.send(part)
                    elif event == "body":
                        if plan in ("reset", "stall") and sent_of_body + len(part) >= max(
                            body_length // 2, 1
                        ):
                            keep = max(body_length // 2 - sent_of_body, 0)
                            to_client.send(part[:keep])
                            if plan == "reset":
                                to_client.send(None)
                                return
                            await asyncio.Event().wait()  # stall: never send more
                        sent_of_body += len(part)
                        to_client.send(part)
                    else:  # end of a response
                        with self._lock:
                            self._stats.in_flight -= 1
                    if event != "end":
                        with self._lock:
                            self._stats.bytes_down += len(part)
        except (ConnectionError, OSError):
            pass
        finally:
            to_client.send(None)
