//! Object ids and the layout of one object's region in the arena.
//!
//! ```text
//! region (64-aligned):  | header 64 B | meta (meta_len) | pad to 64 | data (data_len) | pad |
//! header:               magic "FBOBJ\0\0\x01" | id u128 | format u8 | 7 B zero |
//!                       meta_len u64 | data_len u64 | 16 B zero          (little endian)
//! ```
//!
//! The header makes a region self-describing: an attached process finds an object's format,
//! metadata and data from the region alone, and checks the id so that a stale offset can never
//! be read as another object. A spilled object is its whole region, written and restored
//! as is.

use std::fmt;
use std::str::FromStr;

use crate::arena::align_up;

/// Length of the object header.
pub const HEADER_LEN: usize = 64;
const MAGIC: [u8; 8] = *b"FBOBJ\0\0\x01";

/// Identifier of an object: unique within a store and across stores (the high 64 bits are a
/// random nonce of the store). Shown as 32 hex digits. Ids are never used as file names.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u128);

impl ObjectId {
    /// The nonce of the store that issued the id.
    pub fn store_nonce(self) -> u64 {
        (self.0 >> 64) as u64
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({self})")
    }
}

impl FromStr for ObjectId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() != 32 {
            return Err(format!("an object id is 32 hex digits, got {s:?}"));
        }
        u128::from_str_radix(s, 16)
            .map(ObjectId)
            .map_err(|_| format!("an object id is 32 hex digits, got {s:?}"))
    }
}

/// How an object's data is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Format {
    /// Opaque bytes (the meta bytes say what they are, e.g. a numpy dtype and shape).
    Bytes = 0,
    /// An Arrow IPC stream (schema, dictionaries, record batches, end-of-stream marker) whose
    /// buffers are read in place.
    ArrowIpc = 1,
}

impl Format {
    fn from_u8(v: u8) -> Option<Format> {
        match v {
            0 => Some(Format::Bytes),
            1 => Some(Format::ArrowIpc),
            _ => None,
        }
    }
}

/// The fixed header of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectHeader {
    pub id: ObjectId,
    pub format: Format,
    pub meta_len: usize,
    pub data_len: usize,
}

impl ObjectHeader {
    /// Offset of the metadata within the region.
    pub const fn meta_offset(&self) -> usize {
        HEADER_LEN
    }

    /// Offset of the data within the region (64-aligned).
    pub fn data_offset(&self) -> usize {
        align_up(HEADER_LEN + self.meta_len)
    }

    /// Bytes of the region, before rounding to the allocation unit.
    pub fn region_len(&self) -> usize {
        self.data_offset() + self.data_len
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..24].copy_from_slice(&self.id.0.to_le_bytes());
        h[24] = self.format as u8;
        h[32..40].copy_from_slice(&(self.meta_len as u64).to_le_bytes());
        h[40..48].copy_from_slice(&(self.data_len as u64).to_le_bytes());
        h
    }

    /// Parse a header; `Err` says what is wrong (the caller names the store and object).
    pub fn decode(bytes: &[u8]) -> Result<ObjectHeader, String> {
        if bytes.len() < HEADER_LEN {
            return Err(format!("object header truncated ({} bytes)", bytes.len()));
        }
        if bytes[0..8] != MAGIC {
            return Err("not an object header (bad magic)".into());
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        let id = ObjectId(u128::from_le_bytes(bytes[8..24].try_into().unwrap()));
        let format = Format::from_u8(bytes[24])
            .ok_or_else(|| format!("unknown object format {}", bytes[24]))?;
        let meta_len = usize::try_from(u64_at(32)).map_err(|_| "meta length overflows")?;
        let data_len = usize::try_from(u64_at(40)).map_err(|_| "data length overflows")?;
        Ok(ObjectHeader {
            id,
            format,
            meta_len,
            data_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects_garbage() {
        let h = ObjectHeader {
            id: ObjectId(0x0123_4567_89ab_cdef_fedc_ba98_7654_3210),
            format: Format::ArrowIpc,
            meta_len: 5,
            data_len: 1 << 33,
        };
        let bytes = h.encode();
        assert_eq!(ObjectHeader::decode(&bytes).unwrap(), h);
        assert_eq!(h.data_offset(), 128);
        let mut bad = bytes;
        bad[0] ^= 1;
        assert!(ObjectHeader::decode(&bad).is_err());
        let mut bad = bytes;
        bad[24] = 9;
        assert!(ObjectHeader::decode(&bad).is_err());
        assert!(ObjectHeader::decode(&bytes[..10]).is_err());
        let id: ObjectId = h.id.to_string().parse().unwrap();
        assert_eq!(id, h.id);
        assert!("xyz".parse::<ObjectId>().is_err());
    }
}
