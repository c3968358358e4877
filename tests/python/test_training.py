"""Training streams (``Dataset.training_stream``): the order is a function of (seed, epoch,
dataset), every rank gets the same number of full batches, and a run stopped anywhere and
resumed with other world sizes and loader workers delivers exactly the rest of the sequence.

The reference is independent of the dealing: the epoch's whole sequence read by one rank
with batches of one sample."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay
from conftest import S3_CREDENTIALS, moto_s3

CASES = 120


def write_dataset(directory: Path, rng: random.Random, *, files: int | None = None) -> int:
    """Files of random sizes and row groups; an ``id`` column numbering rows in file order.
    Returns the number of rows."""
    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    for f in range(files if files is not None else rng.randint(1, 5)):
        rows = rng.randint(0 if f else 1, 900)
        table = pa.table(
            {
                "id": pa.array(np.arange(n, n + rows), pa.int64()),
                "text": pa.array(
                    [f"row {i}" if i % 7 else None for i in range(n, n + rows)], pa.string()
                ),
                "vec": pa.array(
                    [[float(i), 1.0] for i in range(n, n + rows)], pa.list_(pa.float64())
                ),
            }
        )
        # Pages of a few rows in some files (no page index, as pyarrow writes by default):
        # blocks then read pages located by forebay (`page_locations`).
        small_pages = rng.random() < 0.5
        pq.write_table(
            table,
            directory / f"part-{f:02}.parquet",
            row_group_size=rng.randint(1, 300),
            data_page_size=64 if small_pages else None,
            write_batch_size=rng.randint(1, 40) if small_pages else None,
        )
        n += rows
    return n


def whole_sequence(ds: forebay.Dataset, epoch: int, **order) -> list[int]:
    stream = ds.training_stream(1, world_size=1, rank=0, **order)
    stream.set_epoch(epoch)
    return [i for batch in stream for i in batch.column("id").to_pylist()]


def run_ranks(ds, state, world_size, workers, steps, batch_size, order, remainder):
    """Run ``world_size`` ranks in lockstep, each taking its batches from ``workers`` loader
    workers round-robin (as torch's DataLoader does), for ``steps`` steps or to the end of
    the epoch. Returns (samples in step-major, rank-minor order, state after them)."""
    ranks = []
    for rank in range(world_size):
        stream = ds.training_stream(
            batch_size, world_size=world_size, rank=rank, remainder=remainder, **order
        )
        if state is not None:
            stream.load_state_dict(state)
        ranks.append(stream)
    left = len(ranks[0])
    assert all(len(s) == left for s in ranks), "every rank has as many batches left"
    take = min(steps, left)
    iterators = [[s.iter_worker(w, workers) for w in range(workers)] for s in ranks]
    delivered = []
    for step in range(take):
        for rank_workers in iterators:
            batch = next(rank_workers[step % workers])
            assert batch.num_rows == batch_size, "only full batches"
            delivered.extend(batch.column("id").to_pylist())
    for rank_workers in iterators:
        for it in rank_workers:
            it.close()  # a kill: whatever was read ahead is lost with the process
    states = []
    for s in ranks:
        s.advance(take)
        states.append(s.state_dict())
    assert all(st == states[0] for st in states), "every rank saves the same state"
    return delivered, states[0]


@pytest.mark.parametrize("case", range(CASES))
@pytest.mark.filterwarnings("ignore:lanes=.*reads more than its share:UserWarning")
def test_resume_with_other_world_sizes_delivers_the_same_sequence(tmp_path, case):
    rng = random.Random(case)
    write_dataset(tmp_path / "data", rng)
    ds = forebay.read_parquet(tmp_path / "data")
    order = {
        "seed": rng.choice([None, rng.randrange(2**64)]),
        "block_rows": rng.randint(1, 200),
        "window_rows": rng.randint(1, 800),
    }
    remainder = rng.choice(["drop", "pad"])
    batch_size = rng.randint(1, 40)
    if case % 3 == 2:
        # In lanes: the same promise, whatever the world sizes (12's divisors read only
        # their lanes; 5 reads more, and gets the same sequence).
        order["lanes"] = rng.choice([12, rng.randint(1, 7)])
        order["lane_chunk"] = batch_size
    epochs = rng.randint(1, 2)
    reference = [whole_sequence(ds, e, **order) for e in range(epochs)]
    n = len(reference[0])
    assert sorted(reference[0]) == list(range(n))

    # Segments with random world sizes, loader workers and kill points until the epochs end.
    delivered: dict[int, list[int]] = {e: [] for e in range(epochs)}
    last_world = {}
    state = None
    epoch = 0
    while epoch < epochs:
        world = rng.randint(1, 6)
        workers = rng.randint(1, 3)
        steps = rng.randint(0, 12)
        got, state = run_ranks(ds, state, world, workers, steps, batch_size, order, remainder)
        delivered[epoch].extend(got)
        last_world[epoch] = world
        epoch = state["epoch"]
    for e in range(epochs):
        got, ref, w = delivered[e], reference[e], last_world[e]
        if remainder == "drop":
            assert got == ref[: len(got)], f"epoch {e}: the ranks' samples are the sequence"
            assert n - len(got) < w * batch_size, "only a partial last step is dropped"
        else:
            assert got[:n] == ref, f"epoch {e}: the whole sequence, in order"
            assert got[n:] == (ref * (len(got) // max(n, 1) + 1))[: len(got) - n]
            assert len(got) - n < w * batch_size


@pytest.mark.parametrize("world_size", range(1, 17))
def test_every_rank_gets_the_same_number_of_full_batches(tmp_path, world_size):
    rng = random.Random(1000 + world_size)
    n = write_dataset(tmp_path / "data", rng, files=4)
    ds = forebay.read_parquet(tmp_path / "data")
    for remainder in ("drop", "pad"):
        batch_size = rng.randint(1, 25)
        counts = []
        samples = []
        for rank in range(world_size):
            stream = ds.training_stream(
                batch_size,
                world_size=world_size,
                rank=rank,
                remainder=remainder,
                seed=3,
                block_rows=50,
                window_rows=300,
            )
            batches = list(stream)
            assert all(b.num_rows == batch_size for b in batches)
            counts.append(len(batches))
            samples += [i for b in batches for i in b.column("id").to_pylist()]
        assert len(set(counts)) == 1, counts
        step = world_size * batch_size
        expected = n // step if remainder == "drop" else -(-n // step)
        assert counts[0] == expected
        if remainder == "pad":
            assert set(samples) == set(range(n))


def test_order_depends_on_seed_and_epoch_not_on_reading(tmp_path):
    write_dataset(tmp_path / "data", random.Random(5), files=4)
    ds = forebay.read_parquet(tmp_path / "data")
    order = {"seed": 11, "block_rows": 64, "window_rows": 256}
    a = whole_sequence(ds, 0, **order)
    assert a == whole_sequence(forebay.read_parquet(tmp_path / "data", num_threads=1), 0, **order)
    assert a != whole_sequence(ds, 1, **order), "a new epoch reshuffles"
    assert a != whole_sequence(ds, 0, **{**order, "seed": 12})
    assert sorted(a) == sorted(whole_sequence(ds, 1, **order))
    # No shuffle: file order.
    assert whole_sequence(ds, 0, seed=None) == sorted(a)
    # Consecutive samples come from many places: no run of 64 in file order.
    runs = sum(1 for x, y in itertools.pairwise(a) if y == x + 1)
    assert runs < len(a) // 10


def test_the_default_order_and_state_do_not_depend_on_the_columns_read(tmp_path):
    """A feature column added between a save and a resume keeps the order (the default
    block size comes from all the columns' sizes, not the selected ones')."""
    directory = tmp_path / "data"
    directory.mkdir()
    ids = np.arange(6000)
    wide = pa.array([f"{i:02000}" for i in ids])  # ~2 KB a row: blocks of 1,024 rows
    # One row group per file: blocks are the only cut of a file.
    for f in range(2):
        part = slice(f * 3000, (f + 1) * 3000)
        pq.write_table(
            pa.table({"id": ids[part], "text": wide[part]}),
            directory / f"{f}.parquet",
            row_group_size=3000,
        )
    narrow = forebay.read_parquet(directory, columns=["id"])
    both = forebay.read_parquet(directory, columns=["id", "text"])
    assert whole_sequence(narrow, 0, seed=3) == whole_sequence(both, 0, seed=3)
    saved = narrow.training_stream(50, seed=3)
    it = iter(saved)
    seen = [i for _ in range(7) for i in next(it).column("id").to_pylist()]
    resumed = both.training_stream(50, seed=3)
    resumed.load_state_dict(saved.state_dict())
    rest = [i for batch in resumed for i in batch.column("id").to_pylist()]
    assert seen + rest == whole_sequence(both, 0, seed=3)


def test_batches_hold_the_rows_of_the_files(tmp_path):
    write_dataset(tmp_path / "data", random.Random(9), files=3)
    ds = forebay.read_parquet(tmp_path / "data", columns=["vec", "id", "text"])
    table = ds.to_arrow()
    by_id = {r["id"]: r for r in table.to_pylist()}
    stream = ds.training_stream(32, seed=2, block_rows=40, window_rows=100, remainder="pad")
    for batch in stream:
        assert batch.schema.names == ["vec", "id", "text"]
        for row in batch.to_pylist():
            assert row == by_id[row["id"]]


def test_the_state_is_small_and_checked(tmp_path):
    rng = random.Random(2)
    write_dataset(tmp_path / "data", rng, files=3)
    ds = forebay.read_parquet(tmp_path / "data")
    stream = ds.training_stream(8, seed=1)
    it = iter(stream)
    next(it)
    next(it)
    state = stream.state_dict()
    assert state["consumed"] == 16 and state["epoch"] == 0
    assert len(repr(state)) < 400

    with pytest.raises(ValueError, match="seed=1"):
        ds.training_stream(8, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="block_rows"):
        ds.training_stream(8, seed=1, block_rows=100).load_state_dict(state)
    with pytest.raises(ValueError, match="not a training stream state"):
        ds.training_stream(8, seed=1).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="lanes=None, this stream has lanes=4"):
        ds.training_stream(8, seed=1, lanes=4).load_state_dict(state)
    in_lanes = ds.training_stream(8, seed=1, lanes=4)
    next(iter(in_lanes))
    lanes_state = in_lanes.state_dict()
    assert (lanes_state["lanes"], lanes_state["lane_chunk"]) == (4, 8)
    with pytest.raises(ValueError, match="lane_chunk=8, this stream has lane_chunk=16"):
        ds.training_stream(16, seed=1, lanes=4).load_state_dict(lanes_state)
    # Another batch size with the run's lane chunk: the same order (one rank reads all).
    other_batch = ds.training_stream(16, seed=1, lanes=4, lane_chunk=8)
    other_batch.load_state_dict(lanes_state)
    assert other_batch.consumed == 8
    # Another file: the dataset changed.
    pq.write_table(
        pa.table({"id": [10**9], "text": ["x"], "vec": [[0.0, 0.0]]}),
        tmp_path / "data" / "zz.parquet",
    )
    with pytest.raises(ValueError, match="dataset changed"):
        forebay.read_parquet(tmp_path / "data").training_stream(8, seed=1).load_state_dict(state)
    # A state saved after the last step of an epoch resumes at the next epoch.
    other = ds.training_stream(8, seed=1)
    other.load_state_dict({**state, "consumed": other.rows})
    assert (other.epoch, other.consumed) == (1, 0)


def test_wrong_arguments_get_clear_errors(tmp_path):
    write_dataset(tmp_path / "data", random.Random(3), files=2)
    ds = forebay.read_parquet(tmp_path / "data")
    with pytest.raises(ValueError, match="rank 4 is not below world_size 4"):
        ds.training_stream(8, world_size=4, rank=4)
    with pytest.raises(ValueError, match="both world_size and rank"):
        ds.training_stream(8, world_size=4)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        ds.training_stream(0)
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        ds.training_stream(8.5)
    with pytest.raises(ValueError, match="remainder must be"):
        ds.training_stream(8, remainder="keep")
    with pytest.raises(ValueError, match="seed must be at least 0"):
        ds.training_stream(8, seed=-1)
    with pytest.raises(ValueError, match="reads the files directly"):
        ds.map_batches(lambda b: b).training_stream(8)
    filtered = forebay.read_parquet(tmp_path / "data", filter=[("id", ">", 3)])
    with pytest.raises(ValueError, match="filter"):
        filtered.training_stream(8)
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        ds.training_stream(8, lanes=0)
    with pytest.raises(ValueError, match="lane_chunk needs lanes"):
        ds.training_stream(8, lane_chunk=8)
    with pytest.warns(UserWarning, match="world_size=5 and batch_size=8 .* reads more"):
        ds.training_stream(8, world_size=5, rank=0, lanes=12)
    stream = ds.training_stream(8)
    with pytest.raises(ValueError, match="worker 2 is not below workers 2"):
        next(stream.iter_worker(2, 2))
    with pytest.raises(ValueError, match=r"only \d+ were left"):
        stream.advance(len(stream) + 1)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 12])
def test_ranks_in_lanes_read_their_share_and_together_the_sequence(tmp_path, world_size):
    rng = random.Random(77)
    n = write_dataset(tmp_path / "data", rng, files=5)
    ds = forebay.read_parquet(tmp_path / "data")
    order = {"seed": 9, "block_rows": 20, "window_rows": 60, "lanes": 12}
    batch = 7
    reference = whole_sequence(ds, 0, lane_chunk=batch, **order)
    lane_rows = n // (12 * batch) * batch
    tail = n - 12 * lane_rows
    delivered, read = [], []
    streams = [
        ds.training_stream(batch, world_size=world_size, rank=r, **order) for r in range(world_size)
    ]
    per_rank = [list(s) for s in streams]
    for r, s in enumerate(streams):
        epoch_stream = s._epoch_stream(0, 0)
        read.append(epoch_stream.rows_read())
        epoch_stream.close()
        assert read[-1] <= lane_rows * 12 // world_size + tail, (r, read[-1], n)
    for step in range(len(per_rank[0])):
        for rank_batches in per_rank:
            delivered += rank_batches[step].column("id").to_pylist()
    assert delivered == reference[: len(delivered)]
    assert n - len(delivered) < world_size * batch
    if world_size > 1:
        assert max(read) < n, "no rank reads the whole dataset"


def test_world_size_and_rank_from_torchrun_environment(tmp_path, monkeypatch):
    write_dataset(tmp_path / "data", random.Random(4), files=2)
    ds = forebay.read_parquet(tmp_path / "data")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    stream = ds.training_stream(4)
    assert (stream.world_size, stream.rank) == (3, 2)


def test_small_and_empty_datasets(tmp_path):
    (tmp_path / "e").mkdir()
    pq.write_table(pa.table({"id": pa.array([], pa.int64())}), tmp_path / "e" / "a.parquet")
    empty = forebay.read_parquet(tmp_path / "e").training_stream(4, remainder="pad")
    assert list(empty) == [] and len(empty) == 0 and empty.epoch == 1
    (tmp_path / "s").mkdir()
    pq.write_table(pa.table({"id": pa.array([0, 1, 2], pa.int64())}), tmp_path / "s" / "a.parquet")
    small = forebay.read_parquet(tmp_path / "s")
    assert list(small.training_stream(4)) == []  # drop: not one full batch
    padded = list(small.training_stream(8, seed=None, remainder="pad"))
    assert [b.column("id").to_pylist() for b in padded] == [[0, 1, 2, 0, 1, 2, 0, 1]]


def test_three_windows_must_fit_the_memory_limit(tmp_path):
    big = pa.table({"id": np.arange(200_000), "pad": np.zeros(200_000)})
    pq.write_table(big, tmp_path / "a.parquet", row_group_size=50_000)
    ds = forebay.read_parquet(tmp_path / "a.parquet")
    try:
        forebay.configure(memory_limit="2MB")
        stream = ds.training_stream(64, window_rows=100_000, block_rows=4096)
        with pytest.raises(
            ValueError,
            match=r"windows need ~4\.\d MiB at times .* limit of 1\.9 MiB. Lower window_rows",
        ):
            next(iter(stream))
        # A window that fits streams under the same limit.
        fits = ds.training_stream(64, window_rows=16_384, block_rows=4096)
        assert sum(b.num_rows for b in fits) == 200_000 // 64 * 64
    finally:
        forebay.configure(memory_limit=forebay._config._default_memory_limit())


def test_training_stream_over_s3(tmp_path):
    pytest.importorskip("moto")
    rng = random.Random(8)
    n = write_dataset(tmp_path / "data", rng, files=3)
    with moto_s3(tmp_path / "moto.log") as (client, endpoint):
        client.create_bucket(Bucket="train")
        for f in sorted((tmp_path / "data").iterdir()):
            client.upload_file(str(f), "train", f"ds/{f.name}")
        options = {"aws_endpoint": endpoint, **S3_CREDENTIALS}
        remote = forebay.read_parquet("s3://train/ds/", storage_options=options)
        order = {"seed": 4, "block_rows": 50, "window_rows": 200}
        local = whole_sequence(forebay.read_parquet(tmp_path / "data"), 0, **order)
        assert whole_sequence(remote, 0, **order) == local
        assert sorted(local) == list(range(n))
        # A state saved against the local copy resumes against the bucket: same dataset.
        stream = forebay.read_parquet(tmp_path / "data").training_stream(16, **order)
        next(iter(stream))
        resumed = remote.training_stream(16, **order)
        resumed.load_state_dict(stream.state_dict())
        rest = [i for b in resumed for i in b.column("id").to_pylist()]
        assert rest == local[16 : 16 + len(rest)]


@pytest.mark.parametrize("lanes", [None, 12])
def test_training_example_killed_and_resumed_with_other_world_sizes(tmp_path, lanes):
    """examples/training_resume.py: ranks in real processes (gradients averaged every
    step), SIGKILLed at random moments, resumed with 4 -> 3 -> 6 ranks; the samples the
    kept steps trained on are the uninterrupted sequence (in lanes too: each rank reading
    its own)."""
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "training_resume.py"
    out = subprocess.run(
        [
            sys.executable,
            str(example),
            "--seed",
            "3",
            "--worlds",
            "4,3,6",
            "--dir",
            str(tmp_path / "w"),
            *(["--lanes", str(lanes)] if lanes else []),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("killed; resuming") == 2, out.stdout
    assert "sequence identical to an uninterrupted run: True" in out.stdout


def test_a_stream_pickles_as_its_dataset_settings_and_position(tmp_path):
    import pickle

    write_dataset(tmp_path / "data", random.Random(12), files=3)
    ds = forebay.read_parquet(tmp_path / "data", columns=["id"])
    stream = ds.training_stream(8, seed=5, world_size=2, rank=1, block_rows=30, window_rows=90)
    it = iter(stream)
    next(it)
    copy = pickle.loads(pickle.dumps(stream))
    assert copy.state_dict() == stream.state_dict()
    assert (copy.world_size, copy.rank, copy.batch_size) == (2, 1, 8)
    rest = [b.column("id").to_pylist() for b in it]
    assert [b.column("id").to_pylist() for b in copy] == rest
    with pytest.raises(TypeError, match="without steps"):
        pickle.dumps(ds.map_batches(lambda b: b))


def test_torch_loader_with_workers_resumes_with_other_workers_and_ranks(tmp_path):
    torch = pytest.importorskip("torch")
    from forebay.torch import TrainingLoader

    write_dataset(tmp_path / "data", random.Random(13), files=4)
    ds = forebay.read_parquet(tmp_path / "data", columns=["id", "vec"])
    order = {"seed": 9, "block_rows": 40, "window_rows": 200}
    reference = whole_sequence(ds, 0, **order)

    def loaders(world, workers, state):
        out = []
        for rank in range(world):
            stream = ds.training_stream(4, world_size=world, rank=rank, **order)
            spawn = {"multiprocessing_context": "spawn"} if workers else {}
            loader = TrainingLoader(stream, num_workers=workers, **spawn)
            if state:
                loader.load_state_dict(state)
            out.append(loader)
        return out

    delivered = []
    state = None
    for world, workers, steps in [(2, 2, 7), (3, 0, 5), (1, 3, 10**6)]:
        ranks = loaders(world, workers, state)
        iterators = [iter(loader) for loader in ranks]
        for _ in range(min(steps, len(ranks[0]))):
            for it in iterators:
                batch = next(it)
                assert isinstance(batch["id"], torch.Tensor)
                assert batch["vec"].shape == (4, 2)
                delivered += batch["id"].tolist()
        state = ranks[0].state_dict()
        assert all(loader.state_dict() == state for loader in ranks)
        del iterators
    assert delivered == reference[: len(delivered)]
    assert len(reference) - len(delivered) < 4


def test_a_window_of_the_whole_dataset_shuffles_it_uniformly(tmp_path):
    (tmp_path / "data").mkdir()
    for f in range(4):  # four sorted files of uneven row groups
        ids = np.arange(f * 5000, (f + 1) * 5000)
        pq.write_table(
            pa.table({"id": ids}), tmp_path / "data" / f"{f}.parquet", row_group_size=1700
        )
    ds = forebay.read_parquet(tmp_path / "data")
    stream = ds.training_stream(100, seed=4, block_rows=256, window_rows=20_000)
    first = [i for _, b in zip(range(20), stream, strict=False) for i in b.column("id").to_pylist()]
    shares = np.bincount(np.array(first) // 5000, minlength=4) / len(first)
    # 2,000 samples: each file's share within 5 standard deviations (~0.05) of a quarter.
    assert np.all(np.abs(shares - 0.25) < 0.05), shares


def mix_of(ds_a, ds_b, world, rank, weights=(0.7, 0.3), seed=5, lanes=None):
    order = {"block_rows": 50, "window_rows": 200, "lanes": lanes}
    a = ds_a.training_stream(8, seed=1, world_size=world, rank=rank, **order)
    b = ds_b.training_stream(8, seed=2, world_size=world, rank=rank, **order)
    return forebay.mix([a, b], weights=list(weights), seed=seed), a, b


def two_datasets(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pq.write_table(
        pa.table({"id": np.arange(0, 700)}), tmp_path / "a" / "a.parquet", row_group_size=130
    )
    pq.write_table(
        pa.table({"id": np.arange(10_000, 10_250)}), tmp_path / "b" / "b.parquet", row_group_size=90
    )
    return forebay.read_parquet(tmp_path / "a"), forebay.read_parquet(tmp_path / "b")


def test_a_mix_draws_by_weight_and_each_source_keeps_its_own_order(tmp_path):
    ds_a, ds_b = two_datasets(tmp_path)
    mixed, _a, b = mix_of(ds_a, ds_b, 1, 0)
    batches = [bt.column("id").to_pylist() for bt in itertools.islice(mixed, 1500)]
    from_a = [x for x in batches if x[0] < 10_000]
    from_b = [x for x in batches if x[0] >= 10_000]
    assert all(all(i < 10_000 for i in x) for x in from_a), "a batch comes whole from a source"
    assert abs(len(from_a) / 1500 - 0.7) < 3 * (0.21 / 1500) ** 0.5 + 0.01
    # Source b's batches, in the mix's order, are b's own epochs one after another
    # (b has 250 rows: 31 full batches an epoch; the mix went through several of them).
    own = []
    for epoch in range(len(from_b) // 31 + 1):
        b.set_epoch(epoch)
        own += [x.column("id").to_pylist() for x in b]
    assert from_b == own[: len(from_b)]
    assert mixed.state_dict()["counts"] == [len(from_a), len(from_b)]


@pytest.mark.parametrize("case", range(12))
@pytest.mark.filterwarnings("ignore:lanes=.*reads more than its share:UserWarning")
def test_a_mix_resumes_with_other_world_sizes(tmp_path, case):
    rng = random.Random(500 + case)
    ds_a, ds_b = two_datasets(tmp_path)
    lanes = 4 if case % 2 else None  # sources in lanes: the same promise
    reference = [
        bt.column("id").to_pylist()
        for bt in itertools.islice(mix_of(ds_a, ds_b, 1, 0, lanes=lanes)[0], 600)
    ]
    delivered, state = [], None
    while len(delivered) < 300:
        world = rng.randint(1, 5)
        ranks = [mix_of(ds_a, ds_b, world, r, lanes=lanes)[0] for r in range(world)]
        for m in ranks:
            if state:
                m.load_state_dict(state)
        iterators = [iter(m) for m in ranks]
        for _ in range(rng.randint(0, 40)):
            for it in iterators:
                delivered.append(next(it).column("id").to_pylist())
        for it in iterators:
            it.close()
        states = [m.state_dict() for m in ranks]
        assert all(s == states[0] for s in states)
        state = states[0]
    assert delivered == reference[: len(delivered)]


def test_mix_arguments_and_states_are_checked(tmp_path):
    ds_a, ds_b = two_datasets(tmp_path)
    a = ds_a.training_stream(8, seed=1)
    with pytest.raises(ValueError, match="one weight per stream"):
        forebay.mix([a], weights=[0.5, 0.5])
    with pytest.raises(ValueError, match="non-negative"):
        forebay.mix([a, ds_b.training_stream(8)], weights=[1, -1])
    with pytest.raises(ValueError, match="same batch_size"):
        forebay.mix([a, ds_b.training_stream(16)], weights=[1, 1])
    with pytest.raises(TypeError, match="training streams"):
        forebay.mix([a, ds_b], weights=[1, 1])
    (tmp_path / "c").mkdir()
    pq.write_table(pa.table({"id": np.arange(100), "x": np.ones(100)}), tmp_path / "c" / "c.pq")
    wider = forebay.read_parquet(tmp_path / "c", file_extensions=["pq"]).training_stream(8)
    with pytest.raises(ValueError, match=r"same columns and types: source 1.*x: missing / double"):
        forebay.mix([a, wider], weights=[1, 1])
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"id": np.arange(100, dtype=np.int32)}), tmp_path / "d" / "d.pq")
    narrower = forebay.read_parquet(tmp_path / "d", file_extensions=["pq"]).training_stream(8)
    with pytest.raises(ValueError, match="id: int64 / int32"):
        forebay.mix([a, narrower], weights=[1, 1])
    mixed, _, _ = mix_of(ds_a, ds_b, 2, 0)
    it = iter(mixed)
    next(it)
    state = mixed.state_dict()
    other, _, _ = mix_of(ds_a, ds_b, 2, 0, weights=(0.5, 0.5))
    with pytest.raises(ValueError, match="other weights"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="inconsistent"):
        mix_of(ds_a, ds_b, 2, 0)[0].load_state_dict({**state, "counts": [0, 0]})
