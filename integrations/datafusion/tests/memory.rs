//! A scan through ForebayTable charges the session's memory pool (SessionMemoryPool): the
//! pool sees the row groups in flight and has them all back after the query; a pool too
//! small for one row group fails the query with forebay's error naming the file.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool, MemoryReservation};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use forebay_datafusion::ForebayTable;
use forebay_parquet::arrow_array::{ArrayRef, Int64Array, RecordBatch};
use forebay_parquet::parquet::arrow::ArrowWriter;
use forebay_parquet::parquet::file::properties::WriterProperties;
use forebay_parquet::DatasetSource;

/// A greedy pool that remembers the most it ever held.
#[derive(Debug)]
struct Watched {
    inner: GreedyMemoryPool,
    peak: AtomicUsize,
}

impl Watched {
    fn note(&self) {
        self.peak
            .fetch_max(self.inner.reserved(), Ordering::Relaxed);
    }
}

impl std::fmt::Display for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "watched ({} reserved)", self.inner.reserved())
    }
}

impl MemoryPool for Watched {
    fn name(&self) -> &str {
        "watched"
    }
    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.inner.grow(reservation, additional);
        self.note();
    }
    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.inner.shrink(reservation, shrink);
    }
    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> datafusion::error::Result<()> {
        self.inner.try_grow(reservation, additional)?;
        self.note();
        Ok(())
    }
    fn reserved(&self) -> usize {
        self.inner.reserved()
    }
}

fn write_file(dir: &std::path::Path) {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..40_000));
    let batch = RecordBatch::try_from_iter([("id", ids)]).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(10_000))
        .build();
    let file = std::fs::File::create(dir.join("ids.parquet")).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

async fn sum_with_pool(
    dir: &std::path::Path,
    pool: Arc<dyn MemoryPool>,
) -> datafusion::error::Result<i64> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(pool)
        .build_arc()
        .unwrap();
    let ctx = SessionContext::new_with_config_rt(SessionConfig::new(), runtime);
    let table = ForebayTable::open(DatasetSource::uris([dir.display().to_string()]))
        .await
        .unwrap();
    ctx.register_table("t", Arc::new(table)).unwrap();
    let batches = ctx.sql("select sum(id) from t").await?.collect().await?;
    let sums = batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Int64Array>()
        .unwrap();
    Ok(sums.value(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scan_charges_the_sessions_pool_and_gives_everything_back() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path());
    let pool = Arc::new(Watched {
        inner: GreedyMemoryPool::new(64 << 20),
        peak: AtomicUsize::new(0),
    });
    let sum = sum_with_pool(dir.path(), pool.clone()).await.unwrap();
    assert_eq!(sum, (0..40_000i64).sum::<i64>());
    assert!(
        pool.peak.load(Ordering::Relaxed) > 0,
        "the scan charged the pool"
    );
    assert_eq!(pool.reserved(), 0, "everything given back after the query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_too_small_for_a_row_group_fails_the_query_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path());
    let err = sum_with_pool(dir.path(), Arc::new(GreedyMemoryPool::new(1024)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ids.parquet") && err.contains("memory pool refused"),
        "{err}"
    );
}
