//! Reading byte ranges of local files, for column chunks.
//!
//! object_store's `LocalFileSystem` answers a ranged GET by zero-filling a fresh buffer and
//! then reading into it on tokio's blocking pool: a `memset` of every byte plus two thread
//! hand-offs per request. On a warm 2-column scan that was about 6 % of the CPU. Here:
//!
//! - the buffer is allocated uninitialised and `pread` fills it (the kernel's copy from the
//!   page cache is the only pass over the bytes);
//! - the first attempt is `preadv2(RWF_NOWAIT)` on the calling (decoding) thread, which the
//!   kernel serves only from the page cache and never blocks on the device: for a cached file
//!   that is the whole read, with no hand-off;
//! - whatever was not cached is read on tokio's blocking pool, so a cold disk never stalls a
//!   decoding worker.
//!
//! A file shorter than the range (truncated after it was listed) is an error, never a short
//! buffer. Footers still go through object_store (one request per file; nothing to gain).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

/// Read `range` of the file at `path`.
pub(crate) async fn read_range(path: Arc<Path>, range: Range<u64>) -> io::Result<Bytes> {
    let len = usize::try_from(range.end - range.start)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "range too large"))?;
    let file = File::open(&path)?;
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    read_cached_part(&file, &mut buf, len, range.start)?;
    if buf.len() < len {
        buf = tokio::task::spawn_blocking(move || {
            while buf.len() < len {
                let offset = range.start + buf.len() as u64;
                if pread_into_spare(&file, &mut buf, len, offset, 0)? == 0 {
                    return Err(ended_early(range.start, buf.len(), len));
                }
            }
            Ok(buf)
        })
        .await
        .map_err(io::Error::other)??;
    }
    Ok(Bytes::from(buf))
}

/// Fill `buf` (up to `len` bytes) with what the page cache holds, without blocking on the
/// device. Stops at the first byte that would need the disk.
fn read_cached_part(file: &File, buf: &mut Vec<u8>, len: usize, start: u64) -> io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    while buf.len() < len {
        let offset = start + buf.len() as u64;
        match pread_into_spare(file, buf, len, offset, libc::RWF_NOWAIT) {
            Ok(0) => return Err(ended_early(start, buf.len(), len)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EAGAIN: the rest is not cached. EOPNOTSUPP/EINVAL/ENOSYS: the file system or kernel
            // does not support RWF_NOWAIT. Either way the blocking path reads the rest.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
                ) =>
            {
                return Ok(())
            }
            Err(e) => return Err(e),
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (file, buf, len, start);
    Ok(())
}

/// One `preadv2` into the uninitialised tail of `buf` (at most up to `len` bytes in total);
/// the bytes read become part of `buf`. Returns how many were read (0 at end of file).
fn pread_into_spare(
    file: &File,
    buf: &mut Vec<u8>,
    len: usize,
    offset: u64,
    flags: libc::c_int,
) -> io::Result<usize> {
    let want = len - buf.len();
    let spare = &mut buf.spare_capacity_mut()[..want];
    let iov = libc::iovec {
        iov_base: spare.as_mut_ptr().cast(),
        iov_len: spare.len(),
    };
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY (both calls): the iovec covers `want` bytes of `buf`'s spare capacity, which we
    // exclusively borrow for the call; the kernel writes at most that many bytes there.
    let n = if flags == 0 {
        unsafe { libc::preadv(file.as_raw_fd(), &iov, 1, off) }
    } else {
        preadv2_syscall(file.as_raw_fd(), &iov, off, flags)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel initialised the first `n` (≤ want) bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// `preadv2` through the raw system call. glibc's wrapper appeared in glibc 2.26; calling
/// the kernel directly keeps the wheel loadable on glibc 2.17 (manylinux2014). A kernel
/// without the call (before 4.6) answers ENOSYS, which the caller treats as "not supported".
#[cfg(target_os = "linux")]
fn preadv2_syscall(
    fd: libc::c_int,
    iov: &libc::iovec,
    offset: libc::off_t,
    flags: libc::c_int,
) -> isize {
    // The offset travels as (low, high) halves; on 64-bit targets the low word holds all of
    // it and the high word must be 0.
    #[cfg(target_pointer_width = "64")]
    let (low, high) = (offset as libc::c_ulong, 0 as libc::c_ulong);
    #[cfg(target_pointer_width = "32")]
    let (low, high) = (
        offset as u64 as libc::c_ulong,
        (offset as u64 >> 32) as libc::c_ulong,
    );
    // SAFETY: the caller's iovec describes memory it exclusively borrows for this call.
    unsafe {
        libc::syscall(
            libc::SYS_preadv2,
            fd,
            iov as *const libc::iovec,
            1,
            low,
            high,
            flags,
        ) as isize
    }
}

#[cfg(not(target_os = "linux"))]
fn preadv2_syscall(
    fd: libc::c_int,
    iov: &libc::iovec,
    offset: libc::off_t,
    _flags: libc::c_int,
) -> isize {
    // SAFETY: as above; no flags on this platform.
    unsafe { libc::preadv(fd, iov, 1, offset) }
}

fn ended_early(start: u64, read: usize, len: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "the file ends at byte {} but {len} bytes were expected from byte {start} \
             (truncated while being read?)",
            start + read as u64
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn reads_exact_ranges_and_reports_a_short_file() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        f.as_file().sync_all().unwrap();
        let path: Arc<Path> = f.path().into();
        for cold in [true, false] {
            if cold {
                // Drop the (clean) pages from the page cache, so the non-blocking attempt
                // finds nothing and the blocking pool reads (best effort: the kernel may
                // keep some pages; the result must be the same either way).
                // SAFETY: a plain syscall on a descriptor we own.
                unsafe {
                    libc::posix_fadvise(f.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
                };
            }
            for range in [
                0..0,
                0..1,
                5..70_000,
                4096..8192,
                299_999..300_000,
                0..300_000,
            ] {
                let got = block_on(read_range(path.clone(), range.clone())).unwrap();
                assert_eq!(&got[..], &data[range.start as usize..range.end as usize]);
            }
        }
        let err = block_on(read_range(path.clone(), 299_000..300_001)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("ends at byte 300000"), "{err}");
        let missing = block_on(read_range(Path::new("/nonexistent/x.parquet").into(), 0..1));
        assert_eq!(missing.unwrap_err().kind(), io::ErrorKind::NotFound);
    }
}
