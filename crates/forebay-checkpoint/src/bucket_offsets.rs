//! Where each bucket of a shard table starts and ends among its records, in ~1.45 bytes a
//! bucket.
//!
//! A probe first looks up its bucket's range, then scans the bucket's records. The records
//! are far larger than the caches, so their line is a miss whatever we do; the ranges need
//! not be. As one `u32` offset a bucket, the ranges of an 8 M-id index take 8 MB (buckets
//! of ~4 ids), which the records streaming through the caches evict. Stored in blocks of
//! 11 buckets, 16 bytes each (a base offset and the buckets' bounds relative to it), they
//! take 36 % as much, and a block never straddles a cache line:
//!
//! ```text
//!  block k (16 bytes, aligned):  base: u32 │ bounds: [u8; 12], bounds[0] = 0
//!  bucket 11k + j:  start = base + bounds[j],  end = base + bounds[j + 1]
//! ```
//!
//! A lookup has no branch on the position in the block: one that mispredicts would throw
//! away the loads the probes behind it have started.
//!
//! A block's buckets must hold at most 255 records together. Buckets average 2 to 4 ids
//! (~22-44 a block), which a hash's random bucket numbers never take near 255. Ids made to
//! share a bucket could; a table with such a block keeps one `u32` offset a bucket instead,
//! and the index probes it through a loop that checks which kind each table is.

use crate::huge_pages::advise_huge_pages;
use crate::prefetch::prefetch;

/// Buckets a block describes: its `u32` base and one `u8` bound more than buckets fill 16
/// bytes.
const BUCKETS_PER_BLOCK: usize = 11;

/// One block: the record where its first bucket starts, and where each of its buckets
/// starts and ends relative to that (`bounds[j]..bounds[j + 1]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(16))]
struct Block {
    base: u32,
    bounds: [u8; BUCKETS_PER_BLOCK + 1],
}

/// The bucket ranges of one shard table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BucketOffsets {
    /// The ranges, 11 buckets a block (empty when `wide` holds them).
    blocks: Vec<Block>,
    /// Bucket `i` is `wide[i]..wide[i + 1]`: only for a table with a block of over 255
    /// records.
    wide: Option<Vec<u32>>,
    buckets: usize,
}

impl BucketOffsets {
    /// The ranges of `offsets.len() - 1` buckets, bucket `i` being `offsets[i]..offsets[i +
    /// 1]` (non-decreasing, `offsets[0] == 0`).
    pub(crate) fn from_offsets(offsets: Vec<u32>) -> BucketOffsets {
        let buckets = offsets.len().saturating_sub(1);
        let block_records =
            |first: usize| offsets[(first + BUCKETS_PER_BLOCK).min(buckets)] - offsets[first];
        if (0..buckets)
            .step_by(BUCKETS_PER_BLOCK)
            .any(|first| block_records(first) > u8::MAX as u32)
        {
            return BucketOffsets {
                blocks: Vec::new(),
                wide: Some(offsets),
                buckets,
            };
        }
        let mut blocks = Vec::with_capacity(buckets.div_ceil(BUCKETS_PER_BLOCK));
        advise_huge_pages(&blocks);
        for first in (0..buckets).step_by(BUCKETS_PER_BLOCK) {
            let base = offsets[first];
            let mut bounds = [0u8; BUCKETS_PER_BLOCK + 1];
            for (j, bucket) in (first..(first + BUCKETS_PER_BLOCK).min(buckets)).enumerate() {
                // At most 255: checked for the whole block above.
                bounds[j + 1] = (offsets[bucket + 1] - base) as u8;
            }
            blocks.push(Block { base, bounds });
        }
        BucketOffsets {
            blocks,
            wide: None,
            buckets,
        }
    }

    /// Whether the ranges are in blocks (every table a hash's random bucket numbers make):
    /// then a probe may use [`compact_range`](Self::compact_range) and
    /// [`compact_prefetch`](Self::compact_prefetch), which skip the check for the other case.
    pub(crate) fn is_compact(&self) -> bool {
        self.wide.is_none()
    }

    /// Bucket `bucket`'s records: `start..end`.
    pub(crate) fn range(&self, bucket: usize) -> (usize, usize) {
        match &self.wide {
            None => self.compact_range(bucket),
            Some(wide) => (wide[bucket] as usize, wide[bucket + 1] as usize),
        }
    }

    /// [`range`](Self::range) of a table whose ranges are in blocks
    /// ([`is_compact`](Self::is_compact)). Probing checks that once a batch, not on each
    /// lookup: the check would cost a probe ~7 % (`cargo bench --bench checkpoint`). On
    /// another table: panics (it has no blocks), never a wrong range.
    #[inline(always)]
    pub(crate) fn compact_range(&self, bucket: usize) -> (usize, usize) {
        let block = &self.blocks[bucket / BUCKETS_PER_BLOCK];
        let j = bucket % BUCKETS_PER_BLOCK;
        let base = block.base as usize;
        (
            base + block.bounds[j] as usize,
            base + block.bounds[j + 1] as usize,
        )
    }

    /// Ask the CPU to fetch the line [`range`](Self::range) of `bucket` will read.
    pub(crate) fn prefetch(&self, bucket: usize) {
        match &self.wide {
            None => self.compact_prefetch(bucket),
            Some(wide) => prefetch(&wide[bucket]),
        }
    }

    /// [`prefetch`](Self::prefetch) of a table whose ranges are in blocks (see
    /// [`compact_range`](Self::compact_range)).
    #[inline(always)]
    pub(crate) fn compact_prefetch(&self, bucket: usize) {
        prefetch(&self.blocks[bucket / BUCKETS_PER_BLOCK]);
    }

    /// How many buckets.
    pub(crate) fn buckets(&self) -> usize {
        self.buckets
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.blocks.capacity() * size_of::<Block>()
            + self
                .wide
                .as_ref()
                .map_or(0, |w| w.capacity() * size_of::<u32>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(offsets: &BucketOffsets) -> Vec<(usize, usize)> {
        (0..offsets.buckets()).map(|b| offsets.range(b)).collect()
    }

    fn plain_ranges(offsets: &[u32]) -> Vec<(usize, usize)> {
        offsets
            .windows(2)
            .map(|w| (w[0] as usize, w[1] as usize))
            .collect()
    }

    #[test]
    fn blocks_give_every_bucket_the_range_its_offsets_say() {
        // Bucket sizes 0..=9 in a repeating pattern, over counts of buckets that fill the
        // last block, leave it partial, or make just one bucket.
        for buckets in [1usize, 10, 11, 12, 22, 100, 1000] {
            let mut offsets = vec![0u32];
            for b in 0..buckets {
                offsets.push(offsets[b] + (b * 7 % 10) as u32);
            }
            let compact = BucketOffsets::from_offsets(offsets.clone());
            assert!(compact.wide.is_none(), "{buckets}");
            assert_eq!(compact.buckets(), buckets);
            assert_eq!(ranges(&compact), plain_ranges(&offsets), "{buckets}");
            assert!(compact.memory_bytes() <= buckets.div_ceil(11) * 16);
        }
    }

    #[test]
    fn a_block_of_more_than_255_records_keeps_one_offset_a_bucket() {
        // The second block: its first bucket, then 10 of 3 each; 255 records still fit,
        // 256 do not.
        for (records, compact) in [(255u32, true), (256, false)] {
            let mut sizes = vec![5u32; 11];
            sizes.push(records - 10 * 3);
            sizes.extend([3; 10]);
            sizes.extend([1; 7]);
            let mut offsets = vec![0u32];
            for size in sizes {
                offsets.push(offsets.last().unwrap() + size);
            }
            let table = BucketOffsets::from_offsets(offsets.clone());
            assert_eq!(table.wide.is_none(), compact, "{records}");
            assert_eq!(ranges(&table), plain_ranges(&offsets), "{records}");
        }
    }

    #[test]
    fn wide_and_compact_ranges_agree_where_both_exist() {
        let offsets: Vec<u32> = (0..=40).map(|b| b * 3).collect();
        let compact = BucketOffsets::from_offsets(offsets.clone());
        let wide = BucketOffsets {
            blocks: Vec::new(),
            wide: Some(offsets.clone()),
            buckets: 40,
        };
        assert!(compact.is_compact() && !wide.is_compact());
        for b in 0..40 {
            assert_eq!(compact.range(b), wide.range(b));
            assert_eq!(compact.range(b), compact.compact_range(b));
        }
    }

    #[test]
    fn an_empty_table_has_no_buckets() {
        let empty = BucketOffsets::from_offsets(vec![0]);
        assert_eq!(empty.buckets(), 0);
        assert_eq!(empty.memory_bytes(), 0);
    }

    #[test]
    fn a_block_is_sixteen_bytes_and_never_straddles_a_cache_line() {
        assert_eq!(size_of::<Block>(), 16);
        assert_eq!(std::mem::align_of::<Block>(), 16);
    }
}
