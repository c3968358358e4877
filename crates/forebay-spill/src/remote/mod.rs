//! [`RemoteSpillTarget`]: spill rounds to S3-like storage through `object_store`.
//!
//! For machines whose local disk is small or slow, or for spilled objects another machine
//! should restore. The objects are laid out exactly as in local spill files
//! ([`crate::format`]: header, length table, 64-byte aligned buffers, XXH3-64 checksum), so a
//! restore verifies the same header and checksum and reports corruption or truncation naming
//! the object's URI and offset.
//!
//! ```text
//!  submit(round) ─► (blocks while `rounds_in_flight` rounds are uploading: backpressure)
//!      │  runtime task: checksums (blocking pool) ─► Bytes chunks: [head][buf 0][pad][buf 1]…
//!      ├─ ≤ part_size bytes: one PUT
//!      └─ > part_size: multipart upload, parts of exactly part_size bytes (the last shorter),
//!         `parts_in_flight` at a time; any failure aborts the upload (no location returned)
//!  RemoteSpillLocation (object, offset, lengths)
//!      ├─ restore_into(&mut [dest buffers]) ── ranged GET streamed into the destinations
//!      ├─ restore() ── ranged GET, buffers as slices of the downloaded bytes
//!      └─ drop (last object of the round) ── DELETE in the background
//! ```
//!
//! **No copy of the payload on our side.** A part is a [`PutPayload`]: a list of [`Bytes`]
//! handles, i.e. slices of the caller's buffers, our small heads, and static zero padding.
//! Parts are cut at fixed offsets by slicing handles, never by assembling a part buffer (what
//! `object_store`'s own `WriteMultipart` does). Every part but the last has the same size,
//! which S3 (≥ 5 MiB per part) and R2 (equal part sizes) both require.
//!
//! **Names.** Round `n` of a target is `<prefix>/<pid>-<nonce>-<host>/<n>.spill`. When a target
//! opens it deletes the directories under its prefix that belong to dead processes of the same
//! host (crashed runs); directories of other hosts are left alone, since their liveness cannot
//! be known from here. Multipart uploads that a crash left unfinished are invisible to listing:
//! give the bucket a lifecycle rule (S3 `AbortIncompleteMultipartUpload`) for those.
//!
//! **Threads.** The target runs its own small tokio runtime, so callers need none. `spill`
//! only waits on a channel and works from any thread; the blocking restores drive the
//! runtime from the caller's thread and refuse to run inside an async runtime (tokio would
//! panic); async embedders use the `_async` methods there. The runtime lives until the
//! target and every location are dropped, then waits (bounded) for pending deletes.
//!
//! | module    | what                                                     |
//! |-----------|----------------------------------------------------------|
//! | this one  | the config, the target, its files and locations, stats    |
//! | `upload`  | a round written: one PUT or a multipart upload             |
//! | `restore` | a round read back, verified                                |
//! | `names`   | process directories, and stale ones of dead processes     |

mod names;
mod restore;
mod upload;

use std::future::Future;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use futures::{FutureExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::area::SpillObject;
use crate::error::{Result, SpillError};
use crate::location::{ObjectExtent, PendingRound};

use forebay_io::durable::process_alive;
use names::{host_name, parse_process_dir, process_dir_name};
use upload::write_round;

/// How a [`RemoteSpillTarget`] uploads.
#[derive(Debug, Clone)]
pub struct RemoteSpillConfig {
    /// Size of every multipart part but the last; rounds up to this size go up as one PUT.
    /// S3 and GCS need at least 5 MiB. Default 16 MiB.
    pub part_size: usize,
    /// Parts of one round uploading at the same time. Default 4.
    pub parts_in_flight: usize,
    /// Rounds uploading at the same time; `submit` blocks beyond that. Default 2.
    pub rounds_in_flight: usize,
    /// Threads of the target's runtime. Default 2.
    pub io_threads: usize,
}

impl Default for RemoteSpillConfig {
    fn default() -> Self {
        RemoteSpillConfig {
            part_size: 16 << 20,
            parts_in_flight: 4,
            rounds_in_flight: 2,
            io_threads: 2,
        }
    }
}

impl RemoteSpillConfig {
    pub fn with_part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes;
        self
    }
    pub fn with_parts_in_flight(mut self, parts: usize) -> Self {
        self.parts_in_flight = parts;
        self
    }
    pub fn with_rounds_in_flight(mut self, rounds: usize) -> Self {
        self.rounds_in_flight = rounds;
        self
    }
    pub fn with_io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads;
        self
    }
}

#[derive(Default)]
struct Counters {
    rounds: AtomicU64,
    failed_rounds: AtomicU64,
    objects_spilled: AtomicU64,
    bytes_spilled: AtomicU64,
    single_puts: AtomicU64,
    multipart_uploads: AtomicU64,
    parts_uploaded: AtomicU64,
    aborted_uploads: AtomicU64,
    remote_objects_deleted: AtomicU64,
    stale_objects_removed: AtomicU64,
    objects_restored: AtomicU64,
    bytes_restored: AtomicU64,
    get_requests: AtomicU64,
}

/// Counters of a remote spill target since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RemoteSpillStats {
    pub rounds: u64,
    pub failed_rounds: u64,
    pub objects_spilled: u64,
    /// Payload bytes (buffers only, no heads or padding).
    pub bytes_spilled: u64,
    /// Rounds uploaded with one PUT.
    pub single_puts: u64,
    /// Rounds uploaded as multipart uploads, and their parts.
    pub multipart_uploads: u64,
    pub parts_uploaded: u64,
    /// Multipart uploads aborted after a failure.
    pub aborted_uploads: u64,
    /// Remote round objects deleted after their last location was dropped.
    pub remote_objects_deleted: u64,
    /// Objects of dead processes (same host) removed when the target opened.
    pub stale_objects_removed: u64,
    pub objects_restored: u64,
    pub bytes_restored: u64,
    pub get_requests: u64,
}

/// What the target, its tasks and its remote objects share. Holds the runtime, so it is
/// dropped only when nothing can issue requests any more.
struct Shared {
    store: Arc<dyn ObjectStore>,
    /// `<prefix>/<pid>-<nonce>-<host>`: this target's directory.
    root: ObjectPath,
    /// Prepended to object paths in messages (`s3://bucket/`).
    display_prefix: String,
    config: RemoteSpillConfig,
    counters: Arc<Counters>,
    next_round: AtomicU64,
    pending_deletes: Arc<AtomicUsize>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Shared {
    fn uri_of(&self, path: &ObjectPath) -> String {
        format!("{}{}", self.display_prefix, path)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("runtime lives as long as Shared")
    }
}

/// How long dropping a target (with its last location) waits for the background deletes of
/// its remote objects. Deletes take milliseconds; an unreachable store would otherwise hold
/// the dropping thread for object_store's whole retry budget. Objects left behind are
/// removed by the first target opened on the same prefix and host after this process exits.
const DELETE_GRACE: Duration = Duration::from_secs(5);

impl Drop for Shared {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let pending = self.pending_deletes.clone();
        let wait_and_stop = move || {
            runtime.block_on(async {
                let deadline = Instant::now() + DELETE_GRACE;
                while pending.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
            drop(runtime);
        };
        // A runtime cannot be blocked on or dropped from inside an async context (the last
        // handle may go away in one of our own tasks): do it on a thread of its own then.
        if tokio::runtime::Handle::try_current().is_ok() {
            let _ = std::thread::Builder::new()
                .name(forebay_io::threads::thread_name("remote-spill-stop"))
                .spawn(wait_and_stop);
        } else {
            wait_and_stop();
        }
    }
}

/// One remote object holding a spill round. Deleted in the background when the last
/// [`RemoteSpillLocation`] in it is dropped.
pub struct RemoteSpillFile {
    shared: Arc<Shared>,
    path: ObjectPath,
    size: u64,
}

impl RemoteSpillFile {
    /// The object's URI (`s3://bucket/prefix/…/3.spill`).
    pub fn uri(&self) -> String {
        self.shared.uri_of(&self.path)
    }
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for RemoteSpillFile {
    fn drop(&mut self) {
        let store = self.shared.store.clone();
        let path = std::mem::replace(&mut self.path, ObjectPath::from(""));
        let counters = self.shared.counters.clone();
        let pending = self.shared.pending_deletes.clone();
        pending.fetch_add(1, Ordering::AcqRel);
        // The task holds the store, the counters and the pending count, not `Shared`: the
        // runtime must never own the last handle to itself.
        self.shared.runtime().spawn(async move {
            if store.delete(&path).await.is_ok() {
                counters
                    .remote_objects_deleted
                    .fetch_add(1, Ordering::Relaxed);
            }
            pending.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

impl std::fmt::Debug for RemoteSpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteSpillFile({}, {} bytes)", self.uri(), self.size)
    }
}

/// Where a remotely spilled object lives: its [`ObjectExtent`] (which it dereferences to) in
/// a remote object. Cloning is cheap; the round's remote object is deleted once the last
/// location in it is dropped.
#[derive(Debug, Clone)]
pub struct RemoteSpillLocation {
    file: Arc<RemoteSpillFile>,
    extent: ObjectExtent,
}

impl RemoteSpillLocation {
    /// URI of the remote object holding this spilled object.
    pub fn uri(&self) -> String {
        self.file.uri()
    }
    fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.end()
    }
    fn corrupt(&self, reason: impl Into<String>) -> SpillError {
        SpillError::Corrupt {
            path: PathBuf::from(self.uri()),
            offset: self.offset,
            reason: reason.into(),
        }
    }
    fn truncated(&self) -> SpillError {
        SpillError::Truncated {
            path: PathBuf::from(self.uri()),
            offset: self.offset,
            needed: self.len,
        }
    }
}

impl Deref for RemoteSpillLocation {
    type Target = ObjectExtent;
    fn deref(&self) -> &ObjectExtent {
        &self.extent
    }
}

/// A round submitted to a [`RemoteSpillTarget`].
pub type PendingRemoteSpill = PendingRound<RemoteSpillLocation>;

/// Spills rounds of objects to an object store (S3, GCS, Azure, a local directory through
/// `object_store`, memory). See the module docs for the protocol.
pub struct RemoteSpillTarget {
    shared: Arc<Shared>,
    /// One token per round uploading; `submit` blocks while all are taken.
    round_slots: Sender<()>,
    round_done: Receiver<()>,
}

fn remote_error(uri: &str, action: String, source: object_store::Error) -> SpillError {
    SpillError::Remote {
        uri: uri.to_string(),
        action,
        source,
    }
}

impl RemoteSpillTarget {
    /// Open a target under `prefix` of `store`. `display_prefix` is prepended to object paths
    /// in messages and URIs (for example `s3://bucket/`). Directories left under `prefix` by
    /// dead processes of this host are deleted first.
    pub fn open(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        display_prefix: &str,
        config: RemoteSpillConfig,
    ) -> Result<RemoteSpillTarget> {
        if config.part_size == 0 || config.parts_in_flight == 0 || config.rounds_in_flight == 0 {
            return Err(SpillError::InvalidArgument(
                "part_size, parts_in_flight and rounds_in_flight must be at least 1".into(),
            ));
        }
        let prefix = ObjectPath::parse(prefix.trim_matches('/')).map_err(|e| {
            SpillError::InvalidArgument(format!(
                "{display_prefix}{prefix}: not a valid object path: {e}"
            ))
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.io_threads.max(1))
            .thread_name(forebay_io::threads::thread_name("remote-spill"))
            .enable_all()
            .build()
            .map_err(|e| SpillError::Io {
                path: PathBuf::from("<thread>"),
                action: "start remote spill runtime",
                source: e,
            })?;
        let (round_slots, round_done) = crossbeam_channel::bounded(config.rounds_in_flight);
        let shared = Arc::new(Shared {
            store,
            root: prefix.clone().join(process_dir_name()),
            display_prefix: display_prefix.to_string(),
            config,
            counters: Arc::new(Counters::default()),
            next_round: AtomicU64::new(0),
            pending_deletes: Arc::new(AtomicUsize::new(0)),
            runtime: Some(runtime),
        });
        let target = RemoteSpillTarget {
            shared,
            round_slots,
            round_done,
        };
        target.block_on(target.remove_stale(prefix))??;
        Ok(target)
    }

    /// Delete the directories under `prefix` that dead processes of this host left behind.
    fn remove_stale(&self, prefix: ObjectPath) -> impl Future<Output = Result<()>> + 'static {
        let shared = self.shared.clone();
        async move {
            let store = &shared.store;
            let uri = shared.uri_of(&prefix);
            let listing = store
                .list_with_delimiter(Some(&prefix))
                .await
                .map_err(|e| remote_error(&uri, "list spill prefix".into(), e))?;
            let host = host_name();
            for dir in listing.common_prefixes {
                let Some(name) = dir.filename() else { continue };
                let Some((pid, dir_host)) = parse_process_dir(name) else {
                    continue;
                };
                if dir_host != host || pid == std::process::id() || process_alive(pid) {
                    continue;
                }
                let dir_uri = shared.uri_of(&dir);
                let objects: Vec<_> = store
                    .list(Some(&dir))
                    .map_ok(|meta| meta.location)
                    .try_collect()
                    .await
                    .map_err(|e| remote_error(&dir_uri, "list stale spill objects".into(), e))?;
                for object in objects {
                    match store.delete(&object).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                            shared
                                .counters
                                .stale_objects_removed
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            return Err(remote_error(
                                &shared.uri_of(&object),
                                "delete stale spill object".into(),
                                e,
                            ))
                        }
                    }
                }
            }
            Ok(())
        }
    }

    /// Run `fut` to completion on the target's runtime from a plain thread.
    fn block_on<F: Future>(&self, fut: F) -> Result<F::Output> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(SpillError::InvalidArgument(
                "blocking remote spill call from inside an async runtime; use the _async methods"
                    .into(),
            ));
        }
        Ok(self.shared.runtime().block_on(fut))
    }

    /// The directory this target writes its rounds under (`s3://bucket/prefix/<pid>-…`).
    pub fn root_uri(&self) -> String {
        self.shared.uri_of(&self.shared.root)
    }

    /// Queue a round for upload. Blocks while `rounds_in_flight` rounds are uploading.
    pub fn submit(&self, objects: Vec<SpillObject>) -> Result<PendingRemoteSpill> {
        self.round_slots.send(()).map_err(|_| SpillError::Closed)?;
        let (reply, rx) = crossbeam_channel::bounded(1);
        let shared = self.shared.clone();
        let done = self.round_done.clone();
        self.shared.runtime().spawn(async move {
            let result = std::panic::AssertUnwindSafe(write_round(&shared, objects))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    Err(SpillError::InvalidArgument(
                        "internal error: remote spill task panicked".into(),
                    ))
                });
            let _ = done.try_recv(); // free the slot before the caller sees the result
            drop(shared); // before replying: the reply may let the caller drop the target
            let _ = reply.send(result);
        });
        Ok(PendingRound { reply: rx })
    }

    /// Upload a round and wait for it.
    pub fn spill(&self, objects: Vec<SpillObject>) -> Result<Vec<RemoteSpillLocation>> {
        self.submit(objects)?.wait()
    }

    /// Upload a round from async code (no backpressure slot: the caller awaits it).
    pub async fn spill_async(&self, objects: Vec<SpillObject>) -> Result<Vec<RemoteSpillLocation>> {
        let shared = self.shared.clone();
        self.shared
            .runtime()
            .spawn(async move { write_round(&shared, objects).await })
            .await
            .map_err(|_| SpillError::InvalidArgument("internal error: spill task failed".into()))?
    }

    pub fn stats(&self) -> RemoteSpillStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RemoteSpillStats {
            rounds: get(&c.rounds),
            failed_rounds: get(&c.failed_rounds),
            objects_spilled: get(&c.objects_spilled),
            bytes_spilled: get(&c.bytes_spilled),
            single_puts: get(&c.single_puts),
            multipart_uploads: get(&c.multipart_uploads),
            parts_uploaded: get(&c.parts_uploaded),
            aborted_uploads: get(&c.aborted_uploads),
            remote_objects_deleted: get(&c.remote_objects_deleted),
            stale_objects_removed: get(&c.stale_objects_removed),
            objects_restored: get(&c.objects_restored),
            bytes_restored: get(&c.bytes_restored),
            get_requests: get(&c.get_requests),
        }
    }

    /// Wait until every remote object whose locations were all dropped has been deleted (or
    /// `timeout` passed). Returns whether none is pending.
    pub fn wait_for_deletes(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.shared.pending_deletes.load(Ordering::Acquire) > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}
