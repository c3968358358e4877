"""``Dataset.training_stream``: the dataset in a seeded global order, dealt to ranks,
resumable at any batch with a state of a few integers.

    >>> stream = forebay.read_parquet("data/", columns=["x", "y"]).training_stream(
    ...     batch_size=256, seed=1234)              # rank and world size from RANK/WORLD_SIZE
    >>> stream.load_state_dict(saved)              # optional: resume where a run stopped
    >>> for epoch in range(stream.epoch, 10):
    ...     for batch in stream:                   # pyarrow.RecordBatch of 256 rows
    ...         train(batch)
    ...         if time_to_save: save({"model": ..., "data": stream.state_dict()})

The order of an epoch depends on (seed, epoch, dataset, block_rows, window_rows, lanes,
lane_chunk) only (``forebay_engine::training``): blocks of rows are permuted across the
dataset, and rows within windows of blocks (with ``lanes``: the permuted blocks cut into
lanes with windows of their own, taken ``lane_chunk`` samples at a time in turn, so that
each rank reads only its lanes). Each step deals ``world_size x batch_size`` consecutive
samples, ``batch_size`` to each rank, so every rank gets the same number of full batches.
The state is (epoch, samples consumed by all ranks), the same on every rank: a run resumed
with another world size or number of loader workers delivers, across its ranks, exactly
the rest of the sequence.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import _config, _forebay
from ._args import integer, optional_integer

if TYPE_CHECKING:
    from ._dataset import Dataset

STATE_FORMAT = "forebay.training/1"
REMAINDERS = ("drop", "pad")


def _rank_from_environment(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """``(world_size, rank)``: as given, else from torchrun's ``WORLD_SIZE``/``RANK``, else 1/0."""
    if world_size is None and rank is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    elif world_size is None or rank is None:
        raise ValueError("pass both world_size and rank, or neither (then RANK/WORLD_SIZE apply)")
    world_size = integer("world_size", world_size, minimum=1)
    rank = integer("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank {rank} is not below world_size {world_size}")
    return world_size, rank


def _reads_own_lanes(lanes: int, lane_chunk: int, world_size: int, batch_size: int) -> bool:
    """Whether each rank's batches come from lanes of its own: a batch is whole chunks,
    and a step's chunks divide the lanes (``forebay_engine::training::order``)."""
    if batch_size % lane_chunk:
        return False
    return lanes % (world_size * (batch_size // lane_chunk)) == 0


class TrainingStream:
    """A dataset as a training stream (made by :meth:`forebay.Dataset.training_stream`).

    Iterating yields this rank's batches (``pyarrow.RecordBatch``, ``batch_size`` rows each)
    of the current epoch from the current position; when they are through, the stream is at
    the start of the next epoch. ``state_dict()`` is where the stream is (after the batches
    yielded so far); ``load_state_dict`` puts it back there, with any world size.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        seed: int | None,
        world_size: int | None,
        rank: int | None,
        remainder: str,
        window_rows: int | None,
        block_rows: int | None,
        lanes: int | None = None,
        lane_chunk: int | None = None,
    ) -> None:
        """Use ``dataset.training_stream(...)``, which documents ``batch_size``, ``seed``,
        ``world_size``, ``rank``, ``remainder``, ``window_rows``, ``block_rows``, ``lanes``
        and ``lane_chunk`` (``dataset``: a ``read_parquet`` dataset without steps or
        filter)."""
        if dataset._steps:
            raise ValueError(
                "training_stream reads the files directly: call it on read_parquet(...) "
                "itself and transform batches in the training loop (or the collate function)"
            )
        self.batch_size = integer("batch_size", batch_size, minimum=1)
        self.seed = optional_integer("seed", seed, minimum=0)
        if self.seed is not None and self.seed >= 2**64:
            raise ValueError(f"seed must be below 2**64, not {self.seed}")
        self.world_size, self.rank = _rank_from_environment(world_size, rank)
        if remainder not in REMAINDERS:
            raise ValueError(f"remainder must be 'drop' or 'pad', not {remainder!r}")
        self.remainder = remainder
        block_rows = optional_integer("block_rows", block_rows, minimum=1)
        self._block_rows_given = block_rows
        window_rows = optional_integer("window_rows", window_rows, minimum=1)
        self.lanes = optional_integer("lanes", lanes, minimum=1)
        lane_chunk = optional_integer("lane_chunk", lane_chunk, minimum=1)
        if self.lanes is None and lane_chunk is not None:
            raise ValueError("lane_chunk needs lanes (the order's lanes, e.g. lanes=12)")
        self._lane_chunk_given = lane_chunk
        # (lanes, samples a lane gives at a time), or None: the order without lanes.
        self._lanes: tuple[int, int] | None = None
        if self.lanes is not None:
            self._lanes = (self.lanes, lane_chunk or self.batch_size)
            if self.world_size > 1 and not _reads_own_lanes(
                *self._lanes, self.world_size, self.batch_size
            ):
                warnings.warn(
                    f"lanes={self.lanes}, lane_chunk={self._lanes[1]}: with world_size="
                    f"{self.world_size} and batch_size={self.batch_size} a rank's batches come "
                    "from other ranks' lanes too, so every rank reads more than its share (the "
                    "order is the same); a world size dividing lanes, with batch_size = "
                    "lane_chunk, reads 1/world_size",
                    stacklevel=3,
                )
        self._dataset = dataset
        self._window_rows = window_rows
        self._layout = _forebay.RsTrainingLayout(dataset._inner, block_rows)
        self.block_rows = int(self._layout.block_rows())
        if window_rows is None:
            self.window_blocks = _forebay.TRAINING_WINDOW_BLOCKS
            if self.lanes is not None:
                # A rank holds a window per lane it takes from, and two more (the next one
                # read and its permuted copy): a world of one then holds what three windows
                # of the default hold without lanes, a larger world less.
                self.window_blocks = max(4, 3 * self.window_blocks // (self.lanes + 2))
        else:
            # Blocks at the ends of row groups are shorter: count by the average block, so
            # that window_rows >= the dataset's rows makes one window (a uniform shuffle).
            rows, blocks = self._layout.rows(), self._layout.blocks()
            self.window_blocks = max(1, -(-window_rows * blocks // max(rows, 1)))
        self.epoch = 0
        self._consumed = 0

    @property
    def lane_chunk(self) -> int | None:
        """Samples a lane gives at a time (None without lanes)."""
        return None if self._lanes is None else self._lanes[1]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickles as its dataset (a ``read_parquet`` call), settings and position: a loader's
        worker process rebuilds it (and reads the footers again)."""
        settings = {
            "seed": self.seed,
            "world_size": self.world_size,
            "rank": self.rank,
            "remainder": self.remainder,
            "window_rows": self._window_rows,
            "block_rows": self._block_rows_given,
            "lanes": self.lanes,
            "lane_chunk": self._lane_chunk_given,
        }
        return _rebuild, (self._dataset, self.batch_size, settings, self.epoch, self._consumed)

    # ------------------------------------------------------------------ where it is

    @property
    def rows(self) -> int:
        """Samples in an epoch (the dataset's rows)."""
        return int(self._layout.rows())

    @property
    def consumed(self) -> int:
        """Samples of the current epoch all ranks together have taken."""
        return self._consumed

    def batches_per_epoch(self) -> int:
        """Batches each rank gets in a whole epoch (the same for every rank)."""
        return self._rank_batches(0)

    def __len__(self) -> int:
        """Batches this rank has left in the current epoch."""
        return self._rank_batches(self._consumed)

    def _rank_batches(self, consumed: int) -> int:
        left = max(0, self.rows - consumed)
        step = self.world_size * self.batch_size
        return -(-left // step) if self.remainder == "pad" else left // step

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch`` (as ``DistributedSampler.set_epoch``)."""
        self.epoch = integer("epoch", epoch, minimum=0)
        self._consumed = 0

    def state_dict(self) -> dict[str, Any]:
        """Where the stream is: a small dict of numbers and strings (JSON-able), the same on
        every rank at the same step. Save it next to the model's checkpoint."""
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "consumed": self._consumed,
            "seed": self.seed,
            "block_rows": self.block_rows,
            "window_blocks": self.window_blocks,
            "lanes": self.lanes,
            "lane_chunk": self.lane_chunk,
            "dataset_rows": self.rows,
            "dataset_fingerprint": self._layout.fingerprint(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` (from :meth:`state_dict`, on any rank, with any world
        size) was. The order-defining settings must be the ones the state was saved with:
        a clear error names one that differs, or a dataset that changed."""
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"not a training stream state (expected format {STATE_FORMAT!r}): {state!r}"
            )
        for key, mine in (
            ("seed", self.seed),
            ("block_rows", self.block_rows),
            ("lanes", self.lanes),
            ("lane_chunk", self.lane_chunk),
            ("window_blocks", self.window_blocks),
        ):
            # States saved before lanes existed have no "lanes" (and were saved without).
            if state.get(key) != mine:
                raise ValueError(
                    f"the state was saved with {key}={state.get(key)!r}, this stream has "
                    f"{key}={mine!r}: the order would differ; make the stream with the same "
                    "seed, block_rows, window_rows, lanes and lane_chunk"
                )
        fingerprint = self._layout.fingerprint()
        if (
            state.get("dataset_fingerprint") != fingerprint
            or state.get("dataset_rows") != self.rows
        ):
            raise ValueError(
                f"the dataset changed since the state was saved ({state.get('dataset_rows')} "
                f"rows, fingerprint {state.get('dataset_fingerprint')}; now {self.rows} rows, "
                f"{fingerprint}): files were added, removed or rewritten"
            )
        epoch = integer("state['epoch']", state.get("epoch"), minimum=0)
        consumed = integer("state['consumed']", state.get("consumed"), minimum=0)
        self.epoch, self._consumed = epoch, consumed
        if consumed >= self.rows:  # saved after the last step of an epoch
            self.epoch, self._consumed = epoch + 1, 0

    # ------------------------------------------------------------------ reading

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        step = self.world_size * self.batch_size
        start = self._consumed
        epoch_stream = self._epoch_stream(self.epoch, start, worker=0, workers=1)
        yielded = 0
        try:
            for batch in epoch_stream:
                yielded += 1
                self._consumed = start + yielded * step
                yield batch
        finally:
            epoch_stream.close()
        self.epoch, self._consumed = self.epoch + 1, 0

    def iter_worker(self, worker: int, workers: int) -> Iterator[pa.RecordBatch]:
        """This rank's batches ``worker``, ``worker + workers``, ... of the current epoch from
        the current position: what loader worker ``worker`` of ``workers`` yields (a torch
        ``DataLoader`` takes its workers' batches round-robin, so the rank sees them in
        order). Does not move the stream: the loader counts what it delivers."""
        workers = integer("workers", workers, minimum=1)
        worker = integer("worker", worker, minimum=0)
        if worker >= workers:
            raise ValueError(f"worker {worker} is not below workers {workers}")
        stream = self._epoch_stream(self.epoch, self._consumed, worker=worker, workers=workers)
        try:
            yield from stream
        finally:
            stream.close()

    def advance(self, batches: int) -> None:
        """Move the position by ``batches`` batches of this rank (every rank moving in step),
        to the next epoch after the last: what a loader that delivered them calls."""
        batches = integer("batches", batches, minimum=0)
        left = len(self)
        if batches > left:
            raise ValueError(f"{batches} batches delivered, only {left} were left in the epoch")
        if batches == left:
            self.epoch, self._consumed = self.epoch + 1, 0
        else:
            self._consumed += batches * self.world_size * self.batch_size

    def _source_reader(self, epoch: int, first_batch: int) -> _forebay.RsEpochStream:
        """Every full batch of ``epoch`` from batch ``first_batch`` on, as the one rank of a
        world of one would read them (what a mix draws from)."""
        return self._epoch_stream(epoch, first_batch * self.batch_size, single_rank=True)

    def _epoch_stream(
        self,
        epoch: int,
        consumed: int,
        *,
        worker: int = 0,
        workers: int = 1,
        single_rank: bool = False,
    ) -> _forebay.RsEpochStream:
        world_size, rank, pad = (
            (1, 0, False) if single_rank else (self.world_size, self.rank, self.remainder == "pad")
        )
        return self._layout.epoch(
            epoch,
            self.seed,
            self.window_blocks,
            self._lanes,
            world_size,
            rank,
            workers,
            worker,
            self.batch_size,
            pad,
            consumed,
            _config.settings()["memory_limit"],
        )

    def __repr__(self) -> str:
        return (
            f"TrainingStream(rows={self.rows}, batch_size={self.batch_size}, seed={self.seed}, "
            f"rank={self.rank}/{self.world_size}, epoch={self.epoch}, consumed={self._consumed})"
        )


def _rebuild(
    dataset: Dataset, batch_size: int, settings: dict[str, Any], epoch: int, consumed: int
) -> TrainingStream:
    stream = TrainingStream(dataset, batch_size, **settings)
    stream.epoch, stream._consumed = epoch, consumed
    return stream
