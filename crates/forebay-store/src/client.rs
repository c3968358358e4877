//! The attached side: a process that maps the owner's arena and asks the owner, over the
//! store socket, to allocate, seal, pin and unpin. Reads and writes of object bytes go
//! straight to the shared mapping.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::arena::Arena;
use crate::error::{Result, StoreError};
use crate::layout::{Format, ObjectId};
use crate::protocol::{error_kind, read_frame, write_frame, Fields, Op};
use crate::server::euid;
use crate::{StoreStats, ARENA_FILE, SOCKET_FILE};

pub(crate) struct ClientCore {
    dir: PathBuf,
    arena: Arc<Arena>,
    stream: Mutex<UnixStream>,
    nonce: u64,
    owner_pid: u32,
}

/// Refuse a path that is not ours alone: owned by another uid, or open to group/others.
fn check_private(path: &Path, store: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|source| StoreError::Io {
        path: path.to_path_buf(),
        context: "inspecting the store before attaching",
        source,
    })?;
    let ours = euid();
    if meta.uid() != ours || meta.mode() & 0o077 != 0 {
        return Err(StoreError::ForeignOwner {
            path: store.to_path_buf(),
            owner: meta.uid(),
            ours,
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

impl ClientCore {
    pub fn attach(dir: &Path) -> Result<ClientCore> {
        check_private(dir, dir)?;
        let arena_path = dir.join(ARENA_FILE);
        let socket_path = dir.join(SOCKET_FILE);
        check_private(&arena_path, dir)?;
        check_private(&socket_path, dir)?;
        let stream = UnixStream::connect(&socket_path).map_err(|e| StoreError::OwnerGone {
            path: dir.to_path_buf(),
            reason: format!("cannot connect to {}: {e}", socket_path.display()),
        })?;
        let arena = Arc::new(Arena::open(&arena_path)?);
        let mut client = ClientCore {
            dir: dir.to_path_buf(),
            arena,
            stream: Mutex::new(stream),
            nonce: 0,
            owner_pid: 0,
        };
        let hello = client.request(Op::Hello, &[])?;
        let mut f = Fields(&hello);
        let (Some(nonce), Some(capacity)) = (f.u64(), f.u64()) else {
            return Err(client.protocol_error("short hello"));
        };
        if capacity as usize != client.arena.capacity() {
            return Err(StoreError::Invalid {
                path: dir.to_path_buf(),
                reason: format!(
                    "arena file is {} bytes but the owner says {capacity}",
                    client.arena.capacity()
                ),
            });
        }
        client.nonce = nonce;
        client.owner_pid =
            f.0.get(..4)
                .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
        Ok(client)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    pub fn owner_pid(&self) -> u32 {
        self.owner_pid
    }

    fn protocol_error(&self, what: &str) -> StoreError {
        StoreError::OwnerGone {
            path: self.dir.clone(),
            reason: format!("protocol error: {what}"),
        }
    }

    fn gone(&self, e: std::io::Error) -> StoreError {
        StoreError::OwnerGone {
            path: self.dir.clone(),
            reason: e.to_string(),
        }
    }

    /// Send a request and wait for its reply.
    fn request(&self, op: Op, payload: &[u8]) -> Result<Vec<u8>> {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        write_frame(&mut *stream, op as u8, payload).map_err(|e| self.gone(e))?;
        match read_frame(&mut *stream).map_err(|e| self.gone(e))? {
            None => Err(self.gone(std::io::ErrorKind::UnexpectedEof.into())),
            Some((0, body)) => Ok(body),
            Some((status, message)) => Err(StoreError::Remote {
                kind: error_kind(status),
                message: String::from_utf8_lossy(&message).into_owned(),
            }),
        }
    }

    /// Send a request that has no reply; errors are dropped (the owner being gone already
    /// released everything).
    fn notify(&self, op: Op, payload: &[u8]) {
        let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        let _ = write_frame(&mut *stream, op as u8, payload);
    }

    pub fn create(
        &self,
        format: Format,
        meta_len: usize,
        data_len: usize,
    ) -> Result<(ObjectId, usize)> {
        let mut p = Vec::with_capacity(17);
        p.push(format as u8);
        p.extend_from_slice(&(meta_len as u64).to_le_bytes());
        p.extend_from_slice(&(data_len as u64).to_le_bytes());
        let r = self.request(Op::Create, &p)?;
        let mut f = Fields(&r);
        match (f.u128(), f.u64()) {
            (Some(id), Some(offset)) => Ok((ObjectId(id), offset as usize)),
            _ => Err(self.protocol_error("short create reply")),
        }
    }

    pub fn seal(&self, id: ObjectId) -> Result<()> {
        self.request(Op::Seal, &id.0.to_le_bytes()).map(drop)
    }

    pub fn abort(&self, id: ObjectId) {
        self.notify(Op::Abort, &id.0.to_le_bytes())
    }

    pub fn pin(&self, id: ObjectId) -> Result<usize> {
        let r = self.request(Op::Pin, &id.0.to_le_bytes())?;
        Fields(&r)
            .u64()
            .map(|o| o as usize)
            .ok_or_else(|| self.protocol_error("short pin reply"))
    }

    pub fn unpin(&self, id: ObjectId) {
        self.notify(Op::Unpin, &id.0.to_le_bytes())
    }

    pub fn delete(&self, id: ObjectId) -> Result<bool> {
        Ok(self.request(Op::Delete, &id.0.to_le_bytes())?.first() == Some(&1))
    }

    pub fn contains(&self, id: ObjectId) -> Result<bool> {
        Ok(self.request(Op::Contains, &id.0.to_le_bytes())?.first() == Some(&1))
    }

    pub fn stats(&self) -> Result<StoreStats> {
        let r = self.request(Op::Stats, &[])?;
        StoreStats::from_le_bytes(&r).ok_or_else(|| self.protocol_error("short stats reply"))
    }
}
