"""``forebay.mix``: training streams of several datasets drawn by weight (70 % web, 30 %
code), as exactly resumable as one stream.

    >>> web = forebay.read_parquet("web/").training_stream(256, seed=1)
    >>> code = forebay.read_parquet("code/").training_stream(256, seed=2)
    >>> mixed = forebay.mix([web, code], weights=[0.7, 0.3], seed=3)
    >>> for batch in itertools.islice(mixed, steps):   # endless: each source loops its epochs
    ...     train(batch)

The mixed sequence is a sequence of whole batches: global batch ``g`` is the next batch of
source ``s(g)``, drawn with the weights from a hash of (seed, g) alone. Step ``t`` deals
global batches ``t * world_size + rank``, so the sequence does not depend on the world
size, and the state is (g, how many batches each source gave): a resume with another world
size delivers, across its ranks, exactly the rest of the sequence (its steps count from
where the state was: step ``t`` after it deals ``g0 + t * world_size + rank``). Source ``s``'s ``k``-th
batch is batch ``k mod n_s`` of its epoch ``k div n_s`` (``n_s``: full batches in an epoch of
that source; its remainder is dropped). Every rank reads each source's windows (as a single
stream does) and keeps its own batches; one stream per source is open at a time, so memory
is the sources' windows together.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ._args import integer
from ._training import TrainingStream

MIX_STATE_FORMAT = "forebay.mix/1"
_CHUNK = 4096  # sources drawn at a time


def _draws(seed: int, first: int, count: int, cumulative: np.ndarray) -> np.ndarray:
    """Sources of global batches ``first .. first + count``: splitmix64 of (seed, g) as a
    uniform number in [0, 1), placed in the cumulative weights (a specification: the same
    numbers on every machine and version)."""
    with np.errstate(over="ignore"):
        # splitmix64's output number g + 1 from state ``seed``.
        g = np.arange(first + 1, first + count + 1, dtype=np.uint64)
        x = np.uint64(seed) + g * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    u = (x >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return np.minimum(np.searchsorted(cumulative, u, side="right"), len(cumulative) - 1)


def _check_same_columns(streams: Sequence[TrainingStream]) -> None:
    """A training loop gets batches of one schema: every source's columns and types are the
    first's (a clear error naming the source and the columns, not a batch that surprises
    the model later)."""
    first = streams[0]._dataset.schema
    for k, s in enumerate(streams[1:], start=1):
        schema = s._dataset.schema
        if schema.names != first.names or schema.types != first.types:
            mine = dict(zip(first.names, map(str, first.types), strict=True))
            theirs = dict(zip(schema.names, map(str, schema.types), strict=True))
            differ = sorted(
                f"{name}: {mine.get(name, 'missing')} / {theirs.get(name, 'missing')}"
                for name in mine.keys() | theirs.keys()
                if mine.get(name) != theirs.get(name)
            ) or [f"column order {first.names} / {schema.names}"]
            raise ValueError(
                f"the streams of a mix need the same columns and types: source {k} differs "
                f"from source 0 ({'; '.join(differ)}); select or cast the columns "
                "(read_parquet(columns=...), map_batches) so that they agree"
            )


class MixedStream:
    """Batches of several :class:`forebay.TrainingStream` drawn by weight (made by
    :func:`forebay.mix`). Endless: each source starts its next epoch when one ends.
    ``state_dict()`` / ``load_state_dict()`` as a stream's (any world size)."""

    def __init__(
        self, streams: Sequence[TrainingStream], weights: Sequence[float], seed: int
    ) -> None:
        """See :func:`forebay.mix` (``streams``, ``weights``, ``seed``)."""
        streams = list(streams)
        if not streams or len(streams) != len(weights):
            raise ValueError("pass one weight per stream, and at least one stream")
        first = streams[0]
        for s in streams:
            if not isinstance(s, TrainingStream):
                raise TypeError(f"mix takes training streams, not {type(s).__name__}")
            if (s.batch_size, s.world_size, s.rank) != (
                first.batch_size,
                first.world_size,
                first.rank,
            ):
                raise ValueError(
                    "the streams of a mix need the same batch_size, world_size and rank"
                )
            if s.rows < s.batch_size:
                raise ValueError(f"{s!r} has not one full batch: nothing to draw from it")
        _check_same_columns(streams)
        w = np.array([float(x) for x in weights])
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"weights must be non-negative numbers, not all 0: {list(weights)}")
        self.streams = streams
        self.weights = [float(x) for x in weights]
        self.seed = integer("seed", seed, minimum=0)
        if self.seed >= 2**64:
            raise ValueError(f"seed must be below 2**64, not {self.seed}")
        self._cumulative = np.cumsum(w / w.sum())
        self.batch_size = first.batch_size
        self.world_size, self.rank = first.world_size, first.rank
        self._consumed = 0  # global batches all ranks together took
        self._counts = [0] * len(streams)  # of them, how many each source gave

    def state_dict(self) -> dict[str, Any]:
        """Where the mix is (the same on every rank at the same step): global batches taken,
        how many came from each source, and what defines the draws and the sources' orders."""
        return {
            "format": MIX_STATE_FORMAT,
            "seed": self.seed,
            "weights": self.weights,
            "consumed": self._consumed,
            "counts": list(self._counts),
            "sources": [
                {k: v for k, v in s.state_dict().items() if k not in ("epoch", "consumed")}
                for s in self.streams
            ],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` was, with any world size; the sources, weights and seed
        must be the ones it was saved with (a clear error names what differs)."""
        if not isinstance(state, Mapping) or state.get("format") != MIX_STATE_FORMAT:
            raise ValueError(f"not a mix state (expected format {MIX_STATE_FORMAT!r}): {state!r}")
        mine = self.state_dict()
        for key in ("seed", "weights", "sources"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"the mix state was saved with other {key} ({state.get(key)!r}; this mix "
                    f"has {mine[key]!r}): the sequence would differ"
                )
        consumed = integer("state['consumed']", state.get("consumed"), minimum=0)
        counts = [integer("state['counts']", c, minimum=0) for c in state.get("counts", [])]
        if len(counts) != len(self.streams) or sum(counts) != consumed:
            raise ValueError(f"inconsistent mix state: counts {counts}, consumed {consumed}")
        self._consumed, self._counts = consumed, counts

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        world, rank = self.world_size, self.rank
        readers: dict[int, _SourceReader] = {}
        try:
            while True:
                g = self._consumed
                sources = _draws(self.seed, g, _CHUNK * world, self._cumulative).tolist()
                for step in range(_CHUNK):
                    counts = list(self._counts)
                    s, k = sources[step * world + rank], 0
                    for i in range(step * world, (step + 1) * world):
                        if i == step * world + rank:
                            k = counts[sources[i]]
                        counts[sources[i]] += 1
                    reader = readers.get(s)
                    if reader is None or not reader.can_reach(k):
                        if reader is not None:
                            reader.close()
                        reader = readers[s] = _SourceReader(self.streams[s], k)
                    batch = reader.take(k)
                    # The step is taken (by every rank): the state moves past it.
                    self._consumed, self._counts = g + (step + 1) * world, counts
                    yield batch
        finally:
            for reader in readers.values():
                reader.close()

    def __repr__(self) -> str:
        return (
            f"MixedStream(weights={self.weights}, seed={self.seed}, rank={self.rank}/"
            f"{self.world_size}, consumed={self._consumed}, counts={self._counts})"
        )


class _SourceReader:
    """Source batches ``k, k+1, ...`` of one stream's endless sequence (its epochs one after
    another, each cut into full batches), read by one rank, skipping what it does not take."""

    def __init__(self, stream: TrainingStream, k: int) -> None:
        self.stream = stream
        self.per_epoch = stream.rows // stream.batch_size
        self.epoch, self.next = divmod(k, self.per_epoch)
        self.reader = stream._source_reader(self.epoch, self.next)

    def can_reach(self, k: int) -> bool:
        epoch, j = divmod(k, self.per_epoch)
        return epoch == self.epoch and j >= self.next

    def take(self, k: int) -> pa.RecordBatch:
        _, j = divmod(k, self.per_epoch)
        while self.next < j:  # another rank's batch of this source: read past it
            next(self.reader)
            self.next += 1
        self.next += 1
        return next(self.reader)

    def close(self) -> None:
        self.reader.close()


def mix(
    streams: Sequence[TrainingStream], weights: Sequence[float], *, seed: int = 0
) -> MixedStream:
    """Draw batches from ``streams`` (training streams of the same ``batch_size``,
    ``world_size`` and ``rank``) with probabilities proportional to ``weights``; ``seed``
    fixes the draws. Each batch comes whole from one source. See :class:`MixedStream`."""
    return MixedStream(streams, weights, seed)
