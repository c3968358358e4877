"""A training loop on several ranks, killed at a random step and resumed with another number
of ranks: the samples it trains on are exactly those of an uninterrupted run, in order.

    python examples/training_resume.py [--backend numpy|torch] [--worlds 4,3,6] [--lanes 12]
                                       [--dir DIR]

1. Writes a small dataset (uneven files and row groups; an ``id`` per row).
2. Trains a linear model with data parallelism: ``world_size`` processes, each reading its
   rank's batches from ``read_parquet(...).training_stream(...)``, gradients averaged across
   ranks every step (``--backend torch``: ``torch.distributed`` with gloo, the model a
   ``torch.nn.Linear`` in DDP; ``numpy``: the same arithmetic in numpy, averaged through
   shared memory). Rank 0 saves a checkpoint every few steps: the model and the stream's
   ``state_dict()``, one file, written atomically.
3. The processes are killed with SIGKILL at a random moment (preemption); the run resumes
   from the last checkpoint with the next world size in ``--worlds``; the last run goes to
   the end of two epochs.
   With ``--lanes N`` the order is in N lanes (``training_stream(lanes=N)``): each rank of a
   world size dividing N reads only its lanes.
4. Verifies: the samples of the steps each run kept (up to the checkpoint the next run
   resumed from), step by step in rank order, are the uninterrupted sequence of both epochs,
   no sample missing, none repeated, in the same order.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

BATCH = 16
SEED = 1234
EPOCHS = 2
FEATURES = 4
SAVE_EVERY = 5
STEP_SECONDS = 0.03
ORDER = {"seed": SEED, "block_rows": 64, "window_rows": 512, "remainder": "pad"}


def write_dataset(directory: Path) -> int:
    rng = np.random.default_rng(0)
    true_w = np.arange(1, FEATURES + 1, dtype=np.float32)
    n = 0
    for f, rows in enumerate([700, 1300, 450, 900]):
        x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
        y = x @ true_w + 0.01 * rng.standard_normal(rows, dtype=np.float32)
        table = pa.table(
            {
                "id": np.arange(n, n + rows),
                "x": pa.FixedSizeListArray.from_arrays(x.reshape(-1), FEATURES),
                "y": y,
            }
        )
        pq.write_table(table, directory / f"part-{f}.parquet", row_group_size=100 + 77 * f)
        n += rows
    return n


def arrays(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = batch.column("x").values.to_numpy().reshape(-1, FEATURES)
    return batch.column("id").to_numpy(), x, batch.column("y").to_numpy()


def order(work_dir: Path) -> dict:
    """The order's settings of this run (``--lanes`` is kept in the work directory)."""
    lanes = json.loads((work_dir / "lanes.json").read_text())
    return {**ORDER, "lanes": lanes, "lane_chunk": BATCH if lanes else None}


def train_rank(run: int, rank: int, world: int, work: str, backend: str, shared, barrier) -> None:
    """One rank: resume from the checkpoint if there is one, then train, logging the ids of
    each step's batch (``step id id ...``) and saving a checkpoint every SAVE_EVERY steps."""
    import forebay

    work_dir = Path(work)
    ckpt_path = work_dir / "checkpoint.json"
    stream = forebay.read_parquet(work_dir / "data").training_stream(
        BATCH, world_size=world, rank=rank, **order(work_dir)
    )
    weights, step = np.zeros(FEATURES, np.float32), 0
    if ckpt_path.exists():
        ckpt = json.loads(ckpt_path.read_text())
        weights, step = np.array(ckpt["weights"], np.float32), ckpt["step"]
        stream.load_state_dict(ckpt["data"])
    if backend == "torch":
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["EXAMPLE_PORT"])
        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(FEATURES, 1, bias=False))
        with torch.no_grad():
            model.module.weight.copy_(torch.from_numpy(weights).view(1, -1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with open(work_dir / f"log-run{run}-rank{rank}.txt", "a", buffering=1) as log:
        while stream.epoch < EPOCHS:
            for batch in stream:
                ids, x, y = arrays(batch)
                log.write(f"{step} {stream.epoch} {' '.join(map(str, ids))}\n")
                if backend == "torch":
                    optimizer.zero_grad()
                    pred = model(torch.tensor(x)).view(-1)
                    loss = torch.mean((pred - torch.tensor(y)) ** 2)
                    loss.backward()  # DDP averages the gradients across ranks (gloo all-reduce)
                    optimizer.step()
                    weights = model.module.weight.detach().numpy().reshape(-1).copy()
                else:
                    grad = 2 * x.T @ (x @ weights - y) / len(y)
                    shared[rank] = grad  # all-reduce through shared memory
                    barrier.wait()
                    weights = weights - 0.05 * shared[:world].mean(axis=0)
                    barrier.wait()
                time.sleep(STEP_SECONDS)  # the model's forward and backward pass
                step += 1
                if step % SAVE_EVERY == 0 and rank == 0:
                    tmp = ckpt_path.with_suffix(".tmp")
                    tmp.write_text(
                        json.dumps(
                            {"weights": weights.tolist(), "step": step, "data": stream.state_dict()}
                        )
                    )
                    os.replace(tmp, ckpt_path)
    if backend == "torch":
        dist.destroy_process_group()


def run_world(run: int, world: int, work: Path, backend: str, kill_after: float | None) -> bool:
    """Run ``world`` ranks; SIGKILL them all ``kill_after`` seconds in (None: to the end).
    Returns whether they finished."""
    ctx = mp.get_context("spawn")
    shared_memory = ctx.Array("f", 16 * FEATURES, lock=False)
    shared = np.frombuffer(shared_memory, np.float32).reshape(16, FEATURES)
    barrier = ctx.Barrier(world)
    os.environ["EXAMPLE_PORT"] = str(29500 + random.randrange(1000))
    ranks = [
        ctx.Process(target=train_rank, args=(run, r, world, str(work), backend, shared, barrier))
        for r in range(world)
    ]
    for p in ranks:
        p.start()
    deadline = None if kill_after is None else time.monotonic() + kill_after
    while any(p.is_alive() for p in ranks):
        if deadline is not None and time.monotonic() > deadline:
            for p in ranks:
                if p.pid is not None:
                    os.kill(p.pid, signal.SIGKILL)
            for p in ranks:
                p.join()
            return False
        time.sleep(0.01)
    if any(p.exitcode != 0 for p in ranks):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in ranks]}")
    return True


def logged_sequence(
    work: Path, run: int, world: int, until_step: int | None
) -> dict[int, tuple[int, list[int]]]:
    """{step: (epoch, the step's samples in rank order)} of one run, steps below
    ``until_step``."""
    steps: dict[int, dict[int, list[int]]] = {}
    epochs: dict[int, int] = {}
    for rank in range(world):
        path = work / f"log-run{run}-rank{rank}.txt"
        for line in path.read_text().splitlines() if path.exists() else []:
            fields = line.split()
            if len(fields) != BATCH + 2:
                continue  # the line a kill cut short
            step = int(fields[0])
            if until_step is None or step < until_step:
                steps.setdefault(step, {})[rank] = [int(i) for i in fields[2:]]
                epochs[step] = int(fields[1])
    return {
        s: (epochs[s], [i for r in range(world) for i in by_rank[r]])
        for s, by_rank in steps.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["numpy", "torch"], default="numpy")
    p.add_argument("--worlds", default="4,3,6", help="world size of each run, comma-separated")
    p.add_argument("--seed", type=int, default=None, help="seed of the kill times")
    p.add_argument("--lanes", type=int, default=None, help="the order in this many lanes")
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    rng = random.Random(args.seed)
    worlds = [int(w) for w in args.worlds.split(",")]
    if max(worlds) > 16:
        raise SystemExit("at most 16 ranks")
    work = args.dir or Path(tempfile.mkdtemp(prefix="forebay-training-"))
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    rows = write_dataset(work / "data")
    (work / "lanes.json").write_text(json.dumps(args.lanes))

    # The uninterrupted sequence of both epochs, read by one rank with batches of one.
    import forebay

    reference = forebay.read_parquet(work / "data").training_stream(
        1, world_size=1, rank=0, **{**order(work), "remainder": "drop"}
    )
    expected = []
    for _ in range(EPOCHS):
        expected += [i for b in reference for i in b.column("id").to_pylist()]

    # Seconds before the first step: spawning the ranks (and with torch, importing it and
    # joining the gloo group); the kills fall within the training after it.
    startup = 6.0 if args.backend == "torch" else 1.0
    delivered: dict[int, list[int]] = {e: [] for e in range(EPOCHS)}
    for n, world in enumerate(worlds):
        last = n == len(worlds) - 1
        checkpoint = work / "checkpoint.json"
        start = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
        finished = run_world(
            n, world, work, args.backend, None if last else startup + rng.uniform(0.5, 3.0)
        )
        end = None
        if not finished:
            end = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
            print(f"world size {world}: killed; resuming from step {end}")
        else:
            print(f"world size {world}: finished")
        steps = logged_sequence(work, n, world, end)
        for step in range(start, max(steps, default=start - 1) + 1):
            epoch, samples = steps[step]  # a step missing here is a step no rank logged
            delivered[epoch] += samples
        if finished:
            break  # (before its kill: the world sizes after it have nothing left to do)
    # Each epoch's last step is padded with samples from the start of the epoch.
    ok = []
    for epoch in range(EPOCHS):
        got, want = delivered[epoch], expected[epoch * rows : (epoch + 1) * rows]
        ok.append(got[:rows] == want and got[rows:] == want[: len(got) - rows])
    print(
        f"{rows} samples per epoch, {EPOCHS} epochs, world sizes {worlds}: "
        f"sequence identical to an uninterrupted run: {all(ok)}"
    )
    if not all(ok):
        raise SystemExit(1)
    if args.dir is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
