//! Which input files and row groups a checkpointed run has finished, decided without races.
//!
//! ```text
//!  source: FileTicket (held while the file's units are emitted)
//!            └─ UnitTicket per row group (held while its batches are emitted)
//!                 └─ cloned into the Origin of every batch derived from it
//!                    (slices, re-chunked pieces, map outputs: each batch its own clone)
//!
//!  a holder lets go *legitimately* through the book:
//!     the writer, when the batches are committed; a stage, when a batch came out empty;
//!     the source, when a unit or file is fully emitted
//!  ──► under the book's lock: a ticket whose every remaining reference is being released
//!      is complete; a file whose every unit ticket completes (and whose hold is gone) is too
//! ```
//!
//! Anything else that drops a batch (an error, a cancellation, a limit that stopped early)
//! drops its references without the book. When such a drop is a ticket's *last* reference,
//! the book is poisoned: no unit or file completes for the rest of the run (they are read
//! again on resume, filtered by id; never skipped with rows missing). Completions are
//! handed to the next commit record ([`LineageBook::take_completed`]); the commit protocol
//! serialises commits, so a completion is recorded only with or after the output it depends
//! on.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

thread_local! {
    /// Set while the book releases references: a ticket dropped then is done legitimately.
    static RELEASING: Cell<bool> = const { Cell::new(false) };
}

/// Poisons the book when the last reference of a ticket goes without the book.
#[derive(Debug)]
struct Guard(Arc<AtomicBool>);

impl Drop for Guard {
    fn drop(&mut self) {
        if !RELEASING.with(Cell::get) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// A file of the source being read.
#[derive(Debug)]
pub(crate) struct FileTicket {
    pub file_index: usize,
    _guard: Guard,
}

/// A row group of a file being read.
#[derive(Debug)]
pub(crate) struct UnitTicket {
    pub file: Arc<FileTicket>,
    pub row_group: usize,
    _guard: Guard,
}

/// Units and files completed since the last commit took them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Completed {
    /// `(file index, row group)`.
    pub units: Vec<(usize, usize)>,
    /// File indices.
    pub files: Vec<usize>,
}

impl Completed {
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.units.is_empty() && self.files.is_empty()
    }
}

#[derive(Default)]
pub(crate) struct LineageBook {
    completed: Mutex<Completed>,
    poisoned: Arc<AtomicBool>,
}

/// Marks drops on this thread as legitimate while it lives.
struct Releasing;

impl Releasing {
    fn start() -> Releasing {
        RELEASING.with(|r| r.set(true));
        Releasing
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        RELEASING.with(|r| r.set(false));
    }
}

impl LineageBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Completed> {
        self.completed.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn file(&self, file_index: usize) -> Arc<FileTicket> {
        Arc::new(FileTicket {
            file_index,
            _guard: Guard(self.poisoned.clone()),
        })
    }

    pub(crate) fn unit(&self, file: &Arc<FileTicket>, row_group: usize) -> Arc<UnitTicket> {
        Arc::new(UnitTicket {
            file: file.clone(),
            row_group,
            _guard: Guard(self.poisoned.clone()),
        })
    }

    /// No completion is recorded from now on (the run failed, or a ticket was dropped
    /// without the book).
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// A holder lets go of these references legitimately (their rows are done).
    pub(crate) fn release(&self, held: Vec<Arc<UnitTicket>>) {
        if held.is_empty() {
            return;
        }
        let mut completed = self.lock();
        let _releasing = Releasing::start();
        let mut counts: HashMap<*const UnitTicket, (usize, Arc<UnitTicket>)> = HashMap::new();
        for t in &held {
            counts
                .entry(Arc::as_ptr(t))
                .or_insert_with(|| (0, t.clone()))
                .0 += 1;
        }
        // `counts` holds one more clone of each ticket.
        let mut files: HashMap<*const FileTicket, (usize, Arc<FileTicket>)> = HashMap::new();
        for (n, ticket) in counts.values() {
            if Arc::strong_count(ticket) == n + 1 {
                completed
                    .units
                    .push((ticket.file.file_index, ticket.row_group));
                files
                    .entry(Arc::as_ptr(&ticket.file))
                    .or_insert_with(|| (0, ticket.file.clone()))
                    .0 += 1;
            }
        }
        drop(held);
        drop(counts);
        // The completing units' tickets are gone; each file ticket is now referenced by its
        // other units, the source's hold, and our clone.
        for (_, file) in files.values() {
            if Arc::strong_count(file) == 1 {
                completed.files.push(file.file_index);
            }
        }
        drop(files);
    }

    /// The source finished emitting a file's units: release its hold.
    pub(crate) fn release_file(&self, file: Arc<FileTicket>) {
        let mut completed = self.lock();
        let _releasing = Releasing::start();
        if Arc::strong_count(&file) == 1 {
            completed.files.push(file.file_index);
        }
        drop(file);
    }

    /// Completions since the last call; none once the book is poisoned.
    pub(crate) fn take_completed(&self) -> Completed {
        let taken = std::mem::take(&mut *self.lock());
        if self.is_poisoned() {
            Completed::default()
        } else {
            taken
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_completes_only_with_its_last_reference() {
        let book = LineageBook::default();
        let file = book.file(3);
        let u0 = book.unit(&file, 0);
        let u1 = book.unit(&file, 1);
        // Two batches derived from u0, one from u1; the source still holds both units.
        let (a, b, c) = (u0.clone(), u0.clone(), u1.clone());
        book.release(vec![a]);
        assert!(book.take_completed().is_empty(), "b and the source hold u0");
        book.release(vec![u0]); // the source's hold
        assert!(book.take_completed().is_empty(), "b still holds u0");
        book.release(vec![b]);
        assert_eq!(book.take_completed().units, vec![(3, 0)]);
        book.release(vec![u1, c]);
        let done = book.take_completed();
        assert_eq!(done.units, vec![(3, 1)]);
        assert!(done.files.is_empty(), "the source still holds the file");
        book.release_file(file);
        assert_eq!(book.take_completed().files, vec![3]);
        assert!(!book.is_poisoned());
    }

    #[test]
    fn a_last_reference_dropped_outside_the_book_poisons_it() {
        let book = LineageBook::default();
        let file = book.file(0);
        let other = book.file(1);
        let u = book.unit(&file, 0);
        let w = book.unit(&other, 0);
        let batch = u.clone();
        drop(u); // not the last reference: nothing happens
        assert!(!book.is_poisoned());
        drop(batch); // the last one, e.g. a batch dropped by an error
        assert!(book.is_poisoned());
        book.release(vec![w]);
        book.release_file(file);
        book.release_file(other);
        assert!(
            book.take_completed().is_empty(),
            "nothing completes once poisoned"
        );
    }
}
