"""How many of a worker's calls go to the server at once, and how often, learnt from its
answers: the async map's congestion control, so that retries never multiply the load on a
server that is rate-limiting (see :mod:`forebay._async_udf`).

    lanes ─► wait while paused ─► wait for a place in the window ─► attempt ─► answer
                 ▲                        ▲                                      │
                 │                        └─ success:   window + 1/window ◄──────┤
                 │                           throttled: window - 49/window ◄─────┤
                 └── the server's Retry-After; at a window of one call, a gap ◄──┘
                     between starts (doubled by a throttle, 2 % less a success)

The window starts at ``max_concurrency`` calls. Each throttled answer (a 429 or 503, or
any answer that asks for a wait) takes 49 times what a success gives back, so the window
settles where about 2 % of answers are throttles: a server that refuses 1 % of requests at
random never shrinks it, one that refuses 90 % shrinks it within a round trip. A server
that takes fewer calls a second than one call at a time makes is paced: at a window of one
call, starts are a gap apart, which settles the same way (a throttle doubles it, at most
once a gap, up to 10 s; a success takes 2 % off). Any ``Retry-After`` pauses every call
of the worker; after it, the window is what the throttles left (often one call: a probe),
and it grows back by about one call a round trip as answers succeed.
"""

from __future__ import annotations

import asyncio

#: The share of answers that are throttles where the window settles.
TARGET_THROTTLED = 0.02
_SHRINK = (1 - TARGET_THROTTLED) / TARGET_THROTTLED
#: The gap between starts at a window of one call: the first, its growth on a throttle and
#: its shrinking on a success; below the last it is gone (the window may grow again).
GAP_FIRST, GAP_GROWTH, GAP_SHRINK, GAP_GONE = 0.01, 2.0, 0.98, 0.001
#: The longest gap: a server still throttling one call this far apart is waited out by the
#: calls' own backoffs and deadlines.
GAP_MOST = 10.0


class Admission:
    """One worker's window and pause (see the module docs), on its event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lanes: int) -> None:
        self._loop = loop
        self._most = float(lanes)
        #: Calls allowed at the server at once (a float: it moves by fractions), and the
        #: places it makes (at least one).
        self.window = float(lanes)
        self._places = lanes
        #: Attempts at the server now.
        self.active = 0
        #: No attempt starts before this loop time (0: never paused yet).
        self.paused_until = 0.0
        #: Seconds between starts at a window of one call (0: no pacing), and when it last
        #: grew (once a gap at most: the throttles of calls started before it are old news).
        self.gap = 0.0
        self._gap_grew = float("-inf")
        #: Lanes waiting in :meth:`enter`, and the event pulsed for them when an attempt
        #: ends.
        self._waiting = 0
        self._freed = asyncio.Event()

    def try_enter(self) -> bool:
        """Take a place at once if there is one and no pause (the common case: no
        coroutine to await, no clock read)."""
        if (
            self.active < self._places
            and not self.gap
            and (not self.paused_until or self.paused_until <= self._loop.time())
        ):
            self.active += 1
            return True
        return False

    async def enter(self) -> None:
        """Wait for the pause to end and a place in the window; take it."""
        while True:
            pause = self.paused_until - self._loop.time()
            if pause > 0:
                await asyncio.sleep(pause)
            elif self.active >= self._places:
                self._waiting += 1
                try:
                    await self._freed.wait()
                finally:
                    self._waiting -= 1
            else:
                self.active += 1
                if self.gap:
                    self.paused_until = max(self.paused_until, self._loop.time() + self.gap)
                return

    def succeeded(self) -> None:
        """An attempt ended with an answer: the window grows (or the gap shrinks)."""
        self.active -= 1
        if self.gap:
            self.gap *= GAP_SHRINK
            if self.gap < GAP_GONE:
                self.gap = 0.0
        elif self.window < self._most:
            self._resize(min(self._most, self.window + 1 / self.window))
        if self._waiting:
            self._pulse()

    def failed(self, *, throttled: bool = False, wait: float | None = None) -> None:
        """An attempt ended otherwise: the server asked to slow down (``throttled``: the
        window shrinks, or at one call the gap grows; ``wait``: the seconds the server asked
        every call to wait), or not (a 400, a reset, a cancel: the window stays)."""
        self.active -= 1
        if throttled:
            now = self._loop.time()
            if self.window <= 1 and now - self._gap_grew >= self.gap:
                self.gap = min(GAP_MOST, max(GAP_FIRST, self.gap * GAP_GROWTH))
                self._gap_grew = now
                self.paused_until = max(self.paused_until, now + self.gap)
            self._resize(max(1.0, self.window - _SHRINK / self.window))
            if wait is not None:
                self.paused_until = max(self.paused_until, now + wait)
        if self._waiting:
            self._pulse()

    def _resize(self, window: float) -> None:
        self.window = window
        self._places = max(1, int(window))

    def _pulse(self) -> None:
        self._freed.set()
        self._freed.clear()
