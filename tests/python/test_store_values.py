"""forebay.ObjectStore with any picklable value: the arrays inside come back as read-only
views of the shared memory (no copy), in this process, in another one, and after a spill and
restore; the rest is rebuilt by pickle. Generated nested values round-trip equal."""

import dataclasses
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import forebay
from forebay import ObjectStore


@pytest.fixture
def store(tmp_path):
    s = ObjectStore(capacity="256MiB", spill_dir=str(tmp_path / "spill"))
    yield s
    s.close()


@dataclasses.dataclass
class Sample:
    name: str
    features: np.ndarray
    label: int | None = None


def _in_store(array: np.ndarray, store: ObjectStore) -> bool:
    """Whether ``array``'s memory lies inside the store's mapping (is a view, not a copy)."""
    base = array
    while getattr(base, "base", None) is not None:
        base = base.base
    return isinstance(base, memoryview) and base.readonly


def test_a_dict_of_arrays_comes_back_as_views(store):
    weights = {f"layer{i}": np.random.default_rng(i).random((256, 64)) for i in range(10)}
    weights["step"] = 7
    ref = store.put(weights)
    got = store.get(ref)
    assert got.keys() == weights.keys() and got["step"] == 7
    for k in weights:
        if k != "step":
            assert np.array_equal(got[k], weights[k]) and got[k].dtype == weights[k].dtype
            assert not got[k].flags.writeable
            assert _in_store(got[k], store)
            with pytest.raises(ValueError, match="read-only"):
                got[k][0, 0] = 1.0
    # The views pin the object; the last one let go unpins it.
    assert store.stats()["pinned_objects"] == 1
    one = got["layer3"]
    del got
    assert store.stats()["pinned_objects"] == 1
    assert store.delete(ref)
    assert float(one[0, 0]) == float(weights["layer3"][0, 0])  # still readable after delete
    used = store.stats()["bytes_used"]
    del one
    assert store.stats()["pinned_objects"] == 0 and store.stats()["bytes_used"] < used


def test_mixed_values_round_trip(store):
    frame = pd.DataFrame({"a": np.arange(5000), "b": np.linspace(0, 1, 5000), "c": ["x"] * 5000})
    values = [
        [1, "two", 3.0, None, (4, 5), {"six": np.arange(2000, dtype=np.int16)}],
        Sample("s", np.ones(3000, dtype=np.float32), label=1),
        frame,
        {"table": pa.table({"x": np.arange(10_000)}), "blob": b"\x00" * 10_000},
        {"view": memoryview(bytes(range(256)) * 64), "small": memoryview(b"abc")},
        np.array([1, "a", None], dtype=object),
        {1, 2, 3},
        {"f": float("nan"), "z": -0.0, "big": 2**100},
        np.arange(20_000, dtype=np.uint8)[::3],  # not contiguous: stored as its bytes
    ]
    for value in values:
        got = store.get(store.put(value))
        _assert_equal(got, value)
    frame_back = store.get(store.put(frame))
    assert not frame_back["a"].to_numpy().flags.writeable  # a view of the store


def test_functions_and_classes_of_the_script_travel_by_value(store, tmp_path):
    # A value put by a script whose class lives in the script (``__main__``) is read by a
    # process that never ran that script: cloudpickle ships the class by value.
    script = tmp_path / "producer.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import numpy as np, pickle, sys
            from forebay import ObjectStore
            class Point:
                def __init__(self, x, y): self.x, self.y = x, y
                def norm(self): return (self.x ** 2 + self.y ** 2) ** 0.5
            store = ObjectStore.attach({store.path!r})
            ref = store.put({{"p": Point(3, 4), "f": lambda v: v * 2, "a": np.arange(9000)}})
            sys.stdout.buffer.write(pickle.dumps(ref))
            """
        )
    )
    produced = subprocess.run([sys.executable, str(script)], capture_output=True, check=True)
    import pickle

    got = store.get(pickle.loads(produced.stdout))
    assert got["p"].norm() == 5.0 and got["f"](21) == 42
    assert _in_store(got["a"], store) and got["a"].sum() == np.arange(9000).sum()


def test_a_class_the_reader_cannot_import_is_named(store, tmp_path):
    module = tmp_path / "only_here" / "shapes_module.py"
    module.parent.mkdir()
    module.write_text("class Triangle:\n    sides = 3\n")
    script = textwrap.dedent(
        f"""
        import pickle, sys
        sys.path.insert(0, {str(module.parent)!r})
        import shapes_module
        from forebay import ObjectStore
        ref = ObjectStore.attach({store.path!r}).put([shapes_module.Triangle()])
        sys.stdout.buffer.write(pickle.dumps(ref))
        """
    )
    produced = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True)
    import pickle

    ref = pickle.loads(produced.stdout)
    with pytest.raises(forebay.StoreError, match=f"{ref.id}.*shapes_module"):
        store.get(ref)


def test_unpicklable_values_are_a_clear_error(store):
    with pytest.raises(TypeError, match=r"cannot store a dict.*pickle"):
        store.put({"lock": threading.Lock()})
    assert store.stats()["objects"] == 0


def test_create_array_is_written_in_place(store):
    with store.create_array((300, 7), "float32") as w:
        a = w.array()
        assert a.flags.writeable and a.shape == (300, 7)
        a[:] = np.arange(2100, dtype=np.float32).reshape(300, 7)
        del a
    got = store.get(w.ref)
    assert got.dtype == np.float32 and got.shape == (300, 7) and not got.flags.writeable
    assert np.array_equal(got, np.arange(2100, dtype=np.float32).reshape(300, 7))
    with store.create_array(0, "int64") as empty:
        pass
    assert store.get(empty.ref).shape == (0,)
    with pytest.raises(TypeError, match="create_array"):
        store.create(8).array()
    with pytest.raises(ValueError):
        store.create_array((-1, 3))


# --- generated values, spilled and restored ---------------------------------------------

_arrays = hnp.arrays(
    dtype=st.sampled_from([np.int8, np.int64, np.uint16, np.float32, np.float64, np.bool_]),
    shape=hnp.array_shapes(max_dims=3, max_side=40),
)
_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=64)
    | _arrays
    | st.integers(1_000, 30_000).map(lambda n: np.arange(n, dtype=np.float64))
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=25,
)


def _assert_equal(got, want):
    assert type(got) is type(want) or (isinstance(want, memoryview) and isinstance(got, memoryview))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype.hasobject:
            assert got.tolist() == want.tolist()
        else:
            assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # NaN, -0.0 by bits
    elif isinstance(want, pd.DataFrame):
        pd.testing.assert_frame_equal(got, want)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_equal(g, w)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            _assert_equal(got[k], want[k])
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got)
    elif isinstance(want, float):
        assert math.copysign(1, got) == math.copysign(1, want) and got == want
    elif isinstance(want, memoryview):
        assert got.tobytes() == want.tobytes()
    elif dataclasses.is_dataclass(want):
        _assert_equal(dataclasses.asdict(got), dataclasses.asdict(want))
    else:
        assert got == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(_values, min_size=1, max_size=6))
def test_generated_values_round_trip_after_spill_and_restore(tmp_path_factory, values):
    capacity = 8 << 20
    with ObjectStore(capacity=capacity, spill_dir=str(tmp_path_factory.mktemp("spill"))) as small:
        refs = [small.put(v) for v in values]
        # Crowd them out to disk: a filler of all but 8 KiB of the store.
        filler = small.put(np.zeros((capacity - 8192) // 8 - 64))
        small.delete(filler)
        for ref, value in zip(refs, values, strict=True):
            got = small.get(ref)
            if isinstance(value, bytes):  # bytes on their own come back as a memoryview
                got = got.tobytes()
            _assert_equal(got, value)
        if any(_size(v) > 16_384 for v in values):
            assert small.stats()["restored_objects"] > 0


def _size(value) -> int:
    import pickle

    return len(pickle.dumps(value, protocol=5))


# --- other processes ----------------------------------------------------------------------


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon")


def _child_gets_views(path, ref, out, hold):
    try:
        store = ObjectStore.attach(path)
        before = _rss_anon_kib()
        got = store.get(ref)
        sums = {k: float(v.sum()) for k, v in got.items()}  # touches every page
        views = all(not v.flags.writeable for v in got.values())
        grew_kib = _rss_anon_kib() - before
        out.put((sums, views, grew_kib))
        if hold:
            time.sleep(120)
    except BaseException as e:  # noqa: BLE001 - report anything; never leave the parent waiting
        out.put((repr(e), None, None))


def test_another_process_gets_views_not_copies_and_its_death_leaks_nothing(store):
    arrays = {f"w{i}": np.full(1_000_000, float(i)) for i in range(10)}  # 80 MB
    ref = store.put(arrays)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_child_gets_views, args=(store.path, ref, out, True))
    p.start()
    sums, views, grew_kib = out.get(timeout=60)
    assert sums == {k: float(v.sum()) for k, v in arrays.items()}, sums
    assert views is True
    # Its private memory did not grow by the arrays' 80 MB: they are the store's pages.
    assert grew_kib < 8_000, grew_kib
    assert store.stats()["pinned_objects"] == 1
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    deadline = time.monotonic() + 10
    while store.stats()["pinned_objects"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert store.stats()["pinned_objects"] == 0
    assert store.delete(ref) and store.stats()["bytes_used"] == 0


# --- the engine's worker processes ---------------------------------------------------------


class WeightReader:
    def __init__(self, weight, scale=1.0):
        self.seen = (float(weight.sum()) * scale, not weight.flags.writeable, os.getpid())

    def __call__(self, batch):
        n = len(batch["x"])
        total, read_only, pid = self.seen
        return {
            "x": batch["x"],
            "total": np.full(n, total),
            "read_only": np.full(n, read_only),
            "pid": np.full(n, pid),
        }


@pytest.mark.parametrize("mib", [0.5, 8])
def test_process_workers_get_large_constructor_arguments_through_shared_memory(tmp_path, mib):
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": np.arange(20_000)}), path, row_group_size=1_000)
    weight = np.random.default_rng(3).random(int(mib * 2**20) // 8)
    ds = forebay.read_parquet(str(path)).map_batches(
        WeightReader,
        fn_constructor_args=(weight,),
        fn_constructor_kwargs={"scale": 2.0},
        compute="processes",
        concurrency=2,
        batch_format="numpy",
        batch_size=1_000,
    )
    out = ds.to_arrow()
    assert sorted(out.column("x").to_pylist()) == list(range(20_000))
    assert set(out.column("total").to_pylist()) == {float(weight.sum()) * 2.0}
    # Small arguments travel pickled (writable copies); 1 MiB and more, as shared views.
    assert set(out.column("read_only").to_pylist()) == {mib >= 1}
    # Run again (new workers): the shared copy is reused, not put a second time.
    again = ds.to_arrow()
    assert set(again.column("total").to_pylist()) == {float(weight.sum()) * 2.0}


def _input_is_a_view(batch):
    arrays = list(batch.values())
    n = len(arrays[0])
    return {"x": batch["x"], "view": np.full(n, all(not a.flags.writeable for a in arrays))}


@pytest.mark.parametrize("zero_copy_batch", [True, False])
def test_process_workers_get_numpy_batches_as_views_of_the_store(tmp_path, zero_copy_batch):
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    table = pa.table({"x": np.arange(4_000), "f": np.linspace(0, 1, 4_000)})
    pq.write_table(table, path, row_group_size=500)
    out = (
        forebay.read_parquet(str(path))
        .map_batches(
            _input_is_a_view,
            compute="processes",
            concurrency=2,
            batch_format="numpy",
            zero_copy_batch=zero_copy_batch,
        )
        .to_arrow()
    )
    assert sorted(out.column("x").to_pylist()) == list(range(4_000))
    # zero_copy_batch=True: the arrays are the store's pages; False: writable copies (Ray's
    # default).
    assert set(out.column("view").to_pylist()) == {zero_copy_batch}


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_numpy_subclasses_keep_their_type(store):
    masked = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    got = store.get(store.put(masked))
    assert isinstance(got, np.ma.MaskedArray) and got.mask.tolist() == [False, True, False]
    matrix = np.asmatrix(np.eye(3))
    assert type(store.get(store.put(matrix))) is np.matrix
