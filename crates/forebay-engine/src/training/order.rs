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
//! The sample sequence of an epoch is the windows' permuted rows, window after window, or,
//! in lanes ([`EpochOrder::in_lanes`]), the lanes' windows taken a chunk at a time in turn.
//! A sample's position in it is all a resume needs; a window is read whole (its blocks, from
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
    /// over all its columns (from the footers: the same on every machine, and whichever
    /// columns are read, so that a resume reading another column keeps the order), a
    /// multiple of 256, at least 256.
    pub fn default_block_rows(files: &[FileRowGroups]) -> u64 {
        let rows: u64 = files.iter().flat_map(|f| &f.row_group_rows).sum();
        let bytes: u64 = files.iter().flat_map(|f| &f.row_group_all_bytes).sum();
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

/// Lanes: the epoch's sequence as `lanes` streams interleaved `chunk` samples at a time,
/// so that a rank can read only its own (see [`EpochOrder::in_lanes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lanes {
    pub lanes: u64,
    /// Samples a lane gives at a time (a rank's batch size, for a rank to read its lanes
    /// only).
    pub chunk: u64,
}

/// The part of the sequence cut into lanes.
#[derive(Debug, Clone)]
struct LaneLayout {
    lanes: u64,
    chunk: u64,
    /// Rows of each lane (a multiple of `chunk`).
    lane_rows: u64,
    /// Offsets in a lane where its windows start (the same for every lane); one more entry
    /// holds `lane_rows`.
    window_starts: Vec<u64>,
}

/// Where some consecutive samples of the sequence are: `offsets` of window `window`'s
/// samples (in the window's sequence order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub window: usize,
    pub offsets: Range<u64>,
}

/// The sample sequence of one epoch, computed window by window (never materialized whole).
///
/// The blocks' rows in the permuted block order make the epoch's *row sequence*; a window
/// is a range of it, its rows permuted. Without lanes the windows follow each other in
/// the sample sequence; with lanes, see [`EpochOrder::in_lanes`].
#[derive(Debug, Clone)]
pub struct EpochOrder {
    layout: Arc<DatasetLayout>,
    shuffle: Shuffle,
    epoch: u64,
    /// Block indices in the epoch's order.
    block_order: Vec<u32>,
    /// Row-sequence position of each block of `block_order`; one more entry holds the
    /// epoch's rows.
    block_starts: Vec<u64>,
    /// Each window's rows of the row sequence: with lanes, lane 0's windows, lane 1's, ...,
    /// then the tail's.
    windows: Vec<Range<u64>>,
    lanes: Option<LaneLayout>,
    /// The first window whose samples are its rows' own positions in the sequence (all of
    /// them without lanes; the tail's with lanes).
    first_in_place: usize,
}

impl EpochOrder {
    /// The epoch's order without lanes: windows of `window_blocks` permuted blocks (as few
    /// as that allows, as even as the blocks allow), one after another.
    pub fn new(
        layout: Arc<DatasetLayout>,
        window_blocks: usize,
        shuffle: Shuffle,
        epoch: u64,
    ) -> EpochOrder {
        let (block_order, block_starts) = block_sequence(&layout, shuffle, epoch);
        let n = block_order.len();
        let count = n.div_ceil(window_blocks.max(1));
        let windows = (0..count)
            .map(|t| block_starts[t * n / count]..block_starts[(t + 1) * n / count])
            .collect();
        EpochOrder {
            layout,
            shuffle,
            epoch,
            block_order,
            block_starts,
            windows,
            lanes: None,
            first_in_place: 0,
        }
    }

    /// The epoch's order in lanes, so that a rank reads only part of the dataset:
    ///
    /// ```text
    ///  row sequence (permuted blocks): [ lane 0 │ lane 1 │ … │ lane L-1 │ tail (< L × chunk) ]
    ///  each lane cut into windows of ~window_blocks blocks' rows, rows permuted in each
    ///  samples:  chunk 0 of lane 0, chunk 0 of lane 1, …, chunk 0 of lane L-1,
    ///            chunk 1 of lane 0, …                                 then the tail's windows
    /// ```
    ///
    /// Lanes have equal rows (a multiple of `chunk`), so with batches of `chunk` samples a
    /// rank of a world whose size divides `lanes` takes lanes `r, r + W, …` (shifted by where
    /// the epoch was resumed) and reads only their windows: 1/W of the dataset, plus the
    /// tail. Any other world size gets the same sequence and reads more. The order depends
    /// on `lanes` and `chunk`: they are fixed for a run like the seed.
    pub fn in_lanes(
        layout: Arc<DatasetLayout>,
        window_blocks: usize,
        shuffle: Shuffle,
        epoch: u64,
        lanes: Lanes,
    ) -> EpochOrder {
        let (block_order, block_starts) = block_sequence(&layout, shuffle, epoch);
        let rows = layout.rows();
        let (count, chunk) = (lanes.lanes.max(1), lanes.chunk.max(1));
        let lane_rows = rows / count.saturating_mul(chunk) * chunk;
        // Windows hold about `window_blocks` average blocks' rows.
        let window_rows = (window_blocks.max(1) as u64)
            .saturating_mul(rows)
            .div_ceil(layout.blocks().max(1) as u64)
            .max(1);
        let even_cuts = |len: u64| -> Vec<u64> {
            let count = len.div_ceil(window_rows);
            (0..=count).map(|t| t * len / count.max(1)).collect()
        };
        let window_starts = even_cuts(lane_rows);
        let mut windows = Vec::new();
        // (No lane has a row when lanes × chunk exceed the rows: all is the tail.)
        for lane in 0..if lane_rows > 0 { count } else { 0 } {
            let base = lane * lane_rows;
            windows.extend(window_starts.windows(2).map(|w| base + w[0]..base + w[1]));
        }
        let first_in_place = windows.len();
        let body = count * lane_rows;
        let tail_cuts = even_cuts(rows - body);
        windows.extend(tail_cuts.windows(2).map(|w| body + w[0]..body + w[1]));
        EpochOrder {
            layout,
            shuffle,
            epoch,
            block_order,
            block_starts,
            windows,
            lanes: Some(LaneLayout {
                lanes: count,
                chunk,
                lane_rows,
                window_starts,
            }),
            first_in_place,
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Samples in the epoch (the dataset's rows).
    pub fn rows(&self) -> u64 {
        *self.block_starts.last().expect("one entry at least")
    }

    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Samples in window `window`.
    pub fn window_rows(&self, window: usize) -> u64 {
        let rows = &self.windows[window];
        rows.end - rows.start
    }

    /// The windows and offsets in them of the samples at `positions` (< [`rows`](Self::rows)),
    /// in sequence order, appended to `out`.
    pub fn pieces(&self, positions: Range<u64>, out: &mut Vec<Piece>) {
        let mut p = positions.start;
        while p < positions.end {
            let (window, offset, run) = self.locate(p);
            let len = run.min(positions.end - p);
            match out.last_mut() {
                Some(last) if last.window == window && last.offsets.end == offset => {
                    last.offsets.end += len;
                }
                _ => out.push(Piece {
                    window,
                    offsets: offset..offset + len,
                }),
            }
            p += len;
        }
    }

    /// (window, offset in it, samples from there on that follow in the same window) of the
    /// sample at position `p`.
    fn locate(&self, p: u64) -> (usize, u64, u64) {
        if let Some(lanes) = &self.lanes {
            if p < lanes.lanes * lanes.lane_rows {
                let k = p / lanes.chunk;
                let lane = k % lanes.lanes;
                let at = (k / lanes.lanes) * lanes.chunk + p % lanes.chunk;
                let j = lanes.window_starts.partition_point(|&s| s <= at) - 1;
                let windows_per_lane = lanes.window_starts.len() - 1;
                let run = (lanes.chunk - p % lanes.chunk).min(lanes.window_starts[j + 1] - at);
                return (
                    lane as usize * windows_per_lane + j,
                    at - lanes.window_starts[j],
                    run,
                );
            }
        }
        let in_place = &self.windows[self.first_in_place..];
        let w = self.first_in_place + in_place.partition_point(|r| r.start <= p) - 1;
        let rows = &self.windows[w];
        (w, p - rows.start, rows.end - p)
    }

    /// The row ranges of `window`'s rows, in the order their rows are concatenated before
    /// the window's permutation; consecutive rows of a row group are one range (in file
    /// order, whole row groups: read by forebay's own decoders).
    pub fn window_blocks(&self, window: usize) -> Vec<RowRange> {
        let mut ranges: Vec<RowRange> = Vec::new();
        for (b, rows) in self.window_parts(window) {
            let block = &self.layout.blocks[b];
            let rows = block.rows.start + rows.start..block.rows.start + rows.end;
            match ranges.last_mut() {
                Some(last)
                    if (last.file_index, last.row_group) == (block.file_index, block.row_group)
                        && last.rows.end == rows.start =>
                {
                    last.rows.end = rows.end;
                }
                _ => ranges.push(RowRange {
                    file_index: block.file_index,
                    row_group: block.row_group,
                    rows,
                }),
            }
        }
        ranges
    }

    /// Estimated decoded bytes of `window`.
    pub fn window_bytes(&self, window: usize) -> u64 {
        self.window_parts(window)
            .map(|(b, rows)| {
                let block = &self.layout.blocks[b].rows;
                let bytes = u128::from(self.layout.block_bytes[b]);
                (bytes * u128::from(rows.end - rows.start)
                    / u128::from((block.end - block.start).max(1))) as u64
            })
            .sum()
    }

    /// (block, its rows in the window, counted from the block's first row) of `window`'s
    /// rows, in row-sequence order.
    fn window_parts(&self, window: usize) -> impl Iterator<Item = (usize, Range<u64>)> + '_ {
        let rows = self.windows[window].clone();
        let first = self
            .block_starts
            .partition_point(|&s| s <= rows.start)
            .max(1)
            - 1;
        (first..self.block_order.len())
            .take_while(move |&i| self.block_starts[i] < rows.end)
            .filter_map(move |i| {
                let (start, end) = (self.block_starts[i], self.block_starts[i + 1]);
                let (from, to) = (rows.start.max(start), rows.end.min(end));
                (from < to).then(|| (self.block_order[i] as usize, from - start..to - start))
            })
    }

    /// Whether samples follow the blocks' rows as read (no shuffle): a window needs no
    /// permuting.
    pub fn is_file_order(&self) -> bool {
        self.shuffle == Shuffle::None
    }

    /// For each sample of `window` (in sequence order), its row among the window's rows
    /// concatenated.
    pub fn window_permutation(&self, window: usize) -> Vec<u32> {
        let n = self.window_rows(window);
        match self.shuffle {
            Shuffle::None => (0..n as u32).collect(),
            Shuffle::Seeded(seed) => {
                permutation(n, &mut generator(seed, self.epoch, window as u64 + 1))
            }
        }
    }
}

/// The epoch's block order and where each block starts in the row sequence.
fn block_sequence(layout: &DatasetLayout, shuffle: Shuffle, epoch: u64) -> (Vec<u32>, Vec<u64>) {
    let n = layout.blocks.len() as u64;
    let block_order = match shuffle {
        Shuffle::None => (0..n as u32).collect(),
        Shuffle::Seeded(seed) => permutation(n, &mut generator(seed, epoch, 0)),
    };
    let mut block_starts = Vec::with_capacity(block_order.len() + 1);
    let mut position = 0u64;
    block_starts.push(0);
    for &b in &block_order {
        let rows = &layout.blocks[b as usize].rows;
        position += rows.end - rows.start;
        block_starts.push(position);
    }
    (block_order, block_starts)
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
                row_group_all_bytes: rgs.iter().map(|r| r * 30).collect(),
            })
            .collect()
    }

    /// Every (file, row group, row) of the dataset, in epoch order.
    fn sequence(order: &EpochOrder) -> Vec<(usize, usize, u64)> {
        let windows: Vec<Vec<(usize, usize, u64)>> = (0..order.windows())
            .map(|w| {
                let rows: Vec<(usize, usize, u64)> = order
                    .window_blocks(w)
                    .iter()
                    .flat_map(|b| b.rows.clone().map(move |r| (b.file_index, b.row_group, r)))
                    .collect();
                assert_eq!(rows.len() as u64, order.window_rows(w));
                order
                    .window_permutation(w)
                    .iter()
                    .map(|&i| rows[i as usize])
                    .collect()
            })
            .collect();
        let mut pieces = Vec::new();
        order.pieces(0..order.rows(), &mut pieces);
        pieces
            .iter()
            .flat_map(|p| &windows[p.window][p.offsets.start as usize..p.offsets.end as usize])
            .copied()
            .collect()
    }

    fn sorted(mut rows: Vec<(usize, usize, u64)>) -> Vec<(usize, usize, u64)> {
        rows.sort();
        rows
    }

    #[test]
    fn an_epoch_is_a_permutation_of_the_dataset() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[10, 7], &[3], &[25, 1]]), 4));
        assert_eq!(layout.rows(), 46);
        assert_eq!(layout.blocks(), 3 + 2 + 1 + 7 + 1);
        let all = sorted(sequence(&EpochOrder::new(
            layout.clone(),
            3,
            Shuffle::None,
            0,
        )));
        assert_eq!(all.len(), 46);
        for seed in 0..20 {
            let order = EpochOrder::new(layout.clone(), 3, Shuffle::Seeded(seed), 0);
            assert_eq!(sorted(sequence(&order)), all);
            for lanes in 1..8 {
                for chunk in [1, 2, 3, 7, 50] {
                    let lanes = Lanes { lanes, chunk };
                    for shuffle in [Shuffle::None, Shuffle::Seeded(seed)] {
                        let order = EpochOrder::in_lanes(layout.clone(), 2, shuffle, 0, lanes);
                        assert_eq!(sorted(sequence(&order)), all, "{lanes:?} {shuffle:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn huge_lanes_chunks_and_windows_are_one_tail() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[10, 7]]), 4));
        let all = sorted(sequence(&EpochOrder::new(
            layout.clone(),
            3,
            Shuffle::None,
            0,
        )));
        for (lanes, chunk) in [(u64::MAX, 1), (1, u64::MAX), (1 << 40, 1 << 40)] {
            let order = EpochOrder::in_lanes(
                layout.clone(),
                usize::MAX,
                Shuffle::Seeded(3),
                0,
                Lanes { lanes, chunk },
            );
            assert_eq!(
                order.windows(),
                1,
                "the whole dataset is the tail, one window"
            );
            assert_eq!(sorted(sequence(&order)), all);
        }
    }

    proptest::proptest! {
        /// With lanes, the samples of batches of `chunk` taken by rank r of a world whose
        /// size divides the lanes come from its own lanes' windows (and the tail's) only, so
        /// that the ranks' windows are disjoint.
        #[test]
        fn a_rank_reads_its_own_lanes(
            row_groups in proptest::collection::vec(1u64..300, 1..12),
            block_rows in 1u64..64, window_blocks in 1usize..8, lanes in 1u64..13,
            chunk in 1u64..20, world_pick in 0usize..6, resumed_steps in 0u64..5, seed in 0u64..1000,
        ) {
            let divisors: Vec<u64> = (1..=lanes).filter(|w| lanes % w == 0).collect();
            let world = divisors[world_pick % divisors.len()];
            let layout = Arc::new(DatasetLayout::new(&files(&[&row_groups]), block_rows));
            let order = EpochOrder::in_lanes(
                layout, window_blocks, Shuffle::Seeded(seed), 1, Lanes { lanes, chunk },
            );
            let tail = order.lanes.as_ref().unwrap().lanes * order.lanes.as_ref().unwrap().lane_rows;
            let mut owner: Vec<Option<u64>> = vec![None; order.windows()];
            // Resumed after some steps of another world (a multiple of chunk consumed).
            let consumed = resumed_steps * 5 * chunk;
            let mut k = 0;
            loop {
                let start = consumed + k * chunk;
                if start + chunk > tail {
                    break;
                }
                let rank = k % world;
                let mut pieces = Vec::new();
                order.pieces(start..start + chunk, &mut pieces);
                for piece in pieces {
                    let seen = owner[piece.window].get_or_insert(rank);
                    proptest::prop_assert_eq!(*seen, rank);
                }
                k += 1;
            }
        }
    }

    #[test]
    fn windows_are_as_even_as_the_blocks_allow() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[10; 19]]), 10));
        let order = EpochOrder::new(layout, 6, Shuffle::Seeded(1), 0);
        let sizes: Vec<u64> = (0..order.windows()).map(|w| order.window_rows(w)).collect();
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

    /// The same for an order in lanes.
    #[test]
    fn the_order_in_lanes_is_pinned() {
        let layout = Arc::new(DatasetLayout::new(&files(&[&[3, 2], &[4]]), 2));
        let lanes = Lanes { lanes: 2, chunk: 2 };
        let order = EpochOrder::in_lanes(layout, 1, Shuffle::Seeded(42), 1, lanes);
        // 9 rows: 2 lanes of 4 (windows of 2 rows), a tail of 1.
        let pinned = [
            (0, 0, 2),
            (1, 0, 0),
            (0, 1, 1),
            (0, 0, 0),
            (1, 0, 1),
            (0, 1, 0),
            (1, 0, 2),
            (0, 0, 1),
            (1, 0, 3),
        ];
        assert_eq!(sequence(&order)[..], pinned[..]);
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
