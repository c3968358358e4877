"""GPUs for ``map_batches(compute="processes", num_gpus=...)``: which devices this machine
offers, and which of them each worker process sees.

A worker sees only its devices through ``CUDA_VISIBLE_DEVICES`` (CUDA numbers them from 0
inside the worker, as Ray does). Worker ``i`` of a stage always gets the same devices, and so
does the worker that replaces it after it died (the engine keeps the environment per worker
slot), so a model pinned to a device is reloaded on the device it had::

    devices = ["0", "1", "2", "3"]
    num_gpus=1,   concurrency=4  ->  worker 0: "0", 1: "1", 2: "2", 3: "3"
    num_gpus=2,   concurrency=2  ->  worker 0: "0,1", 1: "2,3"
    num_gpus=0.5, concurrency=8  ->  workers 0, 1: "0"; 2, 3: "1"; ...

The devices are ``forebay.configure(gpus=...)`` when set, else the ``CUDA_VISIBLE_DEVICES``
this process was started with, else those ``nvidia-smi -L`` lists.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Sequence


def detected() -> list[str]:
    """The devices this process may use: its ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``'s
    list, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listing.returncode != 0:
        return []
    return [str(i) for i, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU")]


def normalize(gpus: int | Sequence[str | int]) -> list[str]:
    """``configure(gpus=...)``: a count (devices 0..n-1) or the device ids."""
    if isinstance(gpus, bool):
        raise TypeError("gpus must be a number of devices or a list of device ids, not a bool")
    if isinstance(gpus, int):
        if gpus < 0:
            raise ValueError(f"gpus must be at least 0, not {gpus}")
        return [str(i) for i in range(gpus)]
    if isinstance(gpus, str):
        raise TypeError('gpus must be a list of device ids, e.g. ["0", "1"], not a string')
    devices = [str(d).strip() for d in gpus]
    if any(not d or "," in d for d in devices):
        raise ValueError(f"gpus: each device id must be one non-empty id, got {list(gpus)!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"gpus: a device is listed twice in {devices!r}")
    return devices


def check_num_gpus(num_gpus: float) -> float:
    """A whole number of devices per worker, or a fraction 1/k of one (k workers share it)."""
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int | float):
        raise TypeError(f"num_gpus must be a number, not {type(num_gpus).__name__}")
    if not math.isfinite(num_gpus) or num_gpus <= 0:
        raise ValueError(f"num_gpus must be more than 0, not {num_gpus}")
    if num_gpus >= 1 and num_gpus != int(num_gpus):
        raise ValueError(f"num_gpus above 1 must be a whole number of devices, not {num_gpus}")
    if num_gpus < 1 and abs(1 / num_gpus - round(1 / num_gpus)) > 1e-9:
        raise ValueError(
            f"num_gpus below 1 must be a fraction 1/k of a device (0.5, 0.25, ...), not {num_gpus}"
        )
    return float(num_gpus)


def workers_fit(num_gpus: float, devices: Sequence[str]) -> int:
    """How many workers of ``num_gpus`` each the devices hold."""
    if num_gpus >= 1:
        return len(devices) // int(num_gpus)
    return len(devices) * round(1 / num_gpus)


def assign(num_gpus: float, workers: int, devices: Sequence[str]) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each of ``workers`` workers (see the module's picture)."""
    if not devices:
        raise ValueError(
            f"map_batches(num_gpus={num_gpus:g}): no GPU found; name the devices with "
            f"forebay.configure(gpus=[...]) or CUDA_VISIBLE_DEVICES"
        )
    room = workers_fit(num_gpus, devices)
    if workers > room:
        raise ValueError(
            f"map_batches(num_gpus={num_gpus:g}, concurrency={workers}): {workers} workers "
            f"need {workers * num_gpus:g} devices, and {len(devices)} are available "
            f"({', '.join(devices)}); at most concurrency={room}"
        )
    if num_gpus >= 1:
        per = int(num_gpus)
        return [",".join(devices[i * per : (i + 1) * per]) for i in range(workers)]
    sharing = round(1 / num_gpus)
    return [devices[i // sharing] for i in range(workers)]
