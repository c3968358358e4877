"""Object store latency: forebay.ObjectStore vs pickle protocol 5, Arrow IPC into an
in-memory buffer, and Ray's ray.put / ray.get, in one run; plus a plain memcpy of the same
bytes and cross-process get latency.

Values are pyarrow Tables of one int64 column of the given size (plus, at 1 KB, a bytes
object and a numpy array). Every call is timed on its own; methods alternate round by
round (A B C A B C ...); the figure is the median over all calls. forebay puts are each
followed by an untimed delete, so the arena is in steady state (regions reused, pages
already faulted in), as in a running pipeline; `--cold` also reports first-touch puts.

    .venv/bin/python benches/python/store.py [--rounds 7] [--no-ray] [--sizes 1K,64M]

Ray is a benchmark-only dependency: `pip install ray` into the venv (the `bench-store`
make target does).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import pickle
import statistics
import sys
import time

import numpy as np
import pyarrow as pa

import forebay

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_sizes(text: str) -> list[int]:
    out = []
    for s in text.split(","):
        s = s.strip().upper().rstrip("B")
        out.append(int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s))
    return out


def label(n: int) -> str:
    for u, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {u}B"
    return f"{n} B"


def make_table(nbytes: int) -> pa.Table:
    n = max(nbytes // 8, 1)
    return pa.table({"x": np.arange(n, dtype=np.int64)})


def calls_for(nbytes: int) -> int:
    """Calls per method per round: enough for stable medians at small sizes."""
    if nbytes <= 64 << 10:
        return 400
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 16 << 20:
        return 10
    return 3


def timed(fn) -> float:
    t = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t) / 1e3  # µs


def ipc_dumps(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def ipc_loads(buf: pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(buf).read_all()


def _cross_process_child(path, refs, calls, out):
    store = forebay.ObjectStore.attach(path)
    result = {}
    for name, ref in refs.items():
        for _ in range(10):
            store.get(ref)
        samples = []
        for _ in range(calls):
            samples.append(timed(lambda: store.get(ref)))
        result[name] = statistics.median(samples)
    out.put(result)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1K,64K,1M,16M,64M,256M")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--cold", action="store_true", help="also time first-touch puts")
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes)

    ray = None
    if not args.no_ray:
        try:
            import ray

            ray.init(
                num_cpus=1,
                include_dashboard=False,
                logging_level="ERROR",
                object_store_memory=max(4 * max(sizes), 512 << 20),
            )
        except ImportError:
            print("ray is not installed: pip install ray (or run with --no-ray)", file=sys.stderr)
            sys.exit(2)

    store = forebay.ObjectStore(capacity=max(3 * max(sizes), 256 << 20))
    print(
        f"# store {store.path}, python {sys.version.split()[0]}, pyarrow {pa.__version__}"
        + (f", ray {ray.__version__}" if ray else "")
    )

    results = []  # (size, kind, op, method, median µs)
    cross = {}
    for nbytes in sizes:
        values = {"table": make_table(nbytes)}
        if nbytes == 1 << 10:
            values["bytes"] = b"x" * nbytes
            values["ndarray"] = np.arange(nbytes // 8, dtype=np.int64)
        calls = calls_for(nbytes)
        for kind, value in values.items():
            # Stored copies for the get side.
            ref = store.put(value)
            blob = pickle.dumps(value, protocol=5)
            ipc = ipc_dumps(value) if kind == "table" else None
            rref = ray.put(value) if ray else None
            gets = {
                "forebay": lambda: store.get(ref),
                "pickle5": lambda: pickle.loads(blob),
            }
            if ipc is not None:
                gets["arrow_ipc"] = lambda: ipc_loads(ipc)
            if ray:
                gets["ray"] = lambda: ray.get(rref)
            puts = {
                "forebay": lambda: store.put(value),
                "pickle5": lambda: pickle.dumps(value, protocol=5),
            }
            if ipc is not None:
                puts["arrow_ipc"] = lambda: ipc_dumps(value)
            if ray:
                puts["ray"] = lambda: ray.put(value)
            if kind == "table" or kind == "ndarray":
                src = value.column(0).chunk(0).to_numpy() if kind == "table" else value
                dst = np.empty_like(src)
                np.copyto(dst, src)  # fault the destination in
                puts["memcpy"] = lambda: np.copyto(dst, src)

            samples = {("put", m): [] for m in puts} | {("get", m): [] for m in gets}
            # Warm up each path once.
            for m, f in puts.items():
                r = f()
                if m == "forebay":
                    store.delete(r)
            for f in gets.values():
                f()
            gc.disable()
            try:
                for _ in range(args.rounds):
                    for m, f in puts.items():
                        for _ in range(calls):
                            if m == "forebay":
                                t = time.perf_counter_ns()
                                r = f()
                                samples[("put", m)].append((time.perf_counter_ns() - t) / 1e3)
                                store.delete(r)
                            else:
                                samples[("put", m)].append(timed(f))
                    for m, f in gets.items():
                        # A get does not scale with the object's size (that is the point):
                        # the same number of calls at every size.
                        for _ in range(200):
                            samples[("get", m)].append(timed(f))
            finally:
                gc.enable()
            for (op, m), xs in samples.items():
                results.append((nbytes, kind, op, m, statistics.median(xs)))
            if kind == "table":
                cross[nbytes] = ref
            else:
                cross[f"{nbytes}-{kind}"] = ref

    if args.cold:
        for nbytes in sizes:
            cold = forebay.ObjectStore(capacity=max(2 * nbytes, 64 << 20))
            value = make_table(nbytes)
            results.append(
                (nbytes, "table", "put (first touch)", "forebay", timed(lambda: cold.put(value)))
            )
            cold.close()

    # Cross-process get: another process attaches and gets the same objects.
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    refs = {label(k) if isinstance(k, int) else k: v for k, v in cross.items()}
    p = ctx.Process(target=_cross_process_child, args=(store.path, refs, 300, out))
    p.start()
    cross_result = out.get(timeout=600)
    p.join()

    print("\n## put / get latency, median µs (ratio = peer / forebay; > 1 means forebay faster)\n")
    peers = ["pickle5", "arrow_ipc", "ray", "memcpy"]
    print("| size | value | op | forebay | " + " | ".join(peers) + " |")
    print("|---|---|---|---:|" + "---:|" * len(peers))
    by = {}
    for nbytes, kind, op, m, med in results:
        by[(nbytes, kind, op, m)] = med
    for nbytes in sizes:
        for kind in ("table", "bytes", "ndarray"):
            for op in ("put", "get", "put (first touch)"):
                f = by.get((nbytes, kind, op, "forebay"))
                if f is None:
                    continue
                cells = []
                for peer in peers:
                    v = by.get((nbytes, kind, op, peer))
                    cells.append("" if v is None else f"{v:,.1f} ({v / f:.2f}x)")
                print(f"| {label(nbytes)} | {kind} | {op} | {f:,.1f} | " + " | ".join(cells) + " |")
    print("\n## cross-process get (another process attached), median µs\n")
    print("| object | get µs |")
    print("|---|---:|")
    for name, med in cross_result.items():
        print(f"| {name} | {med:,.1f} |")
    store.close()
    if ray:
        ray.shutdown()


if __name__ == "__main__":
    main()
