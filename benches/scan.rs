//! Criterion scan benches: projection (2 of 8 columns vs all), a selective filter, and the
//! same file read with arrow-rs's plain synchronous reader as the in-process baseline.
//! Data is generated into a temp dir (nothing large is committed).

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use forebay::reader::{DatasetSource, ParquetDataset, Predicate};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::file::properties::WriterProperties;

const ROWS: usize = 2_000_000;

fn write_dataset(dir: &std::path::Path) -> std::path::PathBuf {
    let mut fields = vec![Field::new("id", DataType::Int64, false)];
    for c in 0..6 {
        fields.push(Field::new(format!("f{c}"), DataType::Float64, false));
    }
    fields.push(Field::new("s", DataType::Utf8, false));
    let schema = Arc::new(Schema::new(fields));
    let path = dir.join("bench.parquet");
    let file = std::fs::File::create(&path).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(125_000))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props)).unwrap();
    for chunk in 0..(ROWS / 100_000) {
        let base = (chunk * 100_000) as i64;
        let mut cols: Vec<ArrayRef> =
            vec![Arc::new(Int64Array::from_iter_values(base..base + 100_000))];
        for c in 0..6 {
            cols.push(Arc::new(Float64Array::from_iter_values(
                (0..100_000).map(|i| ((i * (c + 3)) % 1000) as f64),
            )));
        }
        cols.push(Arc::new(StringArray::from_iter_values(
            (0..100_000).map(|i| format!("s{}", i % 777)),
        )));
        writer
            .write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
            .unwrap();
    }
    writer.close().unwrap();
    path
}

fn scan_rows(ds: &ParquetDataset) -> usize {
    ds.scan()
        .blocking_iter()
        .map(|b| b.unwrap().batch.num_rows())
        .sum()
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_dataset(dir.path());
    let uri = path.to_str().unwrap().to_string();
    let mut group = c.benchmark_group("scan");
    group
        .sample_size(10)
        .throughput(Throughput::Elements(ROWS as u64));

    group.bench_function("forebay_all_columns", |b| {
        let ds = ParquetDataset::open([uri.clone()]).unwrap();
        b.iter(|| assert_eq!(scan_rows(&ds), ROWS))
    });
    group.bench_function("forebay_2_of_8_columns", |b| {
        let ds = ParquetDataset::builder(DatasetSource::uris([uri.clone()]))
            .with_columns(["id", "f3"])
            .build()
            .unwrap();
        b.iter(|| assert_eq!(scan_rows(&ds), ROWS))
    });
    group.bench_function("forebay_selective_filter", |b| {
        let ds = ParquetDataset::builder(DatasetSource::uris([uri.clone()]))
            .with_filter(Predicate::lt("id", (ROWS / 20) as i64))
            .build()
            .unwrap();
        b.iter(|| assert_eq!(scan_rows(&ds), ROWS / 20))
    });
    group.bench_function("arrow_rs_sync_reader_2_of_8_columns", |b| {
        b.iter(|| {
            let file = std::fs::File::open(&path).unwrap();
            let builder = ParquetRecordBatchReaderBuilder::try_new(file)
                .unwrap()
                .with_batch_size(65_536);
            let mask = ProjectionMask::roots(builder.parquet_schema(), [0, 4]);
            let rows: usize = builder
                .with_projection(mask)
                .build()
                .unwrap()
                .map(|b| b.unwrap().num_rows())
                .sum();
            assert_eq!(rows, ROWS)
        })
    });
    group.finish();
}

criterion_group!(scan, benches);
criterion_main!(scan);
