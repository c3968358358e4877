//! One run at a time per checkpoint: a lock on local disks, a lease on object stores.
//!
//! Two runs committing into one checkpoint at once would each write every row (each sees
//! the other's ids only after it loaded its own index), so a second run must be refused
//! before it reads anything.
//!
//! ```text
//!  local checkpoint    flock(<checkpoint>/_forebay_lock)            released by the kernel
//!                                                                   when the process dies
//!  object store        <checkpoint>/_forebay_lease  (JSON: owner, machine, pid, ttl, renewed_at)
//!
//!    acquire ── PUT if absent (If-None-Match: *) ──► ours
//!       │ exists
//!       ▼
//!    GET it ── holder alive (renewed within its ttl, and not a dead pid of this machine)
//!       │                       └──► error naming the holder and when its lease runs out
//!       │ stale (holder SIGKILLed, its machine lost)
//!       ▼
//!    PUT if unchanged since the GET (If-Match: its e-tag) ──► ours   (two contenders: one wins)
//!
//!    heartbeat thread: every ttl/3, PUT if unchanged since our last PUT (renewed_at = now)
//!    before every commit decision: the lease must be ours and renewed within ttl/2,
//!                                  else the run stops (another run may take it over)
//!    end of the run: stop the heartbeat, delete the lease if it is still ours
//! ```
//!
//! A holder that died on another machine blocks new runs until its lease expires (`ttl`,
//! default 30 s); on the same machine (same boot, same pid namespace) a dead holder's pid
//! is noticed at once. Expiry compares the holder's clock (`renewed_at`) with the reader's:
//! machines whose clocks differ by more than the margin (ttl/2) are not kept apart safely.
//! A store that cannot write conditionally (object_store's `PutMode::Create` and
//! `PutMode::Update`) cannot hold a lease: the run fails with an error saying so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use forebay_io::Dir;

const LOCK: &str = "_forebay_lock";
const LEASE: &str = "_forebay_lease";
/// How long a lease lasts without renewal, unless the checkpoint says otherwise.
pub(crate) const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);

/// The run's hold on its checkpoint; released when dropped.
pub(crate) enum RunLock {
    /// An exclusive `flock` on a local checkpoint (the kernel drops it with the process).
    /// The file is only held: closing it releases the lock.
    Local(#[allow(dead_code)] std::fs::File),
    /// A lease object on an object store, renewed by a heartbeat thread.
    Lease(Lease),
}

impl RunLock {
    /// Take the checkpoint whose state directory is `state` for the run `owner`, or fail
    /// naming the run that holds it.
    pub(crate) fn acquire(state: &Dir, owner: &str, ttl: Duration) -> Result<RunLock> {
        match state {
            Dir::Local(root) => lock_local(root).map(RunLock::Local),
            Dir::Remote { .. } => {
                let (store, path) = state.object(LEASE).expect("a remote directory");
                Lease::acquire(store, path, state.shown(LEASE), owner, ttl).map(RunLock::Lease)
            }
        }
    }

    /// Fails if this run may no longer decide commits (its lease was lost or could not be
    /// renewed in time); a local lock cannot be lost.
    pub(crate) fn check(&self) -> Result<()> {
        match self {
            RunLock::Local(_) => Ok(()),
            RunLock::Lease(lease) => lease.check(),
        }
    }
}

fn busy(path: String, reason: String) -> EngineError {
    EngineError::Write {
        stage: "checkpoint".into(),
        path,
        reason,
        source: None,
    }
}

/// One run at a time: an exclusive lock on a local checkpoint (released if the process dies).
fn lock_local(root: &std::path::Path) -> Result<std::fs::File> {
    let path = root.join(LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| EngineError::write("checkpoint", path.display().to_string(), e))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe {
        use std::os::fd::AsRawFd;
        libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB)
    };
    if rc != 0 {
        return Err(busy(
            root.display().to_string(),
            "another run is using this checkpoint right now (one run at a time)".into(),
        ));
    }
    Ok(file)
}

/// What the lease object holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct LeaseRecord {
    /// The run holding it.
    owner: String,
    /// The holder's machine: host name, boot and pid namespace (a pid means something only
    /// where all three match).
    machine: String,
    pid: u32,
    ttl_ms: u64,
    /// When the holder last renewed it (its clock, ms since the epoch).
    renewed_at_ms: u64,
}

impl LeaseRecord {
    /// Whether the holder may be presumed gone: not renewed within its ttl, or its process
    /// is dead on this very machine.
    fn is_stale(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.renewed_at_ms) > self.ttl_ms
            || (self.machine == this_machine()
                && self.pid != std::process::id()
                && !forebay_io::durable::process_alive(self.pid))
    }
}

/// A lease on an object-store checkpoint (see the module docs).
pub(crate) struct Lease {
    shared: Arc<LeaseShared>,
    heartbeat: Option<JoinHandle<()>>,
}

struct LeaseShared {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    shown: String,
    record: Mutex<LeaseRecord>,
    /// The version of the lease object this run wrote last.
    version: Mutex<UpdateVersion>,
    /// When this run last renewed it (its own clock).
    renewed: Mutex<Instant>,
    /// Another run replaced the lease (it judged this run dead).
    lost: AtomicBool,
    /// Why the last renewal failed, for the error of `check`.
    last_failure: Mutex<Option<String>>,
    stop: (Mutex<bool>, Condvar),
}

impl Lease {
    fn acquire(
        store: Arc<dyn ObjectStore>,
        path: ObjectPath,
        shown: String,
        owner: &str,
        ttl: Duration,
    ) -> Result<Lease> {
        let mut record = LeaseRecord {
            owner: owner.to_string(),
            machine: this_machine(),
            pid: std::process::id(),
            ttl_ms: ttl.as_millis().max(1) as u64,
            renewed_at_ms: now_ms(),
        };
        let storage = |e: object_store::Error| busy(shown.clone(), format!("lease: {e}"));
        let unsupported = || {
            busy(
                shown.clone(),
                "this store cannot write conditionally (put-if-absent / put-if-unchanged), \
                 which keeps two runs from using one checkpoint at once; put the checkpoint \
                 on a store that can (S3, GCS, Azure, a local disk), or for S3-compatible \
                 stores set aws_conditional_put=etag if the server supports If-Match"
                    .into(),
            )
        };
        let put = |record: &LeaseRecord, mode: PutMode| {
            let (store, path) = (store.clone(), path.clone());
            let body = serde_json::to_vec(record).expect("lease records serialise");
            forebay_io::block_on(async move {
                store
                    .put_opts(
                        &path,
                        PutPayload::from(body),
                        PutOptions {
                            mode,
                            ..Default::default()
                        },
                    )
                    .await
            })
        };
        // A lease released between our create and our read is tried again.
        let mut attempts = 0;
        let version = loop {
            attempts += 1;
            match put(&record, PutMode::Create) {
                Ok(done) => break UpdateVersion::from(done),
                Err(object_store::Error::NotImplemented { .. }) => return Err(unsupported()),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(storage(e)),
            }
            // Someone holds it, or held it and died.
            let read = {
                let (store, path) = (store.clone(), path.clone());
                forebay_io::block_on(async move {
                    let got = store.get(&path).await?;
                    let version = UpdateVersion {
                        e_tag: got.meta.e_tag.clone(),
                        version: got.meta.version.clone(),
                    };
                    Ok::<_, object_store::Error>((got.bytes().await?, version))
                })
            };
            let (held, version) = match read {
                Ok(read) => read,
                Err(object_store::Error::NotFound { .. }) if attempts < 3 => continue,
                Err(e) => return Err(storage(e)),
            };
            let held: LeaseRecord = serde_json::from_slice(&held).map_err(|e| {
                busy(
                    shown.clone(),
                    format!(
                        "not a lease ({e}); delete this object if no run is using the checkpoint"
                    ),
                )
            })?;
            if !held.is_stale(now_ms()) {
                let left = (held.renewed_at_ms + held.ttl_ms).saturating_sub(now_ms());
                return Err(busy(
                    shown.clone(),
                    format!(
                        "another run is using this checkpoint right now (one run at a time): \
                         run {} (pid {} on {}) holds its lease; if that run is dead, its lease \
                         expires in {:.0} s",
                        held.owner,
                        held.pid,
                        held.machine.split('/').next().unwrap_or("?"),
                        (left as f64 / 1e3).ceil()
                    ),
                ));
            }
            // A stale holder: take the lease over, unless another run just did.
            record.renewed_at_ms = now_ms();
            match put(&record, PutMode::Update(version)) {
                Ok(done) => break UpdateVersion::from(done),
                Err(object_store::Error::NotImplemented { .. }) => return Err(unsupported()),
                // Released since we read it: try to create it again.
                Err(object_store::Error::NotFound { .. }) if attempts < 3 => continue,
                Err(object_store::Error::Precondition { .. }) => {
                    return Err(busy(
                        shown.clone(),
                        "another run took over this checkpoint's expired lease just now (one \
                         run at a time)"
                            .into(),
                    ))
                }
                Err(e) => return Err(storage(e)),
            }
        };
        let shared = Arc::new(LeaseShared {
            store,
            path,
            shown,
            record: Mutex::new(record),
            version: Mutex::new(version),
            renewed: Mutex::new(Instant::now()),
            lost: AtomicBool::new(false),
            last_failure: Mutex::new(None),
            stop: (Mutex::new(false), Condvar::new()),
        });
        let beating = shared.clone();
        let heartbeat = std::thread::Builder::new()
            .name(forebay_io::threads::thread_name("lease"))
            .spawn(move || beating.heartbeat(ttl / 3))
            .map_err(|e| busy(shared.shown.clone(), format!("lease heartbeat: {e}")))?;
        Ok(Lease {
            shared,
            heartbeat: Some(heartbeat),
        })
    }

    fn check(&self) -> Result<()> {
        let s = &self.shared;
        if s.lost.load(Ordering::SeqCst) {
            return Err(busy(
                s.shown.clone(),
                "this run lost the checkpoint's lease: another run judged it dead and took \
                 over; nothing more is committed by this run"
                    .into(),
            ));
        }
        let ttl = Duration::from_millis(lock(&s.record).ttl_ms);
        let age = lock(&s.renewed).elapsed();
        if age > ttl / 2 {
            let failure = lock(&s.last_failure).clone().unwrap_or_default();
            return Err(busy(
                s.shown.clone(),
                format!(
                    "the checkpoint's lease could not be renewed for {:.1} s ({failure}); \
                     another run may take it over, so this run commits nothing more",
                    age.as_secs_f64()
                ),
            ));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LeaseShared {
    fn heartbeat(&self, every: Duration) {
        let (stopped, wake) = &self.stop;
        let mut guard = lock(stopped);
        loop {
            // Checked before waiting too: a stop signalled before this thread first waited
            // would otherwise go unnoticed for a whole period.
            if *guard {
                return;
            }
            let (next, waited) = wake
                .wait_timeout(guard, every)
                .unwrap_or_else(|p| p.into_inner());
            guard = next;
            if *guard || !waited.timed_out() {
                continue;
            }
            drop(guard);
            self.renew();
            if self.lost.load(Ordering::SeqCst) {
                return;
            }
            guard = lock(stopped);
        }
    }

    fn renew(&self) {
        let record = {
            let mut r = lock(&self.record);
            r.renewed_at_ms = now_ms();
            r.clone()
        };
        let version = lock(&self.version).clone();
        let started = Instant::now();
        let (store, path) = (self.store.clone(), self.path.clone());
        let body = serde_json::to_vec(&record).expect("lease records serialise");
        let result = forebay_io::block_on(async move {
            store
                .put_opts(
                    &path,
                    PutPayload::from(body),
                    PutOptions {
                        mode: PutMode::Update(version),
                        ..Default::default()
                    },
                )
                .await
        });
        match result {
            Ok(done) => {
                *lock(&self.version) = UpdateVersion::from(done);
                *lock(&self.renewed) = started;
                *lock(&self.last_failure) = None;
            }
            Err(object_store::Error::Precondition { .. }) => {
                self.lost.store(true, Ordering::SeqCst)
            }
            Err(e) => *lock(&self.last_failure) = Some(e.to_string()),
        }
    }

    /// Delete the lease if it is still this run's.
    fn release(&self) {
        if self.lost.load(Ordering::SeqCst) {
            return;
        }
        let owner = lock(&self.record).owner.clone();
        let (store, path) = (self.store.clone(), self.path.clone());
        let _ = forebay_io::block_on(async move {
            let got = store.get(&path).await?;
            let held: Option<LeaseRecord> = serde_json::from_slice(&got.bytes().await?).ok();
            if held.is_some_and(|h| h.owner == owner) {
                store.delete(&path).await?;
            }
            Ok::<_, object_store::Error>(())
        });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let (stopped, wake) = &self.shared.stop;
            *lock(stopped) = true;
            wake.notify_all();
        }
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        self.shared.release();
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This machine as far as a pid is meaningful: host name, boot id and pid namespace.
fn this_machine() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let host = read("/proc/sys/kernel/hostname");
    let boot = read("/proc/sys/kernel/random/boot_id");
    let pid_ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    format!("{host}/{boot}/{pid_ns}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory_dir() -> Dir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Dir::open(
            &format!("memory://lease-tests-{n}/ckpt"),
            &Default::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_second_run_is_refused_while_the_first_holds_the_lease() {
        let state = memory_dir();
        let first = RunLock::acquire(&state, "run-a", Duration::from_secs(30)).unwrap();
        let err = RunLock::acquire(&state, "run-b", Duration::from_secs(30))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("another run") && err.contains("run-a"),
            "{err}"
        );
        first.check().unwrap();
        drop(first);
        // Released: the next run gets it at once.
        let second = RunLock::acquire(&state, "run-b", Duration::from_secs(30)).unwrap();
        second.check().unwrap();
    }

    #[test]
    fn an_expired_lease_is_taken_over_and_its_holder_stops_committing() {
        let state = memory_dir();
        let ttl = Duration::from_millis(300);
        let first = RunLock::acquire(&state, "run-a", ttl).unwrap();
        // The holder freezes (its heartbeat stops), as a lost machine would.
        if let RunLock::Lease(l) = &first {
            let (stopped, wake) = &l.shared.stop;
            *lock(stopped) = true;
            wake.notify_all();
        }
        std::thread::sleep(ttl + Duration::from_millis(100));
        let second = RunLock::acquire(&state, "run-b", ttl).unwrap();
        let err = first.check().unwrap_err().to_string();
        assert!(err.contains("lease"), "{err}");
        second.check().unwrap();
        // The stale holder's release must not delete the new holder's lease.
        drop(first);
        let err = RunLock::acquire(&state, "run-c", ttl)
            .err()
            .expect("run-b still holds it")
            .to_string();
        assert!(err.contains("run-b"), "{err}");
    }

    #[test]
    fn a_heartbeat_keeps_the_lease_alive_past_its_ttl() {
        let state = memory_dir();
        let ttl = Duration::from_millis(300);
        let first = RunLock::acquire(&state, "run-a", ttl).unwrap();
        std::thread::sleep(Duration::from_millis(900));
        first.check().unwrap();
        assert!(RunLock::acquire(&state, "run-b", ttl).is_err());
    }

    #[test]
    fn a_lease_of_a_dead_process_on_this_machine_is_stale_at_once() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let record = LeaseRecord {
            owner: "dead".into(),
            machine: this_machine(),
            pid,
            ttl_ms: 3_600_000,
            renewed_at_ms: now_ms(),
        };
        assert!(record.is_stale(now_ms()));
        let alive = LeaseRecord {
            pid: std::process::id(),
            machine: format!("{}-elsewhere", this_machine()),
            ..record
        };
        assert!(!alive.is_stale(now_ms()));
    }
}
