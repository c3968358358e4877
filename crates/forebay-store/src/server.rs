//! The owner's side of cross-process access: a Unix socket in the store directory, one
//! thread per attached process.
//!
//! Each connection remembers the pins it holds and the objects it is writing. When the
//! connection ends for any reason (the process exited, crashed or was SIGKILLed) the
//! kernel closes the socket, the thread sees end-of-stream and drops those pins and frees
//! those unsealed objects. No lock or state lives in shared memory, so a dead client can
//! never leave the store wedged or half-updated.
//!
//! The socket is 0600 inside a 0700 directory, and each connection's peer uid (SO_PEERCRED)
//! must equal ours.

use std::collections::HashMap;
use std::io;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::StoreError;
use crate::layout::{Format, ObjectId};
use crate::owner::{Creator, OwnerCore};
use crate::protocol::{error_status, read_frame, write_frame, Fields, Op};

/// The accept thread and the open connections of a store's owner.
pub(crate) struct Server {
    socket_path: PathBuf,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<HashMap<u64, UnixStream>>>,
    accept_thread: Option<JoinHandle<()>>,
}

/// The uid of the process at the other end of a Unix socket.
fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a properly sized ucred.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

impl Server {
    pub fn start(core: Arc<OwnerCore>, socket_path: &Path) -> Result<Server, StoreError> {
        let listener = UnixListener::bind(socket_path).map_err(|source| StoreError::Io {
            path: socket_path.to_path_buf(),
            context: "binding the store socket",
            source,
        })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(socket_path, std::fs::Permissions::from_mode(0o600)).map_err(
            |source| StoreError::Io {
                path: socket_path.to_path_buf(),
                context: "restricting the store socket to its owner",
                source,
            },
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<HashMap<u64, UnixStream>>> = Arc::default();
        let accept_thread = {
            let stop = stop.clone();
            let connections = connections.clone();
            std::thread::Builder::new()
                .name(forebay_io::threads::thread_name("store-accept"))
                .spawn(move || accept_loop(listener, core, stop, connections))
                .map_err(|source| StoreError::Io {
                    path: socket_path.to_path_buf(),
                    context: "starting the store's accept thread",
                    source,
                })?
        };
        Ok(Server {
            socket_path: socket_path.to_path_buf(),
            stop,
            connections,
            accept_thread: Some(accept_thread),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept thread with a connection of our own, then end every session.
        let _ = UnixStream::connect(&self.socket_path);
        if let Some(t) = self.accept_thread.take() {
            let _ = t.join();
        }
        for (_, s) in self
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    core: Arc<OwnerCore>,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<HashMap<u64, UnixStream>>>,
) {
    let next_conn = AtomicU64::new(1);
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(stream) = stream else { continue };
        match peer_uid(&stream) {
            Ok(uid) if uid == euid() => {}
            _ => continue, // another user's process: drop the connection unanswered
        }
        let conn = next_conn.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            connections
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(conn, clone);
        }
        let core = core.clone();
        let registry = connections.clone();
        let spawned = std::thread::Builder::new()
            .name(forebay_io::threads::thread_name(&format!(
                "store-conn-{conn}"
            )))
            .spawn(move || {
                serve_connection(&core, conn, stream);
                registry
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&conn);
            });
        if spawned.is_err() {
            connections
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&conn);
        }
    }
}

/// What one attached process holds; released when its connection ends.
#[derive(Default)]
struct Session {
    pins: HashMap<ObjectId, u32>,
    writing: Vec<ObjectId>,
}

fn serve_connection(core: &OwnerCore, conn: u64, mut stream: UnixStream) {
    let mut session = Session::default();
    let creator = Creator::Connection(conn);
    while let Ok(Some((op, payload))) = read_frame(&mut stream) {
        let Some(op) = Op::from_u8(op) else { break };
        let reply = handle(core, creator, &mut session, op, &payload);
        if op.has_reply() {
            let sent = match reply {
                Ok(body) => write_frame(&mut stream, 0, &body),
                Err(e) => write_frame(
                    &mut stream,
                    error_status(e.kind()),
                    e.to_string().as_bytes(),
                ),
            };
            if sent.is_err() {
                break;
            }
        }
    }
    // The process is gone (or misbehaved): give back everything it held.
    for (id, n) in session.pins {
        for _ in 0..n {
            core.unpin(id);
        }
    }
    for id in session.writing {
        core.abort(id, creator);
    }
}

fn malformed(core: &OwnerCore, op: Op) -> StoreError {
    StoreError::Invalid {
        path: core.dir().to_path_buf(),
        reason: format!("malformed {op:?} request"),
    }
}

fn handle(
    core: &OwnerCore,
    creator: Creator,
    session: &mut Session,
    op: Op,
    payload: &[u8],
) -> Result<Vec<u8>, StoreError> {
    let mut f = Fields(payload);
    let mut id = || f.u128().map(ObjectId).ok_or_else(|| malformed(core, op));
    match op {
        Op::Hello => {
            let mut out = Vec::with_capacity(20);
            out.extend_from_slice(&core.nonce().to_le_bytes());
            out.extend_from_slice(&(core.arena().capacity() as u64).to_le_bytes());
            out.extend_from_slice(&std::process::id().to_le_bytes());
            Ok(out)
        }
        Op::Create => {
            let mut f = Fields(payload);
            let (Some(format), Some(meta_len), Some(data_len)) = (f.u8(), f.u64(), f.u64()) else {
                return Err(malformed(core, op));
            };
            let format = match format {
                0 => Format::Bytes,
                1 => Format::ArrowIpc,
                _ => return Err(malformed(core, op)),
            };
            let (id, offset) =
                core.create(format, meta_len as usize, data_len as usize, creator)?;
            session.writing.push(id);
            let mut out = Vec::with_capacity(24);
            out.extend_from_slice(&id.0.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            Ok(out)
        }
        Op::Seal => {
            let id = id()?;
            core.seal(id, creator)?;
            session.writing.retain(|&w| w != id);
            Ok(Vec::new())
        }
        Op::Abort => {
            let id = id()?;
            core.abort(id, creator);
            session.writing.retain(|&w| w != id);
            Ok(Vec::new())
        }
        Op::Pin => {
            let id = id()?;
            let offset = core.pin(id)?;
            *session.pins.entry(id).or_insert(0) += 1;
            Ok((offset as u64).to_le_bytes().to_vec())
        }
        Op::Unpin => {
            let id = id()?;
            // Only pins this connection holds can be released by it.
            if let Some(n) = session.pins.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    session.pins.remove(&id);
                }
                core.unpin(id);
            }
            Ok(Vec::new())
        }
        Op::Delete => Ok(vec![core.delete(id()?) as u8]),
        Op::Contains => Ok(vec![core.contains(id()?) as u8]),
        Op::Stats => Ok(core.stats().to_le_bytes()),
    }
}
