"""forebay in a forked child: a process that used forebay forks (multiprocessing's default
start method on Linux, PyTorch DataLoader workers), and the child uses forebay as well.

The child inherits its parent's memory but none of its threads; forebay's runtime starts
again in the child. Every case runs in a subprocess with a deadline, so a hang fails the test
(and is killed) instead of stalling the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

DEADLINE = 120


def _data(directory: Path) -> Path:
    directory.mkdir()
    for f in range(3):
        ids = np.arange(f * 1000, (f + 1) * 1000)
        pq.write_table(
            pa.table({"id": ids, "x": ids * 0.5}), directory / f"{f}.parquet", row_group_size=100
        )
    return directory


def _run(script: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_fork_pool_reads_after_the_parent_read(tmp_path):
    data = _data(tmp_path / "data")
    out = _run(
        f"""
        import multiprocessing, forebay
        path = {str(data)!r}

        def rows(filter_id):
            ds = forebay.read_parquet(path, filter=[("id", ">=", filter_id)])
            return ds.to_arrow().num_rows

        assert forebay.read_parquet(path).count_rows() == 3000
        with multiprocessing.get_context("fork").Pool(2) as pool:
            print(pool.map_async(rows, [0, 1500, 2999]).get(timeout={DEADLINE - 30}))
        # the parent still works after its children
        print(forebay.read_parquet(path).to_arrow().num_rows)
        """
    )
    assert out.split("\n")[:2] == ["[3000, 1500, 1]", "3000"]


def test_a_child_forked_in_the_middle_of_a_read_reads_too(tmp_path):
    """The parent's runtime is busy (a read half done, its threads mid-task) when it forks."""
    data = _data(tmp_path / "data")
    out = _run(
        f"""
        import os, forebay
        path = {str(data)!r}
        batches = forebay.read_parquet(path, batch_size=100).iter_batches()
        first = next(iter(batches))
        pid = os.fork()
        if pid == 0:
            n = forebay.read_parquet(path).to_arrow().num_rows
            os._exit(0 if n == 3000 else 1)
        rest = sum(b.num_rows for b in batches)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), first.num_rows + rest)
        """
    )
    assert out.split() == ["0", "3000"]


def test_training_loader_with_the_dataloader_default_start_method(tmp_path):
    pytest.importorskip("torch")
    data = _data(tmp_path / "data")
    out = _run(
        f"""
        import multiprocessing, forebay
        from forebay.torch import TrainingLoader
        assert multiprocessing.get_start_method() == "fork"
        ds = forebay.read_parquet({str(data)!r})
        assert ds.count_rows() == 3000  # forebay's runtime runs in the parent first
        stream = ds.training_stream(100, seed=1)
        loader = TrainingLoader(stream, num_workers=2)
        for epoch in range(2):
            ids = sorted(i for batch in loader for i in batch["id"].tolist())
            print(ids == list(range(3000)))
        """
    )
    assert out.split() == ["True", "True"]


def test_a_training_stream_made_before_the_fork_is_read_in_the_children(tmp_path):
    """What a DataLoader's forked workers do (without torch): each child iterates the
    stream object it inherited, planned by the parent, which read with forebay before."""
    data = _data(tmp_path / "data")
    out = _run(
        f"""
        import os, forebay
        ds = forebay.read_parquet({str(data)!r})
        stream = ds.training_stream(100, seed=1)
        assert len(stream) == 30  # the stream was planned in the parent
        same = ds.training_stream(100, seed=1)
        parent = [i for batch in same for i in batch.column("id").to_pylist()]
        children = []
        for _ in range(2):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                ids = [i for batch in stream for i in batch.column("id").to_pylist()]
                os.write(write, repr(ids).encode())
                os._exit(0)
            os.close(write)
            with os.fdopen(read) as pipe:
                children.append(eval(pipe.read()))
            os.waitpid(pid, 0)
        print(sorted(parent) == list(range(3000)), all(c == parent for c in children))
        """
    )
    assert out.split() == ["True", "True"]
