//! [`ObjectStore`]: one handle type for the owner (which runs the object table and its
//! server) and for attached processes (which reach it over the socket).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use forebay_spill::{SpillArea, SpillConfig};

use crate::arena::Arena;
use crate::backend::Backend;
use crate::client::ClientCore;
use crate::config::{StoreConfig, StoreStats};
use crate::dir::{prepare_dir, random_nonce, reclaim_dead_stores};
pub use crate::error::{Result, StoreError};
pub use crate::layout::{Format, ObjectHeader, ObjectId};
use crate::owner::OwnerCore;
use crate::pinned::Pin;
use crate::pinned::PinnedObject;
use crate::server::Server;
use crate::writer::ObjectWriter;
use crate::{ipc, layout, server, ARENA_FILE, SOCKET_FILE};

/// A handle on an object store: the owner (created with [`ObjectStore::new`]) or an attached
/// process ([`ObjectStore::attach`]). Methods are the same on both.
///
/// ```
/// use forebay_store::{ObjectStore, StoreConfig};
///
/// let store = ObjectStore::new(StoreConfig::new(16 << 20))?;
/// let id = store.put_bytes(b"meta", &[b"hello ", b"world"])?;
/// let object = store.get(id)?; // pinned (never spilled) while `object` lives
/// assert_eq!(object.data(), b"hello world");
/// assert_eq!(store.stats()?.objects, 1);
/// # Ok::<(), forebay_store::StoreError>(())
/// ```
pub struct ObjectStore {
    backend: Backend,
    /// The owner's socket server (None when attached). Dropped first: stops serving.
    server: Option<Server>,
    dir: PathBuf,
    /// Process that opened this handle; a forked child must attach instead.
    pid: u32,
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
