//! [`SpillArea`]: spill directories, the I/O pool that writes spill rounds, restores, and
//! the lifetime of spill files.

use std::fs::{self, File};
use std::io::IoSliceMut;
use std::ops::{Deref, Range};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::Sender;

use forebay_io::durable::process_alive;

use crate::error::{Result, SpillError};
use crate::format::{align_up, check_head, check_payload, length_table, padding, Header};
use crate::location::{ObjectExtent, PendingRound};
use crate::round_file::{write_objects, PlannedObject};
use crate::vectored::read_exact_vectored_at;

/// When spilled bytes are forced to stable storage. With `PerFile` and `PerObject` the
/// writer also starts the device's writeback every few MiB while it writes, so the final
/// `fdatasync` waits only for the tail (see `round_file`); with `None` nothing is forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Never: the kernel writes back when it likes. A machine crash can lose spilled
    /// objects, which is fine for spill (its objects die with the process anyway).
    None,
    /// `fdatasync` once per spill file, after its last object: a round is durable when
    /// `spill` returns.
    PerFile,
    /// `fdatasync` after every object: each object is durable before the next is written.
    PerObject,
}

/// How a spill round picks its directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectoryChoice {
    /// Directories in turn.
    RoundRobin,
    /// The directory whose file system has the most free space (`statvfs`) right now.
    MostFreeSpace,
}

/// Configuration of a [`SpillArea`].
#[derive(Debug, Clone)]
pub struct SpillConfig {
    directories: Vec<PathBuf>,
    sync: SyncPolicy,
    choice: DirectoryChoice,
    io_threads: usize,
    queue_depth: usize,
}

impl SpillConfig {
    /// Spill into these directories (created 0700 if missing).
    pub fn new<I, P>(directories: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        SpillConfig {
            directories: directories.into_iter().map(Into::into).collect(),
            sync: SyncPolicy::None,
            choice: DirectoryChoice::RoundRobin,
            io_threads: 2,
            queue_depth: 4,
        }
    }

    /// Durability policy (default [`SyncPolicy::None`]).
    pub fn with_sync(mut self, sync: SyncPolicy) -> Self {
        self.sync = sync;
        self
    }

    /// Directory choice (default round robin).
    pub fn with_directory_choice(mut self, choice: DirectoryChoice) -> Self {
        self.choice = choice;
        self
    }

    /// Threads writing spill rounds (default 2).
    pub fn with_io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads;
        self
    }

    /// Spill rounds that may wait for an I/O thread before `submit` blocks (default 4).
    pub fn with_queue_depth(mut self, depth: usize) -> Self {
        self.queue_depth = depth;
        self
    }
}

/// One object to spill: the caller's id and its buffers, written as they are.
#[derive(Debug, Clone, Default)]
pub struct SpillObject {
    pub id: u64,
    pub buffers: Vec<Bytes>,
}

#[derive(Default)]
struct Counters {
    rounds: AtomicU64,
    failed_rounds: AtomicU64,
    objects_spilled: AtomicU64,
    bytes_spilled: AtomicU64,
    files_created: AtomicU64,
    files_deleted: AtomicU64,
    stale_files_removed: AtomicU64,
    objects_restored: AtomicU64,
    bytes_restored: AtomicU64,
}

/// Counters of a spill area since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    pub rounds: u64,
    pub failed_rounds: u64,
    pub objects_spilled: u64,
    /// Payload bytes (buffers only, no headers or padding).
    pub bytes_spilled: u64,
    pub files_created: u64,
    pub files_deleted: u64,
    /// Spill files of dead processes removed when the area opened.
    pub stale_files_removed: u64,
    pub objects_restored: u64,
    pub bytes_restored: u64,
}

/// A spill file. It is deleted when the last [`SpillLocation`] in it is dropped.
pub struct SpillFile {
    path: PathBuf,
    file: File,
    size: u64,
    counters: Arc<Counters>,
}

impl SpillFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        if fs::remove_file(&self.path).is_ok() {
            self.counters.files_deleted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for SpillFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpillFile({}, {} bytes)", self.path.display(), self.size)
    }
}

/// Where a spilled object lives: its [`ObjectExtent`] (which it dereferences to) in a spill
/// file. Cloning is cheap; the object is freed (and its file deleted once all its objects
/// are) when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct SpillLocation {
    file: Arc<SpillFile>,
    extent: ObjectExtent,
}

impl SpillLocation {
    pub fn path(&self) -> &Path {
        &self.file.path
    }
}

impl Deref for SpillLocation {
    type Target = ObjectExtent;
    fn deref(&self) -> &ObjectExtent {
        &self.extent
    }
}

/// A spilled object mapped read-only: its buffers, in place, as cheap `Bytes` handles that
/// keep the mapping alive.
#[derive(Debug, Clone)]
pub struct MappedObject {
    mapping: Bytes,
    ranges: Vec<Range<usize>>,
}

impl MappedObject {
    pub fn num_buffers(&self) -> usize {
        self.ranges.len()
    }
    /// Buffer `i` (64-byte aligned in memory).
    pub fn buffer(&self, i: usize) -> Bytes {
        self.mapping.slice(self.ranges[i].clone())
    }
    pub fn buffers(&self) -> Vec<Bytes> {
        (0..self.ranges.len()).map(|i| self.buffer(i)).collect()
    }
}

struct Job {
    objects: Vec<SpillObject>,
    reply: Sender<Result<Vec<SpillLocation>>>,
}

struct Shared {
    directories: Vec<PathBuf>,
    sync: SyncPolicy,
    choice: DirectoryChoice,
    next_directory: AtomicUsize,
    counters: Arc<Counters>,
}

/// A spill round submitted to a [`SpillArea`]'s I/O threads.
pub type PendingSpill = PendingRound<SpillLocation>;

/// Spill directories plus the I/O threads that write to them.
///
/// Each [`SpillArea::submit`] is one *spill round*: its objects go into one new file with one
/// vectored write (or one per object with [`SyncPolicy::PerObject`]). The queue in front of
/// the I/O threads is bounded, so a producer that spills faster than the disk writes blocks
/// in `submit` instead of piling rounds up in memory.
///
/// ```
/// use bytes::Bytes;
/// use forebay_spill::{SpillArea, SpillConfig, SpillObject};
///
/// let dir = std::env::temp_dir().join(format!("forebay-doc-spill-{}", std::process::id()));
/// let area = SpillArea::open(SpillConfig::new([&dir]))?;
/// let header = Bytes::from_static(b"header");
/// let body = Bytes::from(vec![7u8; 4096]);
/// let locations = area.spill(vec![SpillObject { id: 1, buffers: vec![header, body] }])?;
/// let (mut a, mut b) = (vec![0u8; 6], vec![0u8; 4096]);
/// area.restore_into(&locations[0], &mut [&mut a[..], &mut b[..]])?; // checksums verified
/// assert_eq!((&a[..], b[0]), (&b"header"[..], 7));
/// drop(locations); // the file's last object: the file is deleted
/// # drop(area);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SpillArea {
    shared: Arc<Shared>,
    queue: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

fn io_error<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> SpillError + 'a {
    move |source| SpillError::Io {
        path: path.to_path_buf(),
        action,
        source,
    }
}

/// Unique spill file names across all areas of this process.
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

fn spill_file_name(seq: u64) -> String {
    format!("forebay-{}-{seq}.spill", std::process::id())
}

/// The writer pid of a spill file name of ours.
fn spill_file_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("forebay-")?.strip_suffix(".spill")?;
    rest.split_once('-')?.0.parse().ok()
}

fn free_space(dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` points to writable memory
    // of the right type; statvfs only writes into it.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let stat = unsafe { stat.assume_init() };
    // The field types differ between platforms (u64 on x86_64 glibc, u32 on some 32-bit
    // targets), so the casts are only redundant here.
    #[allow(clippy::unnecessary_cast)]
    let available = stat.f_bavail as u64 * stat.f_frsize as u64;
    available
}

impl SpillArea {
    /// Create the directories (0700) if needed, remove spill files left there by dead
    /// processes, and start the I/O threads.
    pub fn open(config: SpillConfig) -> Result<SpillArea> {
        if config.directories.is_empty() {
            return Err(SpillError::InvalidArgument(
                "no spill directory given".into(),
            ));
        }
        if config.io_threads == 0 || config.queue_depth == 0 {
            return Err(SpillError::InvalidArgument(
                "io_threads and queue_depth must be at least 1".into(),
            ));
        }
        let counters = Arc::new(Counters::default());
        for dir in &config.directories {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_error(dir, "create spill directory"))?;
            let entries = fs::read_dir(dir).map_err(io_error(dir, "list spill directory"))?;
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(spill_file_pid) else {
                    continue;
                };
                if pid != std::process::id()
                    && !process_alive(pid)
                    && fs::remove_file(entry.path()).is_ok()
                {
                    counters.stale_files_removed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let shared = Arc::new(Shared {
            directories: config.directories,
            sync: config.sync,
            choice: config.choice,
            next_directory: AtomicUsize::new(0),
            counters,
        });
        let (tx, rx) = crossbeam_channel::bounded::<Job>(config.queue_depth);
        let workers = (0..config.io_threads)
            .map(|i| {
                let rx = rx.clone();
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(forebay_io::threads::thread_name(&format!("spill-{i}")))
                    .spawn(move || {
                        for job in rx {
                            let result =
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                    shared.write_round(&job.objects)
                                }))
                                .unwrap_or_else(|_| {
                                    Err(SpillError::InvalidArgument(
                                        "internal error: spill writer panicked".into(),
                                    ))
                                });
                            let _ = job.reply.send(result);
                        }
                    })
                    .map_err(|e| SpillError::Io {
                        path: PathBuf::from("<thread>"),
                        action: "start spill I/O thread",
                        source: e,
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SpillArea {
            shared,
            queue: Some(tx),
            workers,
        })
    }

    /// Queue a spill round. Blocks while the queue is full (backpressure).
    pub fn submit(&self, objects: Vec<SpillObject>) -> Result<PendingSpill> {
        let (reply, rx) = crossbeam_channel::bounded(1);
        self.queue
            .as_ref()
            .ok_or(SpillError::Closed)?
            .send(Job { objects, reply })
            .map_err(|_| SpillError::Closed)?;
        Ok(PendingRound { reply: rx })
    }

    /// Spill a round and wait for it.
    pub fn spill(&self, objects: Vec<SpillObject>) -> Result<Vec<SpillLocation>> {
        self.submit(objects)?.wait()
    }

    /// Read the object's header and length table and check them against the location.
    fn verify_header(&self, loc: &SpillLocation) -> Result<()> {
        let path = loc.path();
        let file_len = loc
            .file
            .file
            .metadata()
            .map_err(io_error(path, "stat spill file"))?
            .len();
        if file_len < loc.end() {
            return Err(SpillError::Truncated {
                path: path.to_path_buf(),
                offset: loc.offset,
                needed: loc.len,
            });
        }
        let mut head = vec![0u8; loc.head_len() as usize];
        loc.file
            .file
            .read_exact_at(&mut head, loc.offset)
            .map_err(io_error(path, "read spilled object header"))?;
        check_head(&head, &loc.buffer_lens, loc.object_id).map_err(|reason| {
            SpillError::Corrupt {
                path: path.to_path_buf(),
                offset: loc.offset,
                reason,
            }
        })?;
        Ok(())
    }

    fn checksum_of(&self, loc: &SpillLocation) -> Result<u64> {
        let mut h = [0u8; 8];
        loc.file
            .file
            .read_exact_at(&mut h, loc.offset + 24)
            .map_err(io_error(loc.path(), "read spilled object header"))?;
        Ok(u64::from_le_bytes(h))
    }

    /// Restore the object into memory the caller provides: `destinations[i]` receives buffer
    /// `i` and must have exactly its length. One `preadv` (per `IOV_MAX` buffers) reads
    /// straight into them; the checksum is then verified, so on error the destinations'
    /// contents are unspecified but never silently wrong.
    pub fn restore_into(&self, loc: &SpillLocation, destinations: &mut [&mut [u8]]) -> Result<()> {
        let path = loc.path();
        let lens: Vec<u64> = destinations.iter().map(|d| d.len() as u64).collect();
        if lens.as_slice() != loc.buffer_lens() {
            return Err(SpillError::DestinationMismatch {
                path: path.to_path_buf(),
                offset: loc.offset,
                reason: format!(
                    "buffers are {:?} bytes, destinations {lens:?}",
                    loc.buffer_lens
                ),
            });
        }
        self.verify_header(loc)?;
        let pads: usize = loc.buffer_lens.iter().map(|l| padding(*l)).sum();
        let mut pad_sink = vec![0u8; pads];
        let mut slices = Vec::with_capacity(2 * destinations.len());
        let mut pad_rest: &mut [u8] = &mut pad_sink;
        for dest in destinations.iter_mut() {
            let pad = padding(dest.len() as u64);
            slices.push(IoSliceMut::new(dest));
            let (this_pad, rest) = std::mem::take(&mut pad_rest).split_at_mut(pad);
            pad_rest = rest;
            if pad > 0 {
                slices.push(IoSliceMut::new(this_pad));
            }
        }
        read_exact_vectored_at(&loc.file.file, &mut slices, loc.offset + loc.head_len()).map_err(
            |e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => SpillError::Truncated {
                    path: path.to_path_buf(),
                    offset: loc.offset,
                    needed: loc.len,
                },
                _ => SpillError::Io {
                    path: path.to_path_buf(),
                    action: "read spilled object",
                    source: e,
                },
            },
        )?;
        drop(slices);
        let padding_clean = pad_sink.iter().all(|b| *b == 0);
        self.verify_payload(loc, padding_clean, destinations.iter().map(|d| &**d))
    }

    /// Check a restored object's padding and payload checksum, then count the restore.
    fn verify_payload<'a>(
        &self,
        loc: &SpillLocation,
        padding_clean: bool,
        buffers: impl Iterator<Item = &'a [u8]>,
    ) -> Result<()> {
        check_payload(
            &loc.buffer_lens,
            self.checksum_of(loc)?,
            padding_clean,
            buffers,
        )
        .map_err(|reason| SpillError::Corrupt {
            path: loc.path().to_path_buf(),
            offset: loc.offset,
            reason,
        })?;
        let c = &self.shared.counters;
        c.objects_restored.fetch_add(1, Ordering::Relaxed);
        c.bytes_restored
            .fetch_add(loc.payload_len(), Ordering::Relaxed);
        Ok(())
    }

    /// Restore into freshly allocated buffers (convenience over [`SpillArea::restore_into`]).
    pub fn restore(&self, loc: &SpillLocation) -> Result<Vec<Vec<u8>>> {
        let mut out: Vec<Vec<u8>> = loc
            .buffer_lens
            .iter()
            .map(|l| vec![0u8; *l as usize])
            .collect();
        let mut dests: Vec<&mut [u8]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        self.restore_into(loc, &mut dests)?;
        Ok(out)
    }

    /// Map the object read-only (zero copy) after verifying its checksum over the mapping.
    pub fn map(&self, loc: &SpillLocation) -> Result<MappedObject> {
        self.verify_header(loc)?;
        let path = loc.path();
        let page = page_size();
        let start = loc.offset / page * page;
        let map_len = (loc.end() - start) as usize;
        // SAFETY: the mapping is read-only over a spill file this process created (0600, in
        // a 0700 directory) and never writes again; its length was checked above to cover
        // the whole object, so no access past the end of the file (SIGBUS) can happen unless
        // someone else truncates our private file, which is outside the contract.
        let mapping = unsafe {
            memmap2::MmapOptions::new()
                .offset(start)
                .len(map_len)
                .map(&loc.file.file)
        }
        .map_err(io_error(path, "map spill file"))?;
        let mapping = Bytes::from_owner(mapping);
        let mut ranges = Vec::with_capacity(loc.buffer_lens.len());
        let mut at = (loc.offset - start + loc.head_len()) as usize;
        for len in loc.buffer_lens.iter() {
            ranges.push(at..at + *len as usize);
            at += align_up(*len) as usize;
        }
        let padding_clean = ranges.iter().all(|r| {
            let pad_end = r.start + align_up((r.end - r.start) as u64) as usize;
            mapping[r.end..pad_end].iter().all(|b| *b == 0)
        });
        self.verify_payload(
            loc,
            padding_clean,
            ranges.iter().map(|r| &mapping[r.clone()]),
        )?;
        Ok(MappedObject { mapping, ranges })
    }

    pub fn stats(&self) -> SpillStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SpillStats {
            rounds: get(&c.rounds),
            failed_rounds: get(&c.failed_rounds),
            objects_spilled: get(&c.objects_spilled),
            bytes_spilled: get(&c.bytes_spilled),
            files_created: get(&c.files_created),
            files_deleted: get(&c.files_deleted),
            stale_files_removed: get(&c.stale_files_removed),
            objects_restored: get(&c.objects_restored),
            bytes_restored: get(&c.bytes_restored),
        }
    }

    pub fn directories(&self) -> &[PathBuf] {
        &self.shared.directories
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

impl Drop for SpillArea {
    fn drop(&mut self) {
        self.queue = None; // workers drain the queue, then their loops end
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Shared {
    fn choose_directory(&self) -> &Path {
        let dirs = &self.directories;
        let i = match self.choice {
            DirectoryChoice::RoundRobin => {
                self.next_directory.fetch_add(1, Ordering::Relaxed) % dirs.len()
            }
            DirectoryChoice::MostFreeSpace => (0..dirs.len())
                .max_by_key(|i| free_space(&dirs[*i]))
                .unwrap_or(0),
        };
        &dirs[i]
    }

    /// Write one round into a new file. On error the partial file is removed and no location
    /// is returned.
    fn write_round(&self, objects: &[SpillObject]) -> Result<Vec<SpillLocation>> {
        let path = self
            .choose_directory()
            .join(spill_file_name(NEXT_FILE.fetch_add(1, Ordering::Relaxed)));
        let result = self.write_file(&path, objects);
        let c = &self.counters;
        match result {
            Ok(locations) => {
                c.rounds.fetch_add(1, Ordering::Relaxed);
                c.objects_spilled
                    .fetch_add(objects.len() as u64, Ordering::Relaxed);
                c.bytes_spilled.fetch_add(
                    locations.iter().map(|l| l.payload_len()).sum::<u64>(),
                    Ordering::Relaxed,
                );
                Ok(locations)
            }
            Err(e) => {
                c.failed_rounds.fetch_add(1, Ordering::Relaxed);
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    fn write_file(&self, path: &Path, objects: &[SpillObject]) -> Result<Vec<SpillLocation>> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io_error(path, "create spill file"))?;
        // Plan the file (each object's extent, header and length table), then write it; see
        // `round_file` for how the checksum and the device's writeback overlap the write.
        let mut planned = Vec::with_capacity(objects.len());
        let mut extents = Vec::with_capacity(objects.len());
        let mut size = 0u64;
        for object in objects {
            let buffer_lens: Vec<u64> = object.buffers.iter().map(|b| b.len() as u64).collect();
            let header = Header {
                buffer_count: u32::try_from(object.buffers.len()).map_err(|_| {
                    SpillError::InvalidArgument(format!(
                        "object {} has {} buffers, more than 2^32",
                        object.id,
                        object.buffers.len()
                    ))
                })?,
                payload_len: buffer_lens.iter().sum(),
                checksum: 0,
                object_id: object.id,
            };
            planned.push(PlannedObject {
                offset: size,
                header,
                table: length_table(&buffer_lens),
                buffers: &object.buffers,
            });
            let extent = ObjectExtent::new(size, object.id, buffer_lens.into());
            size = extent.end();
            extents.push(extent);
        }
        let flush_each = self.sync == SyncPolicy::PerObject;
        write_objects(&file, &planned, flush_each, self.sync != SyncPolicy::None)
            .map_err(io_error(path, "write spill file"))?;
        if self.sync == SyncPolicy::PerFile {
            file.sync_data()
                .map_err(io_error(path, "fdatasync spill file"))?;
        }
        self.counters.files_created.fetch_add(1, Ordering::Relaxed);
        let spill_file = Arc::new(SpillFile {
            path: path.to_path_buf(),
            file,
            size,
            counters: self.counters.clone(),
        });
        Ok(extents
            .into_iter()
            .map(|extent| SpillLocation {
                file: spill_file.clone(),
                extent,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(
            spill_file_pid(&spill_file_name(3)),
            Some(std::process::id())
        );
        assert_eq!(spill_file_pid("other.spill"), None);
    }
}
