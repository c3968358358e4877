//! Id fingerprints: the fixed hash that is part of the checkpoint's on-disk layout.
//!
//! # Definition (stable: changing any of this changes which shard a file's ids belong to)
//!
//! 1. **Canonical bytes of an id.** String and binary ids (utf8, large_utf8, utf8_view,
//!    binary, large_binary, binary_view, fixed_size_binary) are their bytes as stored, so the
//!    string `"abc"` and the binary `b"abc"` are the same id. Integer ids (int8..int64,
//!    uint8..uint64) are the 16-byte little-endian two's-complement encoding of the value as a
//!    128-bit integer, so `5_i32`, `5_i64` and `5_u64` are the same id, and `-1_i64` differs
//!    from `u64::MAX`. A dictionary-encoded id is the id of its value. Strings and integers are
//!    two separate id families: an index holds one family and refuses the other.
//! 2. **Hash.** `h = XXH3_128(canonical bytes, seed 0)` as specified by xxHash ≥ 0.8.0 (the
//!    algorithm is frozen), read as one unsigned 128-bit number (`high64 << 64 | low64`).
//! 3. **Fingerprint.** The top [`FINGERPRINT_BITS`] = 100 bits: `f = h >> 28`.
//! 4. **Shard.** With `num_shards = 2^s` (a power of two), `shard = f >> (100 - s)`: the top
//!    `s` bits. (`num_shards = 1` means every id is in shard 0.)
//!
//! # False positives
//!
//! An index remembers fingerprints, not ids: it never misses an id it was given (no false
//! negatives), and an id it was not given is reported as present only if its 100-bit
//! fingerprint equals one of the `n` stored ones. Modelling XXH3 as a random function, that
//! probability per lookup is at most `n / 2^100`: 7.9e-21 (2^-66.8) at n = 10^10 ids, below
//! the 2^-64 budget; 6.3e-24 at 8 M ids. XXH3 is not a cryptographic hash: ids chosen by an
//! adversary to collide are not covered by this bound.
//!
//! Null ids are not ids: they are never stored and never reported as present (see the crate
//! docs for the rule).

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::Array;
use arrow_schema::DataType;
use xxhash_rust::xxh3::xxh3_128;

/// Number of hash bits an index keeps per id.
pub const FINGERPRINT_BITS: u32 = 100;

/// The two id families. Ids of different families never compare equal, and an index holds
/// one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdFamily {
    /// utf8 / binary ids of every width and layout, hashed by their bytes.
    Bytes,
    /// Integer ids of every width and signedness, hashed by their value.
    Integer,
}

impl IdFamily {
    /// The family of an Arrow type, looking through dictionaries; `None` if the type cannot
    /// hold ids.
    pub fn of(data_type: &DataType) -> Option<IdFamily> {
        match data_type {
            DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_) => Some(IdFamily::Bytes),
            DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64 => Some(IdFamily::Integer),
            DataType::Dictionary(_, value) => IdFamily::of(value),
            _ => None,
        }
    }

    /// The name used in the manifest and in messages.
    pub fn name(self) -> &'static str {
        match self {
            IdFamily::Bytes => "string/binary",
            IdFamily::Integer => "integer",
        }
    }

    /// Inverse of [`IdFamily::name`].
    pub fn from_name(name: &str) -> Option<IdFamily> {
        match name {
            "string/binary" => Some(IdFamily::Bytes),
            "integer" => Some(IdFamily::Integer),
            _ => None,
        }
    }
}

/// Fingerprint of a string or binary id.
#[inline]
pub fn fingerprint_bytes(id: &[u8]) -> u128 {
    xxh3_128(id) >> (128 - FINGERPRINT_BITS)
}

/// Fingerprint of an integer id (any width or signedness, widened to i128).
#[inline]
pub fn fingerprint_int(id: i128) -> u128 {
    fingerprint_bytes(&id.to_le_bytes())
}

/// Shard of a fingerprint in an index of `2^shard_bits` shards.
#[inline]
pub fn shard_of(fingerprint: u128, shard_bits: u32) -> usize {
    if shard_bits == 0 {
        0
    } else {
        (fingerprint >> (FINGERPRINT_BITS - shard_bits)) as usize
    }
}

/// Write the fingerprint of every row of `ids` into `out` (resized to `ids.len()`). Null rows
/// get an unspecified value: callers consult `ids.logical_nulls()`. Returns `None` if the type
/// cannot hold ids.
pub fn fingerprints_into(ids: &dyn Array, out: &mut Vec<u128>) -> Option<()> {
    out.clear();
    out.reserve(ids.len());
    extend_with_fingerprints(ids, out)
}

/// Like [`fingerprints_into`], writing into a slice of exactly `ids.len()` entries (so
/// threads can fill disjoint parts of one buffer).
pub fn fingerprints_into_slice(ids: &dyn Array, out: &mut [u128]) -> Option<()> {
    assert_eq!(ids.len(), out.len(), "one fingerprint slot per id");
    extend_with_fingerprints(
        ids,
        &mut SliceFiller {
            slice: out,
            next: 0,
        },
    )
}

/// Fills a slice front to back through `Extend`.
struct SliceFiller<'a> {
    slice: &'a mut [u128],
    next: usize,
}

impl Extend<u128> for SliceFiller<'_> {
    fn extend<I: IntoIterator<Item = u128>>(&mut self, iter: I) {
        for (slot, fp) in self.slice[self.next..].iter_mut().zip(iter) {
            *slot = fp;
            self.next += 1;
        }
    }
}

fn extend_with_fingerprints(ids: &dyn Array, out: &mut impl Extend<u128>) -> Option<()> {
    macro_rules! bytes_by_offsets {
        ($arr:expr) => {{
            let arr = $arr;
            let data = arr.value_data();
            let offsets = arr.value_offsets();
            out.extend(
                offsets
                    .windows(2)
                    .map(|w| fingerprint_bytes(&data[w[0] as usize..w[1] as usize])),
            );
        }};
    }
    macro_rules! ints {
        ($t:ty) => {
            out.extend(
                ids.as_primitive::<$t>()
                    .values()
                    .iter()
                    .map(|v| fingerprint_int(*v as i128)),
            )
        };
    }
    match ids.data_type() {
        DataType::Utf8 => bytes_by_offsets!(ids.as_string::<i32>()),
        DataType::LargeUtf8 => bytes_by_offsets!(ids.as_string::<i64>()),
        DataType::Binary => bytes_by_offsets!(ids.as_binary::<i32>()),
        DataType::LargeBinary => bytes_by_offsets!(ids.as_binary::<i64>()),
        DataType::Utf8View => {
            let arr = ids.as_string_view();
            out.extend((0..arr.len()).map(|i| fingerprint_bytes(arr.value(i).as_bytes())));
        }
        DataType::BinaryView => {
            let arr = ids.as_binary_view();
            out.extend((0..arr.len()).map(|i| fingerprint_bytes(arr.value(i))));
        }
        DataType::FixedSizeBinary(_) => {
            let arr = ids.as_fixed_size_binary();
            out.extend((0..arr.len()).map(|i| fingerprint_bytes(arr.value(i))));
        }
        DataType::Int8 => ints!(Int8Type),
        DataType::Int16 => ints!(Int16Type),
        DataType::Int32 => ints!(Int32Type),
        DataType::Int64 => ints!(Int64Type),
        DataType::UInt8 => ints!(UInt8Type),
        DataType::UInt16 => ints!(UInt16Type),
        DataType::UInt32 => ints!(UInt32Type),
        DataType::UInt64 => ints!(UInt64Type),
        DataType::Dictionary(_, _) => {
            // Hash each distinct value once, then gather by key.
            let dict = ids.as_any_dictionary();
            if dict.values().is_empty() {
                // No values: every key is null (or there are no rows). `normalized_keys`
                // would panic on an empty dictionary.
                out.extend(std::iter::repeat_n(0, ids.len()));
                return Some(());
            }
            let mut values = Vec::new();
            fingerprints_into(dict.values().as_ref(), &mut values)?;
            let keys = dict.normalized_keys();
            let key_nulls = dict.keys().nulls().cloned();
            out.extend(keys.iter().enumerate().map(|(row, &k)| {
                match values.get(k) {
                    Some(fp) => *fp,
                    // Only a null key may point outside the dictionary; its value is unused.
                    None => {
                        debug_assert!(key_nulls.as_ref().is_some_and(|n| n.is_null(row)));
                        0
                    }
                }
            }));
        }
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::types::Int8Type as K;
    use arrow_array::{
        BinaryArray, DictionaryArray, FixedSizeBinaryArray, Int32Array, Int64Array,
        LargeStringArray, StringArray, StringViewArray, UInt64Array,
    };
    use std::sync::Arc;

    /// Golden values pin the on-disk layout: if these change, existing checkpoints are read
    /// into the wrong shards. (Values of XXH3_128 with seed 0, shifted right by 28.)
    #[test]
    fn golden_fingerprints_never_change() {
        assert_eq!(xxh3_128(b""), 0x99aa06d3014798d86001c324468d497f);
        assert_eq!(
            fingerprint_bytes(b""),
            0x99aa06d3014798d86001c324468d497f >> 28
        );
        assert_eq!(shard_of(fingerprint_bytes(b""), 4), 0x9);
        assert_eq!(shard_of(fingerprint_bytes(b"anything"), 0), 0);
    }

    #[test]
    fn all_null_dictionary_has_no_values_and_does_not_panic() {
        let all_null: DictionaryArray<K> = vec![None::<&str>, None].into_iter().collect();
        assert_eq!(all_null.values().len(), 0);
        let mut out = Vec::new();
        fingerprints_into(&all_null, &mut out).unwrap();
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn same_id_same_fingerprint_across_types() {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let strings = StringArray::from(vec!["x", "", "héllo"]);
        for other in [
            Arc::new(LargeStringArray::from(vec!["x", "", "héllo"])) as Arc<dyn Array>,
            Arc::new(StringViewArray::from(vec!["x", "", "héllo"])),
            Arc::new(BinaryArray::from(vec![&b"x"[..], b"", "héllo".as_bytes()])),
            Arc::new(
                vec!["héllo", "x", ""]
                    .into_iter()
                    .collect::<DictionaryArray<K>>()
                    .slice(0, 3),
            ),
        ] {
            fingerprints_into(&strings, &mut a).unwrap();
            fingerprints_into(other.as_ref(), &mut b).unwrap();
            if matches!(other.data_type(), DataType::Dictionary(_, _)) {
                assert_eq!(a[0], b[1]);
                assert_eq!(a[1], b[2]);
                assert_eq!(a[2], b[0]);
            } else {
                assert_eq!(a, b, "{}", other.data_type());
            }
        }
        fingerprints_into(&Int32Array::from(vec![5, -1]), &mut a).unwrap();
        fingerprints_into(&Int64Array::from(vec![5, -1]), &mut b).unwrap();
        assert_eq!(a, b);
        fingerprints_into(&UInt64Array::from(vec![5, u64::MAX]), &mut b).unwrap();
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1], "-1 and u64::MAX are different ids");
        let fsb = FixedSizeBinaryArray::try_from_iter(vec![b"ab", b"cd"].into_iter()).unwrap();
        fingerprints_into(&fsb, &mut a).unwrap();
        assert_eq!(a[1], fingerprint_bytes(b"cd"));
    }
}
