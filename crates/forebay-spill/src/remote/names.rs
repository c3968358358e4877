//! The directory a target writes under, naming its process (`<pid>-<nonce>-<host>`), and
//! telling from a name whether its process is gone.

use std::sync::atomic::{AtomicU64, Ordering};

/// A path segment naming this process: `<pid>-<nonce>-<host>`.
pub(super) fn process_dir_name() -> String {
    let nonce = {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        xxhash_rust::xxh3::xxh3_64(&[now.to_le_bytes().as_slice(), &seq.to_le_bytes()].concat())
    };
    format!("{}-{nonce:016x}-{}", std::process::id(), host_name())
}

/// This machine's host name, reduced to characters safe in any object store key.
pub(super) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length; gethostname writes at most that
    // many bytes and we only read up to the first NUL (or the end).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let raw = if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    };
    let safe: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "unknown-host".into()
    } else {
        safe
    }
}

/// The pid and host of a directory name written by [`process_dir_name`].
pub(super) fn parse_process_dir(name: &str) -> Option<(u32, &str)> {
    let (pid, rest) = name.split_once('-')?;
    let (nonce, host) = rest.split_once('-')?;
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((pid.parse().ok()?, host))
}
