"""GPU workers without a GPU: ``map_batches(compute="processes", num_gpus=...)`` over a fake
device list. Each worker process must see exactly its devices in ``CUDA_VISIBLE_DEVICES``,
distinct from the others', and a worker SIGKILLed mid-batch is replaced on the same ones."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay
from forebay import _config

ROWS = 8_000


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS)}), path, row_group_size=1_000)
    return path


@pytest.fixture
def fake_gpus():
    """Four devices named as a scheduler might hand them out."""
    before = _config.settings()["gpus"]
    forebay.configure(gpus=["3", "5", "6", "7"])
    yield ["3", "5", "6", "7"]
    _config._config["gpus"] = before


def who_am_i(batch):
    n = len(batch["id"])
    return {
        "id": batch["id"],
        "pid": np.full(n, os.getpid()),
        "devices": [os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")] * n,
    }


def run(ds) -> pa.Table:
    return pa.concat_tables(list(ds.iter_batches(batch_size=None)))


def test_each_of_four_workers_sees_exactly_one_distinct_device(data, fake_gpus):
    ds = forebay.read_parquet(str(data)).map_batches(
        who_am_i, batch_format="numpy", batch_size=100, compute="processes", num_gpus=1
    )
    out = run(ds)
    assert sorted(out["id"].to_pylist()) == list(range(ROWS))
    seen: dict[int, set[str]] = {}
    for pid, devices in zip(out["pid"].to_pylist(), out["devices"].to_pylist(), strict=True):
        seen.setdefault(pid, set()).add(devices)
    assert all(len(d) == 1 for d in seen.values()), seen
    per_worker = [next(iter(d)) for d in seen.values()]
    assert len(per_worker) == len(set(per_worker)), f"two workers share a device: {seen}"
    assert set(per_worker) <= set(fake_gpus)
    assert len(seen) <= 4  # concurrency defaults to what the devices hold


def test_a_killed_worker_is_replaced_on_the_same_device(data, fake_gpus, tmp_path):
    marker = tmp_path / "killed"

    def dies_once(batch):
        device = os.environ["CUDA_VISIBLE_DEVICES"]
        # Each worker holds its first batch until every device's worker has one: otherwise
        # the workers started first could finish the job before the one on "6" gets a batch
        # to die on.
        (tmp_path / f"started-{device}").touch()
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started-*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        # The worker on device "6" dies (SIGKILL, as an OOM kill) on its first batch.
        if device == "6" and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return who_am_i(batch)

    ds = forebay.read_parquet(str(data)).map_batches(
        dies_once,
        batch_format="numpy",
        batch_size=100,
        compute="processes",
        num_gpus=1,
        concurrency=4,
        max_retries=1,
    )
    out = run(ds)
    assert sorted(out["id"].to_pylist()) == list(range(ROWS)), "the retried batch is not lost"
    assert marker.exists(), "the worker on device 6 never got a batch"
    dead = int(marker.read_text())
    on_six = {
        p
        for p, d in zip(out["pid"].to_pylist(), out["devices"].to_pylist(), strict=True)
        if d == "6"
    }
    assert on_six and dead not in on_six, "a new process took over device 6"
    by_pid: dict[int, set[str]] = {}
    for p, d in zip(out["pid"].to_pylist(), out["devices"].to_pylist(), strict=True):
        by_pid.setdefault(p, set()).add(d)
    assert all(len(d) == 1 for d in by_pid.values()), by_pid
    # Still one process per device at any time: the replacement is the only one on "6".
    assert len(on_six) == 1


@pytest.mark.parametrize(
    ("num_gpus", "concurrency", "expected"),
    [
        (2, None, {"3,5", "6,7"}),
        (0.5, 8, {"3", "5", "6", "7"}),
    ],
)
def test_several_devices_per_worker_and_workers_sharing_a_device(
    data, fake_gpus, num_gpus, concurrency, expected
):
    ds = forebay.read_parquet(str(data)).map_batches(
        who_am_i,
        batch_format="numpy",
        batch_size=100,
        compute="processes",
        num_gpus=num_gpus,
        concurrency=concurrency,
    )
    out = run(ds)
    assert set(out["devices"].to_pylist()) <= expected
    by_device: dict[str, set[int]] = {}
    for p, d in zip(out["pid"].to_pylist(), out["devices"].to_pylist(), strict=True):
        by_device.setdefault(d, set()).add(p)
    limit = 1 if num_gpus >= 1 else round(1 / num_gpus)
    assert all(len(p) <= limit for p in by_device.values()), by_device


def test_without_num_gpus_workers_inherit_the_environment(data, fake_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "9")
    ds = forebay.read_parquet(str(data)).map_batches(
        who_am_i, batch_format="numpy", compute="processes", concurrency=2
    )
    assert set(run(ds)["devices"].to_pylist()) == {"9"}


def test_devices_are_detected_from_cuda_visible_devices(data, monkeypatch):
    monkeypatch.setitem(_config._config, "gpus", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,4")
    ds = forebay.read_parquet(str(data)).map_batches(
        who_am_i, batch_format="numpy", batch_size=500, compute="processes", num_gpus=1
    )
    assert set(run(ds)["devices"].to_pylist()) <= {"1", "4"}


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"num_gpus": 1}, ValueError, "needs compute='processes'"),
        (
            {"num_gpus": 1, "compute": "processes", "concurrency": 5},
            ValueError,
            "at most concurrency=4",
        ),
        ({"num_gpus": 0, "compute": "processes"}, ValueError, "more than 0"),
        ({"num_gpus": 1.5, "compute": "processes"}, ValueError, "whole number"),
        ({"num_gpus": 0.3, "compute": "processes"}, ValueError, "fraction 1/k"),
        ({"num_gpus": "1", "compute": "processes"}, TypeError, "must be a number"),
    ],
)
def test_wrong_gpu_arguments_are_clear_errors(data, fake_gpus, kwargs, error, message):
    with pytest.raises(error, match=message):
        forebay.read_parquet(str(data)).map_batches(who_am_i, **kwargs)


def test_no_device_at_all_is_a_clear_error(data, monkeypatch):
    monkeypatch.setitem(_config._config, "gpus", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"no GPU found.*configure\(gpus="):
        forebay.read_parquet(str(data)).map_batches(who_am_i, compute="processes", num_gpus=1)


@pytest.mark.parametrize(
    ("gpus", "error"), [(["0", "0"], ValueError), ("0,1", TypeError), (-1, ValueError)]
)
def test_wrong_configured_devices_are_refused(gpus, error):
    with pytest.raises(error):
        forebay.configure(gpus=gpus)
