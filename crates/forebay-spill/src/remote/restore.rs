//! Reading a round back: ranged GETs streamed into the caller's memory, or kept as slices of
//! the downloaded bytes; head and checksum verified.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::error::{Result, SpillError};
use crate::format::{align_up, check_head, check_payload, padding};

use super::{remote_error, RemoteSpillLocation, RemoteSpillTarget};

impl RemoteSpillTarget {
    /// Restore into memory the caller provides: `destinations[i]` receives buffer `i` and must
    /// have exactly its length. One ranged GET is streamed into them (the only copy: out of the
    /// network buffers); the head and checksum are then verified, so on error the
    /// destinations' contents are unspecified but never silently wrong.
    pub fn restore_into(
        &self,
        loc: &RemoteSpillLocation,
        destinations: &mut [&mut [u8]],
    ) -> Result<()> {
        self.block_on(self.restore_into_async(loc, destinations))?
    }

    /// [`RemoteSpillTarget::restore_into`] for async callers.
    pub async fn restore_into_async(
        &self,
        loc: &RemoteSpillLocation,
        destinations: &mut [&mut [u8]],
    ) -> Result<()> {
        let lens: Vec<u64> = destinations.iter().map(|d| d.len() as u64).collect();
        if lens.as_slice() != loc.buffer_lens() {
            return Err(SpillError::DestinationMismatch {
                path: PathBuf::from(loc.uri()),
                offset: loc.offset,
                reason: format!(
                    "buffers are {:?} bytes, destinations {lens:?}",
                    loc.buffer_lens
                ),
            });
        }
        let mut head = vec![0u8; loc.head_len() as usize];
        let pads: usize = loc.buffer_lens.iter().map(|l| padding(*l)).sum();
        let mut pad_sink = vec![0u8; pads];
        {
            let mut segments: Vec<&mut [u8]> = Vec::with_capacity(1 + 2 * destinations.len());
            segments.push(&mut head);
            let mut pad_rest: &mut [u8] = &mut pad_sink;
            for dest in destinations.iter_mut() {
                let pad = padding(dest.len() as u64);
                segments.push(&mut **dest);
                let (this_pad, rest) = std::mem::take(&mut pad_rest).split_at_mut(pad);
                pad_rest = rest;
                segments.push(this_pad);
            }
            let mut stream = self.get_stream(loc).await?;
            let mut filler = SegmentFiller::new(segments);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.read_error(loc, e))?;
                if !filler.fill(&chunk) {
                    return Err(loc.corrupt("the store returned more bytes than the object has"));
                }
            }
            if !filler.is_full() {
                return Err(loc.truncated());
            }
        }
        let header =
            check_head(&head, &loc.buffer_lens, loc.object_id).map_err(|r| loc.corrupt(r))?;
        let padding_clean = pad_sink.iter().all(|b| *b == 0);
        check_payload(
            &loc.buffer_lens,
            header.checksum,
            padding_clean,
            destinations.iter().map(|d| &**d),
        )
        .map_err(|r| loc.corrupt(r))?;
        self.count_restore(loc);
        Ok(())
    }

    /// Restore into the downloaded bytes: each buffer is a slice of the one ranged GET's
    /// response (64-byte aligned within it), checksum verified.
    pub fn restore(&self, loc: &RemoteSpillLocation) -> Result<Vec<Bytes>> {
        self.block_on(self.restore_async(loc))?
    }

    /// [`RemoteSpillTarget::restore`] for async callers.
    pub async fn restore_async(&self, loc: &RemoteSpillLocation) -> Result<Vec<Bytes>> {
        let stream = self.get_stream(loc).await?;
        let chunks: Vec<Bytes> = stream
            .try_collect()
            .await
            .map_err(|e| self.read_error(loc, e))?;
        let bytes = if chunks.len() == 1 {
            chunks.into_iter().next().expect("one chunk")
        } else {
            // Several network chunks: one contiguous copy, so buffers can be slices.
            let mut all = Vec::with_capacity(loc.len as usize);
            chunks.iter().for_each(|c| all.extend_from_slice(c));
            Bytes::from(all)
        };
        if (bytes.len() as u64) < loc.len {
            return Err(loc.truncated());
        }
        if bytes.len() as u64 > loc.len {
            return Err(loc.corrupt("the store returned more bytes than the object has"));
        }
        let head_end = loc.head_len() as usize;
        let header = check_head(&bytes[..head_end], &loc.buffer_lens, loc.object_id)
            .map_err(|r| loc.corrupt(r))?;
        let mut buffers = Vec::with_capacity(loc.buffer_lens.len());
        let mut at = head_end;
        let mut padding_clean = true;
        for len in loc.buffer_lens.iter() {
            let len = *len as usize;
            let padded = align_up(len as u64) as usize;
            padding_clean &= bytes[at + len..at + padded].iter().all(|b| *b == 0);
            buffers.push(bytes.slice(at..at + len));
            at += padded;
        }
        check_payload(
            &loc.buffer_lens,
            header.checksum,
            padding_clean,
            buffers.iter().map(|b| &b[..]),
        )
        .map_err(|r| loc.corrupt(r))?;
        self.count_restore(loc);
        Ok(buffers)
    }

    async fn get_stream(
        &self,
        loc: &RemoteSpillLocation,
    ) -> Result<futures::stream::BoxStream<'static, object_store::Result<Bytes>>> {
        self.shared
            .counters
            .get_requests
            .fetch_add(1, Ordering::Relaxed);
        let options = GetOptions {
            range: Some(GetRange::Bounded(loc.range())),
            ..Default::default()
        };
        let result = self
            .shared
            .store
            .get_opts(&loc.file.path, options)
            .await
            .map_err(|e| self.read_error(loc, e))?;
        Ok(result.into_stream())
    }

    fn read_error(&self, loc: &RemoteSpillLocation, source: object_store::Error) -> SpillError {
        remote_error(
            &loc.uri(),
            format!(
                "read spilled object at offset {} ({} bytes)",
                loc.offset, loc.len
            ),
            source,
        )
    }

    fn count_restore(&self, loc: &RemoteSpillLocation) {
        let c = &self.shared.counters;
        c.objects_restored.fetch_add(1, Ordering::Relaxed);
        c.bytes_restored
            .fetch_add(loc.payload_len(), Ordering::Relaxed);
    }
}

/// Copies a stream of chunks into consecutive segments of caller memory.
pub(super) struct SegmentFiller<'a> {
    segments: Vec<&'a mut [u8]>,
    index: usize,
    at: usize,
}

impl<'a> SegmentFiller<'a> {
    fn new(segments: Vec<&'a mut [u8]>) -> Self {
        let mut filler = SegmentFiller {
            segments,
            index: 0,
            at: 0,
        };
        filler.skip_full();
        filler
    }

    fn skip_full(&mut self) {
        while self.index < self.segments.len() && self.at == self.segments[self.index].len() {
            self.index += 1;
            self.at = 0;
        }
    }

    /// Copy `data` in; false if it does not fit (more bytes than expected).
    fn fill(&mut self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            if self.index == self.segments.len() {
                return false;
            }
            let segment = &mut self.segments[self.index][self.at..];
            let n = segment.len().min(data.len());
            segment[..n].copy_from_slice(&data[..n]);
            data = &data[n..];
            self.at += n;
            self.skip_full();
        }
        true
    }

    fn is_full(&self) -> bool {
        self.index == self.segments.len()
    }
}
