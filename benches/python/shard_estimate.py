"""Per-shard figures of the checkpoint index, for estimating 10 B ids over 64 shards.

    python benches/python/shard_estimate.py [--ids 8000000] [--rounds 3]

Writes the seed workload's checkpoint ids ("0".."7999999", strings) as a forebay checkpoint
of 64 shards, then measures on one thread:
  * load of one shard (what one actor reads for each shard it owns): seconds, ids/s,
    index bytes per id;
  * probes of that shard (``contains``) in batches of 65,536 ids, half present: ids/s;
  * the same probes through a ShardedCheckpointFilter actor on a local Ray cluster (one
    actor owning every shard: Ray's call and transfer cost per batch included).
Prints the figures and the extrapolation to 10 B ids.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import forebay

HERE = Path(__file__).resolve().parent
SHARDS = 64
BATCH = 65_536


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data-dir", default=str(HERE.parents[1] / "bench-data" / "checkpoint"))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    source = Path(args.data_dir) / "string" / "checkpoint.parquet"
    ckpt = Path(args.data_dir) / "sharded-64"
    if not (ckpt / "_forebay_checkpoint").exists():
        index = forebay.CheckpointFilter(pa.string(), num_shards=SHARDS, id_column="id")
        index.insert(pq.read_table(source).column("id"))
        index.write(str(ckpt))
    total_ids = pq.ParquetFile(source).metadata.num_rows

    loads, sizes = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        shard = forebay.CheckpointFilter.load(str(ckpt), "id", shards=[0], num_threads=1)
        loads.append(time.perf_counter() - t0)
        sizes.append((len(shard), shard.memory_bytes))
    ids_in_shard, index_bytes = sizes[-1]
    load_s = statistics.median(loads)

    # Probes: ids of shard 0, half present, half never inserted.
    router = forebay.CheckpointFilter(pa.string(), num_shards=SHARDS, id_column="id")
    candidates = pa.array(np.arange(0, 4 * BATCH * SHARDS).astype(str)).combine_chunks()
    mine = candidates.filter(pa.array(router.shard_ids(candidates).to_numpy() == 0))
    numbers = mine.cast(pa.int64()).to_numpy()
    present = mine.filter(pa.array(numbers < total_ids)).slice(0, BATCH // 2)
    absent = mine.filter(pa.array(numbers >= total_ids)).slice(0, BATCH // 2)  # never inserted
    probe = pa.concat_arrays([present, absent])
    one_thread = forebay.CheckpointFilter.load(str(ckpt), "id", shards=[0], num_threads=1)
    assert one_thread.contains(probe).to_numpy(zero_copy_only=False)[: len(present)].all()
    probe_rates = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(100):
            one_thread.contains(probe)
        probe_rates.append(100 * len(probe) / (time.perf_counter() - t0))
    probe_rate = statistics.median(probe_rates)

    import ray

    import forebay.ray as fray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    sharded = fray.ShardedCheckpointFilter(str(ckpt), "id", num_shards=SHARDS, num_actors=1)
    batches = [pa.table({"id": probe}) for _ in range(50)]
    actor_rates = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for b in batches:
            sharded(b)
        actor_rates.append(len(batches) * len(probe) / (time.perf_counter() - t0))
    actor_rate = statistics.median(actor_rates)
    sharded.shutdown()
    ray.shutdown()

    bytes_per_id = index_bytes / ids_in_shard
    print(
        f"checkpoint: {total_ids:,} string ids in {SHARDS} shards; medians of {args.rounds}\n"
        f"one shard: {ids_in_shard:,} ids, index {index_bytes / 1e6:.1f} MB "
        f"({bytes_per_id:.1f} B/id), load {load_s:.3f} s on 1 thread "
        f"({ids_in_shard / load_s / 1e6:.1f} M ids/s)\n"
        f"probe on 1 thread, {len(probe):,}-id batches, half present: "
        f"{probe_rate / 1e6:.1f} M ids/s\n"
        f"through one Ray actor (call + transfer included): {actor_rate / 1e6:.1f} M ids/s"
    )
    per_shard = 10e9 / SHARDS
    print(
        f"\n10 B ids over {SHARDS} shards: {per_shard / 1e6:.0f} M ids a shard, "
        f"{per_shard * bytes_per_id / 1e9:.2f} GB a shard, "
        f"{10e9 * bytes_per_id / 1e9:.0f} GB in all; load of one shard on one thread "
        f"{per_shard / (ids_in_shard / load_s):.0f} s; "
        f"probes {probe_rate / 1e6:.1f} M ids/s a thread"
    )


if __name__ == "__main__":
    main()
