//! The on-disk format of a spilled object (version 1). All integers little-endian.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "FBSPILL\0"
//!      8     2  format version (1)
//!     10     2  flags (0)
//!     12     4  buffer count n
//!     16     8  payload length (sum of the n buffer lengths)
//!     24     8  payload checksum: XXH3-64 of the length table followed by every buffer
//!     32     8  object id (the caller's tag)
//!     40    20  reserved (zero)
//!     60     4  header checksum: low 32 bits of XXH3-64 of bytes 0..60
//!     64  8n    length table: one u64 per buffer
//!      …        zero padding to a multiple of 64
//!      …        buffer 0, zero padding to a multiple of 64, buffer 1, padding, …
//! ```
//!
//! A large object's head (header and length table) is written after its payload, once the
//! checksum is known (see `round_file`); a file cut short by a crash in between has zeros
//! there and fails verification.
//!
//! Objects start at multiples of 64 in their file and every buffer starts 64-byte aligned,
//! so a read-only mapping of an object hands out buffers Arrow can use in place. Padding is
//! written from a static zero block: no byte of the payload is copied to build a file.

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// Magic bytes at the start of every object.
pub const MAGIC: [u8; 8] = *b"FBSPILL\0";
/// Current format version.
pub const VERSION: u16 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 64;
/// Alignment of objects and buffers in a spill file.
pub const ALIGN: u64 = 64;
/// A block of zeros to write as padding.
pub static ZEROS: [u8; ALIGN as usize] = [0; ALIGN as usize];

/// Round `n` up to the alignment.
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Bytes of zero padding after `n` bytes.
pub fn padding(n: u64) -> usize {
    (align_up(n) - n) as usize
}

/// Total bytes an object of these buffer lengths occupies in a file (header to last pad).
pub fn object_len(buffer_lens: &[u64]) -> u64 {
    let table = HEADER_LEN as u64 + 8 * buffer_lens.len() as u64;
    align_up(table) + buffer_lens.iter().map(|l| align_up(*l)).sum::<u64>()
}

/// Bytes before an object's first buffer: the header and the length table, padded to 64.
pub fn head_len(buffer_count: usize) -> u64 {
    align_up(HEADER_LEN as u64 + 8 * buffer_count as u64)
}

/// The length table as bytes.
pub fn length_table(buffer_lens: &[u64]) -> Vec<u8> {
    buffer_lens.iter().flat_map(|l| l.to_le_bytes()).collect()
}

/// Streaming payload checksum: the length table, then each buffer.
pub fn payload_checksum<'a>(table: &[u8], buffers: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut hasher = Xxh3::new();
    hasher.update(table);
    for b in buffers {
        hasher.update(b);
    }
    hasher.digest()
}

/// A decoded fixed header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub buffer_count: u32,
    pub payload_len: u64,
    pub checksum: u64,
    pub object_id: u64,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.buffer_count.to_le_bytes());
        h[16..24].copy_from_slice(&self.payload_len.to_le_bytes());
        h[24..32].copy_from_slice(&self.checksum.to_le_bytes());
        h[32..40].copy_from_slice(&self.object_id.to_le_bytes());
        let crc = xxh3_64(&h[..60]) as u32;
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decode and validate magic, version and header checksum.
    pub fn decode(h: &[u8; HEADER_LEN]) -> Result<Header, String> {
        if h[0..8] != MAGIC {
            return Err("bad magic (not a forebay spill object)".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(60) != xxh3_64(&h[..60]) as u32 {
            return Err("header checksum mismatch".into());
        }
        if u16_at(8) != VERSION {
            return Err(format!("format version {} is not supported", u16_at(8)));
        }
        Ok(Header {
            buffer_count: u32_at(12),
            payload_len: u64_at(16),
            checksum: u64_at(24),
            object_id: u64_at(32),
        })
    }
}

/// Check an object's head (header, length table, padding; `head_len` bytes read back from
/// storage) against what its location says. Returns the decoded header, whose checksum the
/// caller then compares with the payload's.
pub fn check_head(head: &[u8], buffer_lens: &[u64], object_id: u64) -> Result<Header, String> {
    if head.len() as u64 != head_len(buffer_lens.len()) {
        return Err(format!(
            "object head is {} bytes, expected {}",
            head.len(),
            head_len(buffer_lens.len())
        ));
    }
    let header = Header::decode(head[..HEADER_LEN].try_into().expect("64 bytes"))?;
    let table_end = HEADER_LEN + 8 * buffer_lens.len();
    if head[table_end..].iter().any(|b| *b != 0) {
        return Err("non-zero padding after the length table".into());
    }
    if header.buffer_count as usize != buffer_lens.len()
        || head[HEADER_LEN..table_end] != *length_table(buffer_lens)
        || header.payload_len != buffer_lens.iter().sum::<u64>()
        || header.object_id != object_id
    {
        return Err("header disagrees with the object's location".into());
    }
    Ok(header)
}

/// Check a restored payload: the padding between buffers read back as zeros and the
/// buffers hash to the checksum its header carries.
pub fn check_payload<'a>(
    buffer_lens: &[u64],
    checksum: u64,
    padding_clean: bool,
    buffers: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), String> {
    if !padding_clean {
        return Err("non-zero padding between buffers".into());
    }
    if payload_checksum(&length_table(buffer_lens), buffers) != checksum {
        return Err("payload checksum mismatch".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_damage() {
        let h = Header {
            buffer_count: 3,
            payload_len: 1234,
            checksum: 0xdead_beef,
            object_id: 42,
        };
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes).unwrap(), h);
        for i in 0..HEADER_LEN {
            let mut bad = bytes;
            bad[i] ^= 0x10;
            assert!(Header::decode(&bad).is_err(), "flip at byte {i} undetected");
        }
    }

    #[test]
    fn layout_is_aligned() {
        assert_eq!(object_len(&[]), 64);
        assert_eq!(object_len(&[1]), 128 + 64);
        assert_eq!(object_len(&[64, 65]), 128 + 64 + 128);
        assert_eq!(padding(64), 0);
        assert_eq!(padding(65), 63);
    }
}
