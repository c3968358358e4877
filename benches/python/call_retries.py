"""What failed calls cost against a paid endpoint: requests sent, seconds, and good rows
lost, for an async ``map_batches`` with the real ``openai`` client against a local
OpenAI-compatible server (tests/python/openai_server.py, 20 ms a request):

- ``poison``: 3,000 rows, every 6th refused with a 400 (the row's fault); batches of 16,
  32 in flight, ``max_retries=3``, ``on_error="skip"``.
- ``rate-limited``: 5,000 rows; the server admits 25 requests a second (a token bucket)
  and answers the rest 429 without ``Retry-After``; batches of 16, 64 in flight,
  ``max_retries=10``.
- ``rate-limited, tells wait``: the same, the 429s carrying ``Retry-After``.

    python benches/python/call_retries.py [--rounds 3] [--compare-to REV]

``--compare-to REV``: each round also runs forebay's Python package as it was at git
revision REV (the installed native module, REV's ``python/forebay/*.py``), alternated with
the current one. Each run is a child process; medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RATE_LIMITED = dict(
    rows=5_000, poison_every=None, batch_size=16, max_concurrency=64, max_retries=10
)
SCENARIOS = {
    "poison": dict(
        rows=3_000, poison_every=6, batch_size=16, max_concurrency=32, max_retries=3, server={}
    ),
    "rate-limited": dict(RATE_LIMITED, server={"requests_per_second": 25.0}),
    "rate-limited, tells wait": dict(
        RATE_LIMITED, server={"requests_per_second": 25.0, "tell_wait": True}
    ),
}

CHILD = """
import collections, json, sys, time
import openai, pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, sys.argv[3])
from openai_server import ModelServer
import forebay

config = json.loads(sys.argv[1])
path = sys.argv[2] + "/in.parquet"
every = config["poison_every"]
texts = [f"document {i}" + (" POISON" if every and i % every == 0 else "")
         for i in range(config["rows"])]
pq.write_table(pa.table({"id": range(config["rows"]), "text": texts}), path)

class Embed:
    def __init__(self, url):
        self.client = openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
    async def __call__(self, batch):
        r = await self.client.embeddings.create(model="m", input=batch["text"].to_pylist())
        return {"id": batch["id"], "dim0": [d.embedding[0] for d in r.data]}
    async def aclose(self):
        await self.client.close()

forebay.configure(progress=False)
server = ModelServer(latency=0.02, poison="POISON", **config["server"])
with server:
    ds = forebay.read_parquet(path).map_batches(
        Embed, fn_constructor_args=(server.url,), batch_size=config["batch_size"],
        max_concurrency=config["max_concurrency"], max_retries=config["max_retries"],
        on_error="skip",
    )
    started = time.perf_counter()
    out = sum(b.num_rows for b in ds.iter_batches(batch_size=None))
    seconds = time.perf_counter() - started
stage = next(s for s in ds.stats()["stages"] if s["name"] == "map_batches(Embed)")
poison = {i for i in range(config["rows"]) if every and i % every == 0}
statuses = collections.Counter(r.status for r in server.log)
print(json.dumps({
    "seconds": seconds,
    "requests": len(server.log),
    "429s": statuses.get(429, 0),
    "rows_out": out,
    "rows_set_aside": stage["rows_errored"],
    "good_rows_lost": config["rows"] - len(poison) - out,
}))
"""


def package_at(revision: str, into: Path) -> Path:
    """A copy of the installed forebay package with ``revision``'s Python files."""
    import forebay

    installed = Path(forebay.__file__).parent
    target = into / "forebay"
    shutil.copytree(installed, target)
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", revision, "python/forebay"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in listed:
        if name.endswith(".py"):
            text = subprocess.run(
                ["git", "show", f"{revision}:{name}"], cwd=ROOT, check=True, capture_output=True
            ).stdout
            dest = target / Path(name).relative_to("python/forebay")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(text)
    return into


def run(config: dict, pythonpath: Path | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(config), tmp, str(ROOT / "tests" / "python")],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare-to", default=None)
    parser.add_argument("--scenario", choices=list(SCENARIOS), action="append")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as old_root:
        variants: dict[str, Path | None] = {"forebay": None}
        if args.compare_to:
            variants[f"forebay@{args.compare_to}"] = package_at(args.compare_to, Path(old_root))
        for name in args.scenario or list(SCENARIOS):
            results: dict[str, list[dict]] = {v: [] for v in variants}
            for _ in range(args.rounds):
                for variant, path in variants.items():
                    results[variant].append(run(SCENARIOS[name], path))
            print(f"\n{name}")
            for variant, runs in results.items():
                medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                line = ", ".join(
                    f"{k} {v:.1f}" if k == "seconds" else f"{k} {v:g}" for k, v in medians.items()
                )
                print(f"  {variant:>22}: {line}")


if __name__ == "__main__":
    main()
