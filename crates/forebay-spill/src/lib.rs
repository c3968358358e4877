//! # forebay-spill: objects out of memory at disk speed, and back
//!
//! Owns spill files: a *spill round* fuses many objects into one new file, written with
//! vectored writes straight from the objects' own buffers (Arrow buffers as they are: no
//! concatenation buffer, no copy in user space); each object carries a small header with
//! lengths and an XXH3-64 checksum, verified on every restore. Restores read straight into
//! memory the caller provides (`preadv`) or map the object read-only (zero copy). A file is
//! deleted when every object in it has been freed; files of crashed processes are removed
//! when a new spill area opens the directory. It does not decide *what* to evict: that is
//! the object store's job.
//!
//! ```text
//!  submit(round) ──► bounded queue ──► I/O thread: header+table ─┐   hashed in steps
//!   (blocks when full: backpressure)       buffers as given ─────┴─► pwritev ─► forebay-<pid>-<n>.spill
//!                                                                           │
//!  SpillLocation (file, offset, lengths) ◄──────────────────────────────────┘
//!     ├─ restore_into(&mut [dest buffers]) ── preadv + checksum
//!     ├─ map() ── read-only mmap, 64-byte aligned buffers + checksum
//!     └─ drop (last object of the file) ── file deleted
//! ```
//!
//! Format: see [`format`](mod@format). Durability: [`SyncPolicy`]. Errors name the file and offset.
//!
//! [`RemoteSpillTarget`] spills the same object format to S3-like storage through
//! `object_store`: one remote object per round, one PUT or a multipart upload of fixed-size
//! parts that are slices of the caller's buffers (no copy), ranged GETs to restore, deletion
//! when the last location is dropped. See its module docs.
//!
//! ```no_run
//! use bytes::Bytes;
//! use forebay_spill::{SpillArea, SpillConfig, SpillObject, SyncPolicy};
//!
//! let area = SpillArea::open(SpillConfig::new(["/mnt/nvme0/spill", "/mnt/nvme1/spill"])
//!     .with_sync(SyncPolicy::PerFile))?;
//! let object = SpillObject { id: 7, buffers: vec![Bytes::from(vec![1u8; 1 << 20])] };
//! let locations = area.spill(vec![object])?;
//! let mut back = vec![0u8; 1 << 20];
//! area.restore_into(&locations[0], &mut [&mut back[..]])?;
//! drop(locations); // last object of the file: the file is deleted
//! # Ok::<(), forebay_spill::SpillError>(())
//! ```

mod area;
pub mod error;
pub mod format;
mod location;
mod remote;
mod round_file;
pub mod vectored;

pub use area::{
    DirectoryChoice, MappedObject, PendingSpill, SpillArea, SpillConfig, SpillFile, SpillLocation,
    SpillObject, SpillStats, SyncPolicy,
};
pub use error::{Result, SpillError};
pub use location::{ObjectExtent, PendingRound};
pub use remote::{
    PendingRemoteSpill, RemoteSpillConfig, RemoteSpillFile, RemoteSpillLocation, RemoteSpillStats,
    RemoteSpillTarget,
};
