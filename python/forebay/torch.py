"""A :class:`forebay.TrainingStream` for torch (the ``forebay[torch]`` extra).

    >>> stream = forebay.read_parquet("data/").training_stream(256, seed=1)
    >>> loader = forebay.torch.TrainingLoader(stream, num_workers=2)
    >>> loader.load_state_dict(saved)               # optional: resume
    >>> for batch in loader:                        # {column: torch.Tensor}
    ...     train(batch)
    ...     checkpoint = {"model": ..., "data": loader.state_dict()}

:class:`TrainingDataset` is a plain ``torch.utils.data.IterableDataset``: in a ``DataLoader``
with ``num_workers=k`` (and ``batch_size=None``: batches come whole), worker ``j`` reads the
rank's batches ``j, j + k, ...`` and the loader takes them round-robin, so the rank sees its
batches in order, each read once. :class:`TrainingLoader` is that ``DataLoader``, counting the
batches the loop received, so that its ``state_dict()`` is where the loop is, whatever the
number of workers or their read-ahead; the state resumes with any world size and any
number of workers. (torchdata's ``StatefulDataLoader`` can wrap :class:`TrainingDataset` with
``num_workers=0``; with workers its per-worker states cannot change world size.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ._training import TrainingStream

FORMATS = ("torch", "numpy", "pyarrow")


def _column_values(column: pa.Array) -> Any:
    """A column as numpy: a list column whose rows all have the same length (fixed-size or
    not) as a 2-d array; anything else as ``to_numpy`` gives it."""
    is_list = pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type)
    if is_list and column.null_count == 0 and len(column):
        if pa.types.is_fixed_size_list(column.type):
            width = column.type.list_size
        else:
            lengths = column.value_lengths().to_numpy()
            width = int(lengths[0])
            if not (lengths == width).all():
                return column.to_numpy(zero_copy_only=False)
        flat = column.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(column), width)
    return column.to_numpy(zero_copy_only=False)


def _to_format(batch: pa.RecordBatch, format: str) -> Any:
    if format == "pyarrow":
        return batch
    out = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        values = _column_values(column)
        if format == "torch" and values.dtype.kind in "biuf":
            # A copy: Arrow's buffers are read-only, and a tensor may be written to.
            values = torch.tensor(values)
        out[name] = values
    return out


class TrainingDataset(IterableDataset):
    """The rank's batches of ``stream`` from its current position, as an
    ``IterableDataset``; in a worker of a ``DataLoader``, that worker's share of them.

    stream: a :class:`forebay.TrainingStream` (its position is read when iteration starts;
        iterating here does not move it: :class:`TrainingLoader` does).
    format: ``"torch"`` (dict of tensors; strings stay numpy arrays; a list column whose
        rows have equal lengths becomes a 2-d tensor), ``"numpy"`` (dict of arrays, the same
        shapes) or ``"pyarrow"`` (the RecordBatch).
    """

    def __init__(self, stream: TrainingStream, format: str = "torch") -> None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
        self.stream = stream
        self.format = format

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for batch in self.stream.iter_worker(worker, workers):
            yield _to_format(batch, self.format)


class TrainingLoader:
    """A ``DataLoader`` over a training stream whose ``state_dict()`` counts the batches the
    loop received.

    stream: the :class:`forebay.TrainingStream`; the loader moves its position.
    num_workers: loader worker processes (0: read in this process; forebay's reader already
        decodes on its own threads, workers help when ``format`` conversion is costly).
    format: see :class:`TrainingDataset`.
    loader_options: more ``DataLoader`` arguments (``pin_memory``, ``prefetch_factor``,
        ``multiprocessing_context``, ...); not ``batch_size`` (batches come whole).
    """

    def __init__(
        self,
        stream: TrainingStream,
        num_workers: int = 0,
        format: str = "torch",
        **loader_options: Any,
    ) -> None:
        if "batch_size" in loader_options:
            raise ValueError("batch_size is the stream's (training_stream(batch_size=...))")
        self.stream = stream
        self.dataset = TrainingDataset(stream, format)
        self.num_workers = num_workers
        self.loader_options = loader_options

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch; afterwards the stream is at the next epoch."""
        left = len(self.stream)
        if left == 0:
            self.stream.advance(0)
            return
        loader = DataLoader(
            self.dataset,
            batch_size=None,
            num_workers=self.num_workers,
            **self.loader_options,
        )
        for batch in loader:
            self.stream.advance(1)  # the last one moves the stream to the next epoch
            yield batch

    def __len__(self) -> int:
        return len(self.stream)

    def state_dict(self) -> dict[str, Any]:
        """The stream's state after the batches this loader delivered."""
        return self.stream.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where ``state`` was (any world size, any number of workers)."""
        self.stream.load_state_dict(state)
