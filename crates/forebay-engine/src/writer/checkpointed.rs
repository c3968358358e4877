//! A checkpointed write: files cut between batches, each committed with the ids of its
//! rows, the lineage tickets it releases, the input positions it consumed, and the rows set
//! aside since the last commit (dead letters); see the `commit` module for the protocol.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::ArrayRef;
use forebay_checkpoint::IdPartsWriter;

use super::{by_directory, OpenFile, OutputTarget, STAGE};
use crate::batch::EngineBatch;
use crate::commit::{ids_to_commit, stage_ids, CommitLog, IdColumn, StagedData};
use crate::error::{EngineError, Result};
use crate::lineage::UnitTicket;
use crate::memory::{arrays_memory, Admission, MemoryConsumer, Reservation};
use crate::output_schema::check_schema;
use crate::positions::Consumed;
use crate::queue::BatchQueue;
use crate::resources::RunResources;
use crate::stats::{StageCounters, WrittenFile};

/// A checkpointed write: stage the rows set aside since the last commit (see
/// `dead_letter`) for commit `commit`, one file per stage; their ids go to `ids`, and what
/// settles them to `tickets` and `consumed`.
fn stage_dead_letters(
    target: &OutputTarget,
    log: &CommitLog,
    commit: &str,
    resources: &RunResources,
    commits_with: &mut CommitsWith,
) -> Result<Vec<StagedData>> {
    let Some(mut asides) = resources.dead_letters().map(|b| b.take()) else {
        return Ok(Vec::new());
    };
    for aside in &mut asides {
        if let (Some(writer), Some(id)) = (commits_with.ids.as_mut(), log.ids()) {
            let ids = ids_to_commit(&aside.rows, &id.name, Some(id.family)).map_err(|reason| {
                EngineError::BadOutput {
                    stage: STAGE.into(),
                    batch: crate::error::BatchLabel("the rows set aside".into()),
                    reason,
                }
            })?;
            writer.push(&ids).map_err(|e| EngineError::Checkpoint {
                stage: STAGE.into(),
                source: Box::new(e),
            })?;
        }
        commits_with.consumed.add(&aside.origin);
        commits_with.tickets.append(&mut aside.take_tickets());
    }
    by_directory(asides)
        .into_iter()
        .map(|(directory, batches)| {
            let final_name = format!("{directory}/part-{commit}.{}", target.extension());
            let staged = format!("{}/{final_name}", log.output_staging());
            let written = target.stage_file(&staged, &batches)?;
            Ok(StagedData {
                staged,
                final_name,
                rows: written.rows,
                bytes: written.bytes,
            })
        })
        .collect()
}

/// What a commit holds besides its files: the ids of its rows (None: a checkpoint by
/// position), the lineage tickets it releases and the input positions it consumes.
struct CommitsWith {
    ids: Option<IdPartsWriter>,
    tickets: Vec<Arc<UnitTicket>>,
    consumed: Consumed,
}

/// A file being written in a checkpointed run, with what its commit needs.
struct Pending {
    file: OpenFile,
    commit: String,
    staged: String,
    final_name: String,
    /// The ids of the file's rows, encoded into their shards' parts as they come (None: a
    /// checkpoint by position writes no id).
    ids: Option<IdPartsWriter>,
    tickets: Vec<Arc<UnitTicket>>,
    /// The input positions the file's batches consumed.
    consumed: Consumed,
    /// What the file's encoder and `ids` hold, reserved until the commit.
    held: Option<Reservation>,
    /// When its first batch was written: it commits by `CommitLog::commit_interval` after.
    opened: Instant,
}

impl Pending {
    /// Whether its rows have waited as long as the checkpoint lets them.
    fn is_due(&self, interval: Option<Duration>) -> bool {
        interval.is_some_and(|i| self.opened.elapsed() >= i)
    }
}

/// With a checkpoint: files of at least `rows_per_file` rows (less than a batch more), or
/// what came within the checkpoint's commit interval, each committed with its ids, lineage
/// and the input positions its batches consumed. A batch
/// is never split between files: it holds what whole input batches became, so the commit
/// that holds it consumed their positions (see `positions`). A unit completes only when the
/// last file holding rows of it commits (see `lineage`).
pub(super) fn write_checkpointed(
    target: &OutputTarget,
    log: &CommitLog,
    input: &BatchQueue,
    resources: &RunResources,
    holder: &MemoryConsumer,
    rows_written: &AtomicU64,
    counters: &StageCounters,
) -> Result<u64> {
    let mut written = 0;
    let cancel = resources.cancel_token().clone();
    let mut pending: Option<Pending> = None;
    let interval = log.commit_interval();
    loop {
        // With a file open, wait for rows only until it is due: a writer whose rows come
        // slowly (a paid endpoint answering) commits what it has on time.
        let next = match (&pending, interval) {
            (Some(p), Some(interval)) => {
                let left = interval.saturating_sub(p.opened.elapsed());
                match input.pop_timeout(&cancel, left)? {
                    Ok(next) => next,
                    Err(()) => {
                        commit_file(target, log, pending.take().expect("open"), resources)?;
                        continue;
                    }
                }
            }
            _ => input.pop(&cancel)?,
        };
        let Some(mut batch) = next else { break };
        batch.move_to(holder);
        counters.record_in(batch.batch.num_rows());
        let started = Instant::now();
        check_schema(&target.schema, &mut batch)?;
        let ids = log.ids().map(|ids| batch_ids(ids, &batch)).transpose()?;
        let rows = batch.batch.num_rows();
        if pending.is_none() {
            let (commit, staged, final_name) = log.next_commit(target.extension());
            pending = Some(Pending {
                file: target.open_file(&staged, batch.batch.schema(), true)?,
                ids: log.id_parts_writer(&commit)?,
                commit,
                staged,
                final_name,
                tickets: Vec::new(),
                consumed: Consumed::default(),
                held: None,
                opened: Instant::now(),
            });
        }
        let p = pending.as_mut().expect("just opened");
        p.file.write(&batch.batch)?;
        if let (Some(writer), Some(ids)) = (p.ids.as_mut(), &ids) {
            writer.push(ids).map_err(|e| EngineError::Checkpoint {
                stage: STAGE.into(),
                source: Box::new(e),
            })?;
        }
        rows_written.fetch_add(rows as u64, Ordering::Relaxed);
        written += rows as u64;
        p.consumed.add(&batch.origin);
        p.tickets.append(&mut batch.take_tickets());
        p.held = None;
        let held = p.file.memory()
            + p.ids.as_ref().map_or(0, |ids| {
                ids.encoded_bytes() + arrays_memory(ids.unencoded())
            });
        p.held = Some(holder.reserve_bytes(held, Admission::Now)?);
        if p.file.rows as usize >= target.sink.rows_per_file || p.is_due(interval) {
            commit_file(target, log, pending.take().expect("open"), resources)?;
        }
        counters.record_busy(started.elapsed());
        counters.record_out(rows);
        drop(batch);
        cancel.check()?;
    }
    if let Some(p) = pending.take() {
        commit_file(target, log, p, resources)?;
    }
    // Rows set aside after the last file: a commit of their own.
    if resources.dead_letters().is_some_and(|b| !b.is_empty()) {
        let commit = log.next_commit_id();
        let mut with = CommitsWith {
            ids: log.id_parts_writer(&commit)?,
            tickets: Vec::new(),
            consumed: Consumed::default(),
        };
        let dead_letters = stage_dead_letters(target, log, &commit, resources, &mut with)?;
        let ids = with.ids.map(stage_ids).transpose()?.flatten();
        log.commit(
            &commit,
            None,
            dead_letters.clone(),
            ids,
            with.tickets,
            with.consumed,
        )?;
        target.record_dead_letters_published(&dead_letters);
    }
    Ok(written)
}

/// A batch's ids (its id column, checked against the checkpoint's kind of ids).
fn batch_ids(ids: &IdColumn, batch: &EngineBatch) -> Result<ArrayRef> {
    ids_to_commit(&batch.batch, &ids.name, Some(ids.family)).map_err(|reason| {
        EngineError::BadOutput {
            stage: STAGE.into(),
            batch: batch.label(),
            reason,
        }
    })
}

fn commit_file(
    target: &OutputTarget,
    log: &CommitLog,
    p: Pending,
    resources: &RunResources,
) -> Result<()> {
    // Both halves of step 1 wait on the device (the data file's fsync, the id parts'):
    // they are independent, so they wait together.
    let Pending {
        file,
        ids,
        consumed,
        tickets,
        ..
    } = p;
    let mut with = CommitsWith {
        ids,
        tickets,
        consumed,
    };
    let dead_letters = stage_dead_letters(target, log, &p.commit, resources, &mut with)?;
    let CommitsWith {
        ids,
        tickets,
        mut consumed,
    } = with;
    if let Some(positions) = resources.positions() {
        consumed.merge(positions.take_emptied());
    }
    let (staged, ids) = std::thread::scope(|scope| {
        let ids = scope.spawn(move || ids.map(stage_ids).transpose().map(Option::flatten));
        let staged = file.finish();
        let ids = ids
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (staged, ids)
    });
    let (staged, ids) = (staged?, ids?);
    let data = StagedData {
        staged: p.staged,
        final_name: p.final_name.clone(),
        rows: staged.rows,
        bytes: staged.bytes,
    };
    log.commit(
        &p.commit,
        Some(data),
        dead_letters.clone(),
        ids,
        tickets,
        consumed,
    )?;
    target.record_dead_letters_published(&dead_letters);
    drop(p.held);
    target.record(
        WrittenFile {
            path: target.dir.shown(&p.final_name),
            rows: staged.rows,
            bytes: staged.bytes,
        },
        resources,
    );
    Ok(())
}
