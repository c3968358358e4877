//! Re-chunking a stream of batches into batches of exactly `batch_size` rows (the last one
//! may be smaller).
//!
//! ```text
//!  in:  [ 100 rows ][ 250 rows              ][ 30 ]
//!  out: [ 128: slice 0..100 + 28 of next (copy)][128: slice][ 94 + 30 (copy) ] ...
//! ```
//!
//! A chunk that lies inside one input batch is a zero-copy slice (it shares, and is charged
//! through, the input's allocations); only a chunk that spans input batches is concatenated
//! ([`Rechunker::push`]). [`Rechunker::push_runs`] never copies: a chunk is handed out as
//! the slices that make it up (iter_batches gives those to Python as one multi-chunk
//! `pyarrow.Table`; with batch sizes that do not divide the row groups, nearly every chunk
//! spans two input batches, so concatenating would copy almost all the data), and the
//! chunks inside one input batch as one slice of them all, cut by the caller:
//!
//! ```text
//!  in:   [ 100 rows ][ 600 rows                                    ]
//!  runs: Pieces[100 + 28 of next] Run[ 128 | 128 | 128 | 128 ] (rest: 88 rows wait)
//! ```
//!
//! The rows left over after the last full chunk wait for the next input batch, held by a
//! consumer that the source never waits on
//! ([`MemoryPool::consumer_awaiting_input`](crate::memory::MemoryPool::consumer_awaiting_input)):
//! waiting for them to drain would wait forever, since they drain only when the source sends
//! more. Kept as a slice, they pin the whole input batch they came from (its buffers are
//! shared), so the source, not waiting for them, could go over the cap by that batch. They
//! stay a slice while the pool has room for one more batch of that size next to what it
//! holds; otherwise the leftover rows (fewer than `batch_size`) are copied into compact
//! buffers of their own. (Copying always cost iter_batches a quarter of its speed over
//! lineitem: with 65,536-row batches over ~107,000-row row groups, 39 % of the rows were
//! leftovers.)

use std::collections::VecDeque;

use arrow_array::RecordBatch;

use crate::batch::{EngineBatch, Origin};
use crate::error::{EngineError, Result};
use crate::memory::{batch_memory, Admission, MemoryConsumer};
use crate::queue::Queued;

/// Output batches of exactly `batch_size` rows (the last may be smaller), as
/// [`Rechunker::push_runs`] hands them out.
pub(crate) enum Chunks {
    /// One output batch: the zero-copy slices that make it up, in order.
    Pieces(Vec<EngineBatch>),
    /// Consecutive output batches of `each` rows cut from one input batch: `run` is one
    /// slice of them all (a multiple of `each` rows).
    Run { run: EngineBatch, each: usize },
}

impl Chunks {
    /// The rows of each output batch.
    pub(crate) fn batch_rows(&self) -> Vec<usize> {
        match self {
            Chunks::Pieces(pieces) => vec![pieces.iter().map(|b| b.batch.num_rows()).sum()],
            Chunks::Run { run, each } => vec![*each; run.batch.num_rows() / each],
        }
    }
}

impl Queued for Chunks {
    fn memory(&self) -> usize {
        match self {
            Chunks::Pieces(pieces) => pieces.memory(),
            Chunks::Run { run, .. } => run.memory(),
        }
    }
    fn move_to(&self, holder: &MemoryConsumer) {
        match self {
            Chunks::Pieces(pieces) => Queued::move_to(pieces, holder),
            Chunks::Run { run, .. } => run.move_to(holder),
        }
    }
}

pub(crate) struct Rechunker {
    stage: String,
    target: usize,
    pending: VecDeque<EngineBatch>,
    rows: usize,
    /// Charged for the chunks handed out.
    holder: MemoryConsumer,
    /// Charged for the rows waiting to complete a chunk.
    waiting: MemoryConsumer,
    /// The front of `pending` is the rest of a sliced batch (it pins that whole batch).
    front_is_sliced: bool,
    next_seq: u64,
}

impl Rechunker {
    /// `holder` is charged for the chunks handed out; the rows waiting to complete a chunk
    /// are charged to a consumer of the same pool that waits for input.
    pub(crate) fn new(stage: &str, target: usize, holder: MemoryConsumer) -> Rechunker {
        let waiting = holder
            .pool()
            .consumer_awaiting_input(format!("{stage} (rows short of a batch)"));
        Rechunker {
            stage: stage.to_string(),
            target: target.max(1),
            pending: VecDeque::new(),
            rows: 0,
            holder,
            waiting,
            front_is_sliced: false,
            next_seq: 0,
        }
    }

    /// Copy the leftover rows of a sliced batch into buffers of their own, unless the pool
    /// has room for another batch as large as the one they pin (see the module docs);
    /// called when every full chunk has been handed out.
    fn compact_leftover(&mut self) -> Result<()> {
        if !self.front_is_sliced || self.rows == 0 {
            return Ok(());
        }
        let pool = self.waiting.pool();
        let pinned = batch_memory(&self.pending.front().expect("rows > 0").batch);
        if pool.used() + pinned <= pool.limit() {
            // Checked again after the next push, if these rows are still waiting then.
            return Ok(());
        }
        self.front_is_sliced = false;
        let head = self
            .pending
            .pop_front()
            .expect("rows > 0 means a pending batch");
        let compact =
            crate::concat::compact_batch(&head.batch).map_err(|e| EngineError::BadOutput {
                stage: self.stage.clone(),
                batch: head.label(),
                reason: format!("cannot copy the rows that wait for the next batch: {e}"),
            })?;
        let reservation = self.waiting.reserve_batch(&compact, Admission::Now)?;
        self.pending.push_front(EngineBatch {
            batch: compact,
            seq: head.seq,
            origin: head.origin.clone(),
            reservation,
        });
        Ok(())
    }

    /// Add a batch; returns the chunks it completes.
    pub(crate) fn push(&mut self, batch: EngineBatch) -> Result<Vec<EngineBatch>> {
        if batch.batch.num_rows() == 0 {
            return Ok(Vec::new());
        }
        batch.move_to(&self.waiting);
        self.rows += batch.batch.num_rows();
        self.pending.push_back(batch);
        let mut out = Vec::new();
        while self.rows >= self.target {
            out.push(self.take(self.target)?);
        }
        self.compact_leftover()?;
        Ok(out)
    }

    /// Add a batch without ever splitting one: batches are merged whole while they fit in
    /// `batch_size` rows, and one larger than that goes alone. Returns the chunks it
    /// completes. (A checkpointed run's later maps: each chunk then holds what whole input
    /// batches became; see `positions`.)
    pub(crate) fn push_whole(&mut self, batch: EngineBatch) -> Result<Vec<EngineBatch>> {
        let rows = batch.batch.num_rows();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        if self.rows > 0 && self.rows + rows > self.target {
            out.push(self.take(self.rows)?);
        }
        batch.move_to(&self.waiting);
        self.rows += rows;
        self.pending.push_back(batch);
        if self.rows >= self.target {
            out.push(self.take(self.rows)?);
        }
        Ok(out)
    }

    /// The rows left at the end of the input (fewer than `batch_size`), if any.
    pub(crate) fn finish(&mut self) -> Result<Option<EngineBatch>> {
        if self.rows == 0 {
            return Ok(None);
        }
        self.take(self.rows).map(Some)
    }

    /// Add a batch; returns the chunks it completes without copying: a chunk that spans
    /// input batches as the slices that make it up ([`Chunks::Pieces`]), and the chunks that
    /// lie inside the new batch as one [`Chunks::Run`], a single slice of all of them
    /// (iter_batches' caller cuts it, so that a thousand 256-row batches of one row group
    /// cost one hand-over, not a thousand).
    pub(crate) fn push_runs(&mut self, batch: EngineBatch) -> Result<Vec<Chunks>> {
        let rows = batch.batch.num_rows();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let had_leftover = self.rows > 0;
        batch.move_to(&self.waiting);
        self.rows += rows;
        self.pending.push_back(batch);
        let mut out = Vec::new();
        if had_leftover && self.rows >= self.target {
            // The rows left over before (fewer than a chunk) and the first of the new batch.
            out.push(Chunks::Pieces(self.take_pieces(self.target)?));
        }
        let whole_chunk_rows = self.rows / self.target * self.target;
        if whole_chunk_rows > 0 {
            // Only the new batch's rows are pending now: the chunk above took the others.
            let mut run = self.take_pieces(whole_chunk_rows)?;
            debug_assert_eq!(run.len(), 1, "a run lies inside one batch");
            if let Some(run) = run.pop() {
                out.push(Chunks::Run {
                    run,
                    each: self.target,
                });
            }
        }
        self.compact_leftover()?;
        Ok(out)
    }

    /// The rows left at the end, as pieces.
    pub(crate) fn finish_pieces(&mut self) -> Result<Option<Vec<EngineBatch>>> {
        if self.rows == 0 {
            return Ok(None);
        }
        self.take_pieces(self.rows).map(Some)
    }

    fn take_pieces(&mut self, n: usize) -> Result<Vec<EngineBatch>> {
        let mut pieces = Vec::new();
        let mut needed = n;
        while needed > 0 {
            let head = self.pending.pop_front().expect("rows counted");
            let rows = head.batch.num_rows();
            if rows <= needed {
                needed -= rows;
                head.move_to(&self.holder);
                pieces.push(head);
                self.front_is_sliced = false;
            } else {
                let (front, back) = split_origin(&head.origin, needed);
                let piece = head.batch.slice(0, needed);
                let rest = head.batch.slice(needed, rows - needed);
                let piece_reservation = self.holder.reserve_batch(&piece, Admission::Now)?;
                let rest_reservation = self.waiting.reserve_batch(&rest, Admission::Now)?;
                self.front_is_sliced = true;
                pieces.push(EngineBatch {
                    batch: piece,
                    seq: head.seq,
                    origin: front,
                    reservation: piece_reservation,
                });
                self.pending.push_front(EngineBatch {
                    batch: rest,
                    seq: head.seq,
                    origin: back,
                    reservation: rest_reservation,
                });
                needed = 0;
            }
        }
        self.rows -= n;
        self.next_seq += 1;
        Ok(pieces)
    }

    fn take(&mut self, n: usize) -> Result<EngineBatch> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let head = self
            .pending
            .front()
            .expect("rows > 0 means a pending batch");
        let head_rows = head.batch.num_rows();
        if head_rows >= n {
            // Inside one batch: a zero-copy slice.
            let head = self.pending.pop_front().expect("checked");
            self.rows -= n;
            let (front, back) = split_origin(&head.origin, n);
            let chunk = head.batch.slice(0, n);
            self.front_is_sliced = head_rows > n;
            if head_rows > n {
                let rest = head.batch.slice(n, head_rows - n);
                let reservation = self.waiting.reserve_batch(&rest, Admission::Now)?;
                self.pending.push_front(EngineBatch {
                    batch: rest,
                    seq: head.seq,
                    origin: back,
                    reservation,
                });
            }
            let reservation = self.holder.reserve_batch(&chunk, Admission::Now)?;
            // `head` (and its reservation) goes now: the pieces hold the allocations.
            drop(head);
            return Ok(EngineBatch {
                batch: chunk,
                seq,
                origin: front,
                reservation,
            });
        }
        // Spans batches: gather slices, concatenate (one copy).
        let mut parts: Vec<RecordBatch> = Vec::new();
        let mut origin: Vec<Origin> = Vec::new();
        let mut consumed = Vec::new();
        let mut needed = n;
        while needed > 0 {
            let head = self.pending.pop_front().expect("rows counted");
            let rows = head.batch.num_rows();
            if rows <= needed {
                needed -= rows;
                parts.push(head.batch.clone());
                origin.extend(head.origin.iter().cloned());
                consumed.push(head);
                self.front_is_sliced = false;
            } else {
                let (front, back) = split_origin(&head.origin, needed);
                parts.push(head.batch.slice(0, needed));
                origin.extend(front);
                let rest = head.batch.slice(needed, rows - needed);
                let reservation = self.waiting.reserve_batch(&rest, Admission::Now)?;
                self.front_is_sliced = true;
                self.pending.push_front(EngineBatch {
                    batch: rest,
                    seq: head.seq,
                    origin: back,
                    reservation,
                });
                consumed.push(head);
                needed = 0;
            }
        }
        self.rows -= n;
        let schema = parts[0].schema();
        let chunk =
            crate::concat::concat_batches(&schema, &parts).map_err(|e| EngineError::BadOutput {
                stage: self.stage.clone(),
                batch: crate::batch::label(seq, &origin),
                reason: format!(
                    "batches with different schemas cannot be re-chunked into batch_size \
                     {}: {e}",
                    self.target
                ),
            })?;
        let reservation = self.holder.reserve_batch(&chunk, Admission::Now)?;
        drop(parts);
        drop(consumed);
        Ok(EngineBatch {
            batch: chunk,
            seq,
            origin,
            reservation,
        })
    }
}

/// Split an origin list covering a batch's rows at row `at`: (rows before, rows from).
pub(crate) fn split_origin(origin: &[Origin], at: usize) -> (Vec<Origin>, Vec<Origin>) {
    let (mut front, mut back) = (Vec::new(), Vec::new());
    let mut seen = 0;
    for o in origin {
        let len = o.rows.len();
        if seen + len <= at {
            front.push(o.clone());
        } else if seen >= at {
            back.push(o.clone());
        } else {
            let cut = o.rows.start + (at - seen);
            front.push(Origin {
                rows: o.rows.start..cut,
                ..o.clone()
            });
            back.push(Origin {
                rows: cut..o.rows.end,
                ..o.clone()
            });
        }
        seen += len;
    }
    (front, back)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{batch_memory, MemoryPool};
    use arrow_array::{Array, Int64Array};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    fn input(pool: &MemoryPool, seq: u64, start: i64, n: usize) -> EngineBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(
                start..start + n as i64,
            ))],
        )
        .unwrap();
        let reservation = pool
            .consumer("in")
            .reserve_batch(&batch, Admission::Now)
            .unwrap();
        EngineBatch {
            batch,
            seq,
            origin: vec![Origin {
                provenance: None,
                source_seq: seq,
                rows: 0..n,
                ticket: None,
                position: None,
            }],
            reservation,
        }
    }

    fn values(b: &EngineBatch) -> Vec<i64> {
        column(&b.batch)
    }

    #[test]
    fn chunks_have_exact_sizes_and_keep_row_order() {
        let pool = MemoryPool::new(1 << 30);
        let mut r = Rechunker::new("s", 128, pool.consumer("stage"));
        let mut out = Vec::new();
        let mut start = 0;
        for (seq, n) in [100usize, 250, 30, 1, 500].into_iter().enumerate() {
            out.extend(r.push(input(&pool, seq as u64, start, n)).unwrap());
            start += n as i64;
        }
        out.extend(r.finish().unwrap());
        let sizes: Vec<usize> = out.iter().map(|b| b.batch.num_rows()).collect();
        assert_eq!(sizes, vec![128, 128, 128, 128, 128, 128, 113]);
        let all: Vec<i64> = out.iter().flat_map(values).collect();
        assert_eq!(all, (0..start).collect::<Vec<_>>());
        // Origins cover each chunk's rows exactly.
        for b in &out {
            let covered: usize = b.origin.iter().map(|o| o.rows.len()).sum();
            assert_eq!(covered, b.batch.num_rows());
        }
        assert_eq!(out[0].origin.len(), 2, "first chunk spans input 0 and 1");
        assert_eq!(out[0].origin[1].rows, 0..28);
    }

    /// Every chunk as the zero-copy slices that make it up (a run cut into its chunks).
    fn cut(chunks: &[Chunks]) -> Vec<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for chunk in chunks {
            match chunk {
                Chunks::Pieces(p) => out.push(p.iter().map(|b| b.batch.clone()).collect()),
                Chunks::Run { run, each } => {
                    let rows = run.batch.num_rows();
                    assert_eq!(rows % each, 0, "a run is whole chunks");
                    for start in (0..rows).step_by(*each) {
                        out.push(vec![run.batch.slice(start, *each)]);
                    }
                }
            }
        }
        out
    }

    fn column(b: &RecordBatch) -> Vec<i64> {
        b.column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    #[test]
    fn pieces_are_zero_copy_slices_of_exact_total_size() {
        let pool = MemoryPool::new(1 << 30);
        let mut r = Rechunker::new("s", 128, pool.consumer("stage"));
        let mut chunks = Vec::new();
        let mut start = 0;
        let mut inputs = Vec::new();
        for (seq, n) in [100usize, 250, 30, 1, 500].into_iter().enumerate() {
            let b = input(&pool, seq as u64, start, n);
            inputs.push(b.batch.column(0).to_data().buffers()[0].data_ptr());
            chunks.extend(r.push_runs(b).unwrap());
            start += n as i64;
        }
        chunks.extend(r.finish_pieces().unwrap().map(Chunks::Pieces));
        let groups = cut(&chunks);
        let sizes: Vec<usize> = groups
            .iter()
            .map(|g| g.iter().map(|p| p.num_rows()).sum())
            .collect();
        assert_eq!(sizes, vec![128, 128, 128, 128, 128, 128, 113]);
        let all: Vec<i64> = groups.iter().flatten().flat_map(column).collect();
        assert_eq!(all, (0..start).collect::<Vec<_>>());
        for group in &groups {
            for (i, piece) in group.iter().enumerate() {
                let address = piece.column(0).to_data().buffers()[0].data_ptr();
                // A group's first piece may be the compacted leftover of an earlier input
                // (fewer rows than a chunk); every other piece is a slice of an input.
                assert!(
                    inputs.contains(&address) || (i == 0 && piece.num_rows() < 128),
                    "a piece is a slice of an input, or a leftover's compact copy"
                );
            }
        }
        assert_eq!(groups[0].len(), 2);
    }

    /// Runs and pieces, cut, are the chunks `push` makes (by copying), in order; a run is
    /// one zero-copy slice of an input, a whole number of chunks long.
    #[test]
    fn runs_are_slices_of_whole_chunks_and_cut_like_copied_chunks() {
        let pool = MemoryPool::new(1 << 30);
        let sizes = [100usize, 250, 30, 1, 500, 1024, 128, 7];
        let (mut copying, mut by_runs) = (
            Rechunker::new("s", 128, pool.consumer("a")),
            Rechunker::new("s", 128, pool.consumer("b")),
        );
        let (mut copied, mut runs, mut inputs) = (Vec::new(), Vec::new(), Vec::new());
        let mut start = 0;
        for (seq, n) in sizes.into_iter().enumerate() {
            copied.extend(copying.push(input(&pool, seq as u64, start, n)).unwrap());
            let b = input(&pool, seq as u64, start, n);
            inputs.push(b.batch.column(0).to_data().buffers()[0].data_ptr());
            runs.extend(by_runs.push_runs(b).unwrap());
            start += n as i64;
        }
        copied.extend(copying.finish().unwrap());
        runs.extend(by_runs.finish_pieces().unwrap().map(Chunks::Pieces));
        let expected: Vec<Vec<i64>> = copied.iter().map(values).collect();
        let got: Vec<Vec<i64>> = cut(&runs)
            .iter()
            .map(|g| g.iter().flat_map(column).collect())
            .collect();
        assert_eq!(got, expected);
        let mut longest_run = 0;
        for chunk in &runs {
            if let Chunks::Run { run, each } = chunk {
                let address = run.batch.column(0).to_data().buffers()[0].data_ptr();
                assert!(inputs.contains(&address), "a run is a slice of an input");
                longest_run = longest_run.max(run.batch.num_rows() / each);
            }
        }
        // 113 rows left before the 1,024-row input: a chunk of pieces, then a run of seven.
        assert_eq!(longest_run, 7);
        let counted: Vec<usize> = runs.iter().flat_map(Chunks::batch_rows).collect();
        assert_eq!(counted, expected.iter().map(Vec::len).collect::<Vec<_>>());
    }

    #[test]
    fn rows_left_short_of_a_chunk_do_not_pin_their_input_batch_when_the_pool_is_tight() {
        // 100 KB: room for the 80 KB input, not for a second one beside it.
        let pool = MemoryPool::new(100_000);
        let stage = pool.consumer("stage");
        let mut r = Rechunker::new("s", 128, stage.clone());
        let chunks = r.push_runs(input(&pool, 0, 0, 10_000)).unwrap();
        drop(chunks);
        // 10,000 = 78 * 128 + 16: the 16 rows left are a copy, charged to the consumer that
        // waits for input; the 80 KB input buffer is no longer held by anyone.
        let snapshot = pool.snapshot();
        let waiting = snapshot
            .consumers
            .iter()
            .find(|c| c.name.contains("rows short of a batch"))
            .unwrap();
        assert!(waiting.held > 0 && waiting.held < 1024, "{}", waiting.held);
        assert_eq!(pool.used(), waiting.held, "nothing else holds the input");
        let rest = r.finish_pieces().unwrap().unwrap();
        let values: Vec<i64> = rest.iter().flat_map(values).collect();
        assert_eq!(values, (9_984..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn rows_left_short_of_a_chunk_stay_a_slice_while_the_pool_has_room() {
        let pool = MemoryPool::new(1 << 30);
        let mut r = Rechunker::new("s", 128, pool.consumer("stage"));
        let b = input(&pool, 0, 0, 10_000);
        let address = b.batch.column(0).to_data().buffers()[0].data_ptr();
        let whole = batch_memory(&b.batch);
        drop(r.push_runs(b).unwrap());
        // The 16 rows left still share the input's buffer (no copy), and pin it.
        assert_eq!(pool.used(), whole);
        let rest = r.finish_pieces().unwrap().unwrap();
        assert_eq!(rest.len(), 1);
        // (The array data keeps the slice's offset; its buffer is the input's.)
        assert_eq!(
            rest[0].batch.column(0).to_data().buffers()[0].data_ptr(),
            address
        );
        let values: Vec<i64> = rest.iter().flat_map(values).collect();
        assert_eq!(values, (9_984..10_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_chunk_inside_one_batch_is_a_zero_copy_slice() {
        let pool = MemoryPool::new(1 << 30);
        let mut r = Rechunker::new("s", 100, pool.consumer("stage"));
        let b = input(&pool, 0, 0, 1000);
        let address = b.batch.column(0).to_data().buffers()[0].data_ptr();
        let whole = batch_memory(&b.batch);
        let out = r.push(b).unwrap();
        assert_eq!(out.len(), 10);
        for chunk in &out {
            assert_eq!(
                chunk.batch.column(0).to_data().buffers()[0].data_ptr(),
                address
            );
        }
        // Ten slices of one allocation are charged once.
        assert_eq!(pool.used(), whole);
        drop(out);
        assert_eq!(pool.used(), 0);
    }
}
