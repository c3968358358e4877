"""forebay on Ray: forebay's reader as a Ray Data datasource, and the checkpoint index as
a set of actors that each own a share of the id space.

```text
 driver                          Ray cluster
 ──────                          ───────────
 read_parquet(paths) ── lists files, one footer (schema)
    │ groups files into tasks by bytes
    ▼
 ForebayParquetDatasource ──► read task ─► forebay reader (columns, row groups, footers once)
                               │ pyarrow blocks
                               ▼
 ShardedCheckpointFilter ───► filter step: shard_ids(ids) ─► one contains() per actor ─┐
                               ▲                                                        │
                               └──────────── masks ◄── shard actor 0 (shards 0, N, 2N…) ◄┤
                                                       shard actor 1 (shards 1, N+1, …) ◄┘
```

* :func:`read_parquet` returns a ``ray.data.Dataset``: everything Ray Data offers
  downstream (``map_batches``, ``streaming_split``, ``iter_batches``, writes) works on it.
* :class:`ShardedCheckpointFilter` loads a checkpoint (forebay's sharded layout or
  any Parquet files with an id column, such as the directory Ray Data's checkpointing
  writes) into actors that each hold only their own shards. Use it as a Ray Data step
  (``ds.map_batches(filter, batch_format="pyarrow")`` or ``filter.apply(ds)``) or, through
  :func:`checkpoint_config`, as the filter of Ray Data's own ``CheckpointConfig``.

``import forebay`` never imports Ray; this module needs ``pip install forebay[ray]``.
"""

from __future__ import annotations

from ._checkpoint import ShardedCheckpointFilter, checkpoint_config
from ._datasource import ForebayParquetDatasource, read_parquet
from ._lineage import RowCountWarning
from ._write import write_parquet

__all__ = [
    "ForebayParquetDatasource",
    "RowCountWarning",
    "ShardedCheckpointFilter",
    "checkpoint_config",
    "read_parquet",
    "write_parquet",
]
