//! Rows a function failed on, written to a dead-letter dataset beside the output
//! (`MapStage::with_dead_letter`, Python's `map_batches(on_error="dead_letter")`), committed
//! together with what settles them.
//!
//! ```text
//!  first map stage: call(batch) ──► outputs ─────────────────────────► queue ─► writer
//!                       └─► errored rows (see `errored`)                         │
//!                            └─► SetAside { dead-letter rows, origins }           │
//!                                  └─► DeadLetterBox ──(taken by the next commit)─┘
//!
//!  <output>/_dead_letter/<stage>/part-<commit>.parquet   the rows, their errors, where from
//! ```
//!
//! A dead-letter file commits like a data file (staged, named in the commit record,
//! published with it), so a kill at any moment leaves each row set aside in it exactly once.
//! What a `SetAside` carries makes that hold whichever commit takes it:
//! * **Its batch had other output.** The batch's origins are split: the set-aside rows'
//!   (one row each) go with them, the other rows' with the output, each holding clones of
//!   the unit tickets. Each commit consumes exactly the positions of its own rows (and
//!   writes their ids), so the two may commit in either order (the writer's workers commit
//!   at once) and a kill between them loses or repeats nothing; the unit completes only
//!   when both are committed.
//! * **Its batch had no other output.** Its origins are the batch's own (the tickets taken
//!   from it): it settles the whole batch, as an emptied batch would have.
//!
//! Rows line up with input positions only before the first map, so only the first map
//! stage writes dead letters (the pipeline refuses others), and only a write does (an
//! iterator has nowhere to commit them).

use std::sync::{Arc, Mutex};

use arrow_array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{ArrowError, DataType, Field, Schema};

use crate::batch::Origin;
use crate::errored::{ErroredRow, ERROR_MESSAGE, ERROR_TYPE, ROW_IN_CALL};
use crate::lineage::UnitTicket;
use crate::memory::Reservation;

/// Directory of the dead letters, in the output directory (a name readers skip).
pub const DEAD_LETTER_DIR: &str = "_dead_letter";

/// Columns a dead-letter file adds to the input row.
pub const DEAD_LETTER_COLUMNS: [&str; 5] = [
    "_error_type",
    "_error_message",
    "_input_file",
    "_input_row_group",
    "_input_row",
];

/// Rows of one call set aside for the dead-letter dataset, with what settles them.
pub(crate) struct SetAside {
    /// The stage's directory under [`DEAD_LETTER_DIR`].
    pub(crate) directory: String,
    pub(crate) rows: RecordBatch,
    /// What their commit consumes and releases (see the module docs).
    pub(crate) origin: Vec<Origin>,
    _held: Reservation,
}

impl SetAside {
    pub(crate) fn take_tickets(&mut self) -> Vec<Arc<UnitTicket>> {
        self.origin
            .iter_mut()
            .filter_map(|o| o.ticket.take())
            .collect()
    }
}

/// Where a run's first map stage leaves rows set aside for the writer's next commit.
#[derive(Default)]
pub(crate) struct DeadLetterBox(Mutex<Vec<SetAside>>);

impl DeadLetterBox {
    pub(crate) fn push(&self, rows: SetAside) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(rows);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    pub(crate) fn take(&self) -> Vec<SetAside> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The directory of a stage's dead letters: its name, made safe for a path.
pub(crate) fn directory_of(stage: &str) -> String {
    let safe: String = stage
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{DEAD_LETTER_DIR}/{}", safe.trim_matches('_'))
}

/// Set aside the errored rows of a call on a batch with origins `origins`: `described` are
/// the rows (see `errored::describe`); `other_output` whether the call had other output.
/// With other output, the set-aside rows leave `origins` (which the outputs take on): each
/// commit then settles exactly its own rows, in whichever order the two commit.
pub(crate) fn set_aside(
    stage: &str,
    errored: &RecordBatch,
    described: &[ErroredRow],
    origins: &mut Vec<Origin>,
    other_output: bool,
    held: Reservation,
) -> Result<SetAside, ArrowError> {
    let rows = dead_letter_rows(errored, described)?;
    let origin = if other_output {
        let in_call = errored
            .column_by_name(ROW_IN_CALL)
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>().cloned())
            .ok_or_else(|| ArrowError::SchemaError(format!("no column {ROW_IN_CALL}")))?;
        let mut set_aside: Vec<usize> = in_call.values().iter().map(|&r| r as usize).collect();
        set_aside.sort_unstable();
        set_aside.dedup();
        let (theirs, rest) = split_origins(origins, &set_aside);
        *origins = rest;
        theirs
    } else {
        std::mem::take(origins)
    };
    Ok(SetAside {
        directory: directory_of(stage),
        rows,
        origin,
        _held: held,
    })
}

/// Split the origins of a batch (its rows are their rows, in order) into those of the
/// sorted batch rows `rows`, one origin a row, and those of the other rows. Both keep a
/// clone of each unit ticket they touch.
fn split_origins(origins: &[Origin], rows: &[usize]) -> (Vec<Origin>, Vec<Origin>) {
    let piece = |o: &Origin, range: std::ops::Range<usize>| Origin {
        provenance: o.provenance.clone(),
        source_seq: o.source_seq,
        rows: range,
        ticket: o.ticket.clone(),
        position: o.position,
    };
    let (mut theirs, mut rest) = (Vec::new(), Vec::new());
    let mut rows = rows.iter().copied().peekable();
    let mut first = 0;
    for o in origins {
        let end = first + o.rows.len();
        let mut next_kept = o.rows.start;
        while let Some(row) = rows.next_if(|&r| r < end) {
            let at = o.rows.start + row - first;
            if at > next_kept {
                rest.push(piece(o, next_kept..at));
            }
            theirs.push(piece(o, at..at + 1));
            next_kept = at + 1;
        }
        if next_kept < o.rows.end {
            rest.push(piece(o, next_kept..o.rows.end));
        }
        first = end;
    }
    (theirs, rest)
}

/// The dead-letter rows of an errored-rows batch: the input columns, then the error and
/// where the row came from ([`DEAD_LETTER_COLUMNS`]).
fn dead_letter_rows(
    errored: &RecordBatch,
    described: &[ErroredRow],
) -> Result<RecordBatch, ArrowError> {
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    let schema = errored.schema();
    for (field, column) in schema.fields().iter().zip(errored.columns()) {
        if [ROW_IN_CALL, ERROR_TYPE, ERROR_MESSAGE].contains(&field.name().as_str()) {
            continue;
        }
        if DEAD_LETTER_COLUMNS.contains(&field.name().as_str()) {
            return Err(ArrowError::SchemaError(format!(
                "the input has a column '{}', which dead-letter files add themselves",
                field.name()
            )));
        }
        fields.push(field.as_ref().clone());
        columns.push(column.clone());
    }
    let texts = |f: fn(&ErroredRow) -> Option<&str>| -> ArrayRef {
        Arc::new(described.iter().map(f).collect::<StringArray>())
    };
    columns.push(texts(|r| Some(&r.error_type)));
    columns.push(texts(|r| Some(&r.message)));
    columns.push(texts(|r| r.file.as_deref()));
    columns.push(Arc::new(
        described
            .iter()
            .map(|r| r.row_group.map(|g| g as u64))
            .collect::<UInt64Array>(),
    ));
    columns.push(Arc::new(
        described.iter().map(|r| r.row).collect::<UInt64Array>(),
    ));
    let added = [
        (DataType::Utf8, false),
        (DataType::Utf8, false),
        (DataType::Utf8, true),
        (DataType::UInt64, true),
        (DataType::UInt64, true),
    ];
    for (name, (kind, nullable)) in DEAD_LETTER_COLUMNS.iter().zip(added) {
        fields.push(Field::new(*name, kind, nullable));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(rows: std::ops::Range<usize>) -> Origin {
        Origin {
            provenance: None,
            source_seq: 0,
            rows,
            ticket: None,
            position: Some(1000),
        }
    }

    #[test]
    fn origins_split_into_the_set_aside_rows_and_the_rest() {
        // A batch of 10 rows: rows 5..10 of one source batch, then rows 0..5 of another.
        let origins = [origin(5..10), origin(0..5)];
        let (theirs, rest) = split_origins(&origins, &[0, 3, 4, 5, 9]);
        let ranges = |v: &[Origin]| v.iter().map(|o| o.rows.clone()).collect::<Vec<_>>();
        assert_eq!(ranges(&theirs), [5..6, 8..9, 9..10, 0..1, 4..5]);
        assert_eq!(ranges(&rest), [6..8, 1..4]);
        let (theirs, rest) = split_origins(&origins, &[]);
        assert!(theirs.is_empty());
        assert_eq!(ranges(&rest), [5..10, 0..5]);
    }

    #[test]
    fn stage_names_become_safe_directories() {
        assert_eq!(
            directory_of("map_batches(embed)"),
            "_dead_letter/map_batches_embed"
        );
        assert_eq!(directory_of("a/b c"), "_dead_letter/a_b_c");
    }
}
