//! Helpers shared by forebay-spill's integration tests.

use bytes::Bytes;

/// `len` deterministic pseudo-random bytes (xorshift from `seed`): payloads whose every byte
/// matters, so a misplaced or flipped byte shows.
pub fn pattern(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}
