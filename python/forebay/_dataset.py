"""``forebay.Dataset`` (made by ``forebay.read_parquet``, module ``_read``): a lazy dataset
read by Rust, with a plan of steps (``map_batches``, ``limit``) that forebay-engine runs
under one memory cap.

    >>> ds = forebay.read_parquet("data/", columns=["id", "text"])
    >>> out = ds.map_batches(Embed, batch_size=1000, compute="processes", concurrency=2)
    >>> out.write_parquet("embeddings/")          # or: for batch in out.iter_batches(): ...
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from . import _config, _devices, _forebay, _runs
from ._args import integer, optional_integer, optional_seconds, worker_count
from ._async_udf import is_async, make_async_worker
from ._checkpoint_config import Checkpoint
from ._training import TrainingStream
from ._udf import (
    ITER_FORMATS,
    MAP_FORMATS,
    FunctionSpec,
    check_format,
    is_callable_class,
    make_worker,
    to_format,
)


@dataclass(frozen=True)
class _MapStep:
    spec: FunctionSpec
    compute: str
    concurrency: int
    batch_size: int | None
    max_retries: int
    max_errored_rows: int | None
    #: ``CUDA_VISIBLE_DEVICES`` of each worker process (``num_gpus``); empty: none set.
    devices: list[str]
    #: An async function: calls in flight per worker (None: not async).
    max_concurrency: int | None = None
    call_timeout: float | None = None
    retry_deadline: float | None = None
    fingerprint: str | None = None

    def add_to(self, pipeline: _forebay.RsPipeline) -> None:
        if self.compute == "threads":
            spec, in_flight = self.spec, self.max_concurrency
            timeout, retries, deadline = self.call_timeout, self.max_retries, self.retry_deadline
            pipeline.add_threads(
                spec.stage,
                (
                    (lambda: make_async_worker(spec, in_flight, timeout, retries, deadline))
                    if in_flight is not None
                    else (lambda: make_worker(spec))
                ),
                self.concurrency,
                self.batch_size,
                [],
                self.max_errored_rows,
                self.spec.on_error == "dead_letter",
                self.fingerprint,
            )
        else:
            from ._worker import encode_init, native_threads_env

            pipeline.add_processes(
                self.spec.stage,
                [sys.executable, "-m", "forebay._worker"],
                encode_init(self.spec),
                self.concurrency,
                self.batch_size,
                self.max_retries,
                [],
                native_threads_env(self.concurrency),
                self.max_errored_rows,
                [{"CUDA_VISIBLE_DEVICES": d} for d in self.devices],
                self.spec.on_error == "dead_letter",
                self.fingerprint,
            )


@dataclass(frozen=True)
class _LimitStep:
    rows: int

    def add_to(self, pipeline: _forebay.RsPipeline) -> None:
        pipeline.add_limit(self.rows)


_Step = _MapStep | _LimitStep


class Dataset:
    """A lazy Parquet dataset and the steps to apply to it. Nothing runs until you consume
    it (``iter_batches``, ``write_parquet``, ``to_arrow``, ``count``, ``take``, iteration).

    Iterating yields ``pyarrow.RecordBatch`` objects; without steps, in a deterministic order
    (file, then row group). The object implements ``__arrow_c_stream__``, so
    ``pyarrow.table(ds)``, ``polars.from_arrow(ds)`` and DuckDB
    (``duckdb.sql("select * from ds")``) consume it without copying.
    """

    def __init__(self, _inner: _forebay.RsDataset, _steps: tuple[_Step, ...] = ()):
        self._inner = _inner
        self._steps = _steps
        self._last_stats: dict[str, Any] | None = None
        self._schema: pa.Schema | None = None
        self._read_args: functools.partial[Dataset] | None = None

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        """A ``read_parquet(...)`` dataset without steps pickles as that call (its files are
        listed again where it is unpickled: a loader's worker process, a Ray task)."""
        if self._steps or self._read_args is None:
            raise TypeError(
                "only a read_parquet(...) dataset without steps can be pickled; rebuild the "
                "steps where it is used"
            )
        return self._read_args, ()

    def _with(self, step: _Step) -> Dataset:
        return Dataset(self._inner, (*self._steps, step))

    def _has_maps(self) -> bool:
        return any(isinstance(s, _MapStep) for s in self._steps)

    # ------------------------------------------------------------------ steps

    def map_batches(
        self,
        fn: Callable[..., Any] | type,
        *,
        batch_size: int | None = None,
        batch_format: str = "pyarrow",
        compute: str = "threads",
        concurrency: int | tuple[int, ...] | None = None,
        fn_args: Sequence[Any] | None = None,
        fn_kwargs: Mapping[str, Any] | None = None,
        fn_constructor_args: Sequence[Any] | None = None,
        fn_constructor_kwargs: Mapping[str, Any] | None = None,
        max_retries: int = 0,
        zero_copy_batch: bool = False,
        on_error: str = "raise",
        max_errored_rows: int | None = None,
        num_gpus: float | None = None,
        max_concurrency: int | None = None,
        call_timeout: float | None = None,
        retry_deadline: float | None = None,
        fingerprint: str | None = None,
    ) -> Dataset:
        """Apply ``fn`` to every batch (Ray Data's names and meaning).

        fn: a function ``fn(batch, *fn_args, **fn_kwargs) -> batch``, or a class: constructed
            once per worker with ``fn_constructor_args`` / ``fn_constructor_kwargs`` (load a
            model there), its instances then called like the function. ``async def``
            functions (and classes with an ``async def __call__``, and async generators) run
            on an event loop per worker with ``max_concurrency`` calls in flight: the way to
            call a model server. A batch may be
            returned as a ``pyarrow.Table`` or ``RecordBatch``, a dict of numpy arrays, a
            ``pandas.DataFrame``, or a generator of them; with fewer, more or other rows and
            columns than the input.
        batch_size: rows per call; input is re-chunked across source batches (a zero-copy
            slice when the rows lie in one batch, one copy when they span two). ``None``
            (default): the source's batches as they come.
        batch_format: what ``fn`` receives: ``"pyarrow"`` (a ``pyarrow.Table``, no copy),
            ``"numpy"`` (dict of ndarrays; ``"default"`` is the same) or ``"pandas"``.
        compute: ``"threads"`` (default): Python calls on forebay's threads (best when
            ``fn`` releases the GIL: numpy, torch, I/O); ``"processes"``: worker processes
            that receive and return batches through a shared-memory object store, never
            pickled (best when ``fn`` holds the GIL). Functions and classes of your script
            are shipped to the workers by value (cloudpickle); the workers never run your
            script, so it needs no ``if __name__ == "__main__":`` guard.
        concurrency: workers (threads or processes) calling ``fn`` at once; default
            ``forebay.configure(num_threads=...)``, the number of cores. Ray Data's range
            ``(min, max)`` (or ``(min, max, initial)``) is taken too: forebay does not
            autoscale, so ``max`` workers run from the start.
        fn_args, fn_kwargs: extra arguments of every call.
        fn_constructor_args, fn_constructor_kwargs: arguments of the class's constructor.
            With ``compute="processes"``, arguments holding 1 MiB of arrays or more (a
            model's weights) reach the workers through shared memory, one copy for all of
            them: each worker's arrays are read-only views of it.
        max_retries: with ``compute="processes"``, times a batch is retried on a fresh
            worker when its worker dies (SIGKILL, a crash in a C extension); 0: the run
            fails with ``forebay.WorkerDiedError`` naming the batch. With an async ``fn``,
            times a failed call is made again, as its exception says: an HTTP 4xx about
            the request (400, 401, 404, 422; or ``forebay.RowError``) never (the rows are
            at fault); a 408/409/425/429, a 5xx, a connection reset or a timeout (or
            ``forebay.TransientError``) and any other exception after a backoff (0.1 s
            doubling up to 10 s, with jitter) or the wait the server asked for
            (``Retry-After``, ``retry-after-ms``, on a 429 the ``x-ratelimit-reset-*`` of
            the exhausted limit), whichever is longer. 429s and 503s narrow the window of
            the worker's calls in flight (down to one call, then calls spaced apart),
            successes widen it back, and a wait the server asks for pauses every call of
            the worker: retries do not multiply the load on a server that is
            rate-limiting. Status and headers are read from the exceptions
            of openai, httpx, aiohttp, requests and urllib (``status_code``, ``status``,
            ``response``, ``headers``). Then ``on_error`` applies; the error names every
            attempt (its notes; a dead letter's ``_error_message``).
        max_concurrency: with an async ``fn``, calls in flight on each worker's event loop
            (default 64); ``concurrency`` (default 1 for async functions) is the number of
            such workers, each a thread with its own loop.
        call_timeout: with an async ``fn``, seconds one call may take; a call that takes
            longer is cancelled and counts as raising ``TimeoutError`` (a transient
            failure). Default: no limit.
        retry_deadline: with an async ``fn``, seconds from a call's first attempt after
            which it is not made again, whatever ``max_retries`` has left (a wait that
            would end past it ends the retries at once). Default: no deadline.

        zero_copy_batch: with ``batch_format="numpy"``: ``False`` (default, as Ray) hands
            writable arrays, copying the columns that convert without a copy (numeric, no
            nulls): ``batch["x"] *= 2`` works; ``True`` hands those as read-only views of the
            batch (no copy; write into new arrays). ``iter_batches`` always hands views.

        on_error: what an exception raised by ``fn`` does. ``"raise"`` (default): it stops
            the run and is re-raised by the consumer with its original type and traceback (a
            note names the stage and the batch). ``"skip"``: the rows it fails on are set
            aside and the run goes on: the failing batch is called again in halves, and
            halves of the halves that fail, until each failing call holds one row (about
            2·k·log2(batch_size) more calls for k failing rows, so make ``fn`` cheap to call
            twice or keep batches small); the other rows' outputs go on. A transient
            failure (see ``max_retries``: a 429, a 5xx, a reset, a timeout) is not the
            rows' fault: the batch (or half) it ends is set aside whole, not halved. Each set-aside row
            is logged as a warning (the first 20, with its file and row where known) and
            counted in ``stats()`` (``rows_errored`` and ``errored`` of the stage). A
            set-aside row counts as done: in a checkpointed write it is not sent again once
            the rest of its batch is committed. Only exceptions are caught: Ctrl-C, a dying
            worker process (see ``max_retries``) and a return value that is not a batch
            still fail the run. ``"dead_letter"``: as ``"skip"``, and ``write_parquet`` writes
            the rows set aside to ``<path>/_dead_letter/<stage>/`` (readers of the output skip
            ``_`` directories): each input row, with ``_error_type``, ``_error_message``,
            ``_input_file``, ``_input_row_group`` and ``_input_row``. With a checkpoint they
            commit with the output, so after a kill and a rerun each is there exactly once
            and counts as done (its id too). Only on the first ``map_batches`` step (rows
            no longer say which input row they were after a map), and only for a write.
        max_errored_rows: with ``on_error="skip"`` or ``"dead_letter"``, the run fails (``forebay.StageError``
            naming the stage and the last row) once more than this many rows were set
            aside; ``None`` (default): any number. Set it: a function that fails on every
            row would otherwise turn the whole input into set-aside rows.
        num_gpus: with ``compute="processes"``, devices per worker: each worker process
            sees only its own through ``CUDA_VISIBLE_DEVICES`` (1, 2, ...; or 0.5, 0.25:
            2, 4 workers share one). Worker ``i`` keeps its devices, and the worker that
            replaces it after it died gets the same. The devices are
            ``forebay.configure(gpus=...)``, else this process's ``CUDA_VISIBLE_DEVICES``,
            else ``nvidia-smi``'s. ``concurrency`` defaults to as many workers as the
            devices hold; more is an error.
        fingerprint: what identifies this step's transform (a model name and version, a
            prompt template's hash, its parameters: any text). A checkpointed
            ``write_parquet`` records it; a rerun whose fingerprint differs at any step (or
            drops one it gave) is refused before it reads anything, naming the step, since
            the checkpoint's rows came from the old transform and resuming would mix the
            two in one output. Write to a new output with a new checkpoint instead. A
            checkpoint that holds no committed row yet takes the new one.
        """
        if not callable(fn):
            raise TypeError(
                f"map_batches: fn must be a function or a class, not {type(fn).__name__}"
            )
        if isinstance(fn, type) and not is_callable_class(fn):
            raise TypeError(
                f"map_batches: instances of the class {fn.__name__} must be callable (define "
                f"__call__(self, batch)): it is constructed once per worker, then called on "
                f"every batch"
            )
        if not isinstance(fn, type) and (fn_constructor_args or fn_constructor_kwargs):
            # As Ray Data: arguments no constructor takes are a mistake, not ignored.
            raise ValueError(
                "map_batches: fn_constructor_args and fn_constructor_kwargs apply to a class "
                f"(constructed once per worker); {getattr(fn, '__name__', fn)!r} is not one: "
                "pass the class itself, or give a function's extra arguments as "
                "fn_args/fn_kwargs"
            )
        batch_size = optional_integer("batch_size", batch_size, minimum=1)
        fmt = check_format(batch_format, MAP_FORMATS)
        if compute not in ("threads", "processes"):
            raise ValueError(f"compute must be 'threads' or 'processes', not {compute!r}")
        concurrency = worker_count("concurrency", concurrency)
        max_retries = integer("max_retries", max_retries, minimum=0)
        if on_error not in ("raise", "skip", "dead_letter"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'dead_letter', not {on_error!r}")
        max_errored_rows = optional_integer("max_errored_rows", max_errored_rows, minimum=0)
        if fingerprint is not None and (not isinstance(fingerprint, str) or not fingerprint):
            raise TypeError(
                f"map_batches: fingerprint must be a non-empty str, not {fingerprint!r}"
            )
        if max_errored_rows is not None and on_error == "raise":
            raise ValueError(
                "max_errored_rows applies with on_error='skip' or 'dead_letter' (with "
                "'raise' the first error stops the run)"
            )
        asynchronous = is_async(fn)
        if asynchronous:
            if compute != "threads":
                raise ValueError(
                    f"map_batches: {getattr(fn, '__name__', fn)!r} is async: its calls wait "
                    f"on an event loop, which runs on compute='threads' (not {compute!r})"
                )
            max_concurrency = optional_integer("max_concurrency", max_concurrency, minimum=1)
            call_timeout = optional_seconds("call_timeout", call_timeout)
            retry_deadline = optional_seconds("retry_deadline", retry_deadline)
            max_concurrency = max_concurrency or 64
            concurrency = concurrency or 1
        elif max_concurrency is not None or call_timeout is not None or retry_deadline is not None:
            raise ValueError(
                "max_concurrency, call_timeout and retry_deadline apply to async functions "
                "(async def); for others, concurrency sets the calls at once"
            )
        devices: list[str] = []
        if num_gpus is not None:
            num_gpus = _devices.check_num_gpus(num_gpus)
            if compute != "processes":
                raise ValueError(
                    "num_gpus needs compute='processes': threads share one process, and a "
                    "process sees the devices it was started with"
                )
            available = _config.gpus()
            concurrency = concurrency or max(1, _devices.workers_fit(num_gpus, available))
            devices = _devices.assign(num_gpus, concurrency, available)
        name = getattr(fn, "__name__", None) or type(fn).__name__
        spec = FunctionSpec(
            fn=fn,
            batch_format=fmt,
            stage=f"map_batches({name})",
            fn_args=tuple(fn_args or ()),
            fn_kwargs=dict(fn_kwargs or {}),
            fn_constructor_args=tuple(fn_constructor_args or ()),
            fn_constructor_kwargs=dict(fn_constructor_kwargs or {}),
            zero_copy_batch=bool(zero_copy_batch),
            on_error=on_error,
        )
        workers = concurrency or _config.settings()["num_threads"]
        return self._with(
            _MapStep(
                spec,
                compute,
                workers,
                batch_size,
                max_retries,
                max_errored_rows,
                devices,
                max_concurrency if asynchronous else None,
                call_timeout,
                retry_deadline,
                fingerprint,
            )
        )

    def limit(self, n: int) -> Dataset:
        """The first ``n`` rows (in the order steps produce them); reading stops once they
        are through. In a checkpointed ``write_parquet`` the limit is the job's: ``n`` input
        rows over all its runs, so a resumed run writes only what earlier runs left (and a
        finished one nothing)."""
        return self._with(_LimitStep(integer("limit", n, minimum=0)))

    # ------------------------------------------------------------------ running

    def _pipeline(self, preserve_order: bool) -> _forebay.RsPipeline:
        settings = _config.settings()
        pipeline = _forebay.RsPipeline(
            self._inner,
            settings["memory_limit"],
            preserve_order,
            settings["progress"],
            settings["spill_dir"],
        )
        for step in self._steps:
            step.add_to(pipeline)
        return pipeline

    def iter_batches(
        self,
        *,
        batch_size: int | None = 256,
        prefetch_batches: int = 4,
        batch_format: str = "pyarrow",
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        local_shuffle_seed: int | None = None,
        preserve_order: bool = False,
    ) -> Iterator[Any]:
        """Run the pipeline and stream its output (for training loops and inference).

        batch_size: rows per batch, re-chunked across batches (the last may be smaller);
            ``None``: batches as produced.
        prefetch_batches: batches prepared ahead of the consumer (default 4), counted in the
            memory limit like everything else in flight; 0 and 1 both keep one batch ready
            (the one being handed over). The batches cut from one source batch are handed
            over together, however many they are: they are slices of memory already held.
        batch_format: ``"pyarrow"`` (a ``pyarrow.Table`` over the data, no copy: a batch
            whose rows span two source batches has two chunks), ``"numpy"`` (dict of
            ndarrays, zero-copy for numeric columns without nulls that lie in one source
            batch, and then read-only: copy an array to change it; joined otherwise),
            ``"pandas"``, or
            ``"torch"`` (dict of tensors sharing memory with the batch; numeric columns;
            needs PyTorch: ``pip install forebay[torch]``).
        drop_last: drop the last batch if it has fewer than ``batch_size`` rows.
        local_shuffle_buffer_size: shuffle rows within a buffer of at least this many rows
            (as Ray: batches are drawn at random from the buffer); None: no shuffle.
        local_shuffle_seed: seed of that shuffle, for a reproducible order: with a seed the
            shuffle's input keeps the source's order through concurrent steps (as
            ``preserve_order=True``), so the same seed gives the same order every run.
        preserve_order: keep the source's order through concurrent steps (a bounded reorder
            buffer; held batches beyond its budget are spilled); default: yield whatever is
            ready first.

        Stopping early (``break``, an exception, Ctrl-C) stops the run within a second and
        leaves no worker process behind.
        """
        batch_size = optional_integer("batch_size", batch_size, minimum=1)
        prefetch_batches = integer("prefetch_batches", prefetch_batches, minimum=0)
        fmt = check_format(batch_format, ITER_FORMATS)
        if fmt == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                raise ImportError(
                    "iter_batches(batch_format='torch') needs PyTorch: pip install forebay[torch]"
                ) from None
        local_shuffle_buffer_size = optional_integer(
            "local_shuffle_buffer_size", local_shuffle_buffer_size, minimum=1
        )
        local_shuffle_seed = optional_integer("local_shuffle_seed", local_shuffle_seed, minimum=0)
        if local_shuffle_seed is not None and local_shuffle_buffer_size is not None:
            preserve_order = True  # the order of arrival must not depend on thread timing
        stream = self._pipeline(preserve_order).iter(
            batch_size,
            prefetch_batches,
            drop_last,
            local_shuffle_buffer_size,
            local_shuffle_seed,
        )
        return self._drive(stream, fmt)

    def _drive(self, stream: _forebay.RsBatchStream, fmt: str | None) -> Iterator[Any]:
        """Yield the stream's batches (converted to ``fmt``), logging its events; stops the
        run if the consumer stops early or an exception (Ctrl-C) interrupts it."""
        finished = False
        try:
            with _runs.live(stream):
                yield from self._batches(stream, fmt)
            finished = True
        finally:
            if not finished:
                stream.cancel()
            _config.log_events(stream.drain_events())
            self._last_stats = stream.stats()

    @staticmethod
    def _batches(stream: _forebay.RsBatchStream, fmt: str | None) -> Iterator[Any]:
        while True:
            state, pieces, run = stream.poll(0.1)
            _config.log_events(stream.drain_events())
            if state == 2:
                return
            if state == 1 or pieces is None:
                continue  # nothing yet; Ctrl-C is seen between polls
            if fmt is not None:
                yield to_format(pa.Table.from_batches(pieces), fmt)
            elif len(pieces) == 1:
                yield pieces[0]
            else:
                yield pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]
            if run is not None:
                # The next batches of the same input batch, handed over at once (one export
                # instead of one per batch): cut here; the engine counts their memory until
                # the next poll.
                rest, rows = run
                for start in range(0, rest.num_rows, rows):
                    batch = rest.slice(start, rows)
                    yield batch if fmt is None else to_format(batch, fmt)

    def write_parquet(
        self,
        path: str | os.PathLike[str],
        *,
        rows_per_file: int | None = None,
        compression: str = "zstd",
        mode: str | None = None,
        storage_options: Mapping[str, str] | None = None,
        concurrency: int | None = None,
        preserve_order: bool = False,
        checkpoint: Checkpoint | None = None,
        on_changed_input: str = "error",
        retry_dead_letters: bool = False,
    ) -> dict[str, Any]:
        """Run the pipeline into Parquet files under ``path`` (a directory or a URI such as
        ``s3://bucket/out/``); returns ``{"rows", "files", "bytes", "seconds", "paths"}``
        (and ``"resume"``: what was found done and skipped, with a checkpoint).

        rows_per_file: start a new file after this many rows (default 1,048,576).
        compression: ``"zstd"`` (default), ``"snappy"``, ``"gzip"``, ``"lz4"``, ``"brotli"`` or
            ``"none"``.
        mode: ``"append"`` (new files beside existing ones; the default), ``"overwrite"``
            (delete the directory's ``*.parquet`` first) or ``"error"`` (fail if it has any).
            With a checkpoint, a directory holding files committed under another checkpoint
            (another job's, or this path's before its directory was deleted: a rerun would
            write every row again beside them) is refused while this checkpoint has
            committed nothing there, unless ``mode="append"`` is given.
        storage_options: object_store options for URIs (as in :func:`read_parquet`).
        concurrency: files written at once, each by its own writer thread that encodes and
            compresses it. Default: ``forebay.configure(num_threads=...)``, the number of
            cores; 1 with ``preserve_order=True``, so that the files hold the rows in order.
            Each writer cuts its own files, so with more than one writer the last file of
            each is short of ``rows_per_file`` (pass ``concurrency=1`` for exact file sizes;
            with a checkpoint a file is cut only between batches, so it holds at least
            ``rows_per_file`` rows and less than a batch more).
        preserve_order: keep the source's order through concurrent steps.
        checkpoint: a :class:`forebay.Checkpoint`: write exactly once, and resume when the
            same script runs again after any interruption (see ``Checkpoint``); ``mode``
            must then be ``"append"``.
        on_changed_input: with a checkpoint, what to do with an input file that changed
            since the checkpoint recorded it, or with inputs finished under another
            ``read_parquet(filter=...)`` (a finished input may hold rows the new filter
            keeps): ``"error"`` (default) or ``"reprocess"`` (read them again; rows whose id
            is done are still dropped). Inputs finished with no filter stay finished.
        retry_dead_letters: instead of reading the input, run this dataset's steps from its
            first ``map_batches`` on over the rows that step set aside into
            ``<path>/_dead_letter/`` (``on_error="dead_letter"``; fix the function first):
            each is written to ``path`` exactly once, or set aside again (into new
            dead-letter files), and the dead-letter files retried are deleted at the end. A
            kill and a rerun with the same arguments finish it. Needs the job's
            ``checkpoint`` (not changed: its set-aside rows count as done there); the retry
            keeps its own beside it, ``<checkpoint path>.retry``, deleted at the end. The
            result has ``dead_letters_retried``: the dead-letter files taken.

        Each file appears atomically: locally under a hidden temporary name, then renamed;
        on object stores when its upload completes. An error or Ctrl-C leaves no partial file.
        """
        rows_per_file = optional_integer("rows_per_file", rows_per_file, minimum=1)
        if concurrency is None:
            concurrency = 1 if preserve_order else _config.settings()["num_threads"]
        concurrency = integer("concurrency", concurrency, minimum=1)
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError("checkpoint must be a forebay.Checkpoint")
        if retry_dead_letters:
            from ._retry import retry_dead_letters as retry

            write = {
                "rows_per_file": rows_per_file,
                "compression": compression,
                "mode": mode,
                "concurrency": concurrency,
                "preserve_order": preserve_order,
                "on_changed_input": on_changed_input,
            }
            return retry(self, os.fspath(path), checkpoint, storage_options, write)
        running = self._pipeline(preserve_order).write(
            os.fspath(path),
            storage_options,
            compression,
            rows_per_file,
            concurrency,
            mode,
            checkpoint,
            on_changed_input,
        )
        try:
            with _runs.live(running):
                while True:
                    result = running.wait(0.1)
                    _config.log_events(running.drain_events())
                    if result is not None:
                        return result
        except BaseException:
            running.cancel()
            raise
        finally:
            _config.log_events(running.drain_events())
            self._last_stats = running.stats()

    def stats(self) -> dict[str, Any] | None:
        """What the last run of this dataset did: ``wall_s``, ``memory_limit``,
        ``peak_bytes`` (the most memory in flight at once; the shared-memory store that
        worker processes use is reserved in the limit but not counted here),
        ``store_spilled_bytes``, and per
        stage (``stages``): ``rows_in``, ``rows_out``, ``batches_in``, ``batches_out``,
        ``busy_s`` (time inside its function; for the read stage, time waiting for reads and
        decoding; for the write stage, time encoding), ``peak_bytes``, ``spilled_bytes``.
        None before the first run."""
        return self._last_stats

    # ------------------------------------------------------------------ reading

    @property
    def schema(self) -> pa.Schema:
        """Schema of the output. Without ``map_batches`` steps, from the files' footers;
        with them, the first output batch's (running the pipeline up to that batch)."""
        if not self._has_maps():
            return self._inner.schema()
        if self._schema is None:
            first = self.limit(1)
            batches = list(first._drive(first._pipeline(False).iter(None, 1, False), None))
            self._schema = batches[0].schema if batches else pa.schema([])
        return self._schema

    @property
    def files(self) -> list[str]:
        """The files read, in scan order."""
        return self._inner.files()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if not self._steps:
            return iter(self._inner.scan())
        return self._drive(self._pipeline(True).iter(None, 4, False), None)

    def training_stream(
        self,
        batch_size: int,
        *,
        seed: int | None = 0,
        world_size: int | None = None,
        rank: int | None = None,
        remainder: str = "drop",
        window_rows: int | None = None,
        block_rows: int | None = None,
        lanes: int | None = None,
        lane_chunk: int | None = None,
    ) -> TrainingStream:
        """This dataset as a training stream: a seeded global order dealt to ranks, each
        rank reading only what its batches need, resumable exactly with ``state_dict()`` /
        ``load_state_dict()`` even with another world size (see ``forebay.TrainingStream``).

        batch_size: rows per batch of each rank.
        seed: the order's seed (a new epoch reshuffles); None: file order, no shuffle.
        world_size, rank: this process's place (default: torchrun's WORLD_SIZE and RANK).
        remainder: what becomes of the last samples of an epoch that do not fill a batch on
            every rank: ``"drop"`` (not delivered this epoch) or ``"pad"`` (the last step is
            filled with samples from the start of the epoch).
        window_rows: about how many rows are shuffled together (default: 64 blocks, ~128 MiB
            decoded); windows are whole blocks, as even in size as they can be, and three
            are in memory (the one consumed, the next and its shuffled copy; four while a
            batch takes from two). At least the dataset's rows: one window, a uniform
            shuffle of the whole dataset.
        block_rows: rows read together from one row group (default: ~2 MiB decoded, from
            the footers' sizes): smaller blocks mix better and decode more (a block decodes
            the pages holding its rows).
        lanes: None (default): every rank decodes every window and keeps its batches. N:
            the epoch is N lanes (equal parts of the permuted blocks, each shuffled in its
            own windows) taken ``lane_chunk`` samples at a time in turn, so that a rank of
            a world size dividing N reads only its lanes, 1/world_size of the data. Pick a
            multiple of every world size a run may resume with (12 for 4, 3 and 6). A rank
            holds one window per lane it takes from (N/world_size) and two more, so the
            default window is 192/(N+2) blocks (at least 4: a world of one holds what it
            holds without lanes): a batch mixes fewer places of the dataset than without.
        lane_chunk: samples a lane gives at a time (default: ``batch_size``). Like the
            seed, ``lanes`` and ``lane_chunk`` define the order: a resume needs the same.
        """
        return TrainingStream(
            self,
            batch_size,
            seed=seed,
            world_size=world_size,
            rank=rank,
            remainder=remainder,
            window_rows=window_rows,
            block_rows=block_rows,
            lanes=lanes,
            lane_chunk=lane_chunk,
        )

    def iter_batches_with_provenance(self) -> Iterator[tuple[pa.RecordBatch, dict[str, Any]]]:
        """Stream ``(batch, provenance)`` pairs of the source (no steps may be applied).

        ``provenance`` has ``file``, ``file_index``, ``row_group``, ``row_group_first_row``,
        ``batch_index`` and ``first_row`` (index within the file of the batch's first row;
        ``None`` when a filter removed rows, since rows are then not consecutive).
        """
        if self._steps:
            raise ValueError(
                "iter_batches_with_provenance reads the source; this dataset has steps"
            )
        scan = self._inner.scan()
        while True:
            item = scan.next_with_provenance()
            if item is None:
                return
            yield item

    def to_arrow(self) -> pa.Table:
        """Run the pipeline and collect its output into a ``pyarrow.Table``."""
        batches = list(self)
        if batches:
            return pa.Table.from_batches(batches)
        return pa.Table.from_batches(
            [], schema=self.schema if not self._has_maps() else pa.schema([])
        )

    to_table = to_arrow

    def count(self) -> int:
        """Rows the pipeline outputs (from the files' footers when there are no steps and no
        filter; otherwise by running it)."""
        if not self._steps:
            return self._inner.count_rows()
        return sum(b.num_rows for b in self)

    def count_rows(self) -> int:
        """Row count of the source: from file footers alone when there is no filter."""
        return self._inner.count_rows()

    def take(self, n: int = 20) -> list[dict[str, Any]]:
        """The first ``n`` output rows as dicts (as Ray's ``take``)."""
        rows: list[dict[str, Any]] = self.limit(n).to_arrow().to_pylist()
        return rows

    def metrics(self) -> dict[str, int]:
        """I/O and pruning counters accumulated over this dataset's scans.

        Keys: ``data_requests``, ``data_bytes`` (column-chunk reads after coalescing),
        ``footer_requests``, ``footer_bytes``, ``list_requests``, ``head_requests``,
        ``row_groups_total``, ``row_groups_pruned_by_statistics``,
        ``row_groups_pruned_by_page_index``, ``rows_pruned_by_page_index``,
        ``flat_decoder_chunks`` (column chunks decoded by forebay's own decoders rather than
        the parquet crate's), ``row_groups_pages_located`` (row groups of files without a
        page index whose pages forebay located so that reading part of one reads only its
        pages, as a training stream does), ``files_pruned_by_partition`` (files a filter's
        terms on hive partition keys ruled out: neither footer nor data read).
        """
        return self._inner.metrics()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        if not self._steps:
            return self._inner.__arrow_c_stream__(requested_schema)
        batches = iter(self)
        first = next(batches, None)
        schema = first.schema if first is not None else self.schema

        def chained() -> Iterator[pa.RecordBatch]:
            if first is not None:
                yield first
            yield from batches

        reader = pa.RecordBatchReader.from_batches(schema, chained())
        return reader.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        files = self.files
        steps = "".join(
            f" -> {s.spec.stage}" if isinstance(s, _MapStep) else f" -> limit({s.rows})"
            for s in self._steps
        )
        return f"<forebay.Dataset {len(files)} file(s){steps}>"
