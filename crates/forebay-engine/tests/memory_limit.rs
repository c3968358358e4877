//! A run's memory limit against a consumer slower than the source. In a test binary of its
//! own: a run's pool counts everything the process allocates beyond its books, so tests
//! running beside it in one process would hold it back with memory that is not its own.

use std::time::Duration;

use forebay_engine::{IterOptions, Pipeline, Source, UserError};

mod common;
use common::{batch_of, schema, times};

#[test]
fn memory_stays_under_the_limit_with_a_slow_consumer() {
    // 300 batches of 1 MiB through a 2-worker stage, consumer slower than all.
    let big = |i: i64| batch_of((0..131_072).map(move |v| v + i));
    let source = Source::Batches {
        schema: schema(),
        batches: Box::new((0..300).map(move |i| Ok::<_, UserError>(big(i)))),
    };
    // The run's pool counts the process's memory beyond its books too, and with 1 MiB
    // batches the allocator alone keeps 6-8 MiB of freed ones in its arenas: the limit must
    // be large next to that for the books to be what holds the source back.
    let limit = 24 << 20;
    let mut stream = Pipeline::new(source)
        .with_memory_limit(limit)
        .map(times("double", 2).with_concurrency(2))
        .iter(IterOptions {
            prefetch_batches: 2,
            ..Default::default()
        })
        .unwrap();
    let mut rows = 0;
    let mut peak_used = 0;
    while let Some(b) = stream.next() {
        rows += b.unwrap().num_rows();
        if let Some(m) = stream.memory() {
            peak_used = peak_used.max(m.used);
            let held: usize = m.consumers.iter().map(|c| c.held).sum();
            assert_eq!(held, m.used, "holders add up to the pool");
        }
        std::thread::sleep(Duration::from_millis(4)); // slower than the source and the stage
    }
    assert_eq!(rows, 300 * 131_072);
    let stats = stream.stats().unwrap();
    assert!(
        stats.peak_bytes as usize <= limit,
        "peak {} > limit {limit}",
        stats.peak_bytes
    );
    // The queues filled up behind the slow consumer (so the limit was what held it back).
    assert!(
        peak_used > limit / 3,
        "the pipeline used its budget ({peak_used})"
    );
}
