//! Vectored I/O loops: all of a list of buffers written with `pwritev`, or read with `preadv`,
//! despite short transfers, `EINTR` and the `IOV_MAX` limit on buffers per call.

use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::AsRawFd;

/// Most buffers one `pwritev`/`preadv` call takes on Linux (`UIO_MAXIOV`).
pub const IOV_MAX: usize = 1024;

/// Write every byte of `slices` to `file` starting at `offset`, with `pwritev`. Short writes
/// resume where they stopped (the slices are advanced in place), `Interrupted` is retried,
/// and at most [`IOV_MAX`] slices go to one call. Returns the number of write calls made.
pub fn write_all_vectored_at(
    file: &File,
    slices: &mut [IoSlice<'_>],
    offset: u64,
) -> io::Result<usize> {
    write_all_with(slices, |batch, written| {
        let off = libc::off_t::try_from(offset + written)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: `IoSlice` is guaranteed ABI-compatible with `struct iovec` on Unix; the
        // slices are live shared borrows and `batch.len()` ≤ IOV_MAX, so the kernel only
        // reads memory we lend it for the duration of the call.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                batch.as_ptr().cast::<libc::iovec>(),
                batch.len() as libc::c_int,
                off,
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    })
}

/// The retry loop of [`write_all_vectored_at`], over any positional vectored `write`
/// (given the slices of one call and the bytes written so far).
fn write_all_with(
    mut slices: &mut [IoSlice<'_>],
    mut write: impl FnMut(&[IoSlice<'_>], u64) -> io::Result<usize>,
) -> io::Result<usize> {
    let mut calls = 0;
    let mut written = 0u64;
    // Skip leading empty slices so a list of only empty buffers writes nothing.
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let batch = slices.len().min(IOV_MAX);
        calls += 1;
        match write(&slices[..batch], written) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the file accepted no more bytes",
                ))
            }
            Ok(n) => {
                written += n as u64;
                IoSlice::advance_slices(&mut slices, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(calls)
}

/// Fill every byte of `slices` from `file` starting at `offset`, with `preadv`. Short reads
/// resume, `Interrupted` is retried, at most [`IOV_MAX`] slices per call. Hitting the end of
/// the file first is an `UnexpectedEof` error carrying how many bytes were read.
pub fn read_exact_vectored_at(
    file: &File,
    mut slices: &mut [IoSliceMut<'_>],
    mut offset: u64,
) -> io::Result<()> {
    IoSliceMut::advance_slices(&mut slices, 0);
    let start = offset;
    while !slices.is_empty() {
        let batch = slices.len().min(IOV_MAX);
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: `IoSliceMut` is guaranteed ABI-compatible with `struct iovec` on Unix; the
        // slices are live, exclusively borrowed buffers, and `batch` ≤ their count, so the
        // kernel writes only into memory we own for the duration of the call.
        let n = unsafe {
            libc::preadv(
                file.as_raw_fd(),
                slices.as_ptr().cast::<libc::iovec>(),
                batch as libc::c_int,
                off,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("end of file after {} bytes", offset - start),
            ));
        }
        offset += n as u64;
        IoSliceMut::advance_slices(&mut slices, n as usize);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn short_writes_interrupts_and_many_slices() {
        let buffers: Vec<Vec<u8>> = (0..3000).map(|i| vec![(i % 251) as u8; i % 7]).collect();
        let expected: Vec<u8> = buffers.concat();
        let mut slices: Vec<IoSlice> = buffers.iter().map(|b| IoSlice::new(b)).collect();
        // Accepts at most 5 bytes per call and fails every third call with EINTR.
        let mut out = Vec::new();
        let mut calls = 0;
        write_all_with(&mut slices, |batch, written| {
            assert!(batch.len() <= IOV_MAX);
            assert_eq!(written, out.len() as u64);
            calls += 1;
            if calls % 3 == 0 {
                return Err(io::Error::from(io::ErrorKind::Interrupted));
            }
            let mut left = 5;
            for b in batch {
                let take = b.len().min(left);
                out.extend_from_slice(&b[..take]);
                left -= take;
                if left == 0 {
                    break;
                }
            }
            Ok(5 - left)
        })
        .unwrap();
        assert_eq!(out, expected);
    }

    #[test]
    fn pwritev_writes_at_the_offset_across_many_slices() {
        let f = tempfile::tempfile().unwrap();
        let buffers: Vec<Vec<u8>> = (0..2500).map(|i| vec![(i % 251) as u8; i % 5]).collect();
        let mut slices: Vec<IoSlice> = buffers.iter().map(|b| IoSlice::new(b)).collect();
        let calls = write_all_vectored_at(&f, &mut slices, 100).unwrap();
        assert!(
            calls >= 3,
            "2500 slices need at least 3 calls, made {calls}"
        );
        let expected = buffers.concat();
        let mut back = vec![0u8; expected.len()];
        read_exact_vectored_at(&f, &mut [IoSliceMut::new(&mut back)], 100).unwrap();
        assert_eq!(back, expected);
    }

    #[test]
    fn preadv_reads_across_slices_and_reports_eof() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        f.write_all(&data).unwrap();
        let (mut a, mut b) = (vec![0u8; 100], vec![0u8; 5000]);
        read_exact_vectored_at(
            &f,
            &mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)],
            7,
        )
        .unwrap();
        assert_eq!(a, data[7..107]);
        assert_eq!(b, data[107..5107]);
        let mut c = vec![0u8; 100];
        let err = read_exact_vectored_at(&f, &mut [IoSliceMut::new(&mut c)], 9950).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
