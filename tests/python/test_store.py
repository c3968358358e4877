"""forebay.ObjectStore: byte-exact round trips of every supported type, zero copy, pins,
eviction and restore under a small cap, cross-process gets, SIGKILLed clients, and attach
refused for a store that is not ours."""

import multiprocessing as mp
import os
import pickle
import signal
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

import forebay
from forebay import ObjectRef, ObjectStore


@pytest.fixture
def store(tmp_path):
    s = ObjectStore(capacity="64MiB", spill_dir=str(tmp_path / "spill"))
    yield s
    s.close()


def _address(value):
    """Address of the first data buffer of a pyarrow value (to compare two gets)."""
    if isinstance(value, pa.Table):
        value = value.column(0).chunk(0)
    if isinstance(value, pa.RecordBatch):
        value = value.column(0)
    return [b.address for b in value.buffers() if b is not None][-1]


def test_bytes_like_round_trip(store):
    for value in [
        b"",
        b"x",
        bytes(range(256)) * 1000,
        bytearray(b"abc" * 99),
        memoryview(b"0123456789")[2:7],
    ]:
        ref = store.put(value)
        got = store.get(ref)
        assert isinstance(got, memoryview) and got.readonly
        assert got.tobytes() == bytes(value)
    strided = memoryview(np.arange(10, dtype=np.uint8))[::2]  # not contiguous: its bytes
    assert store.get(store.put(strided)).tobytes() == strided.tobytes()
    with pytest.raises(TypeError, match="cannot be pickled"):
        store.put(threading.Lock())


@pytest.mark.parametrize(
    "array",
    [
        np.arange(1000, dtype=np.int64),
        np.linspace(0, 1, 999, dtype=np.float32).reshape(27, 37),
        np.array([True, False, True]),
        np.array([1 + 2j, 3 - 4j], dtype=np.complex128),
        np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[ns]"),
        np.array([b"ab", b"cde"], dtype="S3"),
        np.array(["ab", "cdé"], dtype="U3"),
        np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,)), ("c", "S2")]),
        np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
        np.arange(100, dtype=np.uint8)[::3],
        np.zeros((0, 3)),
        np.array(5.5),
        np.arange(10, dtype=">i4"),
    ],
)
def test_ndarray_round_trip(store, array):
    got = store.get(store.put(array))
    assert got.dtype == array.dtype and got.shape == array.shape
    assert np.array_equal(got, array)
    assert got.tobytes() == np.ascontiguousarray(array).tobytes()
    assert not got.flags.writeable


def test_object_arrays_are_pickled(store):
    got = store.get(store.put(np.array([1, "a", None], dtype=object)))
    assert got.dtype == object and got.tolist() == [1, "a", None]


def _tables():
    n = 5000
    rng = np.random.default_rng(7)
    t = pa.table(
        {
            "i": pa.array(rng.integers(0, 1 << 40, n), mask=rng.random(n) < 0.1),
            "f": rng.random(n),
            "s": pa.array([None if i % 11 == 0 else f"row-{i}-é" for i in range(n)]),
            "ls": pa.array([f"{i}" * (i % 7) for i in range(n)], pa.large_string()),
            "b": pa.array(rng.random(n) < 0.5),
            "list": pa.array([list(range(i % 5)) for i in range(n)]),
            "struct": pa.array([{"x": i, "y": str(i)} for i in range(n)]),
            "dict": pa.array(
                ["red", "green", "blue"] * (n // 3) + ["red"] * (n % 3)
            ).dictionary_encode(),
            "ts": pa.array(np.arange(n).astype("datetime64[us]")),
            "dec": pa.array([i * 10 for i in range(n)], pa.decimal128(20, 3)),
            "fsb": pa.array([i.to_bytes(4, "little") for i in range(n)], pa.binary(4)),
        }
    )
    multi = pa.concat_tables([t.slice(0, 100), t.slice(100, 1), t.slice(101, 4000)])
    return [t, multi, t.slice(17, 333), t.schema.empty_table()]


def test_arrow_round_trip_is_exact_and_zero_copy(store):
    for table in _tables():
        ref = store.put(table)
        got = store.get(ref)
        assert isinstance(got, pa.Table)
        assert got.schema == table.schema
        assert got.equals(table)
        if got.num_rows:
            again = store.get(ref)
            # Two gets see the same memory: the buffers are in the store, not copies.
            assert _address(got) == _address(again)
            assert _address(got) != _address(table)
    batch = _tables()[0].to_batches()[0]
    got = store.get(store.put(batch))
    assert isinstance(got, pa.RecordBatch) and got.equals(batch)
    arr = pa.array([1, None, 3])
    got = store.get(store.put(arr))
    assert isinstance(got, pa.Array) and got.equals(arr)
    chunked = pa.chunked_array([[1, 2], [3], []], pa.int32())
    got = store.get(store.put(chunked))
    assert isinstance(got, pa.ChunkedArray) and got.equals(chunked)


def test_views_hold_pins_and_delete_waits_for_them(store):
    ref = store.put(pa.table({"x": np.arange(100_000)}))
    view = store.get(ref)
    assert store.stats()["pinned_objects"] == 1
    used = store.stats()["bytes_used"]
    assert store.delete(ref)
    assert not store.contains(ref) and ref not in store
    with pytest.raises(forebay.ObjectNotFoundError):
        store.get(ref)
    assert store.stats()["bytes_used"] == used  # still referenced by `view`
    column = view.column("x")
    del view
    assert store.stats()["bytes_used"] == used  # the column alone still holds the pin
    assert column.to_numpy()[-1] == 99_999
    del column
    assert store.stats()["bytes_used"] == 0
    assert store.stats()["pinned_objects"] == 0


def test_create_write_seal(store):
    w = store.create(1 << 16)
    with w.view() as m:
        m[:] = bytes(range(256)) * 256
    ref = w.seal()
    assert store.get(ref).tobytes() == bytes(range(256)) * 256
    # A view still exported blocks seal (it would outlive writability).
    w = store.create(8)
    m = w.view()
    with pytest.raises(BufferError):
        w.seal()
    m.release()
    with w:
        pass
    assert store.get(w.ref).nbytes == 8
    # An exception inside the block aborts and frees the memory.
    used = store.stats()["bytes_used"]
    with pytest.raises(RuntimeError), store.create(1 << 20):
        raise RuntimeError("boom")
    assert store.stats()["bytes_used"] == used


def test_eviction_and_restore_under_a_cap_ten_times_smaller(tmp_path):
    cap = 8 << 20
    with ObjectStore(capacity=cap, spill_dir=str(tmp_path / "spill")) as store:
        rng = np.random.default_rng(1)
        values = [rng.integers(0, 255, 1 << 20, dtype=np.uint8) for _ in range(90)]
        values[5] = pa.table({"v": rng.random(100_000), "s": [str(i) for i in range(100_000)]})
        refs = [store.put(v) for v in values]
        s = store.stats()
        assert s["spilled_objects"] > 0 and s["objects_on_disk"] > 0 and s["bytes_used"] <= cap
        for i in list(range(90))[::-1] + list(range(90)):
            got = store.get(refs[i])
            if isinstance(values[i], pa.Table):
                assert got.equals(values[i])
            else:
                assert got.tobytes() == values[i].tobytes(), f"object {i} differs"
            del got
        assert store.stats()["restored_objects"] > 0
        assert os.listdir(tmp_path / "spill")


def test_pinned_objects_stay_and_full_store_raises_after_timeout(tmp_path):
    with ObjectStore(capacity="4MiB", spill_dir=str(tmp_path / "spill"), put_timeout=0.3) as store:
        keep = np.arange(250_000, dtype=np.int32)  # 1 MB
        pinned = store.get(store.put(keep))
        address = pinned.ctypes.data
        for i in range(20):
            store.put(np.full(250_000, i, dtype=np.int32))
        assert pinned.ctypes.data == address and np.array_equal(pinned, keep)
        big = store.get(store.put(np.zeros(600_000, dtype=np.int32)))  # 2.4 MB, pinned
        t = time.monotonic()
        with pytest.raises(forebay.StoreFullError, match="pinned"):
            store.put(np.zeros(300_000, dtype=np.int32))
        assert time.monotonic() - t >= 0.25
        del big
        store.put(np.zeros(300_000, dtype=np.int32))
        with pytest.raises(forebay.StoreFullError, match="capacity"):
            store.put(b"x" * (5 << 20))


def test_a_put_waiting_for_room_lets_other_threads_release_views(tmp_path):
    import threading

    with ObjectStore(capacity="2MiB", spill=False, put_timeout=10) as store:
        big = store.put(np.zeros(400_000, dtype=np.int32))  # 1.6 MB
        holder = [store.get(big)]  # pinned by a view

        def release_later():
            time.sleep(0.2)
            store.delete(big)
            holder.clear()  # drops the last view: Python code, so it needs the GIL

        t = threading.Thread(target=release_later)
        t.start()
        start = time.monotonic()
        # No spill: the only way to room is the other thread's delete + release, so the put
        # must wait with the GIL released for that thread to run.
        ref = store.put(np.ones(300_000, dtype=np.int32))
        t.join()
        assert 0.15 < time.monotonic() - start < 5
        assert store.get(ref).sum() == 300_000
    # Unpinned objects but no spill: a clear error after the timeout, not a wait forever.
    with ObjectStore(capacity="1MiB", spill=False, put_timeout=0.2) as store:
        store.put(np.zeros(200_000, dtype=np.int32))
        with pytest.raises(forebay.StoreFullError):
            store.put(np.zeros(200_000, dtype=np.int32))


def test_errors_are_clear(store, tmp_path):
    other = ObjectStore(capacity="1MiB", spill_dir=str(tmp_path / "spill2"))
    ref = other.put(b"elsewhere")
    with pytest.raises(forebay.ObjectNotFoundError, match=ref.id):
        store.get(ref)
    with pytest.raises(TypeError):
        store.get("not a ref")
    other.close()
    with pytest.raises(forebay.StoreError, match="closed"):
        other.put(b"x")
    with pytest.raises(ValueError):
        ObjectStore(capacity="lots")
    with pytest.raises(forebay.StoreError):
        ObjectStore.attach(str(tmp_path / "nothing-here"))
    assert issubclass(forebay.StoreError, forebay.ForebayError)


# --- several processes -------------------------------------------------------------------


def _child_get(path, refs, expected_sums, out):
    try:
        store = ObjectStore.attach(path)
        sums = []
        for ref in refs:
            v = store.get(ref)
            if isinstance(v, pa.Table):
                sums.append(int(v.column("x").to_numpy().sum()))
            else:
                sums.append(int(np.asarray(v).sum()))
        mine = store.put(pa.table({"x": pa.array(np.arange(1000))}))
        out.put((sums == expected_sums, pickle.dumps(mine)))
    except BaseException as e:  # noqa: BLE001 - report anything; never leave the parent waiting
        out.put((repr(e), None))


def test_cross_process_get_and_put(store):
    ctx = mp.get_context("spawn")
    values = [pa.table({"x": np.arange(10_000)}), np.arange(5000, dtype=np.int64)]
    refs = [store.put(v) for v in values]
    expected = [int(np.arange(10_000).sum()), int(np.arange(5000).sum())]
    out = ctx.Queue()
    p = ctx.Process(target=_child_get, args=(store.path, refs, expected, out))
    p.start()
    ok, mine = out.get(timeout=60)
    p.join(30)
    assert ok is True and p.exitcode == 0, ok
    got = store.get(pickle.loads(mine))  # an object put by the other process
    assert got.column("x").to_pylist() == list(range(1000))
    assert store.stats()["pinned_objects"] == 1  # only ours: the child's pins went with it


def _child_pins_and_waits(path, ref, ready):
    store = ObjectStore.attach(path)
    held = store.get(ref)  # pinned for as long as this process lives
    ready.set()
    time.sleep(120)
    del held


def _child_allocates_and_waits(path, ready):
    store = ObjectStore.attach(path)
    w = store.create(4 << 20)
    m = w.view()
    m[: 1 << 20] = b"\x07" * (1 << 20)
    ready.set()
    time.sleep(120)


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_sigkilled_client_holding_pins(store):
    ctx = mp.get_context("spawn")
    ref = store.put(pa.table({"x": np.arange(1000)}))
    ready = ctx.Event()
    p = ctx.Process(target=_child_pins_and_waits, args=(store.path, ref, ready))
    p.start()
    assert ready.wait(60)
    assert store.stats()["pinned_objects"] == 1
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert p.exitcode == -signal.SIGKILL
    assert _wait_for(lambda: store.stats()["pinned_objects"] == 0)
    # Nothing is wedged: delete frees at once, and another process can use the store.
    used = store.stats()["bytes_used"]
    assert store.delete(ref) and store.stats()["bytes_used"] < used
    attached = ObjectStore.attach(store.path)
    assert bytes(attached.get(attached.put(b"still fine"))) == b"still fine"


def test_sigkilled_client_while_allocating(store):
    ctx = mp.get_context("spawn")
    before = store.stats()["bytes_used"]
    ready = ctx.Event()
    p = ctx.Process(target=_child_allocates_and_waits, args=(store.path, ready))
    p.start()
    assert ready.wait(60)
    assert store.stats()["bytes_used"] >= before + (4 << 20)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    assert _wait_for(lambda: store.stats()["bytes_used"] == before)
    assert store.stats()["objects"] == 0
    assert bytes(store.get(store.put(b"ok"))) == b"ok"


def test_owner_gone_gives_errors_not_hangs(tmp_path):
    owner = ObjectStore(capacity="1MiB", spill_dir=str(tmp_path / "spill"))
    client = ObjectStore.attach(owner.path)
    ref = owner.put(b"abc")
    view = client.get(ref)
    owner.close()
    del owner
    import gc

    gc.collect()
    with pytest.raises(forebay.StoreError, match="owner"):
        client.get(ref)
    assert bytes(view) == b"abc"  # views already held stay readable


def test_a_forked_child_cannot_release_the_parents_pins(store):
    import gc

    ref = store.put(np.arange(1000))
    view = store.get(ref)
    attached = ObjectStore.attach(store.path)
    remote_view = attached.get(ref)
    writer = store.create(1 << 20)
    used = store.stats()["bytes_used"]
    pid = os.fork()
    if pid == 0:  # child: drop the inherited views and writer, run finalizers, exit
        code = 0
        try:
            with pytest.raises(forebay.StoreError, match="forked child"):
                store.get(ref)
            del view, remote_view, writer
            gc.collect()
        except BaseException:  # noqa: BLE001 - any failure is exit code 1 in this child
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    time.sleep(0.1)
    s = store.stats()
    assert s["pinned_objects"] == 1 and s["bytes_used"] == used
    assert np.array_equal(view, np.arange(1000)) and np.array_equal(remote_view, np.arange(1000))
    del view  # the attached view's pin must still be there (the child did not send an unpin)
    assert store.stats()["pinned_objects"] == 1
    del remote_view
    assert _wait_for(lambda: store.stats()["pinned_objects"] == 0)
    writer.abort()


def test_store_is_private_and_foreign_stores_are_refused(tmp_path):
    path = tmp_path / "store"
    with ObjectStore(str(path), capacity="1MiB", spill_dir=str(tmp_path / "spill")) as store:
        assert os.stat(path).st_mode & 0o777 == 0o700
        assert os.stat(path / "arena").st_mode & 0o777 == 0o600
        assert ObjectStore.attach(str(path)).get(store.put(b"1")).tobytes() == b"1"
        with pytest.raises(forebay.StoreError, match="live store"):
            ObjectStore(str(path), capacity="1MiB")
        if os.geteuid() != 0:
            pytest.skip("needs root to give the store to another user")
        os.chown(path, 65534, 65534)
        try:
            with pytest.raises(forebay.StoreError, match="owned by uid 65534"):
                ObjectStore.attach(str(path))
        finally:
            os.chown(path, 0, 0)


def test_object_ref_pickles():
    ref = ObjectRef(0x1234, "/dev/shm/x")
    again = pickle.loads(pickle.dumps(ref))
    assert again == ref and again.store_path == "/dev/shm/x" and again.id == f"{0x1234:032x}"
