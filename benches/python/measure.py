"""Memory probes shared by the peer benchmarks (DESIGN.md: system-wide used memory rise,
sampled, so helper processes count; plus the process's own max RSS)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


def used_memory() -> int:
    """System-wide used memory in bytes: MemTotal - MemAvailable, less the free pages parked
    on the kernel's per-CPU free lists (see `per_cpu_free_pages`)."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            info[k] = int(v.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"] - per_cpu_free_pages()


def per_cpu_free_pages() -> int:
    """Bytes of free pages held on the kernel's per-CPU page lists (`count:` under each zone's
    `pagesets` in /proc/zoneinfo).

    Those pages are free: the next allocation on that CPU takes them. But MemFree, and so
    MemAvailable, counts only the buddy allocator's pages. Since Linux 6.7 a CPU that
    allocates many pages raises its list's limit automatically (up to `high_max`, 1.1 GB a
    CPU on this 24 GiB VM, kernel 6.18). The limit then decays by an eighth a second. So a
    process that frees a few hundred MB leaves them on the list, counted "used", for tens of
    seconds. Measured in an over-the-cap run: the lists grew from 48 to 336 MB while
    MemAvailable fell 613 MB for a process whose anonymous memory grew 444 MB. Without this
    correction the rise measures how much memory a run churned through the kernel more than
    what it held, and the rise of whatever runs next depends on how much a previous run left
    on the lists."""
    pages = 0
    with open("/proc/zoneinfo") as f:
        for line in f:
            field = line.split()
            if len(field) == 2 and field[0] == "count:":
                pages += int(field[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _status_kb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return float("nan")


def peak_rss_mb() -> float:
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child would report its parent's peak.
    return _status_kb("VmHWM") / 1024


def reset_peak_rss() -> None:
    """Reset this process's VmHWM to its current RSS (Linux: write 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_bytes() -> int:
    return int(_status_kb("VmHWM") * 1024)


def rss_bytes() -> int:
    """Current resident set size of this process."""
    return int(_status_kb("VmRSS") * 1024)


def process_cpu_seconds() -> float:
    """CPU time (user + system) of this process's threads so far (not its helper processes)."""
    usage = os.times()
    return usage.user + usage.system


def wait_until_idle(timeout: float = 1.0) -> None:
    """Wait until this process's own threads are idle: importing numpy (which pyarrow does)
    starts OpenBLAS threads that spin for ~100 ms (70 ms of CPU measured here), and a timing
    started at once would charge that to whichever engine imported numpy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = os.times()
        time.sleep(0.05)
        after = os.times()
        if (after.user - before.user) + (after.system - before.system) < 0.005:
            return


class SystemMemorySampler:
    """Samples system used memory every 10 ms between start() and stop(); reports the rise.
    Created right before a timed run: it first waits for the process to be idle."""

    def __init__(self):
        wait_until_idle()
        self.baseline = used_memory()
        self.peak = self.baseline
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._done.is_set():
            self.peak = max(self.peak, used_memory())
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    @property
    def rise_mb(self) -> float:
        return (self.peak - self.baseline) / 1e6


def wait_for_ray_exit(timeout: float = 120.0) -> None:
    """Wait until no Ray process of a previous run is left and system used memory has stopped
    falling: on this VM the memory of an exited Ray cluster returns to the system over tens
    of seconds, and a measurement taken meanwhile would hide its own rise."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = subprocess.run(
            ["pgrep", "-f", "raylet|gcs_server|ray::"], capture_output=True, text=True
        ).stdout.split()
        if not left:
            break
        time.sleep(0.2)
    previous = used_memory()
    while time.time() < deadline:
        time.sleep(2.0)
        now = used_memory()
        if previous - now < 8_000_000:
            return
        previous = now


def warm_page_cache(paths: list[str]) -> None:
    """Read every file once, so that the next run finds it all in the page cache.

    This VM drops a few % of the page cache within seconds even with memory free (measured:
    2 % of lineitem SF5 gone 20 s after reading it). Without this, whichever engine ran
    first after a pause (a slower peer, a round boundary) read those pages back from disk,
    and the iter benchmark's runs took ~20 % longer for it."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def run_child(script: str, *args: str, python: str | None = None) -> dict:
    """Run ``script --child *args`` in a fresh interpreter (``python``, by default this one:
    so each measurement starts with nothing cached in the process) and return the JSON
    object its last stdout line holds."""
    out = subprocess.run(
        [python or sys.executable, script, "--child", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_of(results: list[dict], key: str) -> float:
    """The median of ``key`` over a list of child results."""
    return statistics.median(r[key] for r in results)


def tpch_lineitem(data_dir: Path, sf: float) -> Path:
    """The directory of TPC-H lineitem at scale factor ``sf`` in 8 Parquet files under
    ``data_dir/sf<sf>/lineitem``, generated with tpchgen-cli the first time."""
    out = data_dir / f"sf{sf:g}" / "lineitem"
    if not out.exists():
        cli = Path(sys.executable).with_name("tpchgen-cli")
        subprocess.run(
            [
                str(cli),
                "parquet",
                "-s",
                f"{sf:g}",
                "--tables",
                "lineitem",
                "--parts",
                "8",
                "--output-dir",
                str(out.parent),
            ],
            check=True,
        )
    return out


def alternate(
    script: str,
    engines: list[str],
    rounds: int,
    files: list[str],
    kind: str,
    *args: str,
    pythons: dict[str, str] | None = None,
) -> dict[str, list[dict]]:
    """Run ``script --child kind engine *args`` for each engine ``rounds`` times, rotating
    which goes first (A B C, B C A, ...), each run in a fresh interpreter (``pythons[engine]``
    where given) after the input ``files`` were read once (``warm_page_cache``) and Ray's
    processes of an earlier run have exited."""
    results: dict[str, list[dict]] = {e: [] for e in engines}
    for r in range(rounds):
        first = r % len(engines)
        for e in engines[first:] + engines[:first]:
            wait_for_ray_exit()
            warm_page_cache(files)
            res = run_child(script, kind, e, *args, python=(pythons or {}).get(e))
            results[e].append(res)
            print(f"  round {r + 1} {e}: {json.dumps(res)}", file=sys.stderr)
    return results
