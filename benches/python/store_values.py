"""Any Python value in forebay.ObjectStore against pickle protocol 5 and Ray's object store,
in one run, methods alternated round by round, medians over all calls.

1. A dict of 10 numpy arrays of 10 MB: put and get (in this process and in another
   attached process), against ``pickle.dumps``/``loads`` (protocol 5, in band),
   ``ray.put``/``ray.get`` under ``ray.init(num_cpus=1)`` and a memcpy of the same bytes
   into memory already faulted in (forebay's puts are each followed by an untimed delete,
   so its arena is in the same steady state). The other process's private memory (RssAnon)
   before and after its get, arrays read through.
2. A list of 100,000 small Python objects (tuples of an int, a str and a float): put and
   get against pickle and Ray.
3. A 1 GB numpy weight given as a constructor argument to 2 worker processes of
   ``map_batches(compute="processes")``, each worker reading all of it: the peak rise of
   system-wide used memory (MemTotal - MemAvailable) and of shared memory (Shmem), sampled
   every 10 ms during the run,
   with the weight shared through the store and with it pickled into each worker's INIT
   (the old path, forced by raising ``forebay._worker.SHARED_SPEC_MIN``), alternated.

    .venv/bin/python benches/python/store_values.py [--rounds 5] [--no-ray] [--no-weights]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import pickle
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import forebay


def timed(fn) -> float:
    t = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t) / 1e3  # µs


def rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def _cross_process_child(path, ref, calls, out):
    store = forebay.ObjectStore.attach(path)
    before = rss_anon_kib()
    value = store.get(ref)
    total = sum(float(a.sum()) for a in value.values())  # read every page
    grew = rss_anon_kib() - before
    del value
    samples = [timed(lambda: store.get(ref)) for _ in range(calls)]
    out.put((statistics.median(samples), grew, total))


def compare(name, value, store, ray, rounds, calls, memcpy=None):
    """Median µs of put and get per method."""
    ref = store.put(value)
    blob = pickle.dumps(value, protocol=5)
    rref = ray.put(value) if ray else None
    puts = {"forebay": None, "pickle5": lambda: pickle.dumps(value, protocol=5)}
    gets = {"forebay": lambda: store.get(ref), "pickle5": lambda: pickle.loads(blob)}
    if ray:
        puts["ray"] = lambda: ray.put(value)
        gets["ray"] = lambda: ray.get(rref)
    if memcpy:
        puts["memcpy"] = memcpy
    samples = {(op, m): [] for op, ms in (("put", puts), ("get", gets)) for m in ms}

    def forebay_put():
        t = time.perf_counter_ns()
        r = store.put(value)
        elapsed = (time.perf_counter_ns() - t) / 1e3
        store.delete(r)
        return elapsed

    forebay_put()
    for f in gets.values():
        f()
    gc.disable()
    try:
        for _ in range(rounds):
            for m, f in puts.items():
                for _ in range(calls):
                    samples[("put", m)].append(forebay_put() if f is None else timed(f))
            for m, f in gets.items():
                for _ in range(calls):
                    samples[("get", m)].append(timed(f))
    finally:
        gc.enable()
    medians = {k: statistics.median(v) for k, v in samples.items()}
    print(f"\n## {name}: median µs (ratio = peer / forebay; > 1 means forebay faster)\n")
    peers = [m for m in ("pickle5", "ray", "memcpy") if m in puts]
    print("| op | forebay | " + " | ".join(peers) + " |")
    print("|---|---:|" + "---:|" * len(peers))
    for op in ("put", "get"):
        f = medians[(op, "forebay")]
        cells = []
        for m in peers:
            v = medians.get((op, m))
            cells.append("" if v is None else f"{v:,.1f} ({v / f:.2f}x)")
        print(f"| {op} | {f:,.1f} | " + " | ".join(cells) + " |")
    return ref, medians


def meminfo() -> dict[str, int]:
    fields = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            fields[k] = int(v.split()[0]) * 1024
    return fields


def used_and_shared() -> tuple[int, int]:
    """System-wide used memory (MemTotal - MemAvailable) and shared memory (Shmem)."""
    f = meminfo()
    return f["MemTotal"] - f["MemAvailable"], f["Shmem"]


class Model:
    def __init__(self, weight):
        self.weight = weight
        self.checksum = float(weight.sum())  # reads every page, as loading a model does

    def __call__(self, batch):
        return {"x": batch["x"] * 2.0, "c": np.full(len(batch["x"]), self.checksum)}


def weights_run(path: str, weight: np.ndarray, shared: bool) -> tuple[int, int]:
    """Peak rise (bytes) of system-wide used memory and of shared memory during one run of
    2 workers given ``weight``."""
    import forebay._worker as worker

    worker.SHARED_SPEC_MIN = (1 << 20) if shared else (1 << 62)
    gc.collect()
    time.sleep(2.0)  # the last run's workers and pages gone
    base = used_and_shared()
    peak = list(base)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            now = used_and_shared()
            peak[0], peak[1] = max(peak[0], now[0]), max(peak[1], now[1])
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        ds = forebay.read_parquet(path).map_batches(
            Model,
            fn_constructor_args=(weight,),
            compute="processes",
            concurrency=2,
            batch_format="numpy",
        )
        rows = sum(b.num_rows for b in ds.iter_batches())
        assert rows == 200_000, rows
        del ds
        gc.collect()
    finally:
        stop.set()
        sampler.join()
    return peak[0] - base[0], peak[1] - base[1]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-weights", action="store_true")
    args = ap.parse_args()
    ray = None
    if not args.no_ray:
        import ray

        ray.init(
            num_cpus=1, include_dashboard=False, logging_level="ERROR", object_store_memory=1 << 30
        )
    store = forebay.ObjectStore(capacity="1GiB")
    print(
        f"# python {sys.version.split()[0]}, numpy {np.__version__}, pyarrow {pa.__version__}"
        + (f", ray {ray.__version__}" if ray else "")
    )

    arrays = {f"w{i}": np.random.default_rng(i).random(10 * 1_000_000 // 8) for i in range(10)}
    targets = {k: np.empty_like(v) for k, v in arrays.items()}
    for k in arrays:
        np.copyto(targets[k], arrays[k])

    def memcpy():
        for k, v in arrays.items():
            np.copyto(targets[k], v)

    ref, medians = compare(
        "a dict of 10 numpy arrays of 10 MB", arrays, store, ray, args.rounds, 5, memcpy
    )
    in_process = medians[("get", "forebay")]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_cross_process_child, args=(store.path, ref, 200, out))
    p.start()
    cross, grew_kib, total = out.get(timeout=600)
    p.join()
    assert abs(total - sum(float(a.sum()) for a in arrays.values())) < 1e-3
    print(
        f"\ncross-process get of the dict: {cross:,.1f} µs median ({cross / in_process:.2f}x the "
        f"in-process get); the reader's RssAnon grew {grew_kib / 1024:,.1f} MiB reading "
        f"{sum(a.nbytes for a in arrays.values()) / 2**20:,.0f} MiB of arrays"
    )

    small = [(i, f"name-{i}", i * 0.5) for i in range(100_000)]
    compare("a list of 100,000 small tuples", small, store, ray, args.rounds, 5)
    store.close()
    if ray:
        ray.shutdown()

    if not args.no_weights:
        weight = np.random.default_rng(0).random((1 << 30) // 8)
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "in.parquet")
            pq.write_table(pa.table({"x": np.arange(200_000, dtype=np.float64)}), path)
            rises = {"shared": [], "pickled into each worker": []}
            for _ in range(5):
                rises["shared"].append(weights_run(path, weight, True))
                rises["pickled into each worker"].append(weights_run(path, weight, False))
        print("\n## a 1 GiB weight to 2 worker processes: peak rise during the run, GiB\n")
        print("| weight | used memory, runs | median | shared memory, runs | median |")
        print("|---|---|---:|---|---:|")
        for k, xs in rises.items():
            used = ", ".join(f"{x[0] / 2**30:.2f}" for x in xs)
            shm = ", ".join(f"{x[1] / 2**30:.2f}" for x in xs)
            mu = statistics.median(x[0] for x in xs) / 2**30
            ms = statistics.median(x[1] for x in xs) / 2**30
            print(f"| {k} | {used} | {mu:.2f} | {shm} | {ms:.2f} |")


if __name__ == "__main__":
    main()
