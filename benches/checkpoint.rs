//! Criterion benches of forebay-checkpoint: loading 8 M string ids from Parquet and probing
//! an 8 M-id index, on one thread (the per-core figure) and on all cores.
//!
//! `cargo bench --bench checkpoint`

use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use forebay::checkpoint::CheckpointIndex;
use parquet::arrow::ArrowWriter;

const IDS: usize = 8_000_000;
const PROBES: usize = 1_000_000;

fn numbered(range: std::ops::Range<usize>) -> StringArray {
    StringArray::from_iter_values(range.map(|i| i.to_string()))
}

fn write_checkpoint(path: &std::path::Path) {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Utf8, false)]));
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), None).unwrap();
    for start in (0..IDS).step_by(1 << 20) {
        let ids = numbered(start..(start + (1 << 20)).min(IDS));
        writer
            .write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(ids)]).unwrap())
            .unwrap();
    }
    writer.close().unwrap();
}

fn bench_load(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.parquet");
    write_checkpoint(&path);
    let path = path.to_str().unwrap().to_string();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut group = c.benchmark_group("checkpoint_load_8M_string_ids");
    group.sample_size(10);
    group.throughput(Throughput::Elements(IDS as u64));
    for threads in [1, cores] {
        group.bench_function(format!("threads_{threads}"), |b| {
            b.iter(|| {
                let index = CheckpointIndex::loader(path.clone(), "id")
                    .with_threads(threads)
                    .load()
                    .unwrap();
                assert_eq!(index.len(), IDS);
            })
        });
    }
    group.finish();
}

fn bench_probe(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // An index as a resumed job has it: loaded from the checkpoint file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.parquet");
    write_checkpoint(&path);
    let mut index = CheckpointIndex::loader(path.to_str().unwrap(), "id")
        .load()
        .unwrap();
    // Half of the probes are present, half absent.
    let probes = numbered(IDS - PROBES / 2..IDS + PROBES / 2);
    let mut group = c.benchmark_group("checkpoint_probe_8M_index");
    group.throughput(Throughput::Elements(PROBES as u64));
    for threads in [1, cores] {
        index = index.with_threads(threads);
        group.bench_function(format!("contains_1M_threads_{threads}"), |b| {
            b.iter(|| assert_eq!(index.contains(&probes).unwrap().true_count(), PROBES / 2))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_load, bench_probe);
criterion_main!(benches);
