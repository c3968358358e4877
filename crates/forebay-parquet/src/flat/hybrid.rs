//! Dictionary indices stored as Parquet's RLE / bit-packed hybrid.
//!
//! ```text
//!  page values:  [bit width: 1 byte] [run] [run] …
//!  run:          ULEB128 header h
//!                  h & 1 == 0 → repeat: (h >> 1) copies of one index, in ⌈width/8⌉ bytes
//!                  h & 1 == 1 → bit-packed: (h >> 1) groups of 8 indices, width bits each,
//!                               least significant bit first
//! ```
//!
//! A repeated index comes out as one [`Indices::Repeat`] (the caller fills, it never
//! expands the run into a buffer); bit-packed indices are unpacked 32 at a time, by a
//! routine made for each width at compile time, into a reused buffer of [`BLOCK`] indices.

/// Indices unpacked at most at once.
pub(crate) const BLOCK: usize = 1024;

/// The next indices of a page.
pub(crate) enum Indices<'a> {
    /// `count` copies of `index`.
    Repeat { index: u32, count: usize },
    /// These indices, in order.
    Listed(&'a [u32]),
}

/// What remains of the run being read.
enum Run {
    /// Copies of one index still to hand out.
    Repeat { index: u32, left: usize },
    /// A bit-packed run: its next unread index starts at byte `next` of the page data
    /// (always at a group of 32 indices), `left` indices (padding included) remain, and
    /// its bytes end at `end`.
    Packed {
        next: usize,
        left: usize,
        end: usize,
    },
    /// Between runs: the next header is at the read position.
    Between,
}

/// Reads the runs of one page's indices.
pub(crate) struct HybridIndices {
    data: bytes::Bytes,
    /// Where the next run header is.
    pos: usize,
    width: usize,
    run: Run,
    unpacked: Box<[u32; BLOCK]>,
    /// `unpacked[from..to]` are indices unpacked but not yet handed out.
    from: usize,
    to: usize,
}

impl HybridIndices {
    /// The runs in `data`, the page's values after the bit-width byte `width`.
    pub(crate) fn new(width: u8, data: bytes::Bytes) -> Result<Self, String> {
        if width > 32 {
            return Err(format!(
                "dictionary indices are {width} bits wide (at most 32)"
            ));
        }
        Ok(Self {
            data,
            pos: 0,
            width: usize::from(width),
            run: Run::Between,
            unpacked: Box::new([0; BLOCK]),
            from: 0,
            to: 0,
        })
    }

    /// Read `page`'s indices with the reader in `slot` (made on first use; its buffer is
    /// kept from page to page).
    pub(super) fn open(slot: &mut Option<Self>, page: super::IndexedPage) -> Result<(), String> {
        match slot {
            Some(indices) => indices.reset(page.width, page.runs),
            None => {
                *slot = Some(Self::new(page.width, page.runs)?);
                Ok(())
            }
        }
    }

    /// Start reading another page's runs, keeping the buffer.
    pub(crate) fn reset(&mut self, width: u8, data: bytes::Bytes) -> Result<(), String> {
        if width > 32 {
            return Err(format!(
                "dictionary indices are {width} bits wide (at most 32)"
            ));
        }
        self.data = data;
        self.pos = 0;
        self.width = usize::from(width);
        self.run = Run::Between;
        self.from = 0;
        self.to = 0;
        Ok(())
    }

    /// The indices' bit width.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Let go of the page's bytes (so that their buffer can be reused).
    pub(crate) fn release(&mut self) {
        self.data = bytes::Bytes::new();
        self.run = Run::Between;
        self.from = 0;
        self.to = 0;
    }

    /// Up to `max` (> 0) next indices; an error when the runs end first.
    pub(crate) fn next(&mut self, max: usize) -> Result<Indices<'_>, String> {
        loop {
            if self.from < self.to {
                let n = max.min(self.to - self.from);
                let listed = &self.unpacked[self.from..self.from + n];
                self.from += n;
                return Ok(Indices::Listed(listed));
            }
            match &mut self.run {
                Run::Repeat { index, left } if *left > 0 => {
                    let count = max.min(*left);
                    *left -= count;
                    return Ok(Indices::Repeat {
                        index: *index,
                        count,
                    });
                }
                Run::Packed { next, left, end } if *left > 0 => {
                    let count = (*left).min(BLOCK);
                    let blocks = count.div_ceil(32);
                    let run = &self.data[*next..*end];
                    unpack_blocks(run, self.width, &mut self.unpacked[..blocks * 32]);
                    *next += blocks * 4 * self.width;
                    *left -= count;
                    self.from = 0;
                    self.to = count;
                }
                _ => self.read_header()?,
            }
        }
    }

    /// Read the next run's header (and a repeated run's index).
    fn read_header(&mut self) -> Result<(), String> {
        let ended = || "the page's dictionary indices end before its values do".to_string();
        let mut header: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *self.data.get(self.pos).ok_or_else(ended)?;
            self.pos += 1;
            if shift > 63 {
                return Err("a run header of the dictionary indices is malformed".into());
            }
            header |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        let length = usize::try_from(header >> 1).map_err(|_| ended())?;
        if header & 1 == 1 {
            let bytes = length.checked_mul(self.width).ok_or_else(ended)?;
            let end = self.pos.checked_add(bytes).ok_or_else(ended)?;
            // A truncated last run still holds the indices before its cut; the page's value
            // count says how many are needed, so cut the run to the bytes that exist.
            let end = end.min(self.data.len());
            // Width 0 packs any number of zero indices into no bytes.
            let left = ((end - self.pos) * 8)
                .checked_div(self.width)
                .unwrap_or(length.saturating_mul(8));
            self.run = Run::Packed {
                next: self.pos,
                left,
                end,
            };
            self.pos = end;
        } else {
            let width_bytes = self.width.div_ceil(8);
            let bytes = self
                .data
                .get(self.pos..self.pos + width_bytes)
                .ok_or_else(ended)?;
            let mut le = [0u8; 4];
            le[..width_bytes].copy_from_slice(bytes);
            self.pos += width_bytes;
            self.run = Run::Repeat {
                index: u32::from_le_bytes(le),
                left: length,
            };
        }
        Ok(())
    }
}

/// Unpack `out.len() / 32` blocks of 32 indices of `width` bits from the start of `packed`
/// (a run's bytes: when fewer than a block's remain, the last block reads zeros past them).
/// The width is dispatched once per call, not once per block.
///
/// On a CPU with AVX2 and BMI2 the same code runs compiled for them: it unpacks twice as
/// fast (iter SF5: unpacking 6.3 % of the samples with the baseline x86-64 build, 3.1 %
/// with AVX2), and the wheel must still run on CPUs without them.
fn unpack_blocks(packed: &[u8], width: usize, out: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("bmi2") {
        // SAFETY: the CPU has AVX2 and BMI2, checked just above.
        return unsafe { unpack_blocks_avx2(packed, width, out) };
    }
    unpack_blocks_by_width(packed, width, out)
}

/// [`unpack_blocks`] compiled for AVX2 and BMI2.
///
/// # Safety
/// Only on a CPU that has both.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi2")]
unsafe fn unpack_blocks_avx2(packed: &[u8], width: usize, out: &mut [u32]) {
    unpack_blocks_by_width(packed, width, out)
}

#[inline(always)]
fn unpack_blocks_by_width(packed: &[u8], width: usize, out: &mut [u32]) {
    macro_rules! by_width {
        ($($w:literal)*) => {
            match width {
                0 => out.fill(0),
                $($w => unpack_blocks_of::<$w>(packed, out),)*
                _ => unreachable!("widths above 32 are rejected when a page is opened"),
            }
        };
    }
    by_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32)
}

#[inline(always)]
fn unpack_blocks_of<const WIDTH: usize>(packed: &[u8], out: &mut [u32]) {
    let block_bytes = 4 * WIDTH;
    for (block, out) in out.chunks_exact_mut(32).enumerate() {
        let out: &mut [u32; 32] = out.try_into().expect("chunks of 32");
        let start = block * block_bytes;
        match packed.get(start..start + block_bytes) {
            Some(bytes) => unpack32_of::<WIDTH>(bytes, out),
            None => {
                // The run's last groups: fewer than 32 indices are left.
                let rest = packed.get(start..).unwrap_or_default();
                let mut padded = [0u8; 128];
                padded[..rest.len()].copy_from_slice(rest);
                unpack32_of::<WIDTH>(&padded[..block_bytes], out);
            }
        }
    }
}

/// 32 indices of one width, known at compile time. Written out for each of the 32
/// lanes (not as a loop) so that every shift is a constant and the two-word case is decided
/// at compile time.
#[inline(always)]
fn unpack32_of<const WIDTH: usize>(packed: &[u8], out: &mut [u32; 32]) {
    let packed = &packed[..4 * WIDTH];
    macro_rules! lanes {
        ($($lane:literal)*) => {$( out[$lane] = lane::<WIDTH>(packed, $lane); )*};
    }
    lanes!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
}

/// Index `lane` of 32 packed `WIDTH`-bit indices (`packed` is `4 * WIDTH` bytes).
#[inline(always)]
fn lane<const WIDTH: usize>(packed: &[u8], lane: usize) -> u32 {
    let word = |k: usize| u32::from_le_bytes(packed[4 * k..4 * k + 4].try_into().unwrap());
    let bit = lane * WIDTH;
    let (k, offset) = (bit / 32, bit % 32);
    let mut value = word(k) >> offset;
    if offset + WIDTH > 32 {
        value |= word(k + 1) << (32 - offset);
    }
    if WIDTH == 32 {
        value
    } else {
        value & ((1u32 << WIDTH) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pack `values` (each < 2^width) as one bit-packed run with its header.
    fn packed_run(values: &[u32], width: usize) -> Vec<u8> {
        let groups = values.len().div_ceil(8);
        let mut bits = vec![0u8; groups * width];
        for (i, &v) in values.iter().enumerate() {
            for b in 0..width {
                if v >> b & 1 == 1 {
                    let at = i * width + b;
                    bits[at / 8] |= 1 << (at % 8);
                }
            }
        }
        let mut out = uleb((groups as u64) << 1 | 1);
        out.extend(bits);
        out
    }

    fn repeat_run(index: u32, count: u64, width: usize) -> Vec<u8> {
        let mut out = uleb(count << 1);
        out.extend(&index.to_le_bytes()[..width.div_ceil(8)]);
        out
    }

    fn uleb(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    /// Every index the runs hold, read `max` at a time.
    fn read_all(width: u8, data: Vec<u8>, total: usize, max: usize) -> Result<Vec<u32>, String> {
        let mut runs = HybridIndices::new(width, data.into())?;
        let mut out = Vec::new();
        while out.len() < total {
            match runs.next(max.min(total - out.len()))? {
                Indices::Repeat { index, count } => out.extend(std::iter::repeat_n(index, count)),
                Indices::Listed(listed) => out.extend_from_slice(listed),
            }
        }
        Ok(out)
    }

    #[test]
    fn every_width_unpacks_what_was_packed() {
        for width in 0..=32usize {
            let top = if width == 32 {
                u32::MAX
            } else {
                (1u64 << width) as u32 - 1
            };
            // A run followed by another holds whole groups of 8.
            let values: Vec<u32> = (0..2504u64)
                .map(|i| (i.wrapping_mul(2654435761) as u32) & top)
                .collect();
            let mut data = packed_run(&values, width);
            data.extend(repeat_run(top, 300, width));
            let mut expected = values.clone();
            expected.extend(std::iter::repeat_n(top, 300));
            for max in [1, 7, 32, 1000, 5000] {
                let got = read_all(width as u8, data.clone(), expected.len(), max).unwrap();
                assert_eq!(got, expected, "width {width}, {max} at a time");
            }
        }
    }

    #[test]
    fn the_portable_unpacking_agrees_with_the_one_this_cpu_runs() {
        // `unpack_blocks` may run the AVX2 build; the portable one must give the same.
        for width in 0..=32usize {
            let bytes: Vec<u8> = (0..4 * 32 * 3 + 5)
                .map(|i| (i * 37 + width) as u8)
                .collect();
            let (mut portable, mut dispatched) = (vec![0u32; 128], vec![0u32; 128]);
            unpack_blocks_by_width(&bytes, width, &mut portable);
            unpack_blocks(&bytes, width, &mut dispatched);
            assert_eq!(portable, dispatched, "width {width}");
        }
    }

    #[test]
    fn a_last_packed_group_may_be_padding() {
        // 13 values need two groups of 8; the page's count (13) ends the read.
        let values: Vec<u32> = (0..13).collect();
        let data = packed_run(&values, 4);
        assert_eq!(read_all(4, data, 13, 1024).unwrap(), values);
    }

    #[test]
    fn runs_that_end_early_are_an_error() {
        let data = repeat_run(3, 10, 2);
        let err = read_all(2, data, 11, 1024).unwrap_err();
        assert!(err.contains("end before"), "{err}");
        assert!(HybridIndices::new(33, bytes::Bytes::new()).is_err());
        // A repeated run whose index bytes are cut off.
        let mut cut = uleb(10 << 1);
        cut.push(1);
        let err = read_all(12, cut, 10, 1024).unwrap_err();
        assert!(err.contains("end before"), "{err}");
    }
}
