"""``forebay.SpillArea``: the Python face of forebay-spill, for tests and benchmarks.

Spill rounds of objects (lists of bytes-like buffers) into checksummed spill files and
restore them (copied back, or mapped read-only as pyarrow arrays over the file).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import _forebay
from ._forebay import RsRemoteSpillLocation, RsSpillLocation


def _round(
    objects: Iterable[Sequence[bytes]], ids: Iterable[int] | None
) -> list[tuple[int, list[bytes]]]:
    """A spill round as the binding takes it: ``[(id, [bytes, ...]), ...]``; ids default to
    the objects' positions."""
    buffers = [[bytes(b) for b in obj] for obj in objects]
    id_list = list(ids) if ids is not None else list(range(len(buffers)))
    if len(id_list) != len(buffers):
        raise ValueError(f"{len(id_list)} ids for {len(buffers)} objects")
    return list(zip(id_list, buffers, strict=True))


class SpillArea:
    """Spill directories plus a small pool of I/O threads.

    ``sync`` is ``"none"`` (page cache only), ``"file"`` (fdatasync per spill file) or
    ``"object"`` (fdatasync per object). Files left by crashed processes in the directories
    are removed when the area opens. A spill file is deleted once all its objects are freed.

    directories: where spill files go (one path or several, e.g. one per disk).
    io_threads: threads writing and reading spill files.
    queue_depth: rounds waiting for an I/O thread before ``spill`` blocks (backpressure).
    choose_by_free_space: put each new file in the directory with the most free space
        (default: round robin).
    """

    def __init__(
        self,
        directories: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        sync: str = "none",
        io_threads: int = 2,
        queue_depth: int = 4,
        choose_by_free_space: bool = False,
    ):
        if isinstance(directories, (str, os.PathLike)):
            directories = [directories]
        self._inner = _forebay.RsSpillArea(
            [os.fspath(d) for d in directories], sync, io_threads, queue_depth, choose_by_free_space
        )

    def spill(
        self, objects: Iterable[Sequence[bytes]], *, ids: Iterable[int] | None = None
    ) -> list[RsSpillLocation]:
        """Spill a round of objects (each a list of bytes-like buffers) into one new file.

        ``ids`` name the objects (default: their positions). Returns one location per object;
        keep it to restore, call ``.free()`` to release."""
        return self._inner.spill(_round(objects, ids))

    def restore(self, location: RsSpillLocation) -> list[bytes]:
        """The buffers of the object at ``location`` as ``bytes`` (read with preadv, checksum
        verified)."""
        return self._inner.restore(location)

    def restore_mapped(self, location: RsSpillLocation) -> list[Any]:
        """The buffers of the object at ``location`` as pyarrow UInt8Arrays over a read-only
        mapping (zero copy)."""
        return self._inner.restore_mapped(location)

    def stats(self) -> dict[str, int]:
        return self._inner.stats()


class RemoteSpillTarget:
    """Spill rounds to S3-like storage (``s3://``, ``gs://``, ``az://``, ``file://``,
    ``memory://``) with the same checksummed object format as :class:`SpillArea`.

    One remote object per round: a single PUT up to ``part_size`` bytes, otherwise a
    multipart upload of ``part_size`` parts (S3 needs at least 5 MiB), ``parts_in_flight`` at
    a time; a failed upload is aborted. ``spill`` blocks while ``rounds_in_flight`` rounds
    are uploading. A round's remote object is deleted once all its locations are freed; the
    directories of dead processes of this host under ``uri`` are removed when a target opens.
    ``storage_options`` are object_store options (as in :func:`forebay.read_parquet`).
    """

    def __init__(
        self,
        uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        part_size: int = 16 << 20,
        parts_in_flight: int = 4,
        rounds_in_flight: int = 2,
    ):
        self._inner = _forebay.RsRemoteSpillTarget(
            str(uri), storage_options, int(part_size), int(parts_in_flight), int(rounds_in_flight)
        )

    @property
    def root_uri(self) -> str:
        """The directory this target's rounds go to: ``<uri>/<pid>-<nonce>-<host>``."""
        return self._inner.root_uri()

    def spill(
        self, objects: Iterable[Sequence[bytes]], *, ids: Iterable[int] | None = None
    ) -> list[RsRemoteSpillLocation]:
        """Upload a round of objects (each a list of bytes-like buffers) as one remote object.

        ``ids`` name the objects (default: their positions). Returns one location per object;
        keep it to restore, call ``.free()`` to release."""
        return self._inner.spill(_round(objects, ids))

    def restore(self, location: RsRemoteSpillLocation) -> list[bytes]:
        """The buffers of the object at ``location`` as ``bytes`` (one ranged GET, checksum
        verified)."""
        return self._inner.restore(location)

    def wait_for_deletes(self, timeout: float = 30.0) -> bool:
        """Wait up to ``timeout`` seconds until the remote objects of freed rounds are deleted;
        returns whether they all were."""
        return self._inner.wait_for_deletes(float(timeout))

    def stats(self) -> dict[str, int]:
        return self._inner.stats()
