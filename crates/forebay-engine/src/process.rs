//! Worker processes for a map stage: batches go out and come back through the run's
//! forebay-store by object id, never serialised; each worker is one process spoken to over
//! its own Unix socket.
//!
//! ```text
//!  stage worker thread                     worker process (e.g. `python -m forebay._worker`)
//!   put batch ──► store ◄── attach ─────────── get (zero copy, pinned)
//!   TASK(task, object id) ──── socket fd 3 ──► call the function
//!   ◄── DONE(task, [output ids]) ──────────── put outputs ──► store
//!   get outputs, copy out, delete objects
//!   EOF on the socket = the process died ──► restart it and retry the batch (max_retries),
//!                                             or fail naming the batch, the pid and the signal
//! ```
//!
//! Frames are `u32 length (LE) | u8 kind | payload`, length counting kind and payload:
//!
//! | kind | direction | payload |
//! |---|---|---|
//! | 1 INIT | to worker | opaque bytes from the caller (the function, its arguments) |
//! | 2 READY | from worker | — |
//! | 3 INIT_FAILED | from worker | error (see below) |
//! | 4 TASK | to worker | task id u64, input object id u128 |
//! | 5 DONE | from worker | task id u64, n u32, n × output object id u128 |
//! | 6 FAILED | from worker | task id u64, error |
//! | 7 SHUTDOWN | to worker | — |
//!
//! An error is `u32 text length | text (UTF-8: what happened, with the traceback) | opaque
//! bytes` (the Python worker sends the pickled exception, which the bindings re-raise).
//!
//! The worker's environment has `FOREBAY_WORKER_FD=3` (its end of the socket) and
//! `FOREBAY_STORE=<store directory>`. Each worker runs in its own process group (Ctrl-C in a
//! terminal reaches only the parent, which stops the workers) and is killed by the kernel
//! if the thread that started it ends (`PR_SET_PDEATHSIG`), so no worker outlives its run.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use forebay_store::{ObjectId, ObjectStore};

use crate::batch::deep_copy;
use crate::error::EngineError;
use crate::events::PipelineEvent;
use crate::stage::{MapFn, MapWorker, StageFailure, WorkerContext};

const INIT: u8 = 1;
const READY: u8 = 2;
const INIT_FAILED: u8 = 3;
const TASK: u8 = 4;
const DONE: u8 = 5;
const FAILED: u8 = 6;
const SHUTDOWN: u8 = 7;

/// The file descriptor number a worker finds its socket on.
pub const WORKER_FD: i32 = 3;

/// An error a worker reported: a readable text and the worker's own encoding of it.
#[derive(Debug, Clone)]
pub struct RemoteError {
    /// What happened, with the worker's traceback.
    pub text: String,
    /// Opaque bytes (the Python worker: the pickled exception).
    pub payload: Vec<u8>,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text.trim_end())
    }
}

impl std::error::Error for RemoteError {}

/// A map function run by worker processes. Cheap to clone.
#[derive(Clone)]
pub struct ProcessPool {
    command: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// More environment for worker `i` of the stage (and every worker replacing it).
    env_of_worker: Arc<Vec<Vec<(OsString, OsString)>>>,
    init: Arc<Vec<u8>>,
    max_retries: usize,
    startup_timeout: Duration,
}

impl ProcessPool {
    /// Workers run `command` (program and arguments); `init` is sent to each as it starts.
    pub fn new(command: Vec<OsString>, init: Vec<u8>) -> ProcessPool {
        ProcessPool {
            command,
            env: Vec::new(),
            env_of_worker: Arc::new(Vec::new()),
            init: Arc::new(init),
            max_retries: 0,
            startup_timeout: Duration::from_secs(120),
        }
    }

    /// Extra environment variables of the workers.
    pub fn with_env(mut self, env: Vec<(OsString, OsString)>) -> Self {
        self.env = env;
        self
    }

    /// Environment variables of each of the stage's workers: worker `i` gets
    /// `per_worker[i]` on top of [`with_env`](Self::with_env)'s, and so does every worker
    /// started in its place after it died. Devices are given this way: one
    /// `CUDA_VISIBLE_DEVICES` per worker, kept by its replacement.
    pub fn with_env_of_each_worker(mut self, per_worker: Vec<Vec<(OsString, OsString)>>) -> Self {
        self.env_of_worker = Arc::new(per_worker);
        self
    }

    /// Times a batch is retried on a fresh worker after its worker died (default 0).
    pub fn with_max_retries(mut self, retries: usize) -> Self {
        self.max_retries = retries;
        self
    }

    /// How long a starting worker may take to report ready (default 120 s).
    pub fn with_startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    fn spawn(&self, ctx: &WorkerContext<'_>, store: &ObjectStore) -> Result<Worker, StageFailure> {
        let worker_err = |reason: String| {
            StageFailure::Engine(EngineError::Worker {
                stage: ctx.stage.to_string(),
                reason,
            })
        };
        let (ours, theirs) = UnixStream::pair()
            .map_err(|e| worker_err(format!("cannot create a socket pair: {e}")))?;
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| worker_err("no worker command".into()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(
                self.env_of_worker
                    .get(ctx.index)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v)),
            )
            .env("FOREBAY_WORKER_FD", WORKER_FD.to_string())
            .env("FOREBAY_STORE", store.path())
            .stdin(Stdio::null());
        let child_fd = theirs.as_raw_fd();
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (dup2, fcntl, prctl, setpgid, getppid, _exit) on values
        // copied in before the fork.
        unsafe {
            command.pre_exec(move || {
                if child_fd == WORKER_FD {
                    let flags = libc::fcntl(WORKER_FD, libc::F_GETFD);
                    libc::fcntl(WORKER_FD, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                } else if libc::dup2(child_fd, WORKER_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                // Its own process group: a terminal's Ctrl-C goes to the parent, which stops
                // the workers itself.
                libc::setpgid(0, 0);
                #[cfg(target_os = "linux")]
                {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                    if libc::getppid() != parent {
                        libc::_exit(1); // the parent died before prctl took effect
                    }
                }
                let _ = parent;
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| {
            worker_err(format!(
                "cannot start {:?}: {e}",
                self.command
                    .iter()
                    .map(|s| s.to_string_lossy().to_string())
                    .collect::<Vec<_>>()
            ))
        })?;
        drop(theirs);
        let pid = child.id();
        let mut worker = Worker {
            child: Some(child),
            socket: ours,
            pid,
        };
        worker.send(INIT, &self.init).map_err(|e| {
            worker_err(format!(
                "worker {pid} did not take its start-up message: {e}"
            ))
        })?;
        let deadline = Instant::now() + self.startup_timeout;
        match worker.receive(ctx, Some(deadline)) {
            Ok((READY, _)) => {}
            Ok((INIT_FAILED, payload)) => {
                worker.kill();
                return Err(StageFailure::User(Box::new(decode_error(&payload))));
            }
            Ok((kind, _)) => {
                worker.kill();
                return Err(worker_err(format!(
                    "worker {pid} sent message kind {kind} while starting"
                )));
            }
            Err(Received::Cancelled) => {
                worker.kill();
                return Err(StageFailure::Engine(EngineError::Cancelled));
            }
            Err(Received::TimedOut) => {
                worker.kill();
                return Err(worker_err(format!(
                    "worker {pid} did not start within {:?}",
                    self.startup_timeout
                )));
            }
            Err(Received::Died(status)) => {
                return Err(worker_err(format!(
                    "worker {pid} died while starting ({})",
                    describe_exit(status)
                )));
            }
            Err(Received::Io(e)) => {
                worker.kill();
                return Err(worker_err(format!("worker {pid}: {e}")));
            }
        }
        ctx.emit(PipelineEvent::WorkerStarted {
            stage: ctx.stage.to_string(),
            pid,
        });
        Ok(worker)
    }
}

impl MapFn for ProcessPool {
    fn start_worker(&self, ctx: &WorkerContext<'_>) -> Result<Box<dyn MapWorker>, StageFailure> {
        let store = ctx.store()?;
        let worker = self.spawn(ctx, &store)?;
        Ok(Box::new(PoolWorker {
            pool: self.clone(),
            store,
            worker: Some(worker),
            next_task: 0,
        }))
    }
}

struct PoolWorker {
    pool: ProcessPool,
    store: Arc<ObjectStore>,
    worker: Option<Worker>,
    next_task: u64,
}

/// Deletes the objects it names when dropped (inputs and outputs of one task).
struct Objects(Arc<ObjectStore>, Vec<ObjectId>);

impl Drop for Objects {
    fn drop(&mut self) {
        for id in &self.1 {
            let _ = self.0.delete(*id);
        }
    }
}

impl MapWorker for PoolWorker {
    fn call(
        &mut self,
        batch: RecordBatch,
        ctx: &WorkerContext<'_>,
    ) -> Result<Vec<RecordBatch>, StageFailure> {
        let input = self
            .store
            .put_arrow(&batch.schema(), std::slice::from_ref(&batch), &[])
            .map_err(|e| EngineError::store(ctx.stage, e))?;
        let _input = Objects(self.store.clone(), vec![input]);
        drop(batch);
        let mut attempts = 0usize;
        loop {
            let worker = match self.worker.as_mut() {
                Some(w) => w,
                None => self.worker.insert(self.pool.spawn(ctx, &self.store)?),
            };
            let task = self.next_task;
            self.next_task += 1;
            let mut message = Vec::with_capacity(24);
            message.extend_from_slice(&task.to_le_bytes());
            message.extend_from_slice(&input.0.to_le_bytes());
            let reply = match worker.send(TASK, &message) {
                Ok(()) => worker.receive(ctx, None),
                Err(e) => Err(Received::Io(e)),
            };
            match reply {
                Ok((DONE, payload)) => {
                    let ids = decode_done(&payload, task).map_err(StageFailure::BadOutput)?;
                    let outputs = Objects(self.store.clone(), ids.clone());
                    let mut batches = Vec::new();
                    for id in ids {
                        let (_, got) = self
                            .store
                            .get_arrow(id)
                            .map_err(|e| EngineError::store(ctx.stage, e))?;
                        // Out of the store at once (one copy): its space serves the next task.
                        batches.extend(got.iter().map(deep_copy));
                    }
                    drop(outputs);
                    return Ok(batches);
                }
                Ok((FAILED, payload)) => {
                    let error = payload
                        .get(8..)
                        .map(decode_error)
                        .unwrap_or_else(|| decode_error(&[]));
                    return Err(StageFailure::User(Box::new(error)));
                }
                Ok((kind, _)) => {
                    let pid = worker.pid;
                    self.kill_worker();
                    return Err(StageFailure::BadOutput(format!(
                        "worker {pid} sent message kind {kind} instead of a task result"
                    )));
                }
                Err(Received::Cancelled) => {
                    self.kill_worker();
                    return Err(StageFailure::Engine(EngineError::Cancelled));
                }
                Err(Received::TimedOut) => unreachable!("no deadline while running a task"),
                Err(ended @ (Received::Died(_) | Received::Io(_))) => {
                    let mut dead = self.worker.take().expect("in use");
                    let pid = dead.pid;
                    let status = match ended {
                        Received::Died(status) => status,
                        _ => dead.reap(),
                    };
                    let how = describe_exit(status);
                    let retrying = attempts < self.pool.max_retries;
                    ctx.emit(PipelineEvent::WorkerDied {
                        stage: ctx.stage.to_string(),
                        pid,
                        how: how.clone(),
                        retrying,
                    });
                    if !retrying {
                        let retries = if attempts > 0 {
                            format!(
                                "; the batch failed {} times, max_retries={}",
                                attempts + 1,
                                self.pool.max_retries
                            )
                        } else if self.pool.max_retries == 0 {
                            "; set max_retries to retry such batches on a fresh worker".to_string()
                        } else {
                            String::new()
                        };
                        return Err(StageFailure::WorkerDied { pid, how, retries });
                    }
                    attempts += 1;
                }
            }
        }
    }

    fn close(&mut self) {
        if let Some(mut w) = self.worker.take() {
            let _ = w.send(SHUTDOWN, &[]);
            // A worker that does not exit promptly is killed.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match w.child.as_mut().map(|c| c.try_wait()) {
                    Some(Ok(Some(_))) | None => {
                        w.child = None;
                        break;
                    }
                    _ if Instant::now() >= deadline => {
                        w.kill();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
    }
}

impl PoolWorker {
    fn kill_worker(&mut self) {
        if let Some(mut w) = self.worker.take() {
            w.kill();
        }
    }
}

impl Drop for PoolWorker {
    fn drop(&mut self) {
        self.kill_worker();
    }
}

/// One worker process and our end of its socket.
struct Worker {
    child: Option<Child>,
    socket: UnixStream,
    pid: u32,
}

enum Received {
    Cancelled,
    TimedOut,
    Died(Option<ExitStatus>),
    Io(io::Error),
}

impl Worker {
    fn send(&mut self, kind: u8, payload: &[u8]) -> io::Result<()> {
        let len = u32::try_from(payload.len() + 1)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "message too large"))?;
        let mut frame = Vec::with_capacity(5 + payload.len());
        frame.extend_from_slice(&len.to_le_bytes());
        frame.push(kind);
        frame.extend_from_slice(payload);
        self.socket.write_all(&frame)
    }

    /// The next message; watches the run's cancellation and the child's liveness.
    fn receive(
        &mut self,
        ctx: &WorkerContext<'_>,
        deadline: Option<Instant>,
    ) -> Result<(u8, Vec<u8>), Received> {
        self.socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(Received::Io)?;
        let mut header = [0u8; 5];
        let mut got = 0;
        while got < header.len() {
            match self.socket.read(&mut header[got..]) {
                Ok(0) => return Err(Received::Died(self.reap())),
                Ok(n) => got += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    if ctx.cancel_token().is_cancelled() {
                        return Err(Received::Cancelled);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Received::TimedOut);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                    return Err(Received::Died(self.reap()))
                }
                Err(e) => return Err(Received::Io(e)),
            }
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let mut payload = vec![0u8; len.saturating_sub(1)];
        self.socket
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(Received::Io)?;
        match self.socket.read_exact(&mut payload) {
            Ok(()) => Ok((header[4], payload)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(Received::Died(self.reap())),
            Err(e) => Err(Received::Io(e)),
        }
    }

    /// Wait for the (dead or dying) child and return how it ended.
    fn reap(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                _ => {
                    let _ = child.kill();
                    return child.wait().ok();
                }
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn decode_done(payload: &[u8], task: u64) -> Result<Vec<ObjectId>, String> {
    let bad = || format!("malformed task result for task {task}");
    let got_task = u64::from_le_bytes(
        payload
            .get(..8)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    );
    if got_task != task {
        return Err(format!(
            "the worker answered task {got_task} while task {task} was running"
        ));
    }
    let n = u32::from_le_bytes(
        payload
            .get(8..12)
            .ok_or_else(bad)?
            .try_into()
            .map_err(|_| bad())?,
    ) as usize;
    let ids = payload.get(12..).ok_or_else(bad)?;
    if ids.len() != n * 16 {
        return Err(bad());
    }
    Ok(ids
        .chunks_exact(16)
        .map(|c| ObjectId(u128::from_le_bytes(c.try_into().expect("16 bytes"))))
        .collect())
}

fn decode_error(payload: &[u8]) -> RemoteError {
    let text_len = payload
        .get(..4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize);
    match text_len.and_then(|n| payload.get(4..4 + n).map(|t| (n, t))) {
        Some((n, text)) => RemoteError {
            text: String::from_utf8_lossy(text).into_owned(),
            payload: payload[4 + n..].to_vec(),
        },
        None => RemoteError {
            text: "the worker reported an error it could not describe".into(),
            payload: Vec::new(),
        },
    }
}

/// "killed by signal 9 (SIGKILL)", "exited with code 3".
fn describe_exit(status: Option<ExitStatus>) -> String {
    match status {
        None => "exit status unknown".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
            _ => format!("ended: {s}"),
        },
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV: a crash in native code",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        libc::SIGINT => "SIGINT",
        _ => "signal",
    }
}
