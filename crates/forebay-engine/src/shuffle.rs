//! Local shuffling for `iter_batches(local_shuffle_buffer_size=...)`, as Ray does it: rows
//! are buffered until at least `min_rows + batch_size` are there, the buffer is permuted
//! (one `take`), and batches are cut from the permuted rows while at least `min_rows` remain
//! mixed in; new input is permuted together with what is left.
//!
//! ```text
//!  input ──► incoming ──(≥ min + batch)──► concat(remaining, incoming) ──take(permutation)──►
//!            shuffled ──slice batch_size──► out      (remaining < min: wait for more input)
//! ```
//!
//! The permutation comes from a seeded generator, so a seed reproduces the order.
//!
//! The buffered rows wait for more input, so they are charged to a consumer the source
//! never waits on, and they are compact copies (the permutation's `take`, string bytes
//! included), not slices that pin whole input batches.

use arrow_array::{RecordBatch, UInt32Array};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use crate::batch::EngineBatch;
use crate::error::{EngineError, Result};
use crate::memory::{Admission, MemoryConsumer};

pub(crate) struct LocalShuffler {
    min_rows: usize,
    batch_size: usize,
    rng: StdRng,
    /// Charged for the batches handed out.
    holder: MemoryConsumer,
    /// Charged for the buffered rows (they wait for more input).
    waiting: MemoryConsumer,
    /// Permuted rows not handed out yet (`offset..` of the batch).
    shuffled: Option<EngineBatch>,
    offset: usize,
    incoming: Vec<EngineBatch>,
    incoming_rows: usize,
    next_seq: u64,
}

impl LocalShuffler {
    pub(crate) fn new(
        min_rows: usize,
        batch_size: usize,
        seed: Option<u64>,
        holder: MemoryConsumer,
    ) -> LocalShuffler {
        LocalShuffler {
            min_rows,
            batch_size: batch_size.max(1),
            rng: match seed {
                Some(seed) => StdRng::seed_from_u64(seed),
                None => rand::make_rng(),
            },
            waiting: holder
                .pool()
                .consumer_awaiting_input("iter_batches (local shuffle buffer)"),
            holder,
            shuffled: None,
            offset: 0,
            incoming: Vec::new(),
            incoming_rows: 0,
            next_seq: 0,
        }
    }

    fn remaining(&self) -> usize {
        self.shuffled
            .as_ref()
            .map_or(0, |b| b.batch.num_rows() - self.offset)
    }

    /// Add input.
    pub(crate) fn push(&mut self, batch: EngineBatch) {
        if batch.batch.num_rows() == 0 {
            return;
        }
        batch.move_to(&self.waiting);
        self.incoming_rows += batch.batch.num_rows();
        self.incoming.push(batch);
    }

    /// The next shuffled batch, if enough rows are buffered (`finishing`: the input ended,
    /// hand out everything).
    pub(crate) fn next_batch(&mut self, finishing: bool) -> Result<Option<EngineBatch>> {
        let available = self.remaining() + self.incoming_rows;
        if available == 0 || (!finishing && available < self.min_rows + self.batch_size) {
            return Ok(None);
        }
        if self.incoming_rows > 0
            && (finishing || self.remaining() < self.min_rows + self.batch_size)
        {
            self.reshuffle()?;
        }
        let Some(shuffled) = &self.shuffled else {
            return Ok(None);
        };
        let n = self.batch_size.min(shuffled.batch.num_rows() - self.offset);
        let out = shuffled.batch.slice(self.offset, n);
        self.offset += n;
        let reservation = self.holder.reserve_batch(&out, Admission::Now)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(Some(EngineBatch {
            batch: out,
            seq,
            origin: Vec::new(),
            reservation,
        }))
    }

    /// Permute what is left of the shuffled rows together with the incoming rows.
    fn reshuffle(&mut self) -> Result<()> {
        let mut parts: Vec<RecordBatch> = Vec::new();
        if let Some(s) = &self.shuffled {
            let left = s.batch.num_rows() - self.offset;
            if left > 0 {
                parts.push(s.batch.slice(self.offset, left));
            }
        }
        parts.extend(self.incoming.iter().map(|b| b.batch.clone()));
        let schema = parts[0].schema();
        let merge_err = |e: arrow_schema::ArrowError| EngineError::BadOutput {
            stage: "iter_batches".into(),
            batch: Default::default(),
            reason: format!("cannot mix batches in the local shuffle buffer: {e}"),
        };
        let all = crate::concat::concat_batches(&schema, &parts).map_err(merge_err)?;
        let n = all.num_rows();
        let n32 = u32::try_from(n).map_err(|_| {
            EngineError::InvalidArgument(format!(
                "local_shuffle_buffer_size: {n} rows is more than a shuffle buffer can hold"
            ))
        })?;
        let mut order: Vec<u32> = (0..n32).collect();
        order.shuffle(&mut self.rng);
        let permuted =
            crate::concat::take_compact(&all, &UInt32Array::from(order)).map_err(merge_err)?;
        drop(all);
        let reservation = self.waiting.reserve_batch(&permuted, Admission::Now)?;
        self.shuffled = Some(EngineBatch {
            batch: permuted,
            seq: 0,
            origin: Vec::new(),
            reservation,
        });
        self.offset = 0;
        self.incoming.clear();
        self.incoming_rows = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Origin;
    use crate::memory::MemoryPool;
    use arrow_array::{Array, Int64Array};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    fn input(pool: &MemoryPool, start: i64, n: usize) -> EngineBatch {
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
            seq: 0,
            origin: vec![Origin {
                provenance: None,
                source_seq: 0,
                rows: 0..n,
                ticket: None,
                position: None,
            }],
            reservation,
        }
    }

    fn run(seed: u64) -> Vec<Vec<i64>> {
        let pool = MemoryPool::new(1 << 30);
        let mut s = LocalShuffler::new(300, 64, Some(seed), pool.consumer("shuffle"));
        let mut out = Vec::new();
        for i in 0..10 {
            s.push(input(&pool, i * 100, 100));
            while let Some(b) = s.next_batch(false).unwrap() {
                out.push(b);
            }
        }
        while let Some(b) = s.next_batch(true).unwrap() {
            out.push(b);
        }
        out.iter()
            .map(|b| {
                b.batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect()
    }

    #[test]
    fn every_row_once_in_a_seeded_shuffled_order() {
        let a = run(7);
        let mut rows: Vec<i64> = a.iter().flatten().copied().collect();
        assert_eq!(rows.len(), 1000);
        assert_ne!(rows, (0..1000).collect::<Vec<_>>(), "shuffled");
        rows.sort_unstable();
        assert_eq!(rows, (0..1000).collect::<Vec<_>>(), "each row exactly once");
        assert!(
            a[..a.len() - 1].iter().all(|b| b.len() == 64),
            "full batches but the last"
        );
        assert_eq!(a, run(7), "same seed, same order");
        assert_ne!(a, run(8), "another seed, another order");
        // Mixing: the first batch already draws from beyond the first 300 rows' inputs.
        assert!(a[0].iter().any(|&v| v >= 300));
    }
}
