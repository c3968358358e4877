"""Running a user's function on batches: the batch formats it receives, the outputs it may
return, and the exceptions that come back from worker processes.

Used on the engine's threads (``compute="threads"``) and inside worker processes
(``compute="processes"``, see ``forebay._worker``): both build a :class:`Runner` with
:func:`make_worker` and give it one ``pyarrow.RecordBatch`` at a time (engine threads
prepare the next batch's input while the function runs on the current one).

Formats a function receives (``batch_format``):

* ``"pyarrow"``: a ``pyarrow.Table`` over the batch's buffers (no copy);
* ``"numpy"``: ``{column: numpy.ndarray}``, zero-copy for numeric columns without nulls,
  fixed-size lists as 2-D arrays;
* ``"pandas"``: a ``pandas.DataFrame`` (pandas converts, which copies most columns).

A function may return any of those, a ``pyarrow.RecordBatch``, or a generator of them.
"""

from __future__ import annotations

import pickle
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from . import _forebay
from ._call_errors import Failure, classify, describe
from ._forebay import StageError

MAP_FORMATS = ("pyarrow", "numpy", "pandas")
ITER_FORMATS = ("pyarrow", "numpy", "pandas", "torch")


@dataclass
class FunctionSpec:
    """Everything a worker needs to call the user's function (picklable)."""

    fn: Any
    batch_format: str
    stage: str
    fn_args: Sequence[Any] = ()
    fn_kwargs: Mapping[str, Any] = field(default_factory=dict)
    fn_constructor_args: Sequence[Any] = ()
    fn_constructor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: Hand numpy batches as they convert (read-only views where zero-copy); False: every
    #: array writable (read-only views copied), as Ray's default.
    zero_copy_batch: bool = False
    #: ``"raise"``: an exception of the function fails the run; ``"skip"``: the rows it
    #: fails on are isolated (:meth:`Runner.isolate`) and set aside, the others go on.
    on_error: str = "raise"


def check_format(batch_format: str, allowed: Sequence[str]) -> str:
    fmt = "numpy" if batch_format == "default" else batch_format
    if fmt not in allowed:
        raise ValueError(
            f"batch_format must be one of {', '.join(repr(f) for f in allowed)}, "
            f"not {batch_format!r}"
        )
    return fmt


class Runner:
    """One worker's runner of the user's function, in three steps: :meth:`prepare` turns a
    batch into the function's input (its ``batch_format``), :meth:`run` calls the function,
    :meth:`finish` turns its output into record batches. Kept apart so that a worker thread
    can prepare its next batch on another thread while the function runs (and tell the
    function's own time from the conversions'); ``runner(batch)`` does all three."""

    def __init__(self, spec: FunctionSpec) -> None:
        fn = spec.fn
        if isinstance(fn, type):
            call = fn(*spec.fn_constructor_args, **dict(spec.fn_constructor_kwargs))
            if not callable(call):
                raise TypeError(f"{fn.__name__} instances must be callable (define __call__)")
        else:
            call = fn
        self._call = call
        self._args, self._kwargs = tuple(spec.fn_args), dict(spec.fn_kwargs)
        self._format, self._stage = spec.batch_format, spec.stage
        self._zero_copy = spec.zero_copy_batch
        #: Whether a failing call is narrowed down to its failing rows (:meth:`isolate`).
        self.isolates = spec.on_error != "raise"
        #: The input's schema: the types of the columns a numpy or pandas output passes
        #: on (see :func:`normalize_output`).
        self._input_schema: pa.Schema | None = None

    @property
    def function(self) -> Any:
        """What is called: the function, or this worker's instance of the class."""
        return self._call

    def prepare(self, batch: pa.RecordBatch) -> Any:
        self._input_schema = batch.schema
        prepared = to_format(batch, self._format)
        if self._format == "numpy" and not self._zero_copy:
            # Writable, as Ray's zero_copy_batch=False: views of Arrow memory are copied.
            prepared = {k: v if v.flags.writeable else v.copy() for k, v in prepared.items()}
        return prepared

    def run(self, prepared: Any) -> Any:
        return self._call(prepared, *self._args, **self._kwargs)

    def finish(self, out: Any) -> list[pa.RecordBatch]:
        return normalize_output(out, self._stage, self._input_schema)

    def __call__(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        try:
            out = self.run(self.prepare(batch))
        except Exception as error:
            if not self.isolates:
                raise
            return self.isolate(batch, error)
        return self.finish(out)

    def _once(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        return self.finish(self.run(self.prepare(batch)))

    def isolate(self, batch: pa.RecordBatch, error: BaseException) -> list[pa.RecordBatch]:
        """The function raised ``error`` on ``batch``: call it again on halves of the batch,
        and on halves of the halves that fail, down to single rows. Returns the outputs of
        the rows it does not fail on (in row order), then one batch of the rows it fails on
        (the errored rows: the input rows, their index in ``batch``, the error's type and
        message; marked for the engine, see ``forebay_engine::errored``). A batch of n rows
        with k failing rows costs about 2·k·log2(n) more calls; a range that fails
        transiently (``forebay._call_errors``: a 429, a reset) is set aside whole. Anything but an
        ``Exception`` (Ctrl-C, ``SystemExit``) and forebay's own errors about the output
        are raised as they are."""
        if not isinstance(error, Exception) or isinstance(error, StageError):
            raise error
        if batch.num_rows == 0:
            raise error
        outputs: list[pa.RecordBatch] = []
        failures: list[tuple[int, BaseException]] = []
        # Ranges still to try, each with the error it is known to raise (None: not tried);
        # a stack, so that rows come out in order.
        todo: list[tuple[int, int, BaseException | None]] = [(0, batch.num_rows, error)]
        while todo:
            start, stop, known = todo.pop()
            if known is None:
                try:
                    outputs.extend(self._once(batch.slice(start, stop - start)))
                    continue
                except StageError:
                    raise
                except Exception as e:  # noqa: BLE001 - the rows' error, kept for them
                    known = e
            if stop - start == 1 or classify(known) is Failure.TRANSIENT:
                # A transient failure (a 429, a reset) is not the rows': halves would only
                # add load to the server.
                failures.extend((row, known) for row in range(start, stop))
                continue
            middle = (start + stop) // 2
            todo.append((middle, stop, None))
            todo.append((start, middle, None))
        if failures:
            outputs.append(errored_rows(batch, failures))
        return outputs


def errored_rows(
    batch: pa.RecordBatch, failures: list[tuple[int, BaseException]]
) -> pa.RecordBatch:
    """The rows of ``batch`` a function failed on, with their errors, marked for the engine
    (the layout of ``forebay_engine::errored::errored_rows_batch``)."""
    rows = pa.array([row for row, _ in failures], pa.uint64())
    taken = batch.take(rows)
    columns = [*taken.columns, rows]
    columns.append(pa.array([type(e).__qualname__ for _, e in failures], pa.string()))
    columns.append(pa.array([describe(e) for _, e in failures], pa.string()))
    names = [*taken.schema.names, _forebay.ROW_IN_CALL, _forebay.ERROR_TYPE, _forebay.ERROR_MESSAGE]
    return pa.RecordBatch.from_arrays(columns, names=names).replace_schema_metadata(
        {_forebay.ERRORED_ROWS: "1"}
    )


def make_worker(spec: FunctionSpec) -> Runner:
    """Build one worker's runner: construct the class (once per worker) if ``fn`` is a
    class; ``runner(batch) -> [RecordBatch, ...]``."""
    return Runner(spec)


def to_format(batch: pa.RecordBatch | pa.Table, fmt: str) -> Any:
    """The batch (a RecordBatch, or a Table whose chunks are the slices of one batch) as the
    function (or the caller of iter_batches) wants it."""
    table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
    if fmt == "pyarrow":
        return table
    if fmt == "numpy":
        return {name: column_to_numpy(table.column(i)) for i, name in enumerate(table.column_names)}
    if fmt == "pandas":
        return table.to_pandas()
    if fmt == "torch":
        return to_torch(table)
    raise ValueError(f"unknown batch format {fmt!r}")


def column_to_numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Zero-copy where Arrow's layout is numpy's (numeric, no nulls, one chunk); fixed-size
    lists of numbers become 2-D (or deeper) arrays. A column in several chunks is joined
    (one copy: numpy arrays are contiguous)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type) and column.null_count == 0:
        size = column.type.list_size
        flat = column_to_numpy(column.flatten())
        return flat.reshape((len(column), size, *flat.shape[1:]))
    array: np.ndarray = column.to_numpy(zero_copy_only=False)
    return array


def to_torch(table: pa.Table) -> dict[str, Any]:
    """``{column: torch.Tensor}`` sharing memory with the batch (numeric columns only)."""
    import warnings

    import torch

    out = {}
    for i, name in enumerate(table.column_names):
        col = table.column(i)
        array = column_to_numpy(col)
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"iter_batches(batch_format='torch'): column {name!r} has type {col.type}, "
                f"which has no tensor form; select numeric columns, or use batch_format='numpy'"
            )
        with warnings.catch_warnings():
            # Arrow's buffers are read-only; the tensor shares them (do not write into it).
            warnings.simplefilter("ignore", UserWarning)
            out[name] = torch.from_numpy(array)
    return out


def _numpy_to_arrow(values: Any, was: pa.DataType | None = None) -> pa.Array:
    """A column of a numpy batch as Arrow. ``was``: the type of the input column of that
    name: numpy has no form of its own for maps, structs, decimals, dictionaries or time
    zones (``column_to_numpy`` gives Python objects, or datetimes without their zone), so a
    column passed on unchanged converts back to it rather than failing or losing the zone."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    array = np.asarray(values)
    if array.ndim > 1:
        inner = _numpy_to_arrow(np.ascontiguousarray(array).reshape((-1, *array.shape[2:])))
        return pa.FixedSizeListArray.from_arrays(inner, array.shape[1])
    if was is not None and _restores(array.dtype, was):
        try:
            return pa.array(array, type=was)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError):
            pass  # other values now: as they are
    return pa.array(array)


def _restores(dtype: np.dtype, was: pa.DataType) -> bool:
    """Whether a numpy column of ``dtype`` may be the numpy form of a column of type ``was``
    (then converted back to ``was``; a column whose numpy type the function changed keeps
    its new type)."""
    if dtype.kind == "O":
        return True
    if pa.types.is_timestamp(was) and was.tz is not None:
        return bool(dtype == np.dtype(f"datetime64[{was.unit}]"))
    return False


def _pandas_to_arrow(frame: Any, input_types: Mapping[str, pa.DataType]) -> pa.Table:
    """A DataFrame output as Arrow; columns pyarrow cannot infer (Python objects of a
    map, say) are converted back to their input column's type (see ``_numpy_to_arrow``)."""
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        if not input_types:
            raise
    columns = {}
    for name in frame.columns:
        was = input_types.get(name)
        series = frame[name]
        if was is not None and series.dtype == object:
            try:
                columns[str(name)] = pa.array(series, type=was, from_pandas=True)
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError):
                pass
        columns[str(name)] = pa.Table.from_pandas(frame[[name]], preserve_index=False).column(0)
    return pa.table(columns)


def normalize_output(
    out: Any, stage: str, input_schema: pa.Schema | None = None
) -> list[pa.RecordBatch]:
    """A function's result as record batches; ``StageError`` for anything else.
    ``input_schema``: the batch's the function was given (numpy and pandas outputs take the
    types of the input columns they pass on where numpy has no form of their own)."""
    if isinstance(out, pa.RecordBatch):
        return [out]
    if isinstance(out, pa.Table):
        return list(out.to_batches())
    input_types = {f.name: f.type for f in input_schema} if input_schema is not None else {}
    if isinstance(out, Mapping):
        try:
            columns = {str(k): _numpy_to_arrow(v, input_types.get(str(k))) for k, v in out.items()}
            return list(pa.Table.from_pydict(columns).to_batches())
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as e:
            raise StageError(f"the function returned a dict that is not a batch: {e}") from None
    if type(out).__name__ == "DataFrame" and hasattr(out, "to_numpy"):
        try:
            return list(_pandas_to_arrow(out, input_types).to_batches())
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise StageError(
                f"the function returned a DataFrame that is not a batch: {e}"
            ) from None
    if isinstance(out, types.GeneratorType | Iterable) and not isinstance(out, str | bytes):
        batches: list[pa.RecordBatch] = []
        for i, item in enumerate(out):
            if not _is_batch(item):
                raise StageError(
                    f"the function returned a {type(out).__name__} whose item {i} is "
                    f"{type(item).__name__}, not a batch; return a pyarrow.Table or "
                    f"RecordBatch, a dict of numpy arrays (a column each), a "
                    f"pandas.DataFrame, or a generator of them"
                )
            batches.extend(normalize_output(item, stage, input_schema))
        return batches
    raise StageError(
        f"the function returned {type(out).__name__}; return a "
        f"pyarrow.Table or RecordBatch, a dict of numpy arrays, a pandas.DataFrame, or a "
        f"generator of them"
    )


def _is_batch(value: Any) -> bool:
    return isinstance(value, pa.RecordBatch | pa.Table | Mapping) or (
        type(value).__name__ == "DataFrame" and hasattr(value, "to_numpy")
    )


def is_callable_class(cls: type) -> bool:
    """Whether instances of ``cls`` can be called (a ``__call__`` of its own or inherited)."""
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process."""

    def __str__(self) -> str:
        return "\n\n" + str(self.args[0]).rstrip()


def _from_last_line(line: str) -> BaseException:
    """A traceback's last line (``module.Type: message``) as an exception: forebay's own
    types rebuilt as themselves (they do not pickle by reference), anything else as a
    ``StageError`` carrying the line."""
    name, sep, message = line.partition(": ")
    module, _, type_name = name.rpartition(".")
    if sep and module in ("_forebay", "forebay._forebay", "forebay"):
        kind = getattr(_forebay, type_name, None)
        if isinstance(kind, type) and issubclass(kind, BaseException):
            return kind(message)
    return StageError(line)


def remote_exception(text: str, payload: bytes, note: str) -> BaseException:
    """The exception a worker process reported, rebuilt: its original type and message,
    with the worker's traceback as its cause."""
    exc: BaseException
    try:
        exc = pickle.loads(payload)
        if not isinstance(exc, BaseException):
            raise TypeError("not an exception")
    except Exception:  # noqa: BLE001 - an unpicklable error still reaches the user as text
        exc = _from_last_line(text.strip().splitlines()[-1] if text.strip() else "worker error")
    exc.__cause__ = RemoteTraceback(text)
    exc.add_note(note)
    return exc
