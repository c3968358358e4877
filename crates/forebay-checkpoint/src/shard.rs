//! One shard of a checkpoint index: a compact, bucketed table of fingerprints.
//!
//! # Layout (10 bytes per id in shards of 2^18+ ids, else 12, plus 0.4-0.7 byte of ranges)
//!
//! Within shard `k` of `2^s`, an id's *local fingerprint* is the low `100 - s` bits of its
//! fingerprint (the top `s` bits are `k` and need not be stored). Its top `b` bits pick one of
//! `2^b` buckets; the remaining `r = 100 - s - b ≤ 96` bits, the *remainder*, are stored as
//! one record in a single array: the top 64 bits, then the rest (the *tail*) in 2 bytes when
//! `r ≤ 80` (any shard of 2^18 ids or more) or 4 otherwise. Entries are grouped by bucket
//! (in no order within it); `dir` holds each bucket's range, in blocks small enough to stay
//! in cache (module `bucket_offsets`). `b` is chosen so that buckets hold 2 to 4 ids on
//! average (20-40 bytes), so a probe reads its range and one cache line of records (two
//! when the bucket straddles a line boundary). Buckets of 4 to 8, as before, made a probe
//! ~15 % slower for ~0.15 byte an id less (`cargo bench --bench checkpoint`, BENCHMARKS.md
//! "checkpoint filter"). Because the bucket bits are implied by position, the full local fingerprint
//! can be rebuilt from the table at any time; a rebuild with more ids picks a larger `b`.
//!
//! # Inserts
//!
//! The table is built by grouping by bucket (two cache-friendly radix passes, see
//! `group_by_bucket`), then dropping duplicates within each bucket. A bulk load
//! collects fingerprints packed in 12 bytes instead and builds with
//! `ShardTable::build_from_packed`, which makes the same table with less memory in flight.
//! Ids inserted later go to a small hash set (`delta`) until it grows to a quarter of the
//! table, when both are rebuilt into a new table: inserts cost amortised O(1), and memory
//! stays near 13 bytes per id.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

use crate::bucket_offsets::BucketOffsets;
use crate::error::{CheckpointError, Result};
use crate::fingerprint::FINGERPRINT_BITS;
use crate::huge_pages::advise_huge_pages;
use crate::prefetch::prefetch;

/// Remainders are stored in 96 bits (u64 + u32).
const REMAINDER_BITS_MAX: u32 = 96;
/// Average ids per bucket the directory is sized for (the real average is in [2, 4)).
const TARGET_BUCKET_LOAD: u64 = 2;
/// Largest bucket count exponent (a 4 GiB directory is already absurd).
const BUCKET_BITS_MAX: u32 = 30;
/// Offsets are u32: a shard holds fewer ids than this.
pub const MAX_IDS_PER_SHARD: u64 = u32::MAX as u64 - 1;
/// Buckets larger than this are sorted to drop duplicates; smaller ones compare each entry
/// with those kept before it (see `Remainders::append_bucket`).
const SMALL_BUCKET: usize = 32;
/// Delta sets smaller than this never trigger a rebuild on their own.
const DELTA_MIN_REBUILD: usize = 1 << 16;

/// Local fingerprints are uniformly random bits: their low 64 bits are a perfect hash.
#[derive(Default)]
pub(crate) struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached if someone hashes something other than a u128; stay correct (FNV-1a).
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100000001b3);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// The remainders of a table in bucket order, each one fixed-width little-endian record: its
/// top 64 bits, then its *tail*, the low bits (2 bytes when the tail has 16 bits or fewer, as
/// in any shard of 2^18 ids or more, else 4). One array rather than one per part, so the
/// entries a probe scans (a bucket of 2 to 4) share one cache line, sometimes two: on a
/// table far larger than the caches every line is a trip to memory.
struct Remainders {
    bytes: Vec<u8>,
    /// 2 or 4.
    tail_bytes: usize,
    /// Records held (`bytes.len() / stride`, kept so that a build asking after every bucket
    /// does not divide each time).
    len: usize,
}

impl Remainders {
    fn with_capacity(tail_bits: u32, n: usize) -> Remainders {
        Remainders::in_buffer(tail_bits, n, Vec::new())
    }

    /// Room for `n` records in `buffer`'s allocation (its contents do not matter), grown
    /// only if it is too small.
    fn in_buffer(tail_bits: u32, n: usize, mut buffer: Vec<u8>) -> Remainders {
        let tail_bytes = if tail_bits <= 16 { 2 } else { 4 };
        let needed = n * (8 + tail_bytes);
        let bytes = if buffer.capacity() >= needed {
            buffer.clear();
            buffer
        } else {
            let fresh = Vec::with_capacity(needed);
            advise_huge_pages(&fresh);
            fresh
        };
        Remainders {
            bytes,
            tail_bytes,
            len: 0,
        }
    }

    #[inline(always)]
    fn stride(&self) -> usize {
        8 + self.tail_bytes
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Append a remainder: `hi` its top bits, the low bits of `rem` its tail.
    fn push(&mut self, hi: u64, rem: u128) {
        self.len += 1;
        self.bytes.extend_from_slice(&hi.to_le_bytes());
        if self.tail_bytes == 2 {
            self.bytes.extend_from_slice(&(rem as u16).to_le_bytes());
        } else {
            self.bytes.extend_from_slice(&(rem as u32).to_le_bytes());
        }
    }

    /// Append one bucket's local fingerprints (any order, duplicates allowed): each distinct
    /// remainder (`f & rem_mask`, its tail the low `tail_bits`) once.
    ///
    /// A bucket of the usual handful keeps its order and drops an entry equal to one kept
    /// before it: ids rarely repeat, so those comparisons branch predictably, where sorting
    /// random values mispredicts about every other comparison (sorting was ~70 % of a
    /// build's time in this function). A large bucket (duplicates, or bad luck) is sorted.
    fn append_bucket(&mut self, bucket: &mut [u128], rem_mask: u128, tail_bits: u32) {
        if bucket.len() > SMALL_BUCKET {
            bucket.sort_unstable();
            let mut last = None;
            for &f in bucket.iter() {
                let rem = f & rem_mask;
                if last != Some(rem) {
                    self.push((rem >> tail_bits) as u64, rem);
                    last = Some(rem);
                }
            }
            return;
        }
        let mut kept = 0;
        for i in 0..bucket.len() {
            let rem = bucket[i] & rem_mask;
            if !bucket[..kept].contains(&rem) {
                bucket[kept] = rem;
                kept += 1;
                self.push((rem >> tail_bits) as u64, rem);
            }
        }
    }

    #[inline(always)]
    fn hi(&self, i: usize) -> u64 {
        let at = i * self.stride();
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().expect("8 bytes"))
    }

    /// Entry `i`'s tail (as stored: the low 16 or 32 bits of its remainder).
    #[inline(always)]
    fn tail(&self, i: usize) -> u32 {
        let at = i * self.stride() + 8;
        if self.tail_bytes == 2 {
            u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]]) as u32
        } else {
            u32::from_le_bytes(self.bytes[at..at + 4].try_into().expect("4 bytes"))
        }
    }

    /// The tail `rem` would have if stored.
    #[inline(always)]
    fn tail_of(&self, rem: u128) -> u32 {
        if self.tail_bytes == 2 {
            rem as u16 as u32
        } else {
            rem as u32
        }
    }

    /// Whether entries `start..end` (one bucket, in no particular order) hold the remainder
    /// whose top bits are `hi` and whose tail is `tail`.
    #[inline]
    fn bucket_holds(&self, start: usize, end: usize, hi: u64, tail: u32) -> bool {
        if self.tail_bytes == 2 {
            scan_bucket::<10>(&self.bytes, start, end, hi, tail)
        } else {
            scan_bucket::<12>(&self.bytes, start, end, hi, tail)
        }
    }

    /// Hint the CPU to fetch entries `start..end` (one or two cache lines).
    #[inline]
    fn prefetch(&self, start: usize, end: usize) {
        if start < end {
            let stride = self.stride();
            prefetch(&self.bytes[start * stride]);
            prefetch(&self.bytes[end * stride - 1]);
        }
    }

    fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
    }

    fn capacity_bytes(&self) -> usize {
        self.bytes.capacity()
    }
}

/// [`Remainders::bucket_holds`] for records of `STRIDE` bytes (10 or 12): a compile-time
/// stride lets the scan run on fixed offsets, with one bounds check for the whole bucket.
/// Every record is compared (a bucket is a cache line or two, already fetched); the top
/// bits differ for all but the match, so the branch is predictable.
#[inline(always)]
fn scan_bucket<const STRIDE: usize>(
    bytes: &[u8],
    start: usize,
    end: usize,
    hi: u64,
    tail: u32,
) -> bool {
    for record in bytes[start * STRIDE..end * STRIDE].chunks_exact(STRIDE) {
        let h = u64::from_le_bytes(record[..8].try_into().expect("8 bytes"));
        if h == hi {
            let t = if STRIDE == 10 {
                u16::from_le_bytes([record[8], record[9]]) as u32
            } else {
                u32::from_le_bytes(record[8..12].try_into().expect("4 bytes"))
            };
            if t == tail {
                return true;
            }
        }
    }
    false
}

/// Where a probe of one local fingerprint looks, computed once per probe so that prefetching
/// it ahead and probing it later do not redo the arithmetic: its bucket, and its remainder
/// split as the table stores it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProbeKey {
    bucket: u32,
    tail: u32,
    hi: u64,
}

type DeltaSet = HashSet<u128, BuildHasherDefault<FingerprintHasher>>;

/// Bits of the bucket number the first grouping pass distributes on: 256 destinations, few
/// enough that each one's next write position stays in cache.
const FIRST_PASS_BITS: u32 = 8;

/// Group fingerprints by bucket (`fp >> rem_bits`, `bucket_bits` wide). Returns the bucket
/// start offsets (`2^b + 1` entries, as counted before deduplication) and the fingerprints in
/// bucket order (order within a bucket unspecified).
///
/// A shard's fingerprints are several MB of uniformly random values, far beyond the L2 cache,
/// so distributing them straight into `2^b` (~100 K) buckets makes nearly every write a cache
/// miss (the in-place American-flag sort used before spent ~2/3 of a checkpoint load there).
/// Two passes keep every write near the previous one to the same destination: first by the
/// top 8 bucket bits into a scratch buffer (256 write streams), then each of those
/// partitions (tens of KB, in cache) by the remaining bits back into the original buffer.
/// Costs one scratch buffer of the shard's size while it builds.
fn group_by_bucket(mut fps: Vec<u128>, rem_bits: u32, bucket_bits: u32) -> (Vec<u32>, Vec<u128>) {
    let buckets = 1usize << bucket_bits;
    let bucket_of = |f: u128| (f >> rem_bits) as usize;
    let mut starts = vec![0u32; buckets + 1];
    for f in &fps {
        starts[bucket_of(*f) + 1] += 1;
    }
    for i in 0..buckets {
        starts[i + 1] += starts[i];
    }
    if fps.len() < 2 {
        return (starts, fps);
    }
    let first_bits = bucket_bits.min(FIRST_PASS_BITS);
    let second_bits = bucket_bits - first_bits;
    // Partition p = buckets [p << second_bits, (p + 1) << second_bits): its range in the
    // final order is already known from `starts`.
    let partitions = 1usize << first_bits;
    let mut next_in_scratch: Vec<usize> = (0..partitions)
        .map(|p| starts[p << second_bits] as usize)
        .collect();
    let mut scratch = vec![0u128; fps.len()];
    for &f in &fps {
        let p = bucket_of(f) >> second_bits;
        scratch[next_in_scratch[p]] = f;
        next_in_scratch[p] += 1;
    }
    let mut next: Vec<u32> = starts[..buckets].to_vec();
    for p in 0..partitions {
        let from = starts[p << second_bits] as usize;
        let to = starts[(p + 1) << second_bits] as usize;
        for &f in &scratch[from..to] {
            let b = bucket_of(f);
            fps[next[b] as usize] = f;
            next[b] += 1;
        }
    }
    (starts, fps)
}

/// The low bits of a fingerprint (at most 96) in 12 bytes: how a bulk load collects
/// fingerprints before building tables, a quarter less memory than a `u128` each. The bits
/// above the stored ones are known from which collection the value is in (see
/// [`ShardTable::build_from_packed`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Packed96([u8; 12]);

/// The allocation of a collection of packed values, emptied, as bytes: a collection the load
/// filled is memory already faulted in, which the table built from it can take over.
/// (Collecting into a type of the same size and alignment reuses the allocation, so no
/// byte is copied or freshly touched.)
fn allocation_as_bytes(mut packed: Vec<Packed96>) -> Vec<u8> {
    packed.clear();
    packed
        .into_iter()
        .map(|v| v.0)
        .collect::<Vec<[u8; 12]>>()
        .into_flattened()
}

impl Packed96 {
    /// Widest value a `Packed96` holds.
    pub(crate) const BITS: u32 = 96;

    /// Pack the low 96 bits of `value` (the caller has masked away the rest).
    #[inline(always)]
    pub(crate) fn new(value: u128) -> Packed96 {
        debug_assert!(value >> Self::BITS == 0, "more than 96 bits");
        let bytes = value.to_le_bytes();
        Packed96(bytes[..12].try_into().expect("12 bytes"))
    }

    #[inline(always)]
    fn get(self) -> u128 {
        let mut bytes = [0u8; 16];
        bytes[..12].copy_from_slice(&self.0);
        u128::from_le_bytes(bytes)
    }
}

/// A shard's fingerprints: bucketed static table plus recent inserts.
pub(crate) struct ShardTable {
    /// `100 - s`: width of a local fingerprint.
    local_bits: u32,
    /// `b`: the directory has `2^b` buckets.
    bucket_bits: u32,
    /// Each bucket's range in `remainders` (`2^b` buckets).
    dir: BucketOffsets,
    remainders: Remainders,
    /// `max(remainder bits - 64, 0)`: the bits of a remainder below its top 64 (16 or fewer
    /// in any shard of 2^18 ids or more).
    tail_bits: u32,
    /// Local fingerprints inserted since the last rebuild, none of them in the table.
    delta: DeltaSet,
}

impl ShardTable {
    /// An empty shard of an index with `2^shard_bits` shards.
    pub(crate) fn empty(shard_bits: u32) -> ShardTable {
        ShardTable::build(Vec::new(), shard_bits, 0).expect("an empty shard always builds")
    }

    fn bucket_bits_for(ids: u64, local_bits: u32) -> u32 {
        let wanted = if ids >= 2 * TARGET_BUCKET_LOAD {
            63 - (ids / TARGET_BUCKET_LOAD).leading_zeros()
        } else {
            0
        };
        wanted
            .max(local_bits.saturating_sub(REMAINDER_BITS_MAX))
            .min(BUCKET_BITS_MAX)
            .min(local_bits)
    }

    /// Build a table from local fingerprints (any order, duplicates allowed). `shard` only
    /// names the shard in errors.
    pub(crate) fn build(fps: Vec<u128>, shard_bits: u32, shard: usize) -> Result<ShardTable> {
        let n = fps.len() as u64;
        if n > MAX_IDS_PER_SHARD {
            return Err(CheckpointError::ShardTooLarge {
                shard,
                ids: n,
                max: MAX_IDS_PER_SHARD,
            });
        }
        let local_bits = FINGERPRINT_BITS - shard_bits;
        let bucket_bits = Self::bucket_bits_for(n, local_bits);
        let rem_bits = local_bits - bucket_bits;
        let rem_mask = (1u128 << rem_bits) - 1;
        let buckets = 1usize << bucket_bits;

        let (dir, fps) = group_by_bucket(fps, rem_bits, bucket_bits);

        // Drop each bucket's duplicates, append each remainder as a record.
        let tail_bits = rem_bits.saturating_sub(64);
        let mut remainders = Remainders::with_capacity(tail_bits, fps.len());
        let mut dir = dir;
        let mut fps = fps;
        let mut start = 0usize;
        for i in 0..buckets {
            let end = dir[i + 1] as usize;
            remainders.append_bucket(&mut fps[start..end], rem_mask, tail_bits);
            start = end;
            dir[i + 1] = remainders.len() as u32;
        }
        drop(fps);
        Ok(ShardTable::from_parts(
            local_bits,
            bucket_bits,
            dir,
            remainders,
            tail_bits,
        ))
    }

    /// Build a table from fingerprints collected in `parts` (any order, duplicates allowed):
    /// part `p` holds the local fingerprints whose top `part_bits` bits are `p`, packed
    /// without those bits (so `100 - shard_bits - part_bits ≤ 96`). The same table as
    /// [`ShardTable::build`] makes of the unpacked fingerprints.
    ///
    /// Made for bulk loads, with the least memory in flight: the parts are distributed by the
    /// top bucket bits into one packed scratch array, then the table is filled one partition
    /// (tens of KB, in cache) at a time into the largest part's allocation, the other parts
    /// freed. The most this holds at once is twice the packed input (12 bytes an id), never
    /// the unpacked fingerprints (16) beside the scratch and the table.
    ///
    /// `scratch` is the caller's to keep between builds (its contents do not matter): a
    /// thread building many shards reuses its pages instead of faulting in fresh zeroed ones
    /// for each shard (a fresh page costs ~0.5 ms a MB on this project's VM; the seed's
    /// 8 M-id load takes ~6,000 fewer page faults, BENCHMARKS.md).
    pub(crate) fn build_from_packed(
        parts: Vec<Vec<Packed96>>,
        part_bits: u32,
        shard_bits: u32,
        shard: usize,
        scratch: &mut Vec<Packed96>,
    ) -> Result<ShardTable> {
        let local_bits = FINGERPRINT_BITS - shard_bits;
        let packed_bits = local_bits - part_bits;
        assert!(packed_bits <= Packed96::BITS, "parts too wide to pack");
        let unpack_part = |p: usize, v: Packed96| ((p as u128) << packed_bits) | v.get();
        let n = parts.iter().map(Vec::len).sum::<usize>() as u64;
        if n > MAX_IDS_PER_SHARD {
            return Err(CheckpointError::ShardTooLarge {
                shard,
                ids: n,
                max: MAX_IDS_PER_SHARD,
            });
        }
        let bucket_bits = Self::bucket_bits_for(n, local_bits);
        let rem_bits = local_bits - bucket_bits;
        // A partition is a range of buckets, numbered by the top `first_bits` bits: the
        // number is implied by position in the scratch array, which stores only the bits
        // below it. Tiny shards, whose few buckets leave more than 96 bits below, are built
        // the plain way.
        let first_bits = bucket_bits.min(FIRST_PASS_BITS);
        if local_bits - first_bits > Packed96::BITS {
            let fps = parts
                .into_iter()
                .enumerate()
                .flat_map(|(p, part)| part.into_iter().map(move |v| unpack_part(p, v)))
                .collect();
            return ShardTable::build(fps, shard_bits, shard);
        }
        let below_first = local_bits - first_bits;
        let partition_of = |local: u128| (local >> below_first) as usize;

        // Distribute by partition into the scratch array.
        let partitions = 1usize << first_bits;
        let mut partition_start = vec![0usize; partitions + 1];
        for (p, part) in parts.iter().enumerate() {
            for v in part {
                partition_start[partition_of(unpack_part(p, *v)) + 1] += 1;
            }
        }
        for q in 0..partitions {
            partition_start[q + 1] += partition_start[q];
        }
        let mut next = partition_start[..partitions].to_vec();
        let below_mask = (1u128 << below_first) - 1;
        scratch.clear();
        if scratch.capacity() < n as usize {
            *scratch = Vec::with_capacity(n as usize);
            advise_huge_pages(scratch);
        }
        scratch.resize(n as usize, Packed96::default());
        for (p, part) in parts.iter().enumerate() {
            for &v in part {
                let local = unpack_part(p, v);
                let q = partition_of(local);
                scratch[next[q]] = Packed96::new(local & below_mask);
                next[q] += 1;
            }
        }
        // The records go into the largest part's memory (12 bytes an entry, a record takes
        // 10 or 12): fresh pages cost ~0.5 ms a MB here, and this memory is already
        // faulted in. The other parts are freed.
        let mut parts = parts;
        let largest = (0..parts.len()).max_by_key(|&p| parts[p].capacity());
        let reused = largest.map_or_else(Vec::new, |p| std::mem::take(&mut parts[p]));
        drop(parts);

        // Each partition: unpack, group by bucket, drop duplicates, append its records.
        let second_bits = bucket_bits - first_bits;
        let buckets_per_partition = 1usize << second_bits;
        let rem_mask = (1u128 << rem_bits) - 1;
        let tail_bits = rem_bits.saturating_sub(64);
        let mut remainders =
            Remainders::in_buffer(tail_bits, n as usize, allocation_as_bytes(reused));
        let mut dir = vec![0u32; (1usize << bucket_bits) + 1];
        advise_huge_pages(&dir);
        let mut locals: Vec<u128> = Vec::new();
        let mut grouped: Vec<u128> = Vec::new();
        let mut bucket_start = vec![0usize; buckets_per_partition + 1];
        let mut fill = Vec::with_capacity(buckets_per_partition);
        for q in 0..partitions {
            let range = partition_start[q]..partition_start[q + 1];
            locals.clear();
            locals.extend(
                scratch[range]
                    .iter()
                    .map(|v| ((q as u128) << below_first) | v.get()),
            );
            let bucket_in_partition =
                |local: u128| (local >> rem_bits) as usize & (buckets_per_partition - 1);
            bucket_start.fill(0);
            for &local in &locals {
                bucket_start[bucket_in_partition(local) + 1] += 1;
            }
            for b in 0..buckets_per_partition {
                bucket_start[b + 1] += bucket_start[b];
            }
            grouped.clear();
            grouped.resize(locals.len(), 0);
            fill.clear();
            fill.extend_from_slice(&bucket_start[..buckets_per_partition]);
            for &local in &locals {
                let b = bucket_in_partition(local);
                grouped[fill[b]] = local;
                fill[b] += 1;
            }
            for b in 0..buckets_per_partition {
                let bucket = &mut grouped[bucket_start[b]..bucket_start[b + 1]];
                remainders.append_bucket(bucket, rem_mask, tail_bits);
                dir[(q << second_bits) + b + 1] = remainders.len() as u32;
            }
        }
        Ok(ShardTable::from_parts(
            local_bits,
            bucket_bits,
            dir,
            remainders,
            tail_bits,
        ))
    }

    /// A table of a finished directory and remainders (trimmed to size), no delta.
    fn from_parts(
        local_bits: u32,
        bucket_bits: u32,
        dir: Vec<u32>,
        mut remainders: Remainders,
        tail_bits: u32,
    ) -> ShardTable {
        remainders.shrink_to_fit();
        ShardTable {
            local_bits,
            bucket_bits,
            dir: BucketOffsets::from_offsets(dir),
            remainders,
            tail_bits,
            delta: DeltaSet::default(),
        }
    }

    /// Where a probe of `local` looks.
    #[inline]
    pub(crate) fn probe_key(&self, local: u128) -> ProbeKey {
        let rem_bits = self.local_bits - self.bucket_bits;
        let rem = local & ((1u128 << rem_bits) - 1);
        ProbeKey {
            bucket: (local >> rem_bits) as u32,
            tail: self.remainders.tail_of(rem),
            hi: (rem >> self.tail_bits) as u64,
        }
    }

    /// Bucket `bucket`'s records; `COMPACT`: the caller checked
    /// [`has_compact_offsets`](Self::has_compact_offsets).
    #[inline(always)]
    fn range<const COMPACT: bool>(&self, bucket: usize) -> (usize, usize) {
        if COMPACT {
            self.dir.compact_range(bucket)
        } else {
            self.dir.range(bucket)
        }
    }

    #[inline]
    fn in_table<const COMPACT: bool>(&self, key: ProbeKey) -> bool {
        let (start, end) = self.range::<COMPACT>(key.bucket as usize);
        self.remainders.bucket_holds(start, end, key.hi, key.tail)
    }

    /// Whether the bucket ranges are in cache-sized blocks (see the `bucket_offsets`
    /// module): then this table may be probed with `COMPACT = true`, which skips a check on
    /// every lookup. True for every table but one built from ids made to share buckets.
    pub(crate) fn has_compact_offsets(&self) -> bool {
        self.dir.is_compact()
    }

    /// Hint the CPU to fetch the bucket range a probe of `key` will read first.
    #[inline]
    pub(crate) fn prefetch_directory<const COMPACT: bool>(&self, key: ProbeKey) {
        if COMPACT {
            self.dir.compact_prefetch(key.bucket as usize);
        } else {
            self.dir.prefetch(key.bucket as usize);
        }
    }

    /// Hint the CPU to fetch the remainders a probe of `key` will scan. Reads the bucket's
    /// range, so call it after [`ShardTable::prefetch_directory`] had time to land.
    #[inline]
    pub(crate) fn prefetch_bucket<const COMPACT: bool>(&self, key: ProbeKey) {
        let (start, end) = self.range::<COMPACT>(key.bucket as usize);
        self.remainders.prefetch(start, end);
    }

    /// Whether the shard holds the local fingerprint whose probe key is `key`; `local` gives
    /// that fingerprint, needed only when ids were inserted since the last build.
    #[inline]
    pub(crate) fn contains_key<const COMPACT: bool>(
        &self,
        key: ProbeKey,
        local: impl FnOnce() -> u128,
    ) -> bool {
        self.in_table::<COMPACT>(key) || (!self.delta.is_empty() && self.delta.contains(&local()))
    }

    /// Whether the shard holds this local fingerprint.
    #[cfg(test)]
    pub(crate) fn contains(&self, local: u128) -> bool {
        self.contains_key::<false>(self.probe_key(local), || local)
    }

    /// Add a local fingerprint; true if it was new. May rebuild the table.
    pub(crate) fn insert(&mut self, local: u128, shard: usize) -> Result<bool> {
        if self.in_table::<false>(self.probe_key(local)) || !self.delta.insert(local) {
            return Ok(false);
        }
        if self.delta.len() >= DELTA_MIN_REBUILD.max(self.remainders.len() / 4) {
            self.rebuild(shard)?;
        }
        Ok(true)
    }

    /// Fold the delta set into a new table.
    fn rebuild(&mut self, shard: usize) -> Result<()> {
        let shard_bits = FINGERPRINT_BITS - self.local_bits;
        let mut all = Vec::with_capacity(self.len());
        all.extend(self.table_fingerprints());
        all.extend(self.delta.drain());
        *self = ShardTable::build(all, shard_bits, shard)?;
        Ok(())
    }

    /// Every local fingerprint of the static table (not the delta), rebuilt from position.
    fn table_fingerprints(&self) -> impl Iterator<Item = u128> + '_ {
        let rem_bits = self.local_bits - self.bucket_bits;
        (0..self.dir.buckets()).flat_map(move |bucket| {
            let (start, end) = self.dir.range(bucket);
            (start..end).map(move |i| {
                ((bucket as u128) << rem_bits)
                    | ((self.remainders.hi(i) as u128) << self.tail_bits)
                    | self.remainders.tail(i) as u128
            })
        })
    }

    /// Every local fingerprint held (table and delta).
    pub(crate) fn fingerprints(&self) -> impl Iterator<Item = u128> + '_ {
        self.table_fingerprints().chain(self.delta.iter().copied())
    }

    /// Distinct ids held.
    pub(crate) fn len(&self) -> usize {
        self.remainders.len() + self.delta.len()
    }

    /// Heap bytes held (capacity, not length: what the allocator gave us).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.dir.memory_bytes()
            + self.remainders.capacity_bytes()
            // hashbrown: one 16-byte slot and one control byte per bucket.
            + self.delta.capacity() * 17
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(seed: &mut u64) -> u128 {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        ((next() as u128) << 64 | next() as u128) & ((1u128 << 96) - 1)
    }

    #[test]
    fn build_insert_rebuild_keep_every_fingerprint() {
        let mut seed = 42;
        let shard_bits = 4;
        let ids: Vec<u128> = (0..200_000).map(|_| random(&mut seed)).collect();
        let mut table = ShardTable::build(ids[..1000].to_vec(), shard_bits, 0).unwrap();
        for id in &ids[..1000] {
            assert!(table.contains(*id));
        }
        for id in &ids[1000..] {
            assert!(!table.contains(*id));
            assert!(table.insert(*id, 0).unwrap());
            assert!(!table.insert(*id, 0).unwrap());
        }
        assert_eq!(table.len(), ids.len());
        assert!(ids.iter().all(|id| table.contains(*id)));
        let mut back: Vec<u128> = table.fingerprints().collect();
        back.sort_unstable();
        let mut want = ids.clone();
        want.sort_unstable();
        assert_eq!(back, want);
        // Rebuilt with a bigger directory after growing 200x.
        assert!(table.bucket_bits >= 15, "bucket bits {}", table.bucket_bits);
    }

    #[test]
    fn big_shards_use_narrow_tails_losslessly() {
        let mut seed = 7;
        let ids: Vec<u128> = (0..600_000).map(|_| random(&mut seed)).collect();
        let table = ShardTable::build(ids.clone(), 4, 0).unwrap();
        assert_eq!(
            table.remainders.tail_bytes, 2,
            "tail bits {}",
            table.tail_bits
        );
        assert!(ids.iter().all(|id| table.contains(*id)));
        let mut absent_hits = 0;
        for _ in 0..100_000 {
            absent_hits += table.contains(random(&mut seed)) as usize;
        }
        assert_eq!(absent_hits, 0);
        let mut back: Vec<u128> = table.fingerprints().collect();
        back.sort_unstable();
        let mut want = ids;
        want.sort_unstable();
        assert_eq!(back, want);
        assert!(
            table.memory_bytes() < 600_000 * 11,
            "{}",
            table.memory_bytes()
        );
    }

    #[test]
    fn grouping_handles_heavy_duplicates_and_every_bucket_width() {
        let mut seed = 11;
        for (n, shard_bits) in [(0usize, 0u32), (1, 3), (9, 0), (5000, 2), (300_000, 4)] {
            let mut ids: Vec<u128> = (0..n).map(|_| random(&mut seed) >> shard_bits).collect();
            // Every other id twice (duplicates inside buckets of the usual handful), and one
            // id repeated far beyond it.
            let again: Vec<u128> = ids.iter().step_by(2).copied().collect();
            ids.extend(again);
            ids.extend(std::iter::repeat_n(ids.first().copied().unwrap_or(5), 1000));
            let table = ShardTable::build(ids.clone(), shard_bits, 0).unwrap();
            let distinct: HashSet<u128> = ids.iter().copied().collect();
            assert_eq!(table.len(), distinct.len());
            let mut back: Vec<u128> = table.fingerprints().collect();
            let mut expected: Vec<u128> = distinct.into_iter().collect();
            back.sort_unstable();
            expected.sort_unstable();
            assert_eq!(back, expected, "n={n}");
            assert!(ids.iter().all(|f| table.contains(*f)));
        }
    }

    #[test]
    fn a_packed_collection_gives_its_allocation_to_the_table_bytes() {
        let mut packed = vec![Packed96::new(7); 1000];
        packed.reserve_exact(24);
        let (at, capacity) = (packed.as_ptr() as usize, packed.capacity());
        let bytes = allocation_as_bytes(packed);
        assert!(bytes.is_empty());
        assert_eq!(
            (bytes.as_ptr() as usize, bytes.capacity()),
            (at, capacity * 12)
        );
        // A buffer large enough is used as it is; a smaller one is replaced.
        let remainders = Remainders::in_buffer(16, 1200, bytes);
        assert_eq!(remainders.bytes.as_ptr() as usize, at);
        assert!(remainders.bytes.capacity() >= 1200 * 10);
        let small = Remainders::in_buffer(16, 1300, remainders.bytes);
        assert!(small.bytes.capacity() >= 1300 * 10);
    }

    #[test]
    fn a_build_from_packed_parts_makes_the_same_table_as_a_plain_build() {
        let mut seed = 23;
        let mut scratch = Vec::new();
        for (n, shard_bits) in [
            (0usize, 0u32),
            (3, 0),
            (40, 2),
            (5000, 0),
            (70_000, 1),
            (300_000, 4),
            (200_000, 6),
        ] {
            let local_bits = FINGERPRINT_BITS - shard_bits;
            // Full-width local fingerprints (up to 100 bits), one repeated many times.
            let mut ids: Vec<u128> = (0..n)
                .map(|_| {
                    ((random(&mut seed) << 8) ^ random(&mut seed)) & ((1u128 << local_bits) - 1)
                })
                .collect();
            ids.extend(std::iter::repeat_n(ids.first().copied().unwrap_or(5), 500));
            let part_bits = local_bits.saturating_sub(Packed96::BITS);
            let packed_bits = local_bits - part_bits;
            let mut parts = vec![Vec::new(); 1 << part_bits];
            for &id in &ids {
                parts[(id >> packed_bits) as usize]
                    .push(Packed96::new(id & ((1u128 << packed_bits) - 1)));
            }
            // Built twice, with a scratch buffer left dirty by the previous round's builds
            // (larger or smaller than this one needs): the same table each time.
            let packed = ShardTable::build_from_packed(
                parts.clone(),
                part_bits,
                shard_bits,
                0,
                &mut scratch,
            )
            .unwrap();
            let again =
                ShardTable::build_from_packed(parts, part_bits, shard_bits, 0, &mut scratch)
                    .unwrap();
            assert_eq!(again.dir, packed.dir);
            assert!(again.remainders.bytes == packed.remainders.bytes);
            let plain = ShardTable::build(ids.clone(), shard_bits, 0).unwrap();
            let what = format!("n={n} shard_bits={shard_bits}");
            assert_eq!(packed.bucket_bits, plain.bucket_bits, "{what}");
            assert_eq!(packed.tail_bits, plain.tail_bits, "{what}");
            assert_eq!(packed.dir, plain.dir, "{what}");
            assert!(packed.remainders.bytes == plain.remainders.bytes, "{what}");
            assert!(ids.iter().all(|id| packed.contains(*id)), "{what}");
        }
    }

    #[test]
    fn duplicates_are_stored_once() {
        let table = ShardTable::build(vec![7, 7, 7, 9, 9], 0, 0).unwrap();
        assert_eq!(table.len(), 2);
        assert!(table.contains(7) && table.contains(9) && !table.contains(8));
    }
}
