"""``ShardedCheckpointFilter``: a checkpoint index spread over Ray actors by hash shard.

Every id hashes to one of ``num_shards`` shards (forebay-checkpoint's documented hash, the
same that names its ``shard=<k>/`` directories); actor ``a`` owns shards ``a, a + N, a + 2N,
...`` for ``N`` actors and loads only those (from a forebay checkpoint, only their
directories; from any other Parquet files with an id column, every id is read once per actor
and only its own are kept). A batch is filtered with one ``contains`` request per actor that
owns some of its ids; ids travel as Arrow arrays through Ray's object store.

Actors restart when they die (``max_restarts=-1``) and reload their shards in ``__init__``;
their calls are retried (``max_task_retries=-1``), so a killed actor costs time, not rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

import forebay

from .._checkpoint_filter import DEFAULT_NUM_SHARDS, CheckpointFilter
from .._forebay import CheckpointError, DatasetNotFoundError

try:
    import ray
    from pyarrow.fs import FileSelector, FileType
    from ray.data.checkpoint import CheckpointConfig
    from ray.data.checkpoint.checkpoint_filter import CheckpointFilter as RayCheckpointFilter
    from ray.data.checkpoint.checkpoint_filter import CheckpointManager
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("forebay.ray needs Ray Data: pip install 'forebay[ray]'") from e


#: The Ray namespace of forebay's named actors.
ACTOR_NAMESPACE = "forebay"


def owned_shards(actor: int, num_actors: int, num_shards: int) -> list[int]:
    """The shards actor ``actor`` of ``num_actors`` owns: ``actor, actor + N, ...``."""
    return list(range(actor, num_shards, num_actors))


def default_num_actors(cluster_cpus: int, num_shards: int = DEFAULT_NUM_SHARDS) -> int:
    """Shard actors by default: one per two CPUs of the cluster, 1-4 (and at most one per
    shard). Each is a Python process of its own (~100 MB and a second of CPU to start)."""
    return max(1, min(4, num_shards, cluster_cpus // 2))


def stop_named_actors(prefix: str) -> int:
    """Stop the actors named ``prefix-<n>`` in forebay's namespace (left by a killed
    driver); returns how many there were."""
    stopped = 0
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name, namespace = actor["name"], actor["namespace"]
        if namespace == ACTOR_NAMESPACE and name.startswith(f"{prefix}-"):
            try:
                ray.kill(ray.get_actor(name, namespace=namespace), no_restart=True)
                stopped += 1
            except ValueError:
                pass  # gone meanwhile
    return stopped


def forebay_cause(error: BaseException) -> forebay.ForebayError | None:
    """The forebay error a Ray task raised, found through Ray's wrappers (``RayTaskError``,
    Ray Data's ``UserCodeException``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        # Ray's wrapper subclasses the error's type too (``RayTaskError(WriteError)``).
        if isinstance(e, forebay.ForebayError) and not isinstance(e, ray.exceptions.RayError):
            return e
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return None


def get_raising_forebay_errors(refs: list[Any]) -> list[Any]:
    """``ray.get(refs)``, raising a forebay error of the actor or task as itself (not
    wrapped in Ray's ``RayTaskError``)."""
    try:
        return list(ray.get(refs))
    except ray.exceptions.RayError as e:
        cause = forebay_cause(e)
        if cause is None:
            raise
        raise cause from None


def _missing(path: str, storage_options: dict[str, str] | None) -> bool:
    """Whether ``path`` holds no Parquet file at all (a checkpoint not written yet)."""
    try:
        # forebay's id parts sit in shard=k directories: not a user's partitions.
        forebay.read_parquet(path, storage_options=storage_options, partitioning=None)
    except DatasetNotFoundError:
        return True
    except forebay.ForebayError:
        return False
    return False


class _ShardOwner:
    """One actor's part of the index (the class Ray runs as an actor)."""

    def __init__(
        self,
        path: str,
        id_column: str,
        num_shards: int,
        shards: list[int],
        storage_options: dict[str, str] | None,
        num_threads: int,
    ):
        self.shards = shards
        # A load error is kept and raised by every call: the actor stays up (a restart
        # would fail the same way, forever) and callers get the error itself.
        self.error: forebay.ForebayError | None = None
        self.index: CheckpointFilter | None = None
        try:
            self.index = CheckpointFilter.load(
                path,
                id_column,
                num_shards=num_shards,
                shards=shards,
                storage_options=storage_options,
                num_threads=num_threads,
            )
        except CheckpointError as e:
            if not _missing(path, storage_options):
                self.error = e
            # else: no checkpoint yet, nothing is done
        except forebay.ForebayError as e:
            self.error = e

    def contains(self, ids: pa.Array) -> pa.Array:
        if self.error is not None:
            raise self.error
        if self.index is None:
            return pa.array(np.zeros(len(ids), dtype=bool))
        return self.index.contains(ids)

    def describe(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return {
            "shards": self.shards,
            "ids": len(self.index) if self.index is not None else 0,
            "memory_bytes": self.index.memory_bytes if self.index is not None else 0,
        }


class PendingProbe:
    """Requests sent to the shard actors for a batch of ids; :meth:`answer` waits."""

    def __init__(self, rows: int, requests: list[tuple[np.ndarray | None, Any]]):
        self.rows = rows
        self.requests = requests

    def answer(self) -> np.ndarray:
        """Whether each id is done (a boolean numpy array)."""
        done = np.zeros(self.rows, dtype=bool)
        masks = get_raising_forebay_errors([request for _, request in self.requests])
        for (where, _), mask in zip(self.requests, masks, strict=True):
            values = mask.to_numpy(zero_copy_only=False)
            if where is None:
                done[:] = values
            else:
                done[where] = values
        return done


class ShardedCheckpointFilter:
    """Drop rows whose id a checkpoint holds, with the index spread over Ray actors.

    path: a forebay checkpoint (a manifest, ``shard=<k>/`` directories and the ``ids/``
        files of checkpointed writes), or any file, directory, glob or URI of Parquet files
        with an ``id_column`` (such as the directory Ray Data's ``CheckpointConfig``
        writes). A missing path means nothing is done yet.
    num_shards: hash shards (a power of two; default 16). Give a forebay checkpoint's own
        count so that each actor reads only its directories and row groups.
    num_actors: actors sharing the shards (1..num_shards; default one per two CPUs of the
        cluster, 1-4). Each holds about 13 bytes per id it owns.
    storage_options: object_store options for URIs (as :func:`forebay.read_parquet`).
    num_cpus_per_actor: CPUs each actor reserves (default 0: the actors mostly wait, and a
        reservation takes CPUs from the tasks that feed them; on a 2-CPU cluster 4 actors of
        0.5 CPU would leave no CPU to any task). The actors and one task must fit the
        cluster, else ValueError.
    num_threads_per_actor: probing threads of an actor.
    wait_for_load: wait in the constructor until every actor has loaded its shards (a load
        error, such as a missing id column, is raised there); False lets the caller start
        reading meanwhile (the first request then waits, and a load error surfaces with
        it).
    first_actor_class: the class actor 0 runs (a subclass of the shard owner that also does
        another job of the caller's, saving a Ray worker process; default: a shard owner).
    name: name the actors ``<name>-<n>`` in the ``"forebay"`` namespace, stopping actors of
        those names first (left behind by a killed driver). For one user of the name at a
        time (forebay.ray.write_parquet names them after the checkpoint it holds locked).

    Construction starts the actors. Call it on a ``pyarrow.Table`` or ``RecordBatch`` to get the rows
    not done, or use it as a Ray Data step: :meth:`apply` (``ds.map_batches(self,
    batch_format="pyarrow")``). It pickles as its actor handles.
    """

    def __init__(
        self,
        path: str,
        id_column: str,
        *,
        num_shards: int | None = None,
        num_actors: int | None = None,
        storage_options: Mapping[str, str] | None = None,
        num_cpus_per_actor: float = 0.0,
        num_threads_per_actor: int = 1,
        wait_for_load: bool = True,
        first_actor_class: type[_ShardOwner] = _ShardOwner,
        name: str | None = None,
    ):
        num_shards = DEFAULT_NUM_SHARDS if num_shards is None else num_shards
        if num_shards < 1 or num_shards & (num_shards - 1):
            raise ValueError(f"num_shards must be a power of two, not {num_shards}")
        if not ray.is_initialized():
            ray.init()
        cluster = ray.cluster_resources().get("CPU", 0)  # type: ignore[no-untyped-call]
        if num_actors is None:
            num_actors = default_num_actors(int(cluster), num_shards)
        if not 1 <= num_actors <= num_shards:
            raise ValueError(f"num_actors must be 1..{num_shards} (num_shards), not {num_actors}")
        if num_cpus_per_actor < 0:
            raise ValueError(f"num_cpus_per_actor must be >= 0, not {num_cpus_per_actor}")
        if num_actors * num_cpus_per_actor + 1 > cluster:
            raise ValueError(
                f"{num_actors} filter actors x {num_cpus_per_actor:g} CPU and a task (1 CPU) "
                f"need {num_actors * num_cpus_per_actor + 1:g} CPUs and the Ray cluster has "
                f"{cluster:g}: the tasks feeding the actors would wait forever; lower "
                "num_cpus_per_actor (0 reserves nothing) or num_actors"
            )
        self.path = str(path)
        self.id_column = id_column
        self.num_shards = num_shards
        options = dict(storage_options) if storage_options else None
        if name is not None:
            stop_named_actors(name)
        self.actors: list[Any] = []
        for a in range(num_actors):
            actor_options: dict[str, Any] = {
                "num_cpus": num_cpus_per_actor,
                "max_restarts": -1,
                "max_task_retries": -1,
            }
            if name is not None:
                actor_options.update(name=f"{name}-{a}", namespace=ACTOR_NAMESPACE)
            self.actors.append(
                ray.remote(first_actor_class if a == 0 else _ShardOwner)
                .options(**actor_options)
                .remote(
                    self.path,
                    id_column,
                    num_shards,
                    owned_shards(a, num_actors, num_shards),
                    options,
                    num_threads_per_actor,
                )
            )
        self._routers: dict[pa.DataType, CheckpointFilter] = {}
        if wait_for_load:
            try:
                self.describe()  # waits for every actor's load; raises its error
            except BaseException:
                self.shutdown()
                raise

    def describe(self) -> list[dict[str, Any]]:
        """Per actor: its shards, ids held and index bytes. An actor's load error (a
        damaged file, a missing id column) is raised as itself."""
        return list(get_raising_forebay_errors([a.describe.remote() for a in self.actors]))

    def __len__(self) -> int:
        return sum(d["ids"] for d in self.describe())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_routers"] = {}
        return state

    def _router(self, id_type: pa.DataType) -> CheckpointFilter:
        """An empty index of the ids' type: it only computes their shards."""
        router = self._routers.get(id_type)
        if router is None:
            router = CheckpointFilter(id_type, num_shards=self.num_shards, id_column=self.id_column)
            self._routers[id_type] = router
        return router

    def done(self, ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """A boolean numpy array: whether each id is in the checkpoint (nulls: False)."""
        return self.ask(ids).answer()

    def ask(self, ids: pa.Array | pa.ChunkedArray) -> PendingProbe:
        """Send the requests for ``ids`` (one per actor owning some) and return at once;
        ``.answer()`` waits for the mask. Lets a caller read on while the actors probe."""
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if len(ids) == 0:
            return PendingProbe(0, [])
        if len(self.actors) == 1:
            return PendingProbe(len(ids), [(None, self.actors[0].contains.remote(ids))])
        shards = self._router(ids.type).shard_ids(ids).to_numpy()
        owner = shards % len(self.actors)
        positions = [np.flatnonzero(owner == a) for a in range(len(self.actors))]
        return PendingProbe(
            len(ids),
            [
                (where, actor.contains.remote(ids.take(pa.array(where))))
                for actor, where in zip(self.actors, positions, strict=True)
                if len(where)
            ],
        )

    def __call__(self, batch: pa.Table | pa.RecordBatch) -> pa.Table | pa.RecordBatch:
        if self.id_column not in batch.schema.names:
            raise KeyError(
                f"ShardedCheckpointFilter: the batch has no id column {self.id_column!r} "
                f"(columns: {batch.schema.names})"
            )
        done = self.done(batch.column(self.id_column))
        if not done.any():
            return batch
        return batch.filter(pa.array(~done))

    def apply(self, ds: ray.data.Dataset, **map_batches_args: Any) -> ray.data.Dataset:
        """``ds`` without the rows whose id is done (a ``map_batches`` step in Ray tasks)."""
        return ds.map_batches(self, batch_format="pyarrow", **map_batches_args)

    def shutdown(self) -> None:
        """Stop the actors (they also stop when the last handle to this filter is gone)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


# ------------------------------------------------------------------ CheckpointConfig plug-in

#: Filters started by the plug-in's manager, kept alive for the driver's session: Ray hands
#: its filter actors only an ObjectRef of the filter.
_STARTED: list[ShardedCheckpointFilter] = []


class ShardedCheckpointManager(CheckpointManager):
    """Ray Data's checkpoint manager, loading into forebay's sharded actors instead of one
    sorted numpy array: Ray calls it on the driver while planning a checkpointed run."""

    def __init__(self, checkpoint_config: CheckpointConfig, data_context: Any):
        super().__init__(checkpoint_config=checkpoint_config, data_context=data_context)
        self._sharding: dict[str, Any] = getattr(checkpoint_config, "_forebay_sharding", {})

    def load_checkpoint(
        self, data_file_dir: str | None = None, data_file_filesystem: Any = None
    ) -> tuple[Any, int]:
        # Ray's own two-phase commit leaves pending files after a crash: resolve them first.
        if data_file_dir is not None:
            self._clean_pending_checkpoints(data_file_dir, data_file_filesystem)
        entries = self.filesystem.get_file_info(
            FileSelector(self.checkpoint_path_unwrapped, recursive=True, allow_not_found=True)
        )
        if not any(e.type == FileType.File and e.path.endswith(".parquet") for e in entries):
            return None, 0
        sharding, path = dict(self._sharding), self.checkpoint_path
        derived = object_store_options(self.filesystem)
        if derived is not None and not sharding.get("storage_options"):
            # Ray's filesystem (CheckpointConfig(override_filesystem=...)) says where the
            # checkpoint is and how to reach it: forebay's reader is told the same.
            sharding["storage_options"] = derived
            path = f"s3://{self.checkpoint_path_unwrapped}"
        sharded = ShardedCheckpointFilter(path, str(self.id_column), **sharding)
        _STARTED.append(sharded)
        return ray.put(sharded), 1 << 20


def object_store_options(filesystem: Any) -> dict[str, str] | None:
    """forebay's object_store options for a ``pyarrow.fs.S3FileSystem`` (its credentials,
    region and endpoint, the settings given to it and left empty otherwise, as object_store
    reads the rest from the environment as pyarrow does); None for any other filesystem."""
    from pyarrow.fs import S3FileSystem

    if not isinstance(filesystem, S3FileSystem):
        return None
    # pyarrow exposes an S3FileSystem's settings only through its pickling arguments.
    _, (settings,) = filesystem.__reduce__()
    options: dict[str, str] = {}
    for setting, option in (
        ("access_key", "aws_access_key_id"),
        ("secret_key", "aws_secret_access_key"),
        ("session_token", "aws_session_token"),
        ("region", "aws_region"),
    ):
        if settings.get(setting):
            options[option] = str(settings[setting])
    endpoint = settings.get("endpoint_override")
    if endpoint:
        scheme = settings.get("scheme") or "https"
        if "://" not in endpoint:
            endpoint = f"{scheme}://{endpoint}"
        options["aws_endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["aws_allow_http"] = "true"
    if settings.get("anonymous"):
        options["aws_skip_signature"] = "true"
    if settings.get("force_virtual_addressing"):
        options["aws_virtual_hosted_style_request"] = "true"
    return options


class ShardedRayCheckpointFilter(RayCheckpointFilter):
    """Ray Data's per-actor checkpoint filter, routing each block to the shard actors."""

    def __init__(self, config: CheckpointConfig, checkpoint_ref: Any = None):
        super().__init__(config, checkpoint_ref)
        self.sharded: ShardedCheckpointFilter = ray.get(checkpoint_ref)

    def filter_rows_for_block(self, block: pa.Table) -> pa.Table:
        if len(block) == 0:
            return block
        return self.sharded(block)


def checkpoint_config(
    id_column: str,
    checkpoint_path: str,
    *,
    num_shards: int | None = None,
    num_actors: int | None = None,
    storage_options: Mapping[str, str] | None = None,
    num_cpus_per_actor: float = 0.0,
    **ray_options: Any,
) -> CheckpointConfig:
    """Ray Data's ``CheckpointConfig`` with forebay's sharded index as its filter.

    Set it as ``ray.data.DataContext.get_current().checkpoint_config``; Ray's checkpointed
    runs then load the checkpoint into :class:`ShardedCheckpointFilter` actors (about 13
    bytes per id, split over ``num_actors``) instead of one sorted numpy array per filter
    actor. ``ray_options`` are other ``CheckpointConfig`` arguments
    (``delete_checkpoint_on_success``, ``override_filesystem``, ...); ``storage_options``
    are forebay's object_store options for the same path, by default those of an
    ``override_filesystem`` that is a ``pyarrow.fs.S3FileSystem`` (credentials, region,
    endpoint).
    """
    config = CheckpointConfig(
        id_column,
        checkpoint_path,
        checkpoint_filter_cls=ShardedRayCheckpointFilter,
        checkpoint_manager_cls=ShardedCheckpointManager,
        **ray_options,
    )
    # Ray constructs the manager with the config alone: the sharding rides on it.
    sharding = {
        "num_shards": num_shards,
        "num_actors": num_actors,
        "storage_options": dict(storage_options) if storage_options else None,
        "num_cpus_per_actor": num_cpus_per_actor,
    }
    setattr(config, "_forebay_sharding", sharding)  # noqa: B010
    return config
