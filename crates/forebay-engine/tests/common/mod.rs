//! Helpers shared by the engine's integration tests: a one-column Int64 schema, batches of
//! it, and a Rust map stage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use forebay_engine::MapStage;

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
