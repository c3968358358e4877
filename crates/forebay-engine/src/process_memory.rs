//! The memory a run costs the process beyond what the pool has on its books.
//!
//! The pool charges every batch in flight, but the process holds more: the Parquet decoder's
//! working pages, what user functions allocate and drop, and above all the allocator's own
//! retention (glibc keeps freed blocks in per-thread arenas for reuse). Measured on the
//! 10x-over-the-cap benchmark: the pool held ~300 MB of a 400 MiB limit while glibc held
//! ~330-400 MB in use and another 150-250 MB free, and the process's anonymous memory grew by
//! ~480-520 MB. The cap is a cap on the process, so the source's admission counts this
//! difference too:
//!
//! ```text
//!  anonymous resident bytes now − at the start of the run      (/proc/self/statm, at most
//!                                                               every 20 ms, and afresh
//!                                                               after each admission)
//!        − bytes the pool has charged                          = untracked
//!  the source admits a batch when
//!        charged + batch + headroom + untracked ≤ limit
//!     or batches held + batch ≤ limit / 4 (and the books alone fit the limit)
//!     or no batch is held at all (so a run always progresses)
//! ```
//!
//! The headroom is what will be allocated before the next look shows it: a batch for each
//! worker downstream and for each of the scan's decoding threads. The admitted batch itself
//! is already decoded, so it is in the process figure too; counting it twice is the margin.
//!
//! When untracked memory is what keeps the source waiting, the allocator is asked to hand its
//! free pages back to the OS first (`malloc_trim`, at most every 200 ms): retention of freed
//! batches is the largest part of it. What a trim cannot return is held by live allocations
//! outside the books (the decoder's working pages, interpreter objects, a model the user's
//! function loaded); the source waits for it like for any other memory, except that the
//! batches in flight always get a quarter of the limit: a large model slows a run (fewer
//! batches in flight) but never stalls it. Such a run exceeds its limit by what the model
//! holds beyond three quarters of it.
//!
//! Off Linux (no `/proc/self/statm`) the pool counts its own charges only.

use std::time::{Duration, Instant};

/// How long a measurement of the process is reused (reading `/proc` costs ~10-20 µs).
const MEASURE_EVERY: Duration = Duration::from_millis(20);
/// The least time between two `malloc_trim` calls (one walks every arena).
const TRIM_EVERY: Duration = Duration::from_millis(200);

/// Reads the process's memory growth since the run started, and returns free heap pages.
pub(crate) struct ProcessMemory {
    read: Box<dyn FnMut() -> Option<usize> + Send>,
    trim: fn(),
    baseline: usize,
    last: Option<(Instant, usize)>,
    last_trim: Option<Instant>,
}

impl ProcessMemory {
    /// Measure this process (`None` where its memory cannot be read).
    pub(crate) fn of_this_process() -> Option<ProcessMemory> {
        ProcessMemory::with_reader(Box::new(anonymous_resident_bytes), give_back_free_heap)
    }

    /// Measure with `read` and trim with `trim` (tests substitute their own).
    pub(crate) fn with_reader(
        mut read: Box<dyn FnMut() -> Option<usize> + Send>,
        trim: fn(),
    ) -> Option<ProcessMemory> {
        let baseline = read()?;
        Some(ProcessMemory {
            read,
            trim,
            baseline,
            last: None,
            last_trim: None,
        })
    }

    /// Bytes the process holds beyond the books: its growth, less what the pool has
    /// `charged`.
    pub(crate) fn untracked(&mut self, charged: usize) -> usize {
        self.growth().saturating_sub(charged)
    }

    /// Bytes the process holds now beyond what it held when the run started.
    fn growth(&mut self) -> usize {
        let now = Instant::now();
        match self.last {
            Some((at, growth)) if now.duration_since(at) < MEASURE_EVERY => growth,
            _ => {
                let growth = (self.read)().map_or(0, |b| b.saturating_sub(self.baseline));
                self.last = Some((now, growth));
                growth
            }
        }
    }

    /// A batch was admitted on the last measurement: the next admission measures afresh.
    /// Taking a batch lets the source decode another at once, which the last figure cannot
    /// show; without this, every batch admitted within one measurement period is judged
    /// against the same figure.
    pub(crate) fn admitted(&mut self) {
        self.last = None;
    }

    /// The trim to run now, if one is due (rate-limited); the caller runs it without
    /// holding the pool's lock, then measures again.
    pub(crate) fn due_trim(&mut self) -> Option<fn()> {
        let now = Instant::now();
        if self
            .last_trim
            .is_some_and(|t| now.duration_since(t) < TRIM_EVERY)
        {
            return None;
        }
        self.last_trim = Some(now);
        self.last = None; // measure afresh after the trim
        Some(self.trim)
    }
}

/// Hand the allocator's free pages back to the OS.
fn give_back_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas and releases free pages; it takes no
    // pointers from us and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident anonymous memory of this process: `resident − shared` pages of
/// `/proc/self/statm` (shared = file-backed and shared-memory pages, such as the object
/// store's mapping and Parquet files in the page cache, which the pool accounts itself or
/// which the kernel can drop).
fn anonymous_resident_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut fields = statm.split_ascii_whitespace().skip(1);
    let resident: usize = fields.next()?.parse().ok()?;
    let shared: usize = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(resident.saturating_sub(shared) * usize::try_from(page).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_trim() {}

    #[test]
    fn untracked_is_the_growth_since_the_start_beyond_the_books() {
        assert!(anonymous_resident_bytes().is_some_and(|b| b > 0));
        let figures = std::sync::Arc::new(std::sync::Mutex::new(100usize));
        let source = figures.clone();
        let mut memory =
            ProcessMemory::with_reader(Box::new(move || Some(*source.lock().unwrap())), no_trim)
                .unwrap();
        assert_eq!(memory.untracked(0), 0);
        *figures.lock().unwrap() = 150;
        assert!(memory.due_trim().is_some()); // also forgets the cached figure
        assert!(memory.due_trim().is_none(), "trims are rate-limited");
        // 50 grown, 10 of it charged.
        assert_eq!(memory.untracked(10), 40);
        // Charges beyond the growth (budgets not yet filled) leave nothing untracked.
        assert_eq!(memory.untracked(60), 0);
        *figures.lock().unwrap() = 90;
        memory.last = None;
        assert_eq!(memory.untracked(0), 0, "memory below the start");
    }

    #[test]
    fn an_admission_makes_the_next_look_measure_afresh() {
        let figures = std::sync::Arc::new(std::sync::Mutex::new(100usize));
        let source = figures.clone();
        let mut memory =
            ProcessMemory::with_reader(Box::new(move || Some(*source.lock().unwrap())), no_trim)
                .unwrap();
        assert_eq!(memory.untracked(0), 0);
        // Within the measurement period the figure is reused (dated in the future here, so
        // that a slow machine cannot let the period run out between two lines)...
        memory.last = Some((Instant::now() + Duration::from_secs(3600), 0));
        *figures.lock().unwrap() = 130;
        assert_eq!(memory.untracked(0), 0);
        // ...unless a batch was admitted on it.
        memory.admitted();
        assert_eq!(memory.untracked(0), 30);
    }
}
