//! Writing one spill round into its file, at the speed of the disk.
//!
//! Three things keep a spill as fast as a raw sequential write of the same bytes:
//!
//! - **No copy.** `pwritev` takes the objects' buffers as they are, plus our headers, length
//!   tables and padding from a static zero block.
//! - **The checksum rides on the write.** Payload goes out in *steps* of about
//!   [`STEP_BYTES`]: each step is hashed just before it is written, so its bytes are already in
//!   the CPU cache when the kernel copies them into the page cache. The payload is read from
//!   memory once, as in a raw write, on the writing thread; no helper thread competes for the
//!   other core. Objects no larger than a step are batched whole (hash them, then one
//!   `pwritev` for the batch, headers included). A larger object is streamed step by step and
//!   its head (header with the checksum, length table) is written last, into the gap left
//!   before its payload.
//! - **Writeback starts while we write** (only when a sync policy will flush the file):
//!   every [`WRITEBACK_BYTES`] the finished range is handed to the device with
//!   `sync_file_range(SYNC_FILE_RANGE_WRITE)`, so the device writes while we copy and the
//!   final `fdatasync` only waits for the tail. Pages holding a head that is still to be
//!   written are left out (they would be written twice). Without a sync policy nothing is
//!   forced: a spill file freed before the kernel writes it back never costs device time.
//!   The hint's own errors are ignored; the `fdatasync` that follows reports the real outcome.
//!
//! A crash before an object's head is written leaves zeros where its header belongs, which
//! fails the magic check on restore; but no location is handed out before the whole round
//! (and its sync) is done, so no caller ever sees such an object.

use std::fs::File;
use std::io::{self, IoSlice};
use std::ops::Range;
use std::os::fd::AsRawFd;

use bytes::Bytes;
use xxhash_rust::xxh3::Xxh3;

use crate::format::{padding, payload_checksum, Header, HEADER_LEN, ZEROS};
use crate::vectored::write_all_vectored_at;

/// Payload hashed and then written in one go: small enough to stay in a core's L2 cache
/// between the hash and the kernel's copy.
pub const STEP_BYTES: usize = 512 << 10;
/// Bytes written between two writeback hints.
pub const WRITEBACK_BYTES: u64 = 4 << 20;
const PAGE: u64 = 4096;

/// Where one object goes in the file, and what we write around its buffers.
pub struct PlannedObject<'a> {
    /// File offset of the object's header.
    pub offset: u64,
    /// The header, checksum still zero.
    pub header: Header,
    /// The length table (one little-endian u64 per buffer).
    pub table: Vec<u8>,
    /// The caller's buffers.
    pub buffers: &'a [Bytes],
}

impl PlannedObject<'_> {
    fn payload_len(&self) -> usize {
        self.buffers.iter().map(Bytes::len).sum()
    }

    fn head_slices<'s>(&'s self, header: &'s [u8; HEADER_LEN]) -> [IoSlice<'s>; 3] {
        [
            IoSlice::new(header),
            IoSlice::new(&self.table),
            IoSlice::new(&ZEROS[..padding((HEADER_LEN + self.table.len()) as u64)]),
        ]
    }

    fn head_end(&self) -> u64 {
        let head = HEADER_LEN + self.table.len();
        self.offset + (head + padding(head as u64)) as u64
    }
}

/// Write `objects` (planned back to back from offset 0) into `file`. With `flush_each`, each
/// object is made durable (`fdatasync`) before the next is written; `hint_writeback` turns on
/// the writeback hints (pass it when the caller will `fdatasync` the file).
pub fn write_objects(
    file: &File,
    objects: &[PlannedObject<'_>],
    flush_each: bool,
    hint_writeback: bool,
) -> io::Result<()> {
    let mut writer = RoundWriter {
        file,
        hint_writeback,
        hinted_to: 0,
    };
    let mut batch = 0..0;
    let mut batch_bytes = 0;
    for (i, object) in objects.iter().enumerate() {
        let len = object.payload_len();
        if len <= STEP_BYTES && !flush_each {
            if !batch.is_empty() && batch_bytes + len > STEP_BYTES {
                writer.write_whole(&objects[batch.clone()])?;
                batch = 0..0;
                batch_bytes = 0;
            }
            if batch.is_empty() {
                batch = i..i;
            }
            batch.end = i + 1;
            batch_bytes += len;
            continue;
        }
        writer.write_whole(&objects[batch.clone()])?;
        batch = 0..0;
        batch_bytes = 0;
        if len <= STEP_BYTES {
            writer.write_whole(std::slice::from_ref(object))?;
        } else {
            writer.write_streamed(object)?;
        }
        if flush_each {
            file.sync_data()?;
        }
    }
    writer.write_whole(&objects[batch])
}

struct RoundWriter<'f> {
    file: &'f File,
    hint_writeback: bool,
    /// Everything before this offset has been handed to writeback (or deliberately skipped).
    hinted_to: u64,
}

impl RoundWriter<'_> {
    /// Hash each object, then write them (heads and payloads) with one `pwritev`.
    fn write_whole(&mut self, objects: &[PlannedObject<'_>]) -> io::Result<()> {
        let Some(first) = objects.first() else {
            return Ok(());
        };
        let headers: Vec<[u8; HEADER_LEN]> = objects
            .iter()
            .map(|o| {
                let checksum = payload_checksum(&o.table, o.buffers.iter().map(|b| &b[..]));
                Header {
                    checksum,
                    ..o.header.clone()
                }
                .encode()
            })
            .collect();
        let mut slices = Vec::with_capacity(
            objects.len() * 3 + 2 * objects.iter().map(|o| o.buffers.len()).sum::<usize>(),
        );
        for (object, header) in objects.iter().zip(&headers) {
            slices.extend(object.head_slices(header));
            for b in object.buffers {
                slices.push(IoSlice::new(b));
                slices.push(IoSlice::new(&ZEROS[..padding(b.len() as u64)]));
            }
        }
        let end = first.offset + slices.iter().map(|s| s.len() as u64).sum::<u64>();
        write_all_vectored_at(self.file, &mut slices, first.offset)?;
        self.hint(end, None);
        Ok(())
    }

    /// Stream a large object's payload in hashed steps, then write its head.
    fn write_streamed(&mut self, object: &PlannedObject<'_>) -> io::Result<()> {
        let mut hasher = Xxh3::new();
        hasher.update(&object.table);
        let head = object.offset..object.head_end();
        let mut at = head.end;
        let mut step: Vec<IoSlice<'_>> = Vec::new();
        let mut step_bytes = 0;
        for b in object.buffers {
            for piece in b.chunks(STEP_BYTES) {
                hasher.update(piece);
                step.push(IoSlice::new(piece));
                step_bytes += piece.len();
                if step_bytes >= STEP_BYTES {
                    at = self.write_step(&mut step, at, &head)?;
                    step_bytes = 0;
                }
            }
            step.push(IoSlice::new(&ZEROS[..padding(b.len() as u64)]));
        }
        self.write_step(&mut step, at, &head)?;
        let header = Header {
            checksum: hasher.digest(),
            ..object.header.clone()
        }
        .encode();
        write_all_vectored_at(self.file, &mut object.head_slices(&header), object.offset)?;
        Ok(())
    }

    fn write_step(
        &mut self,
        step: &mut Vec<IoSlice<'_>>,
        at: u64,
        head: &Range<u64>,
    ) -> io::Result<u64> {
        let end = at + step.iter().map(|s| s.len() as u64).sum::<u64>();
        write_all_vectored_at(self.file, step, at)?;
        step.clear();
        self.hint(end, Some(head));
        Ok(end)
    }

    /// Hand the finished pages before `written_to` to writeback, once enough have gathered,
    /// leaving out the pages of a head still to be written.
    fn hint(&mut self, written_to: u64, pending_head: Option<&Range<u64>>) {
        if !self.hint_writeback || written_to < self.hinted_to + WRITEBACK_BYTES {
            return;
        }
        let ready = written_to / PAGE * PAGE;
        if let Some(head) = pending_head {
            self.start_writeback(head.start / PAGE * PAGE);
            self.hinted_to = self.hinted_to.max(head.end.div_ceil(PAGE) * PAGE);
        }
        self.start_writeback(ready);
    }

    fn start_writeback(&mut self, to: u64) {
        if to <= self.hinted_to {
            return;
        }
        // SAFETY: a plain syscall on a file descriptor we own; no memory is passed.
        // Its result is ignored on purpose (see the module docs).
        unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                self.hinted_to as _,
                (to - self.hinted_to) as _,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        self.hinted_to = to;
    }
}
