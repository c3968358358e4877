//! A run's memory limit against a consumer slower than the source. In a test binary of its
//! own: a run's pool counts everything the process allocates beyond its books, so tests
//! running beside it in one process would hold it back with memory that is not its own.

use std::time::{Duration, Instant};

use forebay_engine::{BatchStream, IterOptions, Pipeline, Source, UserError};

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
    // The consumer takes one batch, then stops until the pool's books stop growing: however
    // busy the machine, the source runs ahead of it until the limit holds it back.
    let mut rows = stream.next().unwrap().unwrap().num_rows();
    let mut peak_used = wait_until_steady(&stream);
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
    // The queues filled up behind the stopped consumer (so the limit was what held it back).
    assert!(
        peak_used > limit / 3,
        "the pipeline used its budget ({peak_used})"
    );
}

/// The pool's charge once it has not changed for 300 ms (at most 20 s).
fn wait_until_steady(stream: &BatchStream) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut last, mut since) = (0, Instant::now());
    while Instant::now() < deadline {
        let used = stream.memory().map_or(0, |m| m.used);
        if used != last {
            (last, since) = (used, Instant::now());
        } else if since.elapsed() > Duration::from_millis(300) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    last
}
