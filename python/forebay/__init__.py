"""forebay: the data plane for resumable batch inference and training ingest.

Rust does the reading, filtering and decoding; Python receives Arrow data without copies.

    >>> import forebay
    >>> ds = forebay.read_parquet("data/", columns=["id", "text"], filter=[("score", ">", 0.5)])
    >>> for batch in ds:          # pyarrow.RecordBatch, streamed with bounded memory
    ...     ...
    >>> table = ds.to_arrow()     # or polars.from_arrow(ds), duckdb.sql("select ... from ds")
"""

from __future__ import annotations

from ._cpu import require_cpu_features

require_cpu_features()  # before the extension loads: a clear error, not SIGILL

from . import _forebay
from ._call_errors import RowError, TransientError
from ._checkpoint_config import Checkpoint
from ._checkpoint_filter import CheckpointFilter
from ._config import configure
from ._dataset import Dataset
from ._forebay import (
    CheckpointError,
    ColumnNotFoundError,
    CorruptFileError,
    DatasetNotFoundError,
    ForebayError,
    InvalidFilterError,
    MemoryLimitExceeded,
    ObjectNotFoundError,
    ParquetError,
    SchemaMismatchError,
    SpillError,
    StageError,
    StorageError,
    StoreError,
    StoreFullError,
    WorkerDiedError,
    WriteError,
)
from ._mix import MixedStream, mix
from ._read import read_parquet
from ._spill import RemoteSpillTarget, SpillArea
from ._store import ObjectRef, ObjectStore, ObjectWriter
from ._training import TrainingStream

__version__ = _forebay.__version__

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointFilter",
    "ColumnNotFoundError",
    "CorruptFileError",
    "Dataset",
    "DatasetNotFoundError",
    "ForebayError",
    "InvalidFilterError",
    "MemoryLimitExceeded",
    "MixedStream",
    "ObjectNotFoundError",
    "ObjectRef",
    "ObjectStore",
    "ObjectWriter",
    "ParquetError",
    "RemoteSpillTarget",
    "RowError",
    "SchemaMismatchError",
    "SpillArea",
    "SpillError",
    "StageError",
    "StorageError",
    "StoreError",
    "StoreFullError",
    "TrainingStream",
    "TransientError",
    "WorkerDiedError",
    "WriteError",
    "configure",
    "mix",
    "read_parquet",
]
