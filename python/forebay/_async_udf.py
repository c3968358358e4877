"""``map_batches`` with an ``async def`` function (or a class whose ``__call__`` is one, or an
async generator): many calls in flight on one event loop per worker, for functions that
wait on a model server.

One engine thread per worker drives its own event loop, and only while it waits::

    engine thread ── submit(call, batch) ──► prepare (batch format) ──► loop.create_task(call)
                  ── completed(timeout) ───► loop runs until a call is done or the timeout
                                             ◄── (call, True, [RecordBatch...]) | (call, False, error)

Nothing else runs the loop, so no second thread competes for the GIL with the engine's;
while the loop waits for the network it releases the GIL like any ``select``. The engine
keeps ``max_concurrency`` calls running and a quarter more submitted, waiting for a slot
(``forebay_engine``'s ``stage::in_flight``): a call that finishes hands its slot to the next
at once, inside the loop, instead of after the engine's next turn (against a server of 256
slots answering in 50 ms, 232-235 of its slots were busy on average, against 231 without
the waiting calls).

Each call: ``call_timeout`` bounds it; an exception or a timeout is retried up to
``max_retries`` times (after 0.1 s, 0.2 s, ... up to 2 s; backing off on a 429 is the
function's own business); then ``on_error`` decides (raise, or isolate the failing rows as
:meth:`forebay._udf.Runner.isolate` does, here with the halves called concurrently).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
from typing import Any

import pyarrow as pa

from ._forebay import StageError
from ._udf import FunctionSpec, Runner, errored_rows


def is_async(fn: Any) -> bool:
    """Whether ``fn`` (a function, or a class whose instances are called) is async: a
    coroutine function or an async generator function."""
    target = fn.__call__ if isinstance(fn, type) else fn
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def _waiting_calls(in_flight: int) -> int:
    """Calls submitted beyond the ``in_flight`` running, waiting for a slot (their inputs
    are charged to the stage like the running calls')."""
    return max(1, in_flight // 4)


def _backoff(attempt: int) -> float:
    return float(min(2.0, 0.1 * 2**attempt))


class AsyncRunner:
    """One worker's event loop and the calls it runs (see the module docs). The engine reads
    ``in_flight`` and calls :meth:`submit`, :meth:`completed` and :meth:`close`."""

    def __init__(
        self, spec: FunctionSpec, in_flight: int, call_timeout: float | None, max_retries: int
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._runner = Runner(spec)  # constructs the class (once per worker)
        #: Calls the engine keeps submitted: those running and the next few, waiting for a
        #: slot (see the module docs).
        self.in_flight = in_flight + _waiting_calls(in_flight)
        self._slots = asyncio.Semaphore(in_flight)

        self._timeout, self._retries = call_timeout, max_retries
        self._running: dict[asyncio.Task[list[pa.RecordBatch]], int] = {}
        self._done: collections.deque[asyncio.Task[list[pa.RecordBatch]]] = collections.deque()
        self._waiting = False

    # -- called by the engine

    def submit(self, call: int, batch: pa.RecordBatch) -> None:
        task = self._loop.create_task(self._call(batch))
        task.add_done_callback(self._finished)
        self._running[task] = call

    def completed(self, timeout: float) -> list[tuple[int, bool, Any]]:
        if not self._done and self._running:
            # Run the loop until a call finishes (its callback stops the loop after the
            # current iteration, which takes every call ready by then) or the timeout.
            self._waiting = True
            timer = self._loop.call_later(timeout, self._loop.stop)
            try:
                self._loop.run_forever()
            finally:
                timer.cancel()
                self._waiting = False
        out = []
        while self._done:
            task = self._done.popleft()
            call = self._running.pop(task)
            error = task.exception() if not task.cancelled() else asyncio.CancelledError()
            out.append((call, error is None, task.result() if error is None else error))
        return out

    def close(self) -> None:
        """Cancel the calls still running, let the instance close what it opened (its
        ``async def aclose(self)``, e.g. an HTTP session), and close the loop."""
        for task in self._running:
            task.cancel()
        if self._running:
            self._loop.run_until_complete(asyncio.gather(*self._running, return_exceptions=True))
        aclose = getattr(self._runner.function, "aclose", None)
        if aclose is not None and inspect.iscoroutinefunction(aclose):
            # The run's outcome is decided: closing is best effort.
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(aclose())
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    # -- on the loop

    def _finished(self, task: asyncio.Task[list[pa.RecordBatch]]) -> None:
        self._done.append(task)
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
        """One call, with its timeout and retries."""
        prepared = self._runner.prepare(batch)
        error: Exception | None = None
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(_backoff(attempt - 1))
            try:
                if self._timeout is None:
                    out = await self._invoke(prepared)
                else:
                    out = await asyncio.wait_for(self._invoke(prepared), self._timeout)
            except TimeoutError as e:
                error = e
                if self._timeout is not None:
                    error = TimeoutError(
                        f"the call took longer than call_timeout={self._timeout:g} s"
                    )
                continue
            except StageError:
                raise
            except Exception as e:  # noqa: BLE001 - retried, then the call's error
                error = e
                continue
            return self._runner.finish(out)
        assert error is not None
        raise error

    async def _call(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        async with self._slots:
            return await self._call_in_slot(batch)

    async def _call_in_slot(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
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
        if stop - start == 1:
            return [], [(start, error)]
        middle = (start + stop) // 2
        (a_out, a_failed), (b_out, b_failed) = await asyncio.gather(
            self._isolate(batch, start, middle, None), self._isolate(batch, middle, stop, None)
        )
        return a_out + b_out, a_failed + b_failed


def make_async_worker(
    spec: FunctionSpec, in_flight: int, call_timeout: float | None, max_retries: int
) -> AsyncRunner:
    return AsyncRunner(spec, in_flight, call_timeout, max_retries)
