//! Writing a round: one PUT, or a multipart upload of equal parts cut from the buffers'
//! handles without copying; any failure aborts it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, ObjectStoreExt, PutPayload};

use crate::area::SpillObject;
use crate::error::{Result, SpillError};
use crate::format::{head_len, length_table, padding, payload_checksum, Header, HEADER_LEN, ZEROS};
use crate::location::ObjectExtent;

use super::{remote_error, Counters, RemoteSpillFile, RemoteSpillLocation, Shared};

/// Upload one round as one remote object; on error nothing of it remains.
pub(super) async fn write_round(
    shared: &Arc<Shared>,
    objects: Vec<SpillObject>,
) -> Result<Vec<RemoteSpillLocation>> {
    let round = shared.next_round.fetch_add(1, Ordering::Relaxed);
    let path = shared.root.clone().join(format!("{round}.spill"));
    let uri = shared.uri_of(&path);
    let c = &shared.counters;
    let result = async {
        // Checksums are CPU work over every payload byte: off the runtime's I/O threads.
        let (objects, heads) = tokio::task::spawn_blocking(move || {
            let heads: Result<Vec<Bytes>> = objects.iter().map(encode_head).collect();
            (objects, heads)
        })
        .await
        .map_err(|_| SpillError::InvalidArgument("internal error: checksum task failed".into()))?;
        let heads = heads?;
        let mut chunks = Vec::new();
        let mut extents = Vec::with_capacity(objects.len());
        let mut size = 0u64;
        for (object, head) in objects.iter().zip(heads) {
            let lens: Vec<u64> = object.buffers.iter().map(|b| b.len() as u64).collect();
            let extent = ObjectExtent::new(size, object.id, lens.into());
            size = extent.end();
            extents.push(extent);
            chunks.push(head);
            for buffer in &object.buffers {
                if !buffer.is_empty() {
                    chunks.push(buffer.clone()); // a handle, not a copy
                }
                let pad = padding(buffer.len() as u64);
                if pad > 0 {
                    chunks.push(Bytes::from_static(&ZEROS[..pad]));
                }
            }
        }
        upload(shared, &path, &uri, chunks, size).await?;
        Ok::<_, SpillError>((extents, size))
    }
    .await;
    match result {
        Ok((extents, size)) => {
            c.rounds.fetch_add(1, Ordering::Relaxed);
            c.objects_spilled
                .fetch_add(extents.len() as u64, Ordering::Relaxed);
            let payload: u64 = extents.iter().map(|e| e.payload_len()).sum();
            c.bytes_spilled.fetch_add(payload, Ordering::Relaxed);
            let file = Arc::new(RemoteSpillFile {
                shared: shared.clone(),
                path,
                size,
            });
            Ok(extents
                .into_iter()
                .map(|extent| RemoteSpillLocation {
                    file: file.clone(),
                    extent,
                })
                .collect())
        }
        Err(e) => {
            c.failed_rounds.fetch_add(1, Ordering::Relaxed);
            Err(e)
        }
    }
}

/// An object's head (header with its checksum, length table, padding) as bytes.
pub(super) fn encode_head(object: &SpillObject) -> Result<Bytes> {
    let lens: Vec<u64> = object.buffers.iter().map(|b| b.len() as u64).collect();
    let table = length_table(&lens);
    let header = Header {
        buffer_count: u32::try_from(lens.len()).map_err(|_| {
            SpillError::InvalidArgument(format!(
                "object {} has {} buffers, more than 2^32",
                object.id,
                lens.len()
            ))
        })?,
        payload_len: lens.iter().sum(),
        checksum: payload_checksum(&table, object.buffers.iter().map(|b| &b[..])),
        object_id: object.id,
    };
    let mut head = Vec::with_capacity(head_len(lens.len()) as usize);
    head.extend_from_slice(&header.encode());
    head.extend_from_slice(&table);
    head.resize(head_len(lens.len()) as usize, 0);
    debug_assert_eq!(head.len() % HEADER_LEN, 0);
    Ok(Bytes::from(head))
}

/// Upload `chunks` (`total` bytes) to `path`: one PUT, or a multipart upload of fixed-size
/// parts that is aborted on any failure.
pub(super) async fn upload(
    shared: &Shared,
    path: &ObjectPath,
    uri: &str,
    chunks: Vec<Bytes>,
    total: u64,
) -> Result<()> {
    let c = &shared.counters;
    let part_size = shared.config.part_size;
    if total <= part_size as u64 {
        shared
            .store
            .put(path, chunks.into_iter().collect::<PutPayload>())
            .await
            .map_err(|e| remote_error(uri, "upload spill object".into(), e))?;
        c.single_puts.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    let mut upload = shared
        .store
        .put_multipart(path)
        .await
        .map_err(|e| remote_error(uri, "start multipart upload".into(), e))?;
    c.multipart_uploads.fetch_add(1, Ordering::Relaxed);
    let parts = PartSplitter {
        chunks: chunks.into_iter(),
        carry: None,
        part_size,
    };
    let outcome = match upload_parts(&mut *upload, parts, shared.config.parts_in_flight, c).await {
        Ok(()) => upload
            .complete()
            .await
            .map(|_| ())
            .map_err(|e| remote_error(uri, "complete multipart upload".into(), e)),
        Err((part, e)) => Err(remote_error(uri, format!("upload part {part}"), e)),
    };
    if outcome.is_err() {
        // Best effort: the upload's parts would otherwise linger (and cost) until a bucket
        // lifecycle rule removes them.
        let _ = upload.abort().await;
        c.aborted_uploads.fetch_add(1, Ordering::Relaxed);
    }
    outcome
}

pub(super) async fn upload_parts(
    upload: &mut dyn MultipartUpload,
    mut parts: PartSplitter,
    parts_in_flight: usize,
    counters: &Counters,
) -> std::result::Result<(), (usize, object_store::Error)> {
    let mut in_flight = FuturesUnordered::new();
    let mut started = 0usize;
    loop {
        while in_flight.len() < parts_in_flight {
            let Some(part) = parts.next() else { break };
            let number = started;
            started += 1;
            let put = upload.put_part(part);
            in_flight.push(async move { put.await.map_err(|e| (number, e)) });
        }
        match in_flight.next().await {
            Some(done) => {
                done?;
                counters.parts_uploaded.fetch_add(1, Ordering::Relaxed);
            }
            None => return Ok(()),
        }
    }
}

/// Cuts a list of chunks into payloads of exactly `part_size` bytes (the last may be
/// shorter) by slicing the chunks' handles: no bytes are copied.
pub(super) struct PartSplitter {
    chunks: std::vec::IntoIter<Bytes>,
    carry: Option<Bytes>,
    part_size: usize,
}

impl Iterator for PartSplitter {
    type Item = PutPayload;

    fn next(&mut self) -> Option<PutPayload> {
        let mut part = Vec::new();
        let mut room = self.part_size;
        while room > 0 {
            let Some(mut chunk) = self.carry.take().or_else(|| self.chunks.next()) else {
                break;
            };
            if chunk.len() > room {
                self.carry = Some(chunk.split_off(room));
            }
            room -= chunk.len();
            part.push(chunk);
        }
        (!part.is_empty()).then(|| part.into_iter().collect())
    }
}
