//! What one call's outputs become before they go downstream: errored rows taken out,
//! counted and (first stage of a write) set aside as dead letters; outputs checked against
//! the columns the pipeline needs, joined into one batch in checkpointed runs, and charged to
//! the stage; an input left with no output settled. Shared by both worker loops (`serve`,
//! `in_flight::serve_in_flight`).

use arrow_array::RecordBatch;

use super::{MapStage, Running};
use crate::batch::{EngineBatch, Origin};
use crate::dead_letter;
use crate::error::{BatchLabel, EngineError, Result};
use crate::errored::{describe, is_errored_rows, ErroredRow};
use crate::events::PipelineEvent;
use crate::memory::Admission;

/// What one call on `input` returned, made ready to go downstream: its errored rows counted
/// (and set aside to dead letters), its outputs checked and charged to the stage. An input
/// with no output left is settled here (lineage released, positions done).
pub(super) fn outputs_of_call(
    r: &Running,
    input: &mut EngineBatch,
    outputs: Vec<RecordBatch>,
) -> Result<Vec<EngineBatch>> {
    let (errored, outputs): (Vec<RecordBatch>, Vec<RecordBatch>) =
        outputs.into_iter().partition(is_errored_rows);
    let mut described = Vec::with_capacity(errored.len());
    for batch in &errored {
        described.push(count_errored(r, batch, &input.origin, || input.label())?);
    }
    if let Some(dead_letters) = r.resources.dead_letters().filter(|_| r.stage.dead_letter) {
        // Before the outputs take `input.origin`: the set-aside rows leave it, so that each
        // commit settles exactly its own rows, in either order (see `dead_letter`).
        let other_output = outputs.iter().any(|b| b.num_rows() > 0);
        for (batch, rows) in errored.iter().zip(&described) {
            let batch_label = input.label();
            let held = r.holder.reserve_batch(batch, Admission::Now)?;
            let aside = dead_letter::set_aside(
                &r.stage.name,
                batch,
                rows,
                &mut input.origin,
                other_output,
                held,
            )
            .map_err(|e| EngineError::BadOutput {
                stage: r.stage.name.clone(),
                batch: batch_label,
                reason: format!("cannot set its errored rows aside: {e}"),
            })?;
            dead_letters.push(aside);
        }
    }
    // Labels are for errors: formatted only when one is reported.
    let label = || input.label();
    let mut reserved = Vec::new();
    let outputs = if r.resources.lineage().is_some() && outputs.len() > 1 {
        // A checkpointed run: what one input batch became travels as one batch,
        // so that one commit holds all of it (see `positions`).
        vec![concat_outputs(&r.stage, outputs, label)?]
    } else {
        outputs
    };
    for batch in outputs {
        check_output(&r.stage, &batch, label)?;
        if batch.num_rows() == 0 {
            continue;
        }
        let reservation = r.holder.reserve_batch(&batch, Admission::Now)?;
        reserved.push(EngineBatch {
            batch,
            seq: 0,
            origin: input.origin.clone(),
            reservation,
        });
    }
    if reserved.is_empty() {
        // Every row of the input is done (filtered out, or dropped by the function):
        // a legitimate end of its lineage, and positions done (see `positions`).
        if let Some(positions) = r.resources.positions() {
            positions.record_emptied(&input.origin);
        }
        if let Some(book) = r.resources.lineage() {
            book.release(input.take_tickets());
        }
    }
    Ok(reserved)
}

/// Count and report the rows a call failed on (an errored-rows batch, see `errored`); fail
/// the run when the stage's limit is passed. Returns the rows, placed in the input.
fn count_errored(
    r: &Running,
    errored: &RecordBatch,
    origins: &[Origin],
    label: impl Fn() -> BatchLabel,
) -> Result<Vec<ErroredRow>> {
    let stage = &r.stage.name;
    let rows =
        describe(stage, errored, origins, r.stage.rows_are_input_rows).map_err(|reason| {
            EngineError::BadOutput {
                stage: stage.clone(),
                batch: label(),
                reason,
            }
        })?;
    let last = rows.last().map(ToString::to_string);
    let (total, kept) = r.counters.record_errored(rows.clone());
    for row in kept {
        r.resources.emit(PipelineEvent::Warning {
            message: format!("stage '{stage}': set aside {row}"),
        });
    }
    match (r.stage.max_errored_rows, last) {
        (Some(limit), Some(last)) if total > limit => Err(EngineError::TooManyErroredRows {
            stage: stage.clone(),
            errored: total,
            limit,
            last,
        }),
        _ => Ok(rows),
    }
}

/// A task's outputs (of calls in flight) joined into batches of up to this many bytes.
const JOINED_BYTES: usize = 4 << 20;

/// Outputs joined at a time as they come back: their memory (often Python's, freed under
/// the GIL) is let go a few at a time, not a task's thousands at once.
const JOIN_EVERY: usize = 64;

/// The outputs of a task's calls, gathered in chunk order as they come back; consecutive
/// small ones of one schema are joined into batches of up to [`JOINED_BYTES`] (origins those
/// of their parts, in order). A worker with calls in flight makes one small output a call
/// (a request's rows: 16 rows, a few hundred bytes), and a task is an input batch's worth of
/// calls: handed on one by one, thousands of batches would each wait their turn in the next
/// stage's queue of two; joined only at the task's end, letting go of the parts stopped the
/// worker's thread (and its event loop) for ~20 ms.
pub(super) struct JoinedOutputs {
    /// Joined so far, each of up to `join_every` outputs ([`JOIN_EVERY`] as they come back).
    joined: Vec<EngineBatch>,
    /// Outputs not joined yet: consecutive, of one schema.
    group: Vec<EngineBatch>,
    group_bytes: usize,
    join_every: usize,
}

impl Default for JoinedOutputs {
    fn default() -> JoinedOutputs {
        JoinedOutputs::joining_every(JOIN_EVERY)
    }
}

impl JoinedOutputs {
    fn joining_every(join_every: usize) -> JoinedOutputs {
        JoinedOutputs {
            joined: Vec::new(),
            group: Vec::new(),
            group_bytes: 0,
            join_every,
        }
    }

    /// The next output in chunk order.
    pub(super) fn push(&mut self, r: &Running, output: EngineBatch) -> Result<()> {
        let bytes = output.batch.get_array_memory_size();
        let fits = self.group.first().is_none_or(|first| {
            first.batch.schema() == output.batch.schema()
                && self.group_bytes + bytes <= JOINED_BYTES
        });
        if !fits {
            self.join_group(r)?;
        }
        self.group_bytes += bytes;
        self.group.push(output);
        if self.group.len() >= self.join_every {
            self.join_group(r)?;
        }
        Ok(())
    }

    /// Everything gathered, the joined pieces joined again up to [`JOINED_BYTES`] (a copy of
    /// memory that is the stage's own by now).
    pub(super) fn finish(mut self, r: &Running) -> Result<Vec<EngineBatch>> {
        self.join_group(r)?;
        let mut whole = JoinedOutputs::joining_every(usize::MAX);
        for piece in self.joined {
            whole.push(r, piece)?;
        }
        whole.join_group(r)?;
        Ok(whole.joined)
    }

    fn join_group(&mut self, r: &Running) -> Result<()> {
        if !self.group.is_empty() {
            let joined = join(r, std::mem::take(&mut self.group))?;
            self.joined.push(joined);
            self.group_bytes = 0;
        }
        Ok(())
    }
}

/// Batches of one schema as one, charged to the stage; the parts are let go.
fn join(r: &Running, mut parts: Vec<EngineBatch>) -> Result<EngineBatch> {
    if parts.len() == 1 {
        return Ok(parts.pop().expect("one part"));
    }
    let origin: Vec<Origin> = parts
        .iter_mut()
        .flat_map(|p| std::mem::take(&mut p.origin))
        .collect();
    let batches: Vec<RecordBatch> = parts.iter().map(|p| p.batch.clone()).collect();
    let batch = crate::concat::concat_batches(&batches[0].schema(), &batches).map_err(|e| {
        EngineError::BadOutput {
            stage: r.stage.name.clone(),
            batch: crate::batch::label(0, &origin),
            reason: format!("its calls' outputs cannot be joined into one batch: {e}"),
        }
    })?;
    let reservation = r.holder.reserve_batch(&batch, Admission::Now)?;
    drop(parts);
    Ok(EngineBatch {
        batch,
        seq: 0,
        origin,
        reservation,
    })
}

/// The outputs of one call as one batch (they must share a schema).
fn concat_outputs(
    stage: &MapStage,
    outputs: Vec<RecordBatch>,
    label: impl Fn() -> BatchLabel,
) -> Result<RecordBatch> {
    for batch in &outputs {
        check_output(stage, batch, &label)?;
    }
    let schema = outputs[0].schema();
    crate::concat::concat_batches(&schema, &outputs).map_err(|e| EngineError::BadOutput {
        stage: stage.name.clone(),
        batch: label(),
        reason: format!(
            "the function returned {} batches that cannot be joined into one (a checkpointed \
             write keeps what one input batch became together): {e}",
            outputs.len()
        ),
    })
}

fn check_output(
    stage: &MapStage,
    batch: &RecordBatch,
    label: impl Fn() -> BatchLabel,
) -> Result<()> {
    for column in &stage.required_columns {
        if batch.schema().index_of(column).is_err() {
            let names: Vec<String> = batch
                .schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect();
            return Err(EngineError::BadOutput {
                stage: stage.name.clone(),
                batch: label(),
                reason: format!(
                    "the function's output has no column '{column}' (it has {names:?}); the \
                     pipeline needs it after this stage, so the function must keep it"
                ),
            });
        }
    }
    Ok(())
}
