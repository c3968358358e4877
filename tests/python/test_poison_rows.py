"""Poison rows: ``map_batches(on_error="skip")`` isolates the rows a function raises on, sets
them aside (counted, reported with their file and row) and goes on with the others, in
threads and in worker processes; ``max_errored_rows`` fails a run with too many."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import forebay

ROWS = 20_000
POISON = {17, 8_000, 8_001, 15_555, ROWS - 1}


@pytest.fixture
def data(tmp_path):
    ids = np.arange(ROWS)
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ids, "x": ids * 2}), path, row_group_size=6_000)
    return path


def poisoned(batch):
    """Raises on a batch holding a poison id (as a model does on a row it cannot take)."""
    hit = POISON.intersection(batch["id"].tolist())
    if hit:
        raise ValueError(f"cannot embed {sorted(hit)}")
    return {"id": batch["id"], "y": batch["x"] + 1}


def collect(ds) -> pa.Table:
    return pa.concat_tables(list(ds.iter_batches(batch_size=None)))


@pytest.mark.parametrize("compute", ["threads", "processes"])
def test_the_failing_rows_and_only_they_are_set_aside(data, compute):
    ds = forebay.read_parquet(str(data)).map_batches(
        poisoned, batch_format="numpy", batch_size=1_000, compute=compute, on_error="skip"
    )
    out = collect(ds)
    assert sorted(out["id"].to_pylist()) == sorted(set(range(ROWS)) - POISON)
    assert out["y"].to_pylist() == [i * 2 + 1 for i in out["id"].to_pylist()]
    stage = next(s for s in ds.stats()["stages"] if s["name"] == "map_batches(poisoned)")
    assert stage["rows_errored"] == len(POISON)
    assert stage["rows_out"] == ROWS - len(POISON)
    errored = sorted(stage["errored"], key=lambda e: e["row"])
    assert [e["row"] for e in errored] == sorted(POISON)
    assert {e["file"] for e in errored} == {str(data)}
    assert [e["row_group"] for e in errored] == [r // 6_000 for r in sorted(POISON)]
    assert errored[0] == {
        "file": str(data),
        "row_group": 0,
        "row": 17,
        "error_type": "ValueError",
        "message": "cannot embed [17]",
    }


@pytest.mark.parametrize("batch_format", ["pyarrow", "pandas"])
def test_isolation_works_in_every_batch_format_and_keeps_the_order(data, batch_format):
    def f(batch):
        ids = batch["id"] if batch_format == "pandas" else batch["id"].to_numpy()
        if POISON.intersection(np.asarray(ids).tolist()):
            raise KeyError("poison")
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(
        f, batch_format=batch_format, batch_size=2_048, on_error="skip"
    )
    ids = [
        i
        for b in ds.iter_batches(batch_size=None, preserve_order=True)
        for i in b["id"].to_pylist()
    ]
    assert ids == [i for i in range(ROWS) if i not in POISON]


def test_a_class_is_constructed_once_per_worker_and_isolates_too(data):
    class Model:
        def __init__(self):
            self.calls = 0

        def __call__(self, batch):
            self.calls += 1
            return poisoned(batch)

    ds = forebay.read_parquet(str(data)).map_batches(
        Model, batch_format="numpy", batch_size=500, concurrency=2, on_error="skip"
    )
    assert collect(ds).num_rows == ROWS - len(POISON)


def test_a_batch_that_fails_only_whole_loses_no_row(data):
    """A function that fails on big batches but not on their halves: every row comes out,
    nothing is set aside."""

    def too_big(batch):
        if len(batch["id"]) > 700:
            raise MemoryError("batch too large for the device")
        return batch

    ds = forebay.read_parquet(str(data)).map_batches(
        too_big, batch_format="numpy", batch_size=1_000, on_error="skip"
    )
    assert sorted(collect(ds)["id"].to_pylist()) == list(range(ROWS))
    stage = next(s for s in ds.stats()["stages"] if s["name"] == "map_batches(too_big)")
    assert stage["rows_errored"] == 0


@pytest.mark.parametrize("compute", ["threads", "processes"])
def test_more_errored_rows_than_allowed_fail_the_run_naming_the_last(data, compute):
    ds = forebay.read_parquet(str(data)).map_batches(
        poisoned,
        batch_format="numpy",
        batch_size=1_000,
        compute=compute,
        on_error="skip",
        max_errored_rows=2,
    )
    with pytest.raises(
        forebay.StageError,
        match=r"map_batches\(poisoned\).*failed on [345] rows, more than the 2 allowed "
        r"\(max_errored_rows\); the last: row \d+ of .*in\.parquet: ValueError: cannot embed",
    ):
        collect(ds)


def test_max_errored_rows_zero_allows_none_but_names_the_row(data):
    ds = forebay.read_parquet(str(data)).map_batches(
        poisoned, batch_format="numpy", on_error="skip", max_errored_rows=0
    )
    with pytest.raises(
        forebay.StageError, match=r"failed on \d+ rows, more than the 0 allowed.*cannot embed"
    ):
        collect(ds)


def test_by_default_the_first_error_still_fails_the_run(data):
    ds = forebay.read_parquet(str(data)).map_batches(poisoned, batch_format="numpy")
    with pytest.raises(ValueError, match="cannot embed"):
        collect(ds)


def test_ctrl_c_inside_the_function_is_not_set_aside(data):
    def interrupted(batch):
        raise KeyboardInterrupt

    ds = forebay.read_parquet(str(data)).map_batches(interrupted, on_error="skip")
    with pytest.raises(KeyboardInterrupt):
        collect(ds)


def test_an_output_that_is_not_a_batch_is_not_set_aside(data):
    ds = forebay.read_parquet(str(data)).map_batches(lambda b: 42, on_error="skip")
    with pytest.raises(forebay.StageError, match="returned int"):
        collect(ds)


def test_after_another_map_errored_rows_name_their_row_group(data):
    def renumber(batch):
        return batch

    ds = (
        forebay.read_parquet(str(data))
        .map_batches(renumber, batch_size=500)
        .map_batches(poisoned, batch_format="numpy", on_error="skip")
    )
    assert collect(ds).num_rows == ROWS - len(POISON)
    stage = next(s for s in ds.stats()["stages"] if s["name"] == "map_batches(poisoned)")
    assert stage["rows_errored"] == len(POISON)
    # Rows no longer line up with input rows after a map: the row group, not the row.
    assert {(e["row_group"], e["row"]) for e in stage["errored"]} <= {
        (r // 6_000, None) for r in POISON
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_error": "ignore"}, "on_error must be 'raise', 'skip' or 'dead_letter'"),
        ({"on_error": "skip", "max_errored_rows": -1}, "max_errored_rows"),
        ({"max_errored_rows": 5}, "applies with on_error='skip'"),
    ],
)
def test_wrong_arguments_are_clear_errors(data, kwargs, message):
    with pytest.raises(ValueError, match=message):
        forebay.read_parquet(str(data)).map_batches(poisoned, **kwargs)


# ---------------------------------------------------------------- dead letters


def dead_letters(root) -> pa.Table:
    import pyarrow.dataset as pds

    return pds.dataset(str(root), format="parquet").to_table().sort_by("id")


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("compute", ["threads", "processes"])
def test_dead_letters_hold_the_failing_rows_with_their_errors_beside_the_output(
    data, tmp_path, compute, checkpoint
):
    ds = forebay.read_parquet(str(data)).map_batches(
        poisoned, batch_format="numpy", batch_size=1_000, compute=compute, on_error="dead_letter"
    )
    out = tmp_path / "out"
    stats = ds.write_parquet(
        str(out), checkpoint=forebay.Checkpoint("id", str(tmp_path / "ck")) if checkpoint else None
    )
    assert stats["rows"] == ROWS - len(POISON)
    assert stats["dead_letter_rows"] == len(POISON)
    assert all("/_dead_letter/map_batches_poisoned/" in p for p in stats["dead_letter_paths"])
    # Readers of the output skip the dead letters ('_' directories).
    assert sorted(pq.read_table(out)["id"].to_pylist()) == sorted(set(range(ROWS)) - POISON)
    dead = dead_letters(out / "_dead_letter")
    assert dead["id"].to_pylist() == sorted(POISON)
    assert dead["x"].to_pylist() == [i * 2 for i in sorted(POISON)], "the input row, whole"
    assert dead["_error_type"].to_pylist() == ["ValueError"] * len(POISON)
    assert dead["_error_message"].to_pylist() == [f"cannot embed [{i}]" for i in sorted(POISON)]
    assert dead["_input_file"].to_pylist() == [str(data)] * len(POISON)
    assert dead["_input_row_group"].to_pylist() == [i // 6_000 for i in sorted(POISON)]
    assert dead["_input_row"].to_pylist() == sorted(POISON)


def test_a_rerun_of_a_finished_job_sets_nothing_aside_again(data, tmp_path):
    def run() -> dict:
        ds = forebay.read_parquet(str(data)).map_batches(
            poisoned, batch_format="numpy", batch_size=1_000, on_error="dead_letter"
        )
        return ds.write_parquet(
            str(tmp_path / "out"), checkpoint=forebay.Checkpoint("id", str(tmp_path / "ck"))
        )

    run()
    again = run()
    assert again["rows"] == 0 and "dead_letter_rows" not in again
    assert dead_letters(tmp_path / "out" / "_dead_letter")["id"].to_pylist() == sorted(POISON)


def test_a_batch_that_fails_on_every_row_is_settled_by_its_dead_letters(data, tmp_path):
    """No output at all from some batches: their dead letters settle them (a rerun sends
    none of their rows again)."""
    bad = set(range(2_000, 3_000))

    def all_bad(batch):
        if bad.intersection(batch["id"].tolist()):
            raise RuntimeError("down")
        return batch

    def run() -> dict:
        ds = forebay.read_parquet(str(data)).map_batches(
            all_bad, batch_format="numpy", batch_size=500, on_error="dead_letter"
        )
        return ds.write_parquet(
            str(tmp_path / "out"), checkpoint=forebay.Checkpoint(None, str(tmp_path / "ck"))
        )

    first = run()
    assert first["rows"] == ROWS - len(bad) and first["dead_letter_rows"] == len(bad)
    assert run()["rows"] == 0
    assert dead_letters(tmp_path / "out" / "_dead_letter")["id"].to_pylist() == sorted(bad)


def test_dead_letters_need_a_write_and_the_first_map(data, tmp_path):
    ds = forebay.read_parquet(str(data)).map_batches(poisoned, on_error="dead_letter")
    with pytest.raises(ValueError, match=r"iter_batches has none.*on_error='skip'"):
        collect(ds)
    later = (
        forebay.read_parquet(str(data))
        .map_batches(lambda b: b)
        .map_batches(poisoned, on_error="dead_letter")
    )
    with pytest.raises(ValueError, match="only the first map step"):
        later.write_parquet(str(tmp_path / "out"))


def test_an_input_column_named_like_a_dead_letter_column_is_a_clear_error(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": np.arange(100), "_error_type": ["x"] * 100}), path)
    ds = forebay.read_parquet(str(path)).map_batches(
        poisoned, batch_format="numpy", on_error="dead_letter"
    )
    with pytest.raises(forebay.StageError, match="'_error_type', which dead-letter files add"):
        ds.write_parquet(str(tmp_path / "out"))


def test_dead_letters_commit_on_s3(data, tmp_path):
    from conftest import S3_CREDENTIALS, moto_s3

    with moto_s3(tmp_path / "moto.log") as (client, endpoint):
        client.create_bucket(Bucket="dead-letters")
        options = {"aws_endpoint": endpoint, **S3_CREDENTIALS}
        ds = forebay.read_parquet(str(data)).map_batches(
            poisoned, batch_format="numpy", batch_size=1_000, on_error="dead_letter"
        )
        stats = ds.write_parquet(
            "s3://dead-letters/out/",
            storage_options=options,
            checkpoint=forebay.Checkpoint("id", "s3://dead-letters/ck/", storage_options=options),
        )
        assert stats["dead_letter_rows"] == len(POISON)
        keys = [o["Key"] for o in client.list_objects_v2(Bucket="dead-letters")["Contents"]]
        dead = [k for k in keys if k.startswith("out/_dead_letter/")]
        assert dead and not [k for k in keys if "_forebay_staging" in k], keys
        got = forebay.read_parquet(
            "s3://dead-letters/out/_dead_letter/", storage_options=options
        ).to_arrow()
        assert sorted(got["id"].to_pylist()) == sorted(POISON)
