"""A small job run by `make test` in a fresh virtual environment that holds only the wheel
and its declared runtime dependencies (pyarrow, numpy): a dev-only import, a missing
dependency or a wheel that does not load fails here, not on a user's machine.

It exercises each component once and checks the results against pyarrow.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import forebay


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "data"
        data.mkdir()
        for part in range(3):
            ids = np.arange(part * 1000, (part + 1) * 1000)
            pq.write_table(
                pa.table({"id": ids, "text": [f"row {i}" for i in ids], "x": ids * 0.5}),
                data / f"part-{part}.parquet",
                row_group_size=300,
            )
        expected = pq.read_table(data)

        # Reader: projection and filter.
        ds = forebay.read_parquet(str(data), columns=["id", "x"], filter=[("id", ">=", 500)])
        table = ds.to_arrow()
        assert table.num_rows == 2500, table.num_rows
        assert table.column("x").to_pylist() == [i * 0.5 for i in range(500, 3000)]

        # Checkpoint: the first 1,000 ids are done.
        done = forebay.CheckpointFilter(pa.int64())
        done.insert(pa.array(np.arange(1000)))
        done.write(str(root / "checkpoint"))
        loaded = forebay.CheckpointFilter.load(str(root / "checkpoint"), "id")
        remaining = sum(b.num_rows for b in loaded.filter(forebay.read_parquet(str(data))))
        assert remaining == expected.num_rows - 1000, remaining

        # Object store: zero-copy round trip.
        with forebay.ObjectStore(capacity="64MiB") as store:
            ref = store.put(expected)
            assert store.get(ref).equals(expected)

    print(f"smoke job OK (forebay {forebay.__version__}, python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
