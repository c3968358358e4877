"""``forebay.configure``: defaults for every pipeline run in this process."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from . import _devices
from ._args import integer
from ._store import parse_size

log = logging.getLogger("forebay")


def _default_memory_limit() -> int:
    """A quarter of the machine's memory (at least 256 MiB)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return max(total // 4, 256 << 20)


_config: dict[str, Any] = {
    "memory_limit": _default_memory_limit(),
    "num_threads": os.cpu_count() or 1,
    "spill_dir": None,
    "progress": True,
    # Devices for map_batches(num_gpus=...); None: detected (see _devices) when first needed.
    "gpus": None,
}


def configure(
    *,
    memory_limit: int | str | None = None,
    num_threads: int | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    gpus: int | Sequence[str | int] | None = None,
) -> dict[str, Any]:
    """Set defaults for pipeline runs; returns the settings now in force.

    memory_limit: hard cap on the memory one run adds to this process (bytes, or a size
        such as ``"4GiB"``); default a quarter of the machine's memory. It covers the batches
        in flight and what the process holds beyond them (decoder pages, the allocator's
        retention, objects a function allocates), except that the batches always get a
        quarter of it. The source waits when the cap is reached; batches a run must hold
        beyond it go to disk.
    num_threads: default ``concurrency`` of ``map_batches(compute="threads")``, of
        ``compute="processes"`` and of ``write_parquet``; default the number of cores.
    spill_dir: where held batches are spilled (default: the system temp directory).
    progress: draw a progress bar on stderr during long runs (only when stderr is a
        terminal). Default True.
    gpus: the devices ``map_batches(num_gpus=...)`` hands to its workers: a count (devices
        0..n-1) or a list of device ids. Default: this process's ``CUDA_VISIBLE_DEVICES``,
        else what ``nvidia-smi -L`` lists.
    Arguments left as ``None`` keep their current value.
    """
    if memory_limit is not None:
        _config["memory_limit"] = parse_size(memory_limit)
    if num_threads is not None:
        _config["num_threads"] = integer("num_threads", num_threads, minimum=1)
    if spill_dir is not None:
        _config["spill_dir"] = os.fspath(spill_dir)
    if progress is not None:
        _config["progress"] = bool(progress)
    if gpus is not None:
        _config["gpus"] = _devices.normalize(gpus)
    return dict(_config)


def gpus() -> list[str]:
    """The devices for ``num_gpus`` workers: configured, else detected."""
    configured = _config["gpus"]
    return list(configured) if configured is not None else _devices.detected()


def settings() -> dict[str, Any]:
    return dict(_config)


def log_events(events: list[tuple[str, str]]) -> None:
    for level, message in events:
        getattr(log, level, log.info)(message)
