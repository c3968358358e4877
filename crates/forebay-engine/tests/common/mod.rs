//! Helpers shared by the engine's integration tests: a one-column Int64 schema, batches of
//! it, a Rust map stage, and the values of a column of what a run wrote.
//!
//! Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use forebay_engine::MapStage;
use forebay_parquet::ParquetDataset;

pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]))
}

pub fn batch_of(values: impl IntoIterator<Item = i64>) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![Arc::new(Int64Array::from_iter_values(values))],
    )
    .unwrap()
}

/// A map that multiplies by `k`, sleeping a little on some batches to shuffle finish order.
pub fn times(name: &str, k: i64) -> MapStage {
    let calls = Arc::new(AtomicUsize::new(0));
    MapStage::rust(name, move |b| {
        let n = calls.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(3) {
            std::thread::sleep(Duration::from_millis(3));
        }
        let x = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        Ok(batch_of(x.values().iter().map(|v| v * k)))
    })
}

/// The values of the Int64 column `column` in the Parquet files under `dir`, in scan order,
/// with multiplicity (empty when `dir` holds no dataset).
pub fn i64_column_in(dir: &Path, column: &str) -> Vec<i64> {
    let Ok(dataset) = ParquetDataset::open([dir.display().to_string()]) else {
        return Vec::new();
    };
    let mut values = Vec::new();
    for batch in dataset.scan().blocking_iter() {
        let batch = batch.unwrap().batch;
        let col = batch
            .column_by_name(column)
            .unwrap_or_else(|| panic!("no column {column:?} in {}", dir.display()))
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        values.extend(col.values().iter());
    }
    values
}
