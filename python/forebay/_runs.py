"""The runs (iterations, writes) live in this process, stopped before the interpreter exits.

A run's engine threads call into Python (``map_batches`` functions, log events). If the
interpreter starts finalizing while one of them is inside Python or about to enter it,
CPython ends that thread on the spot, and the process aborts ("Fatal Python error:
PyGILState_Release"). That happens to a script that leaves an ``iter_batches`` loop early
and exits while the abandoned iterator's run is still going, or that exits while another
thread writes. ``atexit`` callbacks run before finalization starts, so cancelling every live
run there (which waits for its threads) lets the process exit cleanly.

SIGTERM (what ``kill``, Kubernetes, Slurm and systemd send first) ends a run as Ctrl-C does:
while a run is live and the signal has its default action, a handler cancels the live runs
(committed work stays committed; staged files, worker processes and the run's shared-memory
object store are removed), then lets the signal end the process as it would have.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


_lock = threading.RLock()  # reentrant: the SIGTERM handler may run inside a locked block
_live: dict[int, _Cancellable] = {}


@contextmanager
def live(run: Any) -> Iterator[None]:
    """Register ``run`` (an ``RsBatchStream`` or ``RsRunningWrite``) while the block runs."""
    with _lock:
        _live[id(run)] = run
        _catch_sigterm()
    try:
        yield
    finally:
        with _lock:
            _live.pop(id(run), None)
            if not _live:
                _release_sigterm()


def _on_sigterm(signum: int, frame: Any) -> None:
    _cancel_live_runs()
    _release_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)  # the default action now: the process ends


def _catch_sigterm() -> None:
    """Install the SIGTERM handler if nobody else handles the signal (called under _lock)."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _release_sigterm() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _cancel_live_runs() -> None:
    with _lock:
        runs = list(_live.values())
        _live.clear()
    for run in runs:
        run.cancel()


atexit.register(_cancel_live_runs)
