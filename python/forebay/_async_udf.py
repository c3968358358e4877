"""``map_batches`` with an ``async def`` function (or a class whose ``__call__`` is one, or an
async generator): many calls in flight on one event loop per worker, for functions that
wait on a model server.

One engine thread per worker drives its own event loop, and only while it waits::

    engine thread ── submit(call, batch) ──► calls submitted ──► max_concurrency lanes, each
                                                                 taking the next call when
                                                                 its last one is done
                  ── completed(timeout) ───► loop runs until a call is done or the timeout
                                             ◄── (call, True, [RecordBatch...]) | (call, False, error)

Nothing else runs the loop, so no second thread competes for the GIL with the engine's;
while the loop waits for the network it releases the GIL like any ``select``. The engine
keeps a quarter more calls submitted than there are lanes (``forebay_engine``'s
``stage::in_flight``): a lane whose call finishes takes the next at once, in the same turn
of the loop, not after the engine's next turn. A lane is one coroutine for the worker's
life, not a task a call: fewer objects a call, and a third of the garbage collections
(each full one stops the loop; BENCHMARKS.md, "Batch inference at the server's capacity").

Each call: ``call_timeout`` bounds it; a failure is retried as :mod:`forebay._call_errors`
classifies it: never when the rows are at fault (an HTTP 4xx), up to ``max_retries`` times
within ``retry_deadline`` otherwise, each after max(backoff with jitter, the server's
``Retry-After``). How many calls go to the server at once is learnt from its answers
(:mod:`forebay._admission`): throttles (429, 503, a ``Retry-After``) shrink the window of
calls at the server, successes grow it back, and a ``Retry-After`` pauses every call of the
worker, so that a server rate-limiting for a minute is probed by one call at a time, not by
``max_concurrency`` retries at the end of every wait.

Then ``on_error`` decides: raise, or set rows aside: a transient failure sets aside the
whole batch (halves would only add load), any other isolates the failing rows as
:meth:`forebay._udf.Runner.isolate` does, here with the halves called concurrently. A
set-aside row's error names every attempt.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
from typing import Any

import pyarrow as pa

from ._admission import Admission
from ._call_errors import Failure, backoff, classify, note_attempts, server_wait, status_of
from ._forebay import StageError
from ._udf import FunctionSpec, Runner, errored_rows

#: Statuses by which a server says it takes too many calls (the others are not about load).
_THROTTLES = frozenset({429, 503})


def is_async(fn: Any) -> bool:
    """Whether ``fn`` (a function, or a class whose instances are called) is async: a
    coroutine function or an async generator function."""
    target = fn.__call__ if isinstance(fn, type) else fn
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def _waiting_calls(in_flight: int) -> int:
    """Calls submitted beyond the ``in_flight`` running, waiting for a lane (their inputs
    are charged to the stage like the running calls')."""
    return max(1, in_flight // 4)


class AsyncRunner:
    """One worker's event loop and the calls it runs (see the module docs). The engine reads
    ``in_flight`` and calls :meth:`submit`, :meth:`completed` and :meth:`close`."""

    def __init__(
        self,
        spec: FunctionSpec,
        in_flight: int,
        call_timeout: float | None,
        max_retries: int,
        retry_deadline: float | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._runner = Runner(spec)  # constructs the class (once per worker)
        #: Calls the engine keeps submitted: those running and the next few, waiting for a
        #: lane (see the module docs).
        self.in_flight = in_flight + _waiting_calls(in_flight)
        self._lane_count = in_flight
        self._timeout, self._retries = call_timeout, max_retries
        self._deadline = retry_deadline
        #: How many calls go to the server at once (see the module docs).
        self._admission = Admission(self._loop, in_flight)
        #: Calls submitted and not yet taken by a lane.
        self._submitted: collections.deque[tuple[int, pa.RecordBatch]] = collections.deque()
        #: Lanes with no call, each waiting on its future.
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lanes: list[asyncio.Task[None]] = []
        self._unfinished = 0
        self._done: collections.deque[tuple[int, bool, Any]] = collections.deque()
        self._waiting = False

    # -- called by the engine

    def submit(self, call: int, batch: pa.RecordBatch) -> None:
        if not self._lanes:
            self._lanes = [self._loop.create_task(self._lane()) for _ in range(self._lane_count)]
        self._submitted.append((call, batch))
        self._unfinished += 1
        while self._idle:
            idle = self._idle.popleft()
            if not idle.done():
                idle.set_result(None)
                break

    def completed(self, timeout: float) -> list[tuple[int, bool, Any]]:
        if not self._done and self._unfinished:
            # Run the loop until a call finishes (which stops the loop after the current
            # iteration, taking every call ready by then) or the timeout.
            self._waiting = True
            timer = self._loop.call_later(timeout, self._loop.stop)
            try:
                self._loop.run_forever()
            finally:
                timer.cancel()
                self._waiting = False
        out = list(self._done)
        self._done.clear()
        return out

    def close(self) -> None:
        """Cancel the calls still running, let the instance close what it opened (its
        ``async def aclose(self)``, e.g. an HTTP session), and close the loop."""
        for lane in self._lanes:
            lane.cancel()
        if self._lanes:
            self._loop.run_until_complete(asyncio.gather(*self._lanes, return_exceptions=True))
        aclose = getattr(self._runner.function, "aclose", None)
        if aclose is not None and inspect.iscoroutinefunction(aclose):
            # The run's outcome is decided: closing is best effort.
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(aclose())
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    # -- on the loop

    async def _lane(self) -> None:
        """Make one call after another, as long as the worker runs: a lane is one of the
        ``max_concurrency`` calls at a time, and a call that finishes takes the next
        submitted one at once, in the same turn of the loop."""
        while True:
            if not self._submitted:
                idle = self._loop.create_future()
                self._idle.append(idle)
                await idle
                continue
            call, batch = self._submitted.popleft()
            try:
                result: tuple[int, bool, Any] = (call, True, await self._call(batch))
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # the worker is closing
                result = (call, False, asyncio.CancelledError())
            except Exception as error:  # noqa: BLE001 - the call's outcome, for the engine
                result = (call, False, error)
            self._unfinished -= 1
            self._done.append(result)
            if self._waiting:
                self._waiting = False
                self._loop.stop()

    async def _invoke(self, prepared: Any) -> Any:
        out = self._runner.run(prepared)
        if inspect.isasyncgen(out):
            return [item async for item in out]
        if inspect.isawaitable(out):
            return await out
        return out  # a plain function that returned at once

    async def _attempt(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """One call, with its timeout and retries (see the module docs)."""
        prepared = self._runner.prepare(batch)
        # The failures of earlier attempts; made at the first (a list a call would add to
        # the garbage collector's count of every call).
        earlier: list[BaseException] | None = None
        first = 0.0  # loop time of the first attempt, read only with a retry_deadline
        admission = self._admission
        while True:
            if not admission.try_enter():
                await admission.enter()
            if not first and self._deadline is not None:
                first = self._loop.time()
            try:
                if self._timeout is None:
                    out = await self._invoke(prepared)
                else:
                    out = await asyncio.wait_for(self._invoke(prepared), self._timeout)
            except (StageError, asyncio.CancelledError):
                admission.failed()
                raise
            except TimeoutError as e:
                error: Exception = e
                if self._timeout is not None:
                    error = TimeoutError(
                        f"the call took longer than call_timeout={self._timeout:g} s"
                    )
            except Exception as e:  # noqa: BLE001 - retried, then the call's error
                error = e
            else:
                admission.succeeded()
                return self._runner.finish(out)
            kind = classify(error)
            asked = server_wait(error) if kind is Failure.TRANSIENT else None
            admission.failed(
                throttled=asked is not None
                or (kind is Failure.TRANSIENT and status_of(error) in _THROTTLES),
                wait=asked,
            )
            wait = self._retry_wait(kind, asked, len(earlier) if earlier else 0, first)
            if wait is None:
                note_attempts(error, earlier or [])
                raise error
            if earlier is None:
                earlier = []
            earlier.append(error)
            await asyncio.sleep(wait)

    def _retry_wait(
        self, kind: Failure, asked: float | None, retries: int, first: float
    ) -> float | None:
        """After a failure of ``kind`` (``asked``: the wait the server asked for;
        ``retries`` made so far; the first attempt at loop time ``first``, read only with a
        ``retry_deadline``): the seconds to wait before calling again, or None: not again."""
        if kind is Failure.ROW or retries >= self._retries:
            return None
        wait = max(backoff(retries), asked or 0.0)
        if self._deadline is not None and self._loop.time() + wait - first > self._deadline:
            return None
        return wait

    async def _call(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        try:
            return await self._attempt(batch)
        except StageError:
            raise
        except Exception as error:
            if not self._runner.isolates or batch.num_rows == 0:
                raise
            outputs, failures = await self._isolate(batch, 0, batch.num_rows, error)
            if failures:
                outputs.append(errored_rows(batch, failures))
            return outputs

    async def _isolate(
        self, batch: pa.RecordBatch, start: int, stop: int, error: Exception | None
    ) -> tuple[list[pa.RecordBatch], list[tuple[int, BaseException]]]:
        """The outputs of rows ``start..stop`` that do not fail and the rows that do (as
        ``Runner.isolate``; the two halves of a failing range are called at once)."""
        if error is None:
            try:
                return await self._attempt(batch.slice(start, stop - start)), []
            except StageError:
                raise
            except Exception as e:  # noqa: BLE001 - the rows' error, kept for them
                error = e
        if stop - start == 1 or classify(error) is Failure.TRANSIENT:
            return [], [(row, error) for row in range(start, stop)]
        middle = (start + stop) // 2
        (a_out, a_failed), (b_out, b_failed) = await asyncio.gather(
            self._isolate(batch, start, middle, None), self._isolate(batch, middle, stop, None)
        )
        return a_out + b_out, a_failed + b_failed


def make_async_worker(
    spec: FunctionSpec,
    in_flight: int,
    call_timeout: float | None,
    max_retries: int,
    retry_deadline: float | None = None,
) -> AsyncRunner:
    return AsyncRunner(spec, in_flight, call_timeout, max_retries, retry_deadline)
