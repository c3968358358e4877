"""The runs (iterations, writes) live in this process, stopped before the interpreter exits.

A run's engine threads call into Python (``map_batches`` functions, log events). If the
interpreter starts finalizing while one of them is inside Python or about to enter it,
CPython ends that thread on the spot, and the process aborts ("Fatal Python error:
PyGILState_Release"). That happens to a script that leaves an ``iter_batches`` loop early
and exits while the abandoned iterator's run is still going, or that exits while another
thread writes. ``atexit`` callbacks run before finalization starts, so cancelling every live
run there (which waits for its threads) lets the process exit cleanly.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


_lock = threading.Lock()
_live: dict[int, _Cancellable] = {}


@contextmanager
def live(run: Any) -> Iterator[None]:
    """Register ``run`` (an ``RsBatchStream`` or ``RsRunningWrite``) while the block runs."""
    with _lock:
        _live[id(run)] = run
    try:
        yield
    finally:
        with _lock:
            _live.pop(id(run), None)


def _cancel_live_runs() -> None:
    with _lock:
        runs = list(_live.values())
        _live.clear()
    for run in runs:
        run.cancel()


atexit.register(_cancel_live_runs)
