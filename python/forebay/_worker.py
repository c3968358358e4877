"""A worker process of ``map_batches(..., compute="processes")``.

Started by the engine as ``python -m forebay._worker`` with its socket on the file
descriptor ``FOREBAY_WORKER_FD`` and the run's object store at ``FOREBAY_STORE``. It speaks
the engine's protocol (``forebay-engine``'s ``process`` module): it receives the function
once (INIT), then task after task: the input batch's object id, to which it answers with the
ids of its output batches, put into the same store. Arrow data never crosses the socket.

The function is shipped with cloudpickle (a dependency), so functions and classes defined
in the user's script travel by value, as in Ray: the worker never runs the user's script, and
a script works as written, with or without ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import struct
import sys
import traceback
from collections.abc import Iterator
from typing import Any

INIT, READY, INIT_FAILED, TASK, DONE, FAILED, SHUTDOWN = 1, 2, 3, 4, 5, 6, 7


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            return None  # the parent is gone
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _receive(sock: socket.socket) -> tuple[int, bytes] | None:
    header = _read_exact(sock, 5)
    if header is None:
        return None
    length, kind = struct.unpack("<IB", header)
    payload = _read_exact(sock, length - 1) if length > 1 else b""
    if payload is None:
        return None
    return kind, payload


def _send(sock: socket.socket, kind: int, payload: bytes = b"") -> None:
    sock.sendall(struct.pack("<IB", len(payload) + 1, kind) + payload)


def _error_payload(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(exc)).encode()
    try:
        pickled = _dumps(exc)
        pickle.loads(pickled)  # the parent must be able to load it
    except Exception:  # noqa: BLE001 - an unpicklable exception travels as its text only
        pickled = b""
    return struct.pack("<I", len(text)) + text + pickled


def _dumps(obj: Any) -> bytes:
    """cloudpickle: functions and classes of the user's script travel by value."""
    import cloudpickle

    return bytes(cloudpickle.dumps(obj))


#: A function whose arguments hold at least this many bytes of arrays and buffers reaches
#: its workers through shared memory (one copy for all workers) instead of inside INIT.
SHARED_SPEC_MIN = 1 << 20

#: The parent's stores of shared specs, by the id of their spec: one per spec, kept while
#: the spec lives (a worker restarted later attaches to it again).
_shared_specs: dict[int, tuple[Any, bytes]] = {}


def encode_init(spec: Any) -> bytes:
    """The INIT message for ``spec`` (called in the parent).

    Large arrays in the spec (a model's weights given as constructor arguments) are put
    into a store of their own, once: each worker attaches to it and gets read-only views of
    the same pages, as Ray's object store gives its actors. The rest travels in INIT."""
    from forebay import _pickled

    known = _shared_specs.get(id(spec))
    if known is not None:
        return known[1]
    meta, parts = _pickled.encode(spec)
    shared = sum(p.nbytes for p in parts[1:] if isinstance(p, memoryview))
    if shared < SHARED_SPEC_MIN:
        return pickle.dumps({"spec": _dumps(spec), "sys_path": list(sys.path)})
    import weakref

    from forebay._store import ObjectStore

    size = sum(memoryview(p).nbytes for p in parts) + len(meta)
    store = ObjectStore(capacity=size + (4 << 20), spill=False)
    ref = store._ref(store._store().put_buffers(meta, parts))
    init = pickle.dumps({"spec_in": (store.path, ref._id), "sys_path": list(sys.path)})
    _shared_specs[id(spec)] = (store, init)
    weakref.finalize(spec, _drop_shared_spec, id(spec))
    return init


def _drop_shared_spec(spec_id: int) -> None:
    entry = _shared_specs.pop(spec_id, None)
    if entry is not None:
        entry[0].close()


#: Thread pools of native libraries (OpenMP, OpenBLAS, MKL) that size themselves to the
#: machine's cores unless told otherwise.
NATIVE_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def native_threads_env(concurrency: int) -> dict[str, str]:
    """Environment for ``concurrency`` workers: native thread pools sized to one worker's
    share of the cores, as Ray does for its workers. Without it every worker starts a pool
    as large as the machine (``concurrency`` x cores threads competing for the cores), and
    numpy's OpenBLAS threads alone spin ~70 ms of CPU per worker after import. A variable the
    user has set is left as it is."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = str(max(1, (cores or 1) // max(1, concurrency)))
    return {name: share for name in NATIVE_THREAD_VARIABLES if name not in os.environ}


def _load_spec(payload: bytes) -> Any:
    envelope = pickle.loads(payload)
    for entry in envelope["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    if "spec_in" in envelope:
        from forebay._store import ObjectRef, ObjectStore

        path, object_id = envelope["spec_in"]
        return ObjectStore.attach(path).get(ObjectRef(object_id, path))
    return pickle.loads(envelope["spec"])


@contextlib.contextmanager
def _store_full_is_the_memory_limit(what: str) -> Iterator[None]:
    """A full store is the memory limit's doing: say which settings would make room. The
    store is full when a worker puts its output, and also when it gets its input back from
    disk (the run spilled it while the store was full)."""
    from forebay._forebay import MemoryLimitExceeded, StoreFullError

    try:
        yield
    except StoreFullError as e:
        raise MemoryLimitExceeded(
            f"{what} did not fit the run's shared-memory object store, which gets a quarter "
            f"of the memory limit ({e}); raise forebay.configure(memory_limit=...), use "
            f"smaller batches (batch_size) or fewer workers (concurrency)"
        ) from None


def _put_output(store: Any, batch: Any) -> int:
    """Put an output batch into the run's store."""
    with _store_full_is_the_memory_limit("a worker's output batch"):
        return int(store.put(batch)._id)


def main() -> None:
    # Ctrl-C is the parent's to handle: it stops this worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=int(os.environ["FOREBAY_WORKER_FD"]))
    from forebay._store import ObjectRef, ObjectStore
    from forebay._udf import make_worker

    store = ObjectStore.attach(os.environ["FOREBAY_STORE"])
    first = _receive(sock)
    if first is None:
        return
    try:
        run = make_worker(_load_spec(first[1]))
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure to the parent
        _send(sock, INIT_FAILED, _error_payload(exc))
        return
    _send(sock, READY)
    while True:
        message = _receive(sock)
        if message is None or message[0] == SHUTDOWN:
            return
        kind, payload = message
        if kind != TASK:
            return  # not the protocol this worker speaks: leave, the parent reports it
        task = payload[:8]
        try:
            (object_id,) = struct.unpack("<16s", payload[8:24])
            ref = ObjectRef(int.from_bytes(object_id, "little"), store.path)
            with _store_full_is_the_memory_limit("a worker's input batch, back from disk,"):
                table = store.get(ref)
            outputs = []
            for batch in table.to_batches():
                outputs.extend(run(batch))
            del table
            ids = [_put_output(store, out) for out in outputs]
            reply = task + struct.pack("<I", len(ids))
            reply += b"".join(i.to_bytes(16, "little") for i in ids)
            _send(sock, DONE, reply)
        except BaseException as exc:  # noqa: BLE001 - the user's error goes to the parent
            _send(sock, FAILED, task + _error_payload(exc))


if __name__ == "__main__":
    main()
