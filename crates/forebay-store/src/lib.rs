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
//! # Modules
//!
//! | module     | what                                                                  |
//! |------------|-----------------------------------------------------------------------|
//! | `store`    | [`ObjectStore`]: put, get, create, delete; owner or attached            |
//! | `backend`  | how a handle reaches the object table: the owner's core or a client     |
//! | `pinned`   | [`PinnedObject`]: an object read in place, its region pinned            |
//! | `writer`   | [`ObjectWriter`]: an object written in place, then sealed               |
//! | `config`   | [`StoreConfig`], [`StoreStats`]                                         |
//! | `dir`      | the store directory: private, reused, dead owners' stores reclaimed    |
//! | `owner`    | the object table and allocator, eviction to forebay-spill, restore     |
//! | `server`, `client`, `protocol` | the socket between the owner and attached processes |
//! | `arena`    | the mapped file                                                        |
//! | [`layout`], [`ipc`] | an object's bytes; Arrow IPC written with one copy, read in place |
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
mod backend;
mod client;
mod config;
mod dir;
mod error;
pub mod ipc;
pub mod layout;
mod owner;
mod pinned;
mod protocol;
mod server;
mod store;
mod writer;

pub use crate::config::{StoreConfig, StoreStats};
pub use crate::error::{ErrorKind, Result, StoreError};
pub use crate::layout::{Format, ObjectHeader, ObjectId};
pub use crate::pinned::PinnedObject;
pub use crate::store::ObjectStore;
pub use crate::writer::ObjectWriter;

/// Name of the arena file inside the store directory.
pub const ARENA_FILE: &str = "arena";
/// Name of the owner's socket inside the store directory.
pub const SOCKET_FILE: &str = "store.sock";
