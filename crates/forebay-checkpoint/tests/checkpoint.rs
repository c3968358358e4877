//! forebay-checkpoint against a HashSet reference: probes, inserts, merges, Parquet loads in
//! flat and partitioned layouts, write/reload round trips, crash leftovers and bad input.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use arrow_array::types::Int16Type;
use arrow_array::{
    Array, ArrayRef, BinaryArray, DictionaryArray, Float64Array, Int32Array, Int64Array,
    LargeStringArray, RecordBatch, StringArray, StringViewArray, UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use forebay_checkpoint::{CheckpointError, CheckpointIndex, MANIFEST_FILE};
use parquet::arrow::ArrowWriter;
use proptest::prelude::*;

fn write_parquet(path: &Path, column: &str, ids: ArrayRef) {
    let schema = Arc::new(Schema::new(vec![Field::new(
        column,
        ids.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema.clone(), vec![ids]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn bools(a: &arrow_array::BooleanArray) -> Vec<bool> {
    assert_eq!(a.null_count(), 0, "contains() never returns nulls");
    (0..a.len()).map(|i| a.value(i)).collect()
}

fn expected(reference: &HashSet<String>, probes: &[Option<String>]) -> Vec<bool> {
    probes
        .iter()
        .map(|p| p.as_ref().is_some_and(|s| reference.contains(s)))
        .collect()
}

fn id_strategy() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(String::new())),
        6 => "[a-c]{0,3}".prop_map(Some),             // many duplicates
        2 => "\\PC{0,12}".prop_map(Some),              // unicode
        1 => "[x-z]{200,300}".prop_map(Some),          // long
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Build, probe (all string layouts), insert more, write, reload (partitioned and with a
    /// different shard count), merge: always equal to a HashSet of the non-null ids.
    #[test]
    fn index_matches_hashset(
        first in prop::collection::vec(id_strategy(), 0..200),
        second in prop::collection::vec(id_strategy(), 0..200),
        probes in prop::collection::vec(id_strategy(), 0..300),
        shard_exp in 0u32..6,
    ) {
        let num_shards = 1usize << shard_exp;
        let dir = tempfile::tempdir().unwrap();
        let flat = dir.path().join("flat");
        std::fs::create_dir(&flat).unwrap();
        write_parquet(&flat.join("part-0.parquet"), "id", Arc::new(StringArray::from(first.clone())));

        let mut reference: HashSet<String> = first.iter().flatten().cloned().collect();
        let mut index = CheckpointIndex::loader(flat.to_str().unwrap(), "id")
            .with_num_shards(num_shards)
            .load()
            .unwrap();
        prop_assert_eq!(index.len(), reference.len());
        let want = expected(&reference, &probes);
        let variants: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(probes.clone())),
            Arc::new(LargeStringArray::from(probes.clone())),
            Arc::new(StringViewArray::from(probes.clone())),
            Arc::new(BinaryArray::from(
                probes.iter().map(|p| p.as_deref().map(str::as_bytes)).collect::<Vec<_>>(),
            )),
            Arc::new(probes.iter().map(|p| p.as_deref()).collect::<DictionaryArray<Int16Type>>()),
        ];
        for v in &variants {
            prop_assert_eq!(bools(&index.contains(v.as_ref()).unwrap()), want.clone(), "{}", v.data_type());
        }

        let added = index.insert(&StringArray::from(second.clone())).unwrap();
        let before = reference.len();
        reference.extend(second.iter().flatten().cloned());
        prop_assert_eq!(added, reference.len() - before);
        prop_assert_eq!(index.len(), reference.len());
        let want = expected(&reference, &probes);
        prop_assert_eq!(bools(&index.contains(variants[0].as_ref()).unwrap()), want.clone());

        // Persist what this run inserted plus what was loaded, reload both layouts.
        let ckpt = dir.path().join("ckpt");
        let mut fresh = CheckpointIndex::new(DataType::Utf8, "id", num_shards).unwrap();
        fresh.insert(&StringArray::from(first.clone())).unwrap();
        fresh.write(ckpt.to_str().unwrap(), &Default::default()).unwrap();
        index.write(ckpt.to_str().unwrap(), &Default::default()).unwrap();
        prop_assert_eq!(index.pending_ids(), 0);
        let reloaded = CheckpointIndex::loader(ckpt.to_str().unwrap(), "id").load().unwrap();
        prop_assert_eq!(reloaded.num_shards(), num_shards, "shard count comes from the manifest");
        prop_assert_eq!(reloaded.len(), reference.len());
        prop_assert_eq!(bools(&reloaded.contains(variants[2].as_ref()).unwrap()), want.clone());
        let rehashed = CheckpointIndex::loader(ckpt.to_str().unwrap(), "id")
            .with_num_shards(64 >> shard_exp)
            .load()
            .unwrap();
        prop_assert_eq!(bools(&rehashed.contains(variants[1].as_ref()).unwrap()), want.clone());

        // Merge two halves == the whole.
        let mut a = CheckpointIndex::new(DataType::Utf8, "id", num_shards).unwrap();
        a.insert(&StringArray::from(first.clone())).unwrap();
        let mut b = CheckpointIndex::new(DataType::LargeUtf8, "id", num_shards).unwrap();
        b.insert(&LargeStringArray::from(second.clone())).unwrap();
        a.merge(&b).unwrap();
        prop_assert_eq!(a.len(), reference.len());
        prop_assert_eq!(bools(&a.contains(variants[4].as_ref()).unwrap()), want);
    }

    /// Integer ids of every width agree with a HashSet of i128 values.
    #[test]
    fn integer_ids_match_hashset(
        ids in prop::collection::vec(prop::option::of(-50i64..50), 0..300),
        probes in prop::collection::vec(prop::option::of(-60i64..60), 0..300),
    ) {
        let mut index = CheckpointIndex::new(DataType::Int64, "id", 8).unwrap();
        index.insert(&Int64Array::from(ids.clone())).unwrap();
        let reference: HashSet<i64> = ids.iter().flatten().copied().collect();
        prop_assert_eq!(index.len(), reference.len());
        let want: Vec<bool> = probes.iter().map(|p| p.is_some_and(|v| reference.contains(&v))).collect();
        let as_i32 = Int32Array::from(probes.iter().map(|p| p.map(|v| v as i32)).collect::<Vec<_>>());
        prop_assert_eq!(bools(&index.contains(&as_i32).unwrap()), want);
    }
}

fn numbered(range: std::ops::Range<u64>) -> StringArray {
    StringArray::from_iter_values(range.map(|i| i.to_string()))
}

#[test]
fn parallel_grouped_probe_equals_reference() {
    // Big enough to take the parallel, grouped-by-shard path in contains/insert.
    let mut index = CheckpointIndex::new(DataType::Utf8, "id", 16).unwrap();
    index.insert(&numbered(0..300_000)).unwrap();
    assert_eq!(index.len(), 300_000);
    let probes = numbered(150_000..450_000);
    let hits = index.contains(&probes).unwrap();
    for i in 0..probes.len() {
        assert_eq!(hits.value(i), i < 150_000, "row {i}");
    }
    let ints = UInt64Array::from_iter_values(0..200_000);
    let mut ints_index = CheckpointIndex::new(DataType::UInt64, "id", 4).unwrap();
    ints_index.insert(&ints.slice(0, 100_000)).unwrap();
    assert_eq!(ints_index.contains(&ints).unwrap().true_count(), 100_000);
}

#[test]
fn filter_removes_done_rows_and_is_zero_copy_otherwise() {
    let mut index = CheckpointIndex::new(DataType::Utf8, "id", 4).unwrap();
    index.insert(&StringArray::from(vec!["b", "d"])).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, true),
        Field::new("x", DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec![
                Some("a"),
                Some("b"),
                None,
                Some("d"),
            ])),
            Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
        ],
    )
    .unwrap();
    let out = index.filter(&batch).unwrap();
    assert_eq!(out.schema(), schema);
    assert_eq!(out.num_rows(), 2, "a and the null id stay");
    let x = out.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(x.values(), &[1, 3]);

    let untouched = batch.slice(0, 1);
    let same = index.filter(&untouched).unwrap();
    assert_eq!(
        same.column(1).to_data().buffers()[0].as_ptr(),
        untouched.column(1).to_data().buffers()[0].as_ptr(),
        "nothing removed: same buffers"
    );
    assert!(index.filter_or_unchanged(&untouched).unwrap().is_none());
    let many = index
        .filter_many(&[batch.clone(), untouched.clone(), batch])
        .unwrap();
    assert_eq!(many[0].as_ref().unwrap().num_rows(), 2);
    assert!(many[1].is_none());
}

#[test]
fn partitioned_layout_puts_each_id_in_its_shard_and_loads_subsets() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let ckpt_s = ckpt.to_str().unwrap();
    let mut index = CheckpointIndex::new(DataType::Utf8, "id", 8).unwrap();
    index.insert(&numbered(0..20_000)).unwrap();
    let summary = index.write(ckpt_s, &Default::default()).unwrap();
    assert_eq!(summary.ids, 20_000);
    assert_eq!(summary.files.len(), 8);
    assert!(ckpt.join(MANIFEST_FILE).exists());
    // Every file in shard=k holds only ids of shard k.
    for k in 0..8 {
        let shard_dir = ckpt.join(format!("shard={k}"));
        let only = CheckpointIndex::loader(shard_dir.to_str().unwrap(), "id")
            .with_num_shards(8)
            .load()
            .unwrap();
        assert!(only.len() > 1500);
        assert_eq!(only.loaded_shards().len(), 8);
        let shards = index.shard_ids(&numbered(0..20_000)).unwrap();
        let in_k: Vec<String> = (0..20_000u64)
            .filter(|i| shards[*i as usize] == k as u32)
            .map(|i| i.to_string())
            .collect();
        assert_eq!(only.len(), in_k.len(), "shard {k}");
        assert_eq!(
            only.contains(&StringArray::from(in_k))
                .unwrap()
                .false_count(),
            0
        );
    }
    // A worker owning shards {1, 6} reads just those directories.
    let part = CheckpointIndex::loader(ckpt_s, "id")
        .with_shards([1, 6])
        .load()
        .unwrap();
    assert_eq!(part.loaded_shards(), vec![1, 6]);
    let shards = index.shard_ids(&numbered(0..20_000)).unwrap();
    let mine: Vec<String> = (0..20_000u64)
        .filter(|i| matches!(shards[*i as usize], 1 | 6))
        .map(|i| i.to_string())
        .collect();
    assert_eq!(part.len(), mine.len());
    assert_eq!(
        part.contains(&StringArray::from(mine))
            .unwrap()
            .false_count(),
        0
    );
    let foreign = (0..20_000u64).find(|i| shards[*i as usize] == 3).unwrap();
    let err = part
        .contains(&StringArray::from(vec![foreign.to_string()]))
        .unwrap_err();
    assert!(
        matches!(err, CheckpointError::ShardNotLoaded { shard: 3, .. }),
        "{err}"
    );

    // A file moved into the wrong shard directory is detected, not silently mis-sharded.
    std::fs::rename(ckpt.join("shard=2"), ckpt.join("shard=5").join("moved")).unwrap();
    let err = CheckpointIndex::loader(ckpt_s, "id").load().unwrap_err();
    assert!(
        matches!(err, CheckpointError::ShardMismatch { declared: 5, .. }),
        "{err}"
    );
}

#[test]
fn manifest_disagreement_and_empty_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let ckpt_s = ckpt.to_str().unwrap();
    let mut a = CheckpointIndex::new(DataType::Utf8, "id", 4).unwrap();
    a.write(ckpt_s, &Default::default()).unwrap();
    // Manifest only: an empty checkpoint of the right type.
    let empty = CheckpointIndex::loader(ckpt_s, "id").load().unwrap();
    assert_eq!((empty.len(), empty.num_shards()), (0, 4));
    let mut b = CheckpointIndex::new(DataType::Utf8, "id", 8).unwrap();
    b.insert(&StringArray::from(vec!["x"])).unwrap();
    let err = b.write(ckpt_s, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("4 shards"), "{err}");
    assert_eq!(b.pending_ids(), 1, "a failed write keeps its ids pending");
    let mut ints = CheckpointIndex::new(DataType::Int64, "id", 4).unwrap();
    assert!(ints.write(ckpt_s, &Default::default()).is_err());
    let err = a.contains(&Int64Array::from(vec![1])).unwrap_err();
    assert!(
        matches!(err, CheckpointError::IdTypeMismatch { .. }),
        "{err}"
    );
}

#[test]
fn crash_leftovers_are_ignored_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ck");
    let ckpt_s = ckpt.to_str().unwrap();
    let mut index = CheckpointIndex::new(DataType::Utf8, "id", 2).unwrap();
    index.insert(&numbered(0..1000)).unwrap();
    index.write(ckpt_s, &Default::default()).unwrap();

    // A writer that died between write and rename: a temp file with half a Parquet file.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let shard0 = ckpt.join("shard=0");
    let committed = std::fs::read_dir(&shard0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(&committed).unwrap();
    let stale = shard0.join(format!(".part-dead.parquet.{dead_pid}.tmp"));
    std::fs::write(&stale, &bytes[..bytes.len() / 2]).unwrap();
    // One of a live writer (this process's parent shell stands in): must be left alone.
    let live = shard0.join(format!(
        ".part-live.parquet.{}.tmp",
        std::os::unix::process::parent_id()
    ));
    std::fs::write(&live, b"in progress").unwrap();

    let reloaded = CheckpointIndex::loader(ckpt_s, "id").load().unwrap();
    assert_eq!(reloaded.len(), 1000, "half-written file not read");
    assert!(!stale.exists(), "dead writer's temp file removed");
    assert!(live.exists(), "live writer's temp file kept");
}

#[test]
fn bad_input_names_file_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ids.parquet");
    write_parquet(&file, "id", Arc::new(Float64Array::from(vec![1.0])));
    let f = file.to_str().unwrap();

    let err = CheckpointIndex::loader(f, "request_id").load().unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("request_id") && msg.contains("ids.parquet"),
        "{msg}"
    );

    let err = CheckpointIndex::loader(f, "id").load().unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, CheckpointError::UnsupportedIdType { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("ids.parquet") && msg.contains("'id'") && msg.contains("Float64"),
        "{msg}"
    );

    let junk = dir.path().join("junk.parquet");
    std::fs::write(&junk, b"not parquet at all").unwrap();
    let msg = CheckpointIndex::loader(junk.to_str().unwrap(), "id")
        .load()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("junk.parquet"), "{msg}");

    let msg = CheckpointIndex::loader(dir.path().join("nope").to_str().unwrap(), "id")
        .load()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("nope"), "{msg}");

    assert!(
        CheckpointIndex::new(DataType::Utf8, "id", 12).is_err(),
        "not a power of two"
    );
    let index = CheckpointIndex::new(DataType::Utf8, "id", 4).unwrap();
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new(
            "other",
            DataType::Utf8,
            false,
        )])),
        vec![Arc::new(StringArray::from(vec!["a"]))],
    )
    .unwrap();
    let msg = index.filter(&batch).unwrap_err().to_string();
    assert!(msg.contains("'id'") && msg.contains("other"), "{msg}");
}
