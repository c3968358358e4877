//! Training streams read from real files: the batches of all ranks are the epoch's
//! sequence, a stream dropped part way stops its reader, a file that changed under a stream
//! is an error, and the windows are charged to the pool.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Array, Int64Array, RecordBatch};
use forebay_engine::training::{
    DatasetLayout, EpochOrder, EpochStream, Lanes, Remainder, Share, Shuffle,
};
use forebay_engine::MemoryPool;
use forebay_parquet::{DatasetSource, ParquetDataset};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use common::batch_of;

/// Files of 1,000 rows numbered in file order, row groups of 300.
fn write_files(dir: &std::path::Path, files: i64) {
    for f in 0..files {
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(300))
            .build();
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut writer = ArrowWriter::try_new(file, common::schema(), Some(props)).unwrap();
        writer.write(&batch_of(f * 1000..(f + 1) * 1000)).unwrap();
        writer.close().unwrap();
    }
}

fn open(dir: &std::path::Path) -> ParquetDataset {
    ParquetDataset::builder(DatasetSource::uris([dir.display().to_string()]))
        .for_row_ranges()
        .build()
        .unwrap()
}

/// `files` files written under a new directory, opened for row ranges, and the order of
/// epoch 0 with blocks of `block_rows` and windows of `window_blocks` (seed `seed`).
fn dataset_and_order(
    files: i64,
    block_rows: u64,
    window_blocks: usize,
    seed: u64,
) -> (tempfile::TempDir, ParquetDataset, Arc<EpochOrder>) {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), files);
    let dataset = open(dir.path());
    let layout = Arc::new(DatasetLayout::new(
        &dataset.row_group_layout().unwrap(),
        block_rows,
    ));
    let order = Arc::new(EpochOrder::new(
        layout,
        window_blocks,
        Shuffle::Seeded(seed),
        0,
    ));
    (dir, dataset, order)
}

fn values(batch: &RecordBatch) -> Vec<i64> {
    let x = batch
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    x.values().to_vec()
}

fn share(world_size: u64, rank: u64) -> Share {
    Share {
        world_size,
        rank,
        workers: 1,
        worker: 0,
        batch_size: 50,
        remainder: Remainder::Drop,
    }
}

#[test]
fn ranks_together_deliver_the_epoch_sequence() {
    let (_dir, dataset, order) = dataset_and_order(3, 64, 5, 3);
    let pool = MemoryPool::new(64 << 20);
    let one = EpochStream::start(dataset.clone(), order.clone(), share(1, 0), 0, &pool).unwrap();
    let sequence: Vec<i64> = one.flat_map(|b| values(&b.unwrap())).collect();
    let mut sorted = sequence.clone();
    sorted.sort();
    assert_eq!(sorted, (0..3000).collect::<Vec<_>>());

    let ranks: Vec<Vec<Vec<i64>>> = (0..3)
        .map(|r| {
            EpochStream::start(dataset.clone(), order.clone(), share(3, r), 0, &pool)
                .unwrap()
                .map(|b| values(&b.unwrap()))
                .collect()
        })
        .collect();
    let steps = ranks[0].len();
    assert_eq!(steps, 3000 / 150);
    let dealt: Vec<i64> = (0..steps)
        .flat_map(|k| ranks.iter().flat_map(move |r| r[k].clone()))
        .collect();
    assert_eq!(dealt, sequence[..dealt.len()]);
    assert!(pool.peak() > 0, "the windows were charged to the pool");
    assert_eq!(pool.used(), 0, "and let go");
}

#[test]
fn a_stream_dropped_part_way_stops_its_reader() {
    let (_dir, dataset, order) = dataset_and_order(4, 32, 4, 1);
    let pool = MemoryPool::new(64 << 20);
    let mut stream = EpochStream::start(dataset, order, share(1, 0), 0, &pool).unwrap();
    stream.next().unwrap().unwrap();
    let started = Instant::now();
    drop(stream);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(pool.used(), 0);
}

#[test]
fn a_file_rewritten_under_the_stream_is_an_error() {
    let (dir, dataset, order) = dataset_and_order(2, 100, 3, 2);
    // The second file loses rows after the layout was read.
    let props = WriterProperties::builder().build();
    let file = std::fs::File::create(dir.path().join("part-1.parquet")).unwrap();
    let mut writer = ArrowWriter::try_new(file, common::schema(), Some(props)).unwrap();
    writer.write(&batch_of(0..10)).unwrap();
    writer.close().unwrap();
    let pool = MemoryPool::new(64 << 20);
    let stream = EpochStream::start(dataset, order, share(1, 0), 0, &pool).unwrap();
    let results: Vec<_> = stream.collect();
    let error = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("an error");
    assert!(error.to_string().contains("part-1.parquet"), "{error}");
}

#[test]
fn windows_that_do_not_fit_the_limit_are_refused() {
    // One window of the whole dataset: read, then permuted while the read rows are held.
    let (_dir, dataset, order) = dataset_and_order(2, 100, 20, 2);
    assert_eq!(order.windows(), 1);
    let needs = 2 * order.window_bytes(0) as usize;
    let pool = MemoryPool::new(needs - 1);
    let error = EpochStream::start(dataset.clone(), order.clone(), share(1, 0), 0, &pool)
        .err()
        .expect("refused");
    assert!(error.to_string().contains("window_rows"), "{error}");
    let stream = EpochStream::start(dataset, order, share(1, 0), 0, &MemoryPool::new(needs));
    assert_eq!(stream.unwrap().count(), 2000 / 50);

    // Two windows: the one consumed, the next one and its permuted copy.
    let (_dir, dataset, order) = dataset_and_order(2, 100, 10, 2);
    assert_eq!(order.windows(), 2);
    let needs = (order.window_bytes(0) + 2 * order.window_bytes(1)) as usize;
    let refused = EpochStream::start(
        dataset.clone(),
        order.clone(),
        share(1, 0),
        0,
        &MemoryPool::new(needs - 1),
    );
    assert!(refused.is_err());
    let stream = EpochStream::start(dataset, order, share(1, 0), 0, &MemoryPool::new(needs));
    assert_eq!(stream.unwrap().count(), 2000 / 50);
}

/// In lanes, the ranks of a world size dividing the lanes together deliver the epoch's
/// sequence, and each reads its own lanes and the tail: about a third of the rows and of
/// the bytes (blocks of whole row groups here, so that a rank's blocks are whole column
/// chunks).
#[test]
fn ranks_in_lanes_read_their_share() {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), 8); // 8,000 rows in 32 row groups
    let layout = Arc::new(DatasetLayout::new(
        &open(dir.path()).row_group_layout().unwrap(),
        300,
    ));
    let lanes = Lanes {
        lanes: 3,
        chunk: 50,
    };
    let order = Arc::new(EpochOrder::in_lanes(
        layout,
        3,
        Shuffle::Seeded(11),
        0,
        lanes,
    ));
    let pool = MemoryPool::new(64 << 20);
    let whole = open(dir.path());
    let one = EpochStream::start(whole.clone(), order.clone(), share(1, 0), 0, &pool).unwrap();
    assert_eq!(one.rows_read(), 8000);
    let sequence: Vec<i64> = one.flat_map(|b| values(&b.unwrap())).collect();
    assert_eq!(sequence.len(), 8000);
    let all_bytes = whole.metrics().io.data_bytes;

    let mut ranks = Vec::new();
    for rank in 0..3 {
        let dataset = open(dir.path());
        let stream =
            EpochStream::start(dataset.clone(), order.clone(), share(3, rank), 0, &pool).unwrap();
        // 8,000 rows = 3 lanes of 2,650 rows (53 chunks of 50) and a tail of 50.
        assert_eq!(stream.rows_read(), 2650, "its lane; the tail is dropped");
        let batches: Vec<Vec<i64>> = stream.map(|b| values(&b.unwrap())).collect();
        let bytes = dataset.metrics().io.data_bytes;
        assert!(
            bytes * 100 < all_bytes * 40,
            "rank {rank} read {bytes} bytes of {all_bytes}"
        );
        ranks.push(batches);
    }
    let steps = ranks[0].len();
    assert_eq!(steps, 8000 / 150);
    let dealt: Vec<i64> = (0..steps)
        .flat_map(|k| ranks.iter().flat_map(move |r| r[k].clone()))
        .collect();
    assert_eq!(dealt, sequence[..7950]);
    assert_eq!(pool.used(), 0);
}

/// A padded last batch wraps to the start of the epoch: it reads the first window again
/// rather than holding it all epoch (the memory of four windows, as without padding: at a
/// window's edge a batch takes from two while the next is read and permuted).
#[test]
fn a_padded_last_batch_reads_the_first_window_again() {
    let (_dir, dataset, order) = dataset_and_order(3, 100, 5, 4);
    assert_eq!(order.windows(), 6);
    let pad = Share {
        remainder: Remainder::Pad,
        batch_size: 70, // 3,000 rows: 42 full batches and a padded 43rd
        ..share(1, 0)
    };
    let largest = (0..order.windows())
        .map(|w| order.window_bytes(w))
        .max()
        .unwrap();
    let pool = MemoryPool::new(4 * largest as usize);
    let stream = EpochStream::start(dataset, order.clone(), pad, 0, &pool).unwrap();
    assert_eq!(stream.rows_read(), 3000 + order.window_rows(0));
    let batches: Vec<Vec<i64>> = stream.map(|b| values(&b.unwrap())).collect();
    assert_eq!(batches.len(), 43);
    let last = &batches[42];
    assert_eq!(last[..60], batches.concat()[2940..3000]);
    assert_eq!(last[60..], batches[0][..10]);
    assert_eq!(pool.used(), 0);
}
