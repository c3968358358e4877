//! The order of an epoch: a function of (seed, epoch, dataset layout, block and window
//! sizes) and of nothing else (not threads, timing, prefetch, world size).
//!
//! ```text
//!  dataset, in file order:  [rg 0 of file 0: b0 b1 b2][rg 1: b3 b4][file 1 rg 0: b5 b6 b7]...
//!                            blocks: runs of ≤ block_rows rows of one row group
//!  block permutation (seed, epoch):     b6 b1 b4 │ b0 b7 b3 │ b5 b2 ...
//!  windows of ≤ window_blocks blocks:   window 0 │ window 1 │ window 2
//!  (as few as that allows, sizes within one block of each other: no small last window
//!   whose batches would all come from a few blocks)
//!  rows of a window (its blocks' rows, in the permuted block order), permuted by
//!  (seed, epoch, window): the window's slice of the epoch's sample sequence
//! ```
//!
//! The sample sequence of an epoch is the windows' permuted rows, window after window. A
//! sample's position in it is all a resume needs; a window is read whole (its blocks, from
//! many files) and is what the shuffle holds in memory.
//!
//! Randomness is ChaCha8 keyed by (seed, epoch) with one stream per window (stream 0 for
//! the block order), and Fisher-Yates with Lemire's unbiased bounded draws, written out
//! here so that the order is part of forebay's format: a saved state resumes the same
//! sequence on any later version (a test pins it).

use std::ops::Range;
use std::sync::Arc;

use chacha20::rand_core::{Rng, SeedableRng};
use chacha20::ChaCha8Rng;
use forebay_parquet::{FileRowGroups, RowRange};

/// The dataset cut into blocks, in file order, and what identifies it.
#[derive(Debug, Clone)]
pub struct DatasetLayout {
    blocks: Vec<RowRange>,
    /// Estimated decoded bytes of each block (its share of its row group's uncompressed
    /// size).
    block_bytes: Vec<u64>,
    rows: u64,
    fingerprint: u64,
    block_rows: u64,
}

/// Decoded bytes a block holds by default: about a data page of the widest columns, so that
/// a block decodes little more than its own rows, and small enough that a window of
/// [`DEFAULT_WINDOW_BLOCKS`] blocks mixes many places of the dataset.
pub const DEFAULT_BLOCK_BYTES: u64 = 2 << 20;

/// Blocks in a window by default (~128 MiB decoded with [`DEFAULT_BLOCK_BYTES`]).
pub const DEFAULT_WINDOW_BLOCKS: usize = 64;

impl DatasetLayout {
    /// Rows of a block of [`DEFAULT_BLOCK_BYTES`] at the dataset's average decoded row width
    /// (from the footers: the same on every machine), a multiple of 256, at least 256.
    pub fn default_block_rows(files: &[FileRowGroups]) -> u64 {
        let rows: u64 = files.iter().flat_map(|f| &f.row_group_rows).sum();
        let bytes: u64 = files.iter().flat_map(|f| &f.row_group_bytes).sum();
        let row_bytes = bytes.checked_div(rows).unwrap_or(1).max(1);
        (DEFAULT_BLOCK_BYTES / row_bytes / 256).max(1) * 256
    }

    /// Cut each row group of `files` (in the order given) into blocks of `block_rows` rows
    /// (the last block of a row group holds what is left).
    pub fn new(files: &[FileRowGroups], block_rows: u64) -> DatasetLayout {
        let block_rows = block_rows.max(1);
        let mut blocks = Vec::new();
        let mut block_bytes = Vec::new();
        let mut rows = 0u64;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for file in files {
            // A file is identified by its name (not where it lives: a dataset copied to
            // another bucket is the same dataset), its size and its row groups.
            let name = file.uri.rsplit('/').next().unwrap_or(&file.uri);
            hasher.update(name.as_bytes());
            hasher.update(&[0]);
            hasher.update(&file.size.to_le_bytes());
            hasher.update(&(file.row_group_rows.len() as u64).to_le_bytes());
            for (rg, (&n, &bytes)) in file
                .row_group_rows
                .iter()
                .zip(&file.row_group_bytes)
                .enumerate()
            {
                hasher.update(&n.to_le_bytes());
                rows += n;
                let mut start = 0;
                while start < n {
                    let end = (start + block_rows).min(n);
                    blocks.push(RowRange {
                        file_index: file.file_index,
                        row_group: rg,
                        rows: start..end,
                    });
                    block_bytes.push(bytes * (end - start) / n);
                    start = end;
                }
            }
        }
        DatasetLayout {
            blocks,
            block_bytes,
            rows,
            fingerprint: hasher.digest(),
            block_rows,
        }
    }

    /// Rows in the dataset.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Blocks the dataset is cut into.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Block `index` (in file order).
    pub fn block(&self, index: usize) -> RowRange {
        self.blocks[index].clone()
    }

    pub fn block_rows(&self) -> u64 {
        self.block_rows
    }

    /// Estimated decoded bytes of the whole dataset (its selected columns).
    pub fn bytes(&self) -> u64 {
        self.block_bytes.iter().sum()
    }

    /// A hash of the files' names, sizes and row groups: a saved state checks it.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// How an epoch's samples are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shuffle {
    /// File order: windows of consecutive blocks, rows in order (the no-shuffle reference;
    /// still dealt to ranks and resumable).
    None,
    /// Blocks permuted, rows permuted within each window, from this seed.
    Seeded(u64),
}

/// The sample sequence of one epoch, computed window by window (never materialized whole).
#[derive(Debug, Clone)]
pub struct EpochOrder {
    layout: Arc<DatasetLayout>,
    shuffle: Shuffle,
    epoch: u64,
    /// Index in `block_order` of each window's first block; one more entry holds the
    /// number of blocks.
    window_first_blocks: Vec<usize>,
    /// Block indices in the epoch's order.
    block_order: Vec<u32>,
    /// Position of each window's first sample; one more entry holds the epoch's rows.
    window_starts: Vec<u64>,
}

impl EpochOrder {
    pub fn new(
        layout: Arc<DatasetLayout>,
        window_blocks: usize,
        shuffle: Shuffle,
        epoch: u64,
    ) -> EpochOrder {
        let n = layout.blocks.len() as u64;
        let windows = (n as usize).div_ceil(window_blocks.max(1));
        let window_first_blocks: Vec<usize> = (0..=windows)
            .map(|t| t * n as usize / windows.max(1))
            .collect();
        let block_order = match shuffle {
            Shuffle::None => (0..n as u32).collect(),
            Shuffle::Seeded(seed) => permutation(n, &mut generator(seed, epoch, 0)),
        };
        let mut window_starts = Vec::with_capacity(windows + 1);
        let mut position = 0u64;
        for bounds in window_first_blocks.windows(2) {
            let window = &block_order[bounds[0]..bounds[1]];
            window_starts.push(position);
            position += window
                .iter()
                .map(|&b| {
                    let r = &layout.blocks[b as usize].rows;
                    r.end - r.start
                })
                .sum::<u64>();
        }
        window_starts.push(position);
        EpochOrder {
            layout,
            shuffle,
            epoch,
            window_first_blocks,
            block_order,
            window_starts,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Samples in the epoch (the dataset's rows).
    pub fn rows(&self) -> u64 {
        *self.window_starts.last().expect("one entry at least")
    }

    pub fn windows(&self) -> usize {
        self.window_starts.len() - 1
    }

    /// The window holding sample `position` (< [`rows`](Self::rows)).
    pub fn window_of(&self, position: u64) -> usize {
        self.window_starts.partition_point(|&s| s <= position) - 1
    }

    /// Positions of the samples of window `window`.
    pub fn window_positions(&self, window: usize) -> Range<u64> {
        self.window_starts[window]..self.window_starts[window + 1]
    }

    /// The row ranges of `window`'s blocks, in the order their rows are concatenated before
    /// the window's permutation; blocks that follow each other in their row group are one
    /// range (in file order, whole row groups: read by forebay's own decoders).
    pub fn window_blocks(&self, window: usize) -> Vec<RowRange> {
        let mut ranges: Vec<RowRange> = Vec::new();
        for &b in self.block_indices(window) {
            let block = &self.layout.blocks[b as usize];
            match ranges.last_mut() {
                Some(last)
                    if (last.file_index, last.row_group) == (block.file_index, block.row_group)
                        && last.rows.end == block.rows.start =>
                {
                    last.rows.end = block.rows.end;
                }
                _ => ranges.push(block.clone()),
            }
        }
        ranges
    }

    /// Estimated decoded bytes of `window`.
    pub fn window_bytes(&self, window: usize) -> u64 {
        self.block_indices(window)
            .iter()
            .map(|&b| self.layout.block_bytes[b as usize])
            .sum()
    }

    fn block_indices(&self, window: usize) -> &[u32] {
        &self.block_order[self.window_first_blocks[window]..self.window_first_blocks[window + 1]]
    }

    /// Whether samples follow the blocks' rows as read (no shuffle): a window needs no
    /// permuting.
    pub fn is_file_order(&self) -> bool {
        self.shuffle == Shuffle::None
    }

    /// For each sample of `window` (in sequence order), its row among the window's blocks'
    /// rows concatenated.
    pub fn window_permutation(&self, window: usize) -> Vec<u32> {
        let rows = self.window_positions(window);
        let n = rows.end - rows.start;
        match self.shuffle {
            Shuffle::None => (0..n as u32).collect(),
            Shuffle::Seeded(seed) => {
                permutation(n, &mut generator(seed, self.epoch, window as u64 + 1))
            }
        }
    }
}

/// The generator of stream `stream` of (seed, epoch).
fn generator(seed: u64, epoch: u64, stream: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&epoch.to_le_bytes());
    key[16..].copy_from_slice(b"forebay.training");
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(stream);
    rng
}

/// A uniformly random permutation of `0..n` (Fisher-Yates).
fn permutation(n: u64, rng: &mut ChaCha8Rng) -> Vec<u32> {
    assert!(n <= u32::MAX as u64 + 1, "a window or block list over 2^32");
    let mut items: Vec<u32> = (0..n).map(|i| i as u32).collect();
    for i in (1..items.len()).rev() {
        let j = below(i as u64 + 1, rng) as usize;
        items.swap(i, j);
    }
    items
}

/// A uniform draw from `0..n` (Lemire's multiply-and-reject).
fn below(n: u64, rng: &mut ChaCha8Rng) -> u64 {
    let mut m = u128::from(rng.next_u64()) * u128::from(n);
    if (m as u64) < n {
        let threshold = n.wrapping_neg() % n;
        while (m as u64) < threshold {
            m = u128::from(rng.next_u64()) * u128::from(n);
        }
    }
    (m >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(row_groups: &[&[u64]]) -> Vec<FileRowGroups> {
        row_groups
            .iter()
            .enumerate()
            .map(|(i, rgs)| FileRowGroups {
                file_index: i,
                uri: format!("/data/part-{i}.parquet").into(),
                size: 1000 + i as u64,
                row_group_rows: rgs.to_vec(),
                row_group_bytes: rgs.iter().map(|r| r * 10).collect(),
            })
            .collect()
    }

    /// Every (file, row group, row) of the dataset, in epoch order.
    fn sequence(order: &EpochOrder) -> Vec<(usize, usize, u64)> {
        let mut out = Vec::new();
        for w in 0..order.windows() {
            let rows: Vec<(usize, usize, u64)> = order
                .window_blocks(w)
                .iter()
                .flat_map(|b| b.rows.clone().map(move |r| (b.file_index, b.row_group, r)))
                .collect();
            out.extend(
                order
                    .window_permutation(w)
                    .iter()
                    .map(|&i| rows[i as usize]),
            );
        }
        out
    }

    #[test]
    fn an_epoch_is_a_permutation_of_the_dataset() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[10, 7], &[3], &[25, 1]]), 4));
        assert_eq!(layout.rows(), 46);
        assert_eq!(layout.blocks(), 3 + 2 + 1 + 7 + 1);
        for seed in 0..20 {
            let order = EpochOrder::new(layout.clone(), 3, Shuffle::Seeded(seed), 0);
            let mut seen = sequence(&order);
            assert_eq!(seen.len(), 46);
            for (i, p) in (0..46).zip(seen.iter()) {
                assert_eq!(
                    order.window_of(i),
                    (0..order.windows())
                        .find(|&w| order.window_positions(w).contains(&i))
                        .unwrap(),
                    "{p:?}"
                );
            }
            seen.sort();
            let mut all = sequence(&EpochOrder::new(layout.clone(), 3, Shuffle::None, 0));
            all.sort();
            assert_eq!(seen, all);
        }
    }

    #[test]
    fn windows_are_as_even_as_the_blocks_allow() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[10; 19]]), 10));
        let order = EpochOrder::new(layout, 6, Shuffle::Seeded(1), 0);
        let sizes: Vec<u64> = (0..order.windows())
            .map(|w| order.window_positions(w).end - order.window_positions(w).start)
            .collect();
        assert_eq!(sizes, vec![40, 50, 50, 50]); // not 60, 60, 60, 10
    }

    #[test]
    fn no_shuffle_is_file_order() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[5, 2], &[3]]), 2));
        let order = EpochOrder::new(layout, 2, Shuffle::None, 3);
        let expected: Vec<(usize, usize, u64)> = (0..5)
            .map(|r| (0, 0, r))
            .chain((0..2).map(|r| (0, 1, r)))
            .chain((0..3).map(|r| (1, 0, r)))
            .collect();
        assert_eq!(sequence(&order), expected);
    }

    #[test]
    fn the_order_depends_on_seed_and_epoch_only() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[100, 50], &[80]]), 16));
        let a = sequence(&EpochOrder::new(layout.clone(), 4, Shuffle::Seeded(7), 1));
        let b = sequence(&EpochOrder::new(layout.clone(), 4, Shuffle::Seeded(7), 1));
        let c = sequence(&EpochOrder::new(layout.clone(), 4, Shuffle::Seeded(7), 2));
        let d = sequence(&EpochOrder::new(layout, 4, Shuffle::Seeded(8), 1));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    /// The order is part of the saved-state format: if this changes, states saved by
    /// earlier versions would resume a different sequence.
    #[test]
    fn the_order_is_pinned() {
        let mut rng = generator(42, 3, 5);
        let first: Vec<u32> = permutation(10, &mut rng);
        assert_eq!(first, vec![3, 9, 6, 4, 8, 2, 5, 7, 0, 1]);
        let layout = Arc::new(DatasetLayout::new(&files(&[&[3, 2], &[4]]), 2));
        assert_eq!(layout.fingerprint(), 0xcd8e_cfb6_caa3_4eec);
        let order = EpochOrder::new(layout, 2, Shuffle::Seeded(42), 1);
        let pinned = [
            (0, 0, 2),
            (1, 0, 1),
            (0, 1, 1),
            (1, 0, 0),
            (0, 1, 0),
            (0, 0, 1),
        ];
        assert_eq!(sequence(&order)[..6], pinned[..]);
    }

    #[test]
    fn permutations_are_uniform() {
        // Each of the 6 permutations of 3 items, over 60,000 draws: within 5 % of 10,000.
        let mut rng = generator(1, 0, 0);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..60_000 {
            *counts.entry(permutation(3, &mut rng)).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 6);
        assert!(
            counts.values().all(|&c| (9_500..10_500).contains(&c)),
            "{counts:?}"
        );
    }
}
