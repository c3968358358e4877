//! Restoring order behind a stage that runs tasks concurrently (`preserve_order=True`).
//!
//! ```text
//!  workers finish tasks 3, 1, 4 ──insert──► held {1, 3, 4} ──next is 0: wait──► ...
//!                                            │ held bytes over budget
//!                                            ▼
//!                       forebay-store (put; spills to disk through forebay-spill)
//!                                            │ its turn: get, copy back, re-reserve
//!  task 0 done ──► emit 0, 1 ──► (3, 4 wait for 2)
//! ```
//!
//! Held batches that fit the byte budget stay in memory (charged to the reorder holder);
//! the rest move into the run's object store, which keeps them in its arena or spills them
//! to disk when the arena is full, and come back when their turn comes.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use forebay_store::ObjectId;

use crate::batch::{deep_copy, EngineBatch, Origin};
use crate::error::{EngineError, Result};
use crate::memory::{batch_memory, Admission, MemoryConsumer};
use crate::resources::RunResources;

enum Held {
    InMemory(Vec<EngineBatch>, usize),
    /// Moved into the object store: one object per batch, with what it needs to come back.
    InStore(Vec<(ObjectId, u64, Vec<Origin>)>),
}

pub(crate) struct ReorderBuffer {
    stage: String,
    next: u64,
    held: BTreeMap<u64, Held>,
    held_bytes: usize,
    budget: usize,
    holder: MemoryConsumer,
    resources: RunResources,
    /// Bytes moved into the store so far.
    pub(crate) spilled_bytes: u64,
}

impl ReorderBuffer {
    pub(crate) fn new(
        stage: &str,
        budget: usize,
        holder: MemoryConsumer,
        resources: RunResources,
    ) -> ReorderBuffer {
        ReorderBuffer {
            stage: stage.to_string(),
            next: 0,
            held: BTreeMap::new(),
            held_bytes: 0,
            budget,
            holder,
            resources,
            spilled_bytes: 0,
        }
    }

    /// The next task index to emit.
    pub(crate) fn next_index(&self) -> u64 {
        self.next
    }

    /// Task `index` finished with `outputs`; returns the outputs now ready, in order.
    pub(crate) fn insert(
        &mut self,
        index: u64,
        outputs: Vec<EngineBatch>,
    ) -> Result<Vec<EngineBatch>> {
        if index == self.next {
            let mut ready = outputs;
            self.next += 1;
            ready.extend(self.drain_ready()?);
            return Ok(ready);
        }
        let bytes: usize = outputs.iter().map(|b| batch_memory(&b.batch)).sum();
        if self.held_bytes + bytes <= self.budget || bytes == 0 {
            for b in &outputs {
                b.move_to(&self.holder);
            }
            self.held_bytes += bytes;
            self.held.insert(index, Held::InMemory(outputs, bytes));
        } else {
            let store = self.resources.store(&self.stage)?;
            let mut stored = Vec::with_capacity(outputs.len());
            for b in outputs {
                let id = store
                    .put_arrow(&b.batch.schema(), std::slice::from_ref(&b.batch), &[])
                    .map_err(|e| EngineError::store(&self.stage, e))?;
                self.spilled_bytes += batch_memory(&b.batch) as u64;
                stored.push((id, b.seq, b.origin));
            }
            self.held.insert(index, Held::InStore(stored));
        }
        Ok(Vec::new())
    }

    fn drain_ready(&mut self) -> Result<Vec<EngineBatch>> {
        let mut ready = Vec::new();
        while let Some(held) = self.held.remove(&self.next) {
            self.next += 1;
            match held {
                Held::InMemory(batches, bytes) => {
                    self.held_bytes -= bytes;
                    ready.extend(batches);
                }
                Held::InStore(objects) => {
                    let store = self.resources.store(&self.stage)?;
                    for (id, seq, origin) in objects {
                        let (_, batches) = store
                            .get_arrow(id)
                            .map_err(|e| EngineError::store(&self.stage, e))?;
                        // Back into process memory (one copy), so the store's region is
                        // freed at once rather than pinned by the batch downstream.
                        let copies: Vec<RecordBatch> = batches.iter().map(deep_copy).collect();
                        drop(batches);
                        let _ = store.delete(id);
                        for batch in copies {
                            let reservation = self.holder.reserve_batch(&batch, Admission::Now)?;
                            ready.push(EngineBatch {
                                batch,
                                seq,
                                origin: origin.clone(),
                                reservation,
                            });
                        }
                    }
                }
            }
        }
        Ok(ready)
    }
}

impl Drop for ReorderBuffer {
    fn drop(&mut self) {
        // A cancelled run: objects still in the store are deleted with it, but free them now.
        for held in std::mem::take(&mut self.held).into_values() {
            if let Held::InStore(objects) = held {
                if let Ok(store) = self.resources.store(&self.stage) {
                    for (id, _, _) in objects {
                        let _ = store.delete(id);
                    }
                }
            }
        }
    }
}
