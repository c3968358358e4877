//! Training streams: a seeded global order of the dataset, dealt to ranks, resumable at any
//! batch with a state of a few integers.
//!
//! ```text
//!  files ──row_group_layout──► DatasetLayout (blocks: ≤ block_rows rows of one row group)
//!                                   │ (seed, epoch)
//!                                   ▼
//!                              EpochOrder: blocks permuted, cut into windows (or into lanes
//!                                   │      cut into windows), rows permuted in each window =
//!                                   │      the epoch's sample sequence
//!                                   ▼
//!  (world_size, rank, loader workers, batch_size, remainder) ── Share: step k = W × b samples,
//!                                   │                           rank r takes the r-th b
//!                                   ▼
//!                              EpochStream: reads the windows its batches touch (one ahead,
//!                              permuted whole, in the memory pool), slices its batches out
//! ```
//!
//! The sequence is a function of (seed, epoch, dataset, block_rows, window_blocks, lanes) only, so
//! the state of a run is where it is in it: (epoch, samples consumed). Every rank saves the
//! same state; a run resumed with another world size or number of loader workers deals the
//! rest of the same sequence ([`deal`]), so the ranks together deliver exactly what the
//! uninterrupted run would have. The Python package keeps that state
//! (`forebay.TrainingStream`, `python/forebay/_training.py`).
//!
//! Mixing is bounded by memory: a batch's samples come from the blocks of one window (two at
//! a window's edge), spread over the whole dataset by the block permutation. Smaller blocks
//! mix more, and cost more decoding (a block reads the pages holding its rows: located from
//! the page index, or, in files without one, by the reader once per row group).
//!
//! A rank reads every window its batches touch. Without lanes, once a window holds more
//! than `world_size` batches, that is every window: each rank decodes the whole dataset
//! and keeps its share. Giving each rank its own blocks would make the order depend on the
//! world size, which the resume across world sizes rules out; instead the order can be made
//! of lanes fixed for the run ([`EpochOrder::in_lanes`], as MosaicML's canonical nodes):
//! equal parts of the permuted blocks, each shuffled in its own windows, taken a batch at a
//! time in turn. A rank of a world size dividing the lanes then takes its batches from its
//! own lanes and reads 1/W of the dataset (plus the epoch's short tail), holding one window
//! per lane it takes from.
//!
//! ```no_run
//! use std::sync::Arc;
//! use forebay_engine::training::{DatasetLayout, EpochOrder, EpochStream, Remainder, Share, Shuffle};
//! use forebay_engine::MemoryPool;
//! use forebay_parquet::{DatasetSource, ParquetDataset};
//!
//! let dataset = ParquetDataset::builder(DatasetSource::uris(["data/"])).for_row_ranges().build()?;
//! let layout = Arc::new(DatasetLayout::new(&dataset.row_group_layout()?, 8192));
//! let order = Arc::new(EpochOrder::new(layout, 64, Shuffle::Seeded(1234), 0));
//! let share = Share { world_size: 4, rank: 1, workers: 1, worker: 0, batch_size: 256, remainder: Remainder::Drop };
//! for batch in EpochStream::start(dataset, order, share, 0, &MemoryPool::new(1 << 30))? {
//!     println!("{} rows", batch?.num_rows());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod deal;
pub mod order;
mod stream;

pub use deal::{Remainder, Share};
pub use order::{
    DatasetLayout, EpochOrder, Lanes, Piece, Shuffle, DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW_BLOCKS,
};
pub use stream::EpochStream;
