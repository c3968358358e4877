//! forebay-store: a memory-mapped object store. Blocks between the reader, the user's
//! function and the writer live here: addressable by id, read without copying or
//! deserialising, shared with other processes of the same user, and moved to disk
//! (through forebay-spill) when the store is full.
//!
//! Owns: the arena (a fixed-capacity file mapped shared, in `/dev/shm` by default), the
//! allocator, the object table (id → region, state, pins), LRU eviction and restore, and
//! cross-process attach. Does not own: spill file formats (forebay-spill), deciding what
//! the engine keeps in memory (forebay-engine), any file format other than its own.
//!
//! ```text
//!  put(bytes | Arrow) ─ one copy ─▶ ┌──────── arena (mmap, /dev/shm) ────────┐
//!  create(n) → write → seal ──────▶ │ [obj][obj]   [obj]      [obj]  free    │
//!                                   └──┬───────────────────────────▲───────┘
//!  get(id) → PinnedObject / RecordBatches ◀┘ views into the mapping │
//!                  over the cap: LRU unpinned objects ─▶ forebay-spill ─┘ restore on get
//! ```
//!
//! # Design
//! * **One owner process, attached clients.** The process that creates the store owns the
//!   object table and the allocator, in its own memory. Other processes `attach`: they map
//!   the same arena file and talk to the owner over a Unix socket in the store directory
//!   (allocate, seal, pin, unpin, delete); object bytes never cross the socket. The owner
//!   tracks each connection's pins and unsealed objects; when a client dies, even by
//!   SIGKILL, the kernel closes its socket and the owner releases everything it held. No
//!   lock lives in shared memory, so nothing can be left locked or half-updated. If the owner
//!   dies, clients get [`StoreError::OwnerGone`] (views they hold stay readable).
//! * **Object layout.** Each object is one 64-aligned region: a 64-byte header (magic, id,
//!   format, lengths), caller metadata, then the data at a 64-byte boundary
//!   ([`layout`]). Arrow values are stored as a complete Arrow IPC stream, written with one
//!   copy of each buffer and read in place ([`ipc`]).
//! * **Pins.** [`get`](ObjectStore::get) returns a [`PinnedObject`]; Arrow arrays, `Bytes` and
//!   Python views made from it hold the pin, and the region can neither move nor be evicted
//!   nor freed until the last of them is dropped. `delete` of a pinned object frees it at the
//!   last unpin.
//! * **Memory cap.** The arena's capacity is the cap. When an allocation does not fit, the
//!   least recently used unpinned objects are spilled and their regions freed; `get` of a
//!   spilled object restores it (checksum verified). If everything resident is pinned, the
//!   put waits up to the put timeout, then fails with [`StoreError::Full`].
//! * **Security.** The store directory is created 0700, its files 0600; `attach` refuses a
//!   directory or file owned by another uid or open to others, and the owner refuses socket
//!   peers of another uid. Object ids are 128-bit numbers, never file names.
//!
//! # Example
//! ```
//! use forebay_store::{ObjectStore, StoreConfig};
//! let store = ObjectStore::new(StoreConfig::new(64 << 20)).unwrap();
//! let id = store.put_bytes(b"", &[b"hello ", b"world"]).unwrap();
//! let obj = store.get(id).unwrap();          // pinned while `obj` lives
//! assert_eq!(obj.data(), b"hello world");
//! // Another process: ObjectStore::attach(store.path())?.get(id)
//! ```

pub mod arena;
mod client;
mod error;
pub mod ipc;
pub mod layout;
mod owner;
mod protocol;
mod server;

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_schema::{Schema, SchemaRef};
use bytes::Bytes;
use forebay_spill::{SpillArea, SpillConfig};

use crate::arena::Arena;
use crate::client::ClientCore;
pub use crate::error::{ErrorKind, Result, StoreError};
pub use crate::layout::{Format, ObjectHeader, ObjectId};
use crate::owner::{Creator, OwnerCore};
use crate::server::Server;

/// Name of the arena file inside the store directory.
pub const ARENA_FILE: &str = "arena";
/// Name of the owner's socket inside the store directory.
pub const SOCKET_FILE: &str = "store.sock";

/// Configuration of a new store (the owner side).
#[derive(Debug, Clone)]
pub struct StoreConfig {
    dir: Option<PathBuf>,
    capacity: usize,
    spill_dirs: Option<Vec<PathBuf>>,
    spill: bool,
    put_timeout: Duration,
    prefault: bool,
}

impl StoreConfig {
    /// A store of `capacity` bytes in a new directory under `/dev/shm`, spilling to a
    /// directory under the system temp dir, with a 10 s put timeout.
    pub fn new(capacity: usize) -> StoreConfig {
        StoreConfig {
            dir: None,
            capacity,
            spill_dirs: None,
            spill: true,
            put_timeout: Duration::from_secs(10),
            prefault: false,
        }
    }

    /// Put the store in this directory (created 0700; may exist if private and empty or
    /// holding a dead store's files). Use a tmpfs directory to keep objects in memory.
    pub fn with_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// Spill evicted objects into these directories.
    pub fn with_spill_dirs<I, P>(mut self, dirs: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<PathBuf>,
    {
        self.spill_dirs = Some(dirs.into_iter().map(Into::into).collect());
        self.spill = true;
        self
    }

    /// Never spill: a full store makes puts wait, then fail.
    pub fn without_spill(mut self) -> Self {
        self.spill = false;
        self
    }

    /// How long a put waits for room when everything resident is pinned.
    pub fn with_put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = timeout;
        self
    }

    /// Touch every page of the arena at creation, so that first writes run at memcpy
    /// speed (commits the whole capacity up front).
    pub fn with_prefault(mut self, prefault: bool) -> Self {
        self.prefault = prefault;
        self
    }
}

/// A snapshot of the store's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub capacity: u64,
    /// Bytes of the arena allocated to objects (64-byte granularity, headers included).
    pub bytes_used: u64,
    pub free_extents: u64,
    pub largest_free: u64,
    /// Sealed, not deleted objects (resident or on disk).
    pub objects: u64,
    pub resident_objects: u64,
    pub objects_on_disk: u64,
    pub pinned_objects: u64,
    pub puts: u64,
    /// Objects (and bytes) written to spill files since the store opened.
    pub spilled_objects: u64,
    pub spilled_bytes: u64,
    pub restored_objects: u64,
    pub restored_bytes: u64,
    /// Regions freed by eviction (a re-eviction of an object with a disk copy costs no I/O).
    pub evictions: u64,
}

impl StoreStats {
    const FIELDS: usize = 14;

    fn as_array(&self) -> [u64; Self::FIELDS] {
        [
            self.capacity,
            self.bytes_used,
            self.free_extents,
            self.largest_free,
            self.objects,
            self.resident_objects,
            self.objects_on_disk,
            self.pinned_objects,
            self.puts,
            self.spilled_objects,
            self.spilled_bytes,
            self.restored_objects,
            self.restored_bytes,
            self.evictions,
        ]
    }

    pub(crate) fn to_le_bytes(self) -> Vec<u8> {
        self.as_array()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    pub(crate) fn from_le_bytes(b: &[u8]) -> Option<StoreStats> {
        if b.len() < Self::FIELDS * 8 {
            return None;
        }
        let v = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        Some(StoreStats {
            capacity: v(0),
            bytes_used: v(1),
            free_extents: v(2),
            largest_free: v(3),
            objects: v(4),
            resident_objects: v(5),
            objects_on_disk: v(6),
            pinned_objects: v(7),
            puts: v(8),
            spilled_objects: v(9),
            spilled_bytes: v(10),
            restored_objects: v(11),
            restored_bytes: v(12),
            evictions: v(13),
        })
    }

    /// (name, value) pairs, for bindings.
    pub fn fields(&self) -> [(&'static str, u64); Self::FIELDS] {
        let names = [
            "capacity",
            "bytes_used",
            "free_extents",
            "largest_free",
            "objects",
            "resident_objects",
            "objects_on_disk",
            "pinned_objects",
            "puts",
            "spilled_objects",
            "spilled_bytes",
            "restored_objects",
            "restored_bytes",
            "evictions",
        ];
        let values = self.as_array();
        std::array::from_fn(|i| (names[i], values[i]))
    }
}

/// Owner or attached: the two ways a handle reaches the object table.
#[derive(Clone)]
enum Backend {
    Owner(Arc<OwnerCore>),
    Client(Arc<ClientCore>),
}

impl Backend {
    fn arena(&self) -> &Arc<Arena> {
        match self {
            Backend::Owner(c) => c.arena(),
            Backend::Client(c) => c.arena(),
        }
    }
    fn dir(&self) -> &Path {
        match self {
            Backend::Owner(c) => c.dir(),
            Backend::Client(c) => c.dir(),
        }
    }
    fn create(
        &self,
        format: Format,
        meta_len: usize,
        data_len: usize,
    ) -> Result<(ObjectId, usize)> {
        match self {
            Backend::Owner(c) => c.create(format, meta_len, data_len, Creator::Local),
            Backend::Client(c) => c.create(format, meta_len, data_len),
        }
    }
    fn seal(&self, id: ObjectId) -> Result<()> {
        match self {
            Backend::Owner(c) => c.seal(id, Creator::Local),
            Backend::Client(c) => c.seal(id),
        }
    }
    fn abort(&self, id: ObjectId) {
        match self {
            Backend::Owner(c) => c.abort(id, Creator::Local),
            Backend::Client(c) => c.abort(id),
        }
    }
    fn pin(&self, id: ObjectId) -> Result<usize> {
        match self {
            Backend::Owner(c) => c.pin(id),
            Backend::Client(c) => c.pin(id),
        }
    }
    fn unpin(&self, id: ObjectId) {
        match self {
            Backend::Owner(c) => c.unpin(id),
            Backend::Client(c) => c.unpin(id),
        }
    }
}

/// The pin on one object: while it lives the object's region stays where it is.
struct Pin {
    backend: Backend,
    id: ObjectId,
    offset: usize,
    header: ObjectHeader,
    /// Process that took the pin: a forked child that inherited the view must not release
    /// the parent's pin (it would share the parent's socket to the owner).
    pid: u32,
}

// A pin is only ever dropped or read (its fields are immutable after creation); a panic
// elsewhere cannot leave it in a state that matters. Arrow's custom allocations ask for it.
impl std::panic::RefUnwindSafe for Pin {}

impl Drop for Pin {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            self.backend.unpin(self.id);
        }
    }
}

/// A sealed object, pinned in memory. Views made from it (`Bytes`, Arrow buffers and
/// arrays) keep the pin alive on their own.
#[derive(Clone)]
pub struct PinnedObject {
    pin: Arc<Pin>,
}

/// A slice of a pinned object that owns its pin (backs `Bytes`).
struct PinnedSlice {
    pin: Arc<Pin>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for PinnedSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the region is sealed (immutable) and pinned by `self.pin`.
        unsafe { self.pin.backend.arena().slice(self.start, self.len) }
    }
}

impl std::fmt::Debug for PinnedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedObject")
            .field("id", &self.pin.id)
            .field("offset", &self.pin.offset)
            .field("header", &self.pin.header)
            .finish()
    }
}

impl PinnedObject {
    pub fn id(&self) -> ObjectId {
        self.pin.id
    }

    pub fn format(&self) -> Format {
        self.pin.header.format
    }

    pub fn header(&self) -> &ObjectHeader {
        &self.pin.header
    }

    fn region(&self, start: usize, len: usize) -> &[u8] {
        // SAFETY: the region is sealed (immutable) and pinned by `self.pin` for as long as
        // `self` (and so the returned borrow) lives.
        unsafe { self.pin.backend.arena().slice(self.pin.offset + start, len) }
    }

    /// The metadata given at put/create.
    pub fn meta(&self) -> &[u8] {
        let h = &self.pin.header;
        self.region(h.meta_offset(), h.meta_len)
    }

    /// The object's data (64-byte aligned).
    pub fn data(&self) -> &[u8] {
        let h = &self.pin.header;
        self.region(h.data_offset(), h.data_len)
    }

    /// The data as `Bytes` that hold the pin.
    pub fn data_bytes(&self) -> Bytes {
        let h = &self.pin.header;
        Bytes::from_owner(PinnedSlice {
            pin: self.pin.clone(),
            start: self.pin.offset + h.data_offset(),
            len: h.data_len,
        })
    }

    /// The data as an Arrow buffer that holds the pin.
    pub fn data_buffer(&self) -> Buffer {
        let h = &self.pin.header;
        let ptr = self
            .pin
            .backend
            .arena()
            .ptr(self.pin.offset + h.data_offset());
        let ptr = NonNull::new(ptr).expect("mapping addresses are not null");
        // SAFETY: ptr..ptr+data_len is inside the mapping, sealed (never written again) and
        // stays mapped and in place while the pin (the allocation owner) lives.
        unsafe { Buffer::from_custom_allocation(ptr, h.data_len, self.pin.clone()) }
    }

    /// Read an Arrow object: its schema and record batches, with buffers in the mapping.
    pub fn record_batches(&self) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        if self.format() != Format::ArrowIpc {
            return Err(StoreError::Invalid {
                path: self.pin.backend.dir().to_path_buf(),
                reason: format!("object {} holds bytes, not an Arrow value", self.id()),
            });
        }
        ipc::decode(&self.data_buffer()).map_err(|source| StoreError::Arrow {
            path: self.pin.backend.dir().to_path_buf(),
            id: self.id(),
            source,
        })
    }
}

/// An object being written in place (`create` → write → `seal`). Dropped unsealed, its
/// memory is freed.
pub struct ObjectWriter {
    backend: Backend,
    header: ObjectHeader,
    offset: usize,
    sealed: bool,
    /// Process that created it (see `Pin::pid`).
    pid: u32,
}

impl ObjectWriter {
    pub fn id(&self) -> ObjectId {
        self.header.id
    }

    pub fn header(&self) -> &ObjectHeader {
        &self.header
    }

    /// The data region to fill (its initial contents are unspecified).
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (start, len) = (
            self.offset + self.header.data_offset(),
            self.header.data_len,
        );
        // SAFETY: the region is allocated to this writer alone until it is sealed or
        // aborted; `&mut self` makes this the only live slice of it.
        unsafe { self.backend.arena().slice_mut(start, len) }
    }

    fn meta_mut(&mut self) -> &mut [u8] {
        let (start, len) = (
            self.offset + self.header.meta_offset(),
            self.header.meta_len,
        );
        // SAFETY: as in `data_mut`.
        unsafe { self.backend.arena().slice_mut(start, len) }
    }

    /// Make the object immutable and visible to `get`.
    pub fn seal(mut self) -> Result<ObjectId> {
        self.backend.seal(self.header.id)?;
        self.sealed = true;
        Ok(self.header.id)
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if !self.sealed && std::process::id() == self.pid {
            self.backend.abort(self.header.id);
        }
    }
}

/// A handle on an object store: the owner (created with [`ObjectStore::new`]) or an attached
/// process ([`ObjectStore::attach`]). Methods are the same on both.
pub struct ObjectStore {
    backend: Backend,
    /// The owner's socket server (None when attached). Dropped first: stops serving.
    server: Option<Server>,
    dir: PathBuf,
    /// Process that opened this handle; a forked child must attach instead.
    pid: u32,
}

fn io_err<'a>(
    path: &'a Path,
    context: &'static str,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        context,
        source,
    }
}

fn random_nonce() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let local = 0u8;
    let mut seed = Vec::with_capacity(40);
    seed.extend_from_slice(&t.to_le_bytes());
    seed.extend_from_slice(&std::process::id().to_le_bytes());
    seed.extend_from_slice(&(&local as *const u8 as usize).to_le_bytes());
    static STORES_OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = STORES_OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    seed.extend_from_slice(&n.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&seed) | 1
}

/// Prepare the store directory: create it 0700, or reuse a private one that holds no live
/// store (a dead owner's files are removed).
fn prepare_dir(dir: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            // Parents may be missing: create them, then the store directory itself.
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|_| e)
                .map_err(io_err(dir, "creating the store directory"))?;
            return Ok(());
        }
    }
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir).map_err(io_err(dir, "inspecting the store directory"))?;
    if !meta.is_dir() || meta.uid() != server::euid() || meta.mode() & 0o077 != 0 {
        return Err(StoreError::Invalid {
            path: dir.to_path_buf(),
            reason: format!(
                "exists and is not a private directory of ours (uid {}, mode {:o}); use a new \
                 path",
                meta.uid(),
                meta.mode() & 0o7777
            ),
        });
    }
    let socket = dir.join(SOCKET_FILE);
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        return Err(StoreError::Invalid {
            path: dir.to_path_buf(),
            reason: "a live store already uses this directory; attach to it instead".into(),
        });
    }
    for name in [SOCKET_FILE, ARENA_FILE] {
        match fs::remove_file(dir.join(name)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(dir, "removing a dead store's files")(e)),
        }
    }
    Ok(())
}

/// Remove the default-placed stores (`<base>/forebay-store-<pid>-<nonce>`) of this user
/// whose owner is dead: a process killed with SIGKILL (or SIGTERM without a handler) cannot
/// remove its own, and each holds a sparse arena file in `/dev/shm` (memory, once written).
/// A store counts as dead only when its owner's pid is gone and its socket accepts no
/// connection; anything unexpected is left alone.
fn reclaim_dead_stores(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_prefix("forebay-store-"))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(_, nonce)| nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let ours =
            fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == server::euid());
        let owner_alive = owner == std::process::id()
            || !cfg!(target_os = "linux")
            || Path::new("/proc").join(owner.to_string()).exists();
        if !ours || owner_alive {
            continue;
        }
        if std::os::unix::net::UnixStream::connect(dir.join(SOCKET_FILE)).is_ok() {
            continue; // served after all (another pid namespace)
        }
        for file in [SOCKET_FILE, ARENA_FILE] {
            let _ = fs::remove_file(dir.join(file));
        }
        let _ = fs::remove_dir(&dir);
    }
}

impl ObjectStore {
    /// Create a store and start serving attached processes. A store placed by default
    /// (under `/dev/shm`) first removes the stores that dead processes of this user left
    /// there.
    pub fn new(config: StoreConfig) -> Result<ObjectStore> {
        let nonce = random_nonce();
        let dir = match &config.dir {
            Some(d) => d.clone(),
            None => {
                let shm = Path::new("/dev/shm");
                let base = if shm.is_dir() {
                    shm.to_path_buf()
                } else {
                    std::env::temp_dir()
                };
                reclaim_dead_stores(&base);
                base.join(format!("forebay-store-{}-{nonce:016x}", std::process::id()))
            }
        };
        prepare_dir(&dir)?;
        let build = || -> Result<(Arc<OwnerCore>, Server)> {
            let arena = Arc::new(Arena::create(
                &dir.join(ARENA_FILE),
                config.capacity,
                config.prefault,
            )?);
            let spill = if config.spill {
                let dirs = config.spill_dirs.clone().unwrap_or_else(|| {
                    vec![std::env::temp_dir()
                        .join(format!("forebay-store-spill-{}", server::euid()))]
                });
                Some(SpillArea::open(SpillConfig::new(dirs)).map_err(|source| {
                    StoreError::Spill {
                        path: dir.clone(),
                        id: ObjectId(0),
                        source: Box::new(source),
                    }
                })?)
            } else {
                None
            };
            let core = Arc::new(OwnerCore::new(
                dir.clone(),
                arena,
                nonce,
                spill,
                config.put_timeout,
            ));
            let server = Server::start(core.clone(), &dir.join(SOCKET_FILE))?;
            Ok((core, server))
        };
        match build() {
            Ok((core, server)) => Ok(ObjectStore {
                backend: Backend::Owner(core),
                server: Some(server),
                dir,
                pid: std::process::id(),
            }),
            Err(e) => {
                let _ = fs::remove_file(dir.join(SOCKET_FILE));
                let _ = fs::remove_file(dir.join(ARENA_FILE));
                let _ = fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// Attach to the store in `dir`, created by another process of the same user.
    pub fn attach(dir: impl AsRef<Path>) -> Result<ObjectStore> {
        let dir = dir.as_ref();
        let client = ClientCore::attach(dir)?;
        Ok(ObjectStore {
            backend: Backend::Client(Arc::new(client)),
            server: None,
            dir: dir.to_path_buf(),
            pid: std::process::id(),
        })
    }

    /// The store directory (what another process passes to `attach`).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn capacity(&self) -> usize {
        self.backend.arena().capacity()
    }

    /// Whether this handle created the store (false: attached).
    pub fn is_owner(&self) -> bool {
        matches!(self.backend, Backend::Owner(_))
    }

    /// The random nonce of the store (the high half of every id it issues).
    pub fn nonce(&self) -> u64 {
        match &self.backend {
            Backend::Owner(c) => c.nonce(),
            Backend::Client(c) => c.nonce(),
        }
    }

    /// Pid of the process that owns the store.
    pub fn owner_pid(&self) -> u32 {
        match &self.backend {
            Backend::Owner(_) => self.pid,
            Backend::Client(c) => c.owner_pid(),
        }
    }

    fn check_process(&self) -> Result<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(StoreError::Invalid {
                path: self.dir.clone(),
                reason: format!(
                    "this handle was opened by process {}, and this is process {now} (a forked \
                     child); attach to the store in the child instead",
                    self.pid
                ),
            });
        }
        Ok(())
    }

    /// Allocate an object of `data_len` bytes to be written in place, then sealed.
    pub fn create(&self, data_len: usize) -> Result<ObjectWriter> {
        self.create_with(Format::Bytes, &[], data_len)
    }

    /// Like [`create`](Self::create), with a format and metadata bytes (stored in front of
    /// the data, returned by [`PinnedObject::meta`]).
    pub fn create_with(
        &self,
        format: Format,
        meta: &[u8],
        data_len: usize,
    ) -> Result<ObjectWriter> {
        self.check_process()?;
        let (id, offset) = self.backend.create(format, meta.len(), data_len)?;
        let mut writer = ObjectWriter {
            backend: self.backend.clone(),
            header: ObjectHeader {
                id,
                format,
                meta_len: meta.len(),
                data_len,
            },
            offset,
            sealed: false,
            pid: self.pid,
        };
        writer.meta_mut().copy_from_slice(meta);
        Ok(writer)
    }

    /// Put bytes: the concatenation of `parts`, copied once into the arena.
    pub fn put_bytes(&self, meta: &[u8], parts: &[&[u8]]) -> Result<ObjectId> {
        self.put_parts(Format::Bytes, meta, parts)
    }

    /// Put Arrow record batches (all of `schema`) as one object: an Arrow IPC stream whose
    /// buffers are copied once into the arena (a slice of a string view column that points
    /// into far larger buffers has its strings compacted first; see [`ipc::compact_views`]).
    pub fn put_arrow(
        &self,
        schema: &Schema,
        batches: &[RecordBatch],
        meta: &[u8],
    ) -> Result<ObjectId> {
        let buffers = ipc::encode(schema, batches).map_err(|source| StoreError::Arrow {
            path: self.dir.clone(),
            id: ObjectId(0),
            source,
        })?;
        let parts: Vec<&[u8]> = buffers.iter().map(|b| b.as_slice()).collect();
        self.put_parts(Format::ArrowIpc, meta, &parts)
    }

    /// Allocate, copy the parts back to back, seal.
    fn put_parts(&self, format: Format, meta: &[u8], parts: &[&[u8]]) -> Result<ObjectId> {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut w = self.create_with(format, meta, len)?;
        let mut rest = w.data_mut();
        for p in parts {
            let (dst, tail) = rest.split_at_mut(p.len());
            dst.copy_from_slice(p);
            rest = tail;
        }
        w.seal()
    }

    /// Pin an object (restoring it from disk if it was evicted) and return a view of it.
    pub fn get(&self, id: ObjectId) -> Result<PinnedObject> {
        self.check_process()?;
        let offset = self.backend.pin(id)?;
        let arena = self.backend.arena();
        // SAFETY: the object is sealed and now pinned by us: its region is immutable and
        // stays in place.
        let header = ObjectHeader::decode(unsafe { arena.slice(offset, layout::HEADER_LEN) });
        match header {
            Ok(h) if h.id == id && offset + h.region_len() <= arena.capacity() => {
                Ok(PinnedObject {
                    pin: Arc::new(Pin {
                        backend: self.backend.clone(),
                        id,
                        offset,
                        header: h,
                        pid: self.pid,
                    }),
                })
            }
            other => {
                self.backend.unpin(id);
                Err(StoreError::Invalid {
                    path: self.dir.clone(),
                    reason: format!(
                        "object {id}: region at offset {offset} does not hold it ({})",
                        match other {
                            Ok(h) => format!("found object {}", h.id),
                            Err(e) => e,
                        }
                    ),
                })
            }
        }
    }

    /// Get an Arrow object as its schema and record batches (buffers in the mapping).
    pub fn get_arrow(&self, id: ObjectId) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        self.get(id)?.record_batches()
    }

    /// Delete an object. Views already held stay valid; its memory is freed when the last
    /// is dropped. Returns whether the object existed.
    pub fn delete(&self, id: ObjectId) -> Result<bool> {
        self.check_process()?;
        match &self.backend {
            Backend::Owner(c) => Ok(c.delete(id)),
            Backend::Client(c) => c.delete(id),
        }
    }

    /// Whether a sealed object with this id is in the store.
    pub fn contains(&self, id: ObjectId) -> Result<bool> {
        self.check_process()?;
        match &self.backend {
            Backend::Owner(c) => Ok(c.contains(id)),
            Backend::Client(c) => c.contains(id),
        }
    }

    pub fn stats(&self) -> Result<StoreStats> {
        self.check_process()?;
        match &self.backend {
            Backend::Owner(c) => Ok(c.stats()),
            Backend::Client(c) => c.stats(),
        }
    }
}

impl Drop for ObjectStore {
    fn drop(&mut self) {
        let Some(server) = self.server.take() else {
            return;
        };
        if std::process::id() != self.pid {
            // A forked child's copy of the owner: its server threads do not exist here and
            // its sockets are the parent's. Touch nothing.
            std::mem::forget(server);
            return;
        }
        drop(server);
        // The owner closes the store: its files go (mappings held by pins or other
        // processes stay valid until unmapped).
        let _ = fs::remove_file(self.dir.join(SOCKET_FILE));
        let _ = fs::remove_file(self.dir.join(ARENA_FILE));
        let _ = fs::remove_dir(&self.dir);
    }
}
