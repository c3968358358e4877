//! Rows a map function failed on, set aside so that the run goes on (Python's
//! `map_batches(on_error="skip")`): how a worker hands them over, where they came from, and
//! the stage's account of them.
//!
//! ```text
//!  worker.call(batch) ──► [output, …, output, errored rows]      (marked ERRORED_ROWS)
//!                              │                    │
//!                              ▼                    ▼
//!                         downstream          StageCounters::record_errored
//!                                              ├─ counted (StageStats::rows_errored)
//!                                              ├─ the first SAMPLES kept, each with where its
//!                                              │  row came from, and a warning event each
//!                                              └─ more than the stage's max_errored_rows:
//!                                                 the run fails (TooManyErroredRows)
//! ```
//!
//! The worker isolates the failing rows itself (Python's runner splits a failing batch in
//! halves until each failing call holds one row) and returns them as one more output batch,
//! made by [`errored_rows_batch`]: the failing input rows, plus the columns [`ROW_IN_CALL`],
//! [`ERROR_TYPE`] and [`ERROR_MESSAGE`], its schema marked with the metadata key
//! [`ERRORED_ROWS`]. The stage takes such batches out of the outputs before anything else
//! sees them.
//!
//! An errored row is settled like a row the function filtered out: once the rest of its
//! input batch is committed, a resume does not send it to the function again. (Rows of an
//! input batch that ended with no output at all are settled at once.) In a checkpoint by id,
//! a resume re-reads the rows of row groups not finished and probes their ids: an errored
//! row has no id in the checkpoint, so it is sent again there, and set aside again.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{ArrowError, DataType, Field, Schema};

use crate::batch::Origin;

/// Schema metadata key that marks a worker's output batch as its errored rows.
pub const ERRORED_ROWS: &str = "forebay.errored_rows";
/// Column of an errored-rows batch: the row's index in the batch the call was given.
pub const ROW_IN_CALL: &str = "__forebay_row_in_call";
/// Column of an errored-rows batch: the error's type (a Python exception's class name).
pub const ERROR_TYPE: &str = "__forebay_error_type";
/// Column of an errored-rows batch: the error's message.
pub const ERROR_MESSAGE: &str = "__forebay_error_message";

/// Errored rows a stage keeps the details of (the rest are only counted).
pub const SAMPLES: usize = 20;

/// One row a stage's function failed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErroredRow {
    pub stage: String,
    /// The input file it was read from, when known.
    pub file: Option<String>,
    /// Its row group in that file, when known.
    pub row_group: Option<usize>,
    /// Its row in that file, when known: for the first map stage of a pipeline over an
    /// unfiltered scan (after another map, rows no longer line up with input rows).
    pub row: Option<u64>,
    pub error_type: String,
    pub message: String,
}

impl std::fmt::Display for ErroredRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.file, self.row_group, self.row) {
            (Some(file), _, Some(row)) => write!(f, "row {row} of {file}")?,
            (Some(file), Some(rg), None) => write!(f, "a row of {file}, row group {rg}")?,
            _ => f.write_str("a row")?,
        }
        write!(f, ": {}: {}", self.error_type, self.message)
    }
}

/// The errored-rows batch of a call on `input`: each failure is (row index in `input`,
/// error type, message).
pub fn errored_rows_batch(
    input: &RecordBatch,
    failures: &[(usize, String, String)],
) -> Result<RecordBatch, ArrowError> {
    let rows = UInt64Array::from_iter_values(failures.iter().map(|f| f.0 as u64));
    let taken = arrow_select::take::take_record_batch(input, &rows)?;
    let mut fields: Vec<Field> = input
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(ROW_IN_CALL, DataType::UInt64, false));
    fields.push(Field::new(ERROR_TYPE, DataType::Utf8, false));
    fields.push(Field::new(ERROR_MESSAGE, DataType::Utf8, false));
    let mut columns: Vec<ArrayRef> = taken.columns().to_vec();
    columns.push(Arc::new(rows));
    columns.push(Arc::new(StringArray::from_iter_values(
        failures.iter().map(|f| f.1.as_str()),
    )));
    columns.push(Arc::new(StringArray::from_iter_values(
        failures.iter().map(|f| f.2.as_str()),
    )));
    let metadata = HashMap::from([(ERRORED_ROWS.to_string(), "1".to_string())]);
    RecordBatch::try_new(
        Arc::new(Schema::new(fields).with_metadata(metadata)),
        columns,
    )
}

/// Whether a worker's output batch holds its errored rows.
pub(crate) fn is_errored_rows(batch: &RecordBatch) -> bool {
    batch.schema().metadata().contains_key(ERRORED_ROWS)
}

/// The rows of an errored-rows batch, each placed in the input through `origins` (the
/// origins of the batch the call was given). `rows_are_input_rows`: the call's rows are the
/// scan's rows, in order (the first map stage), so a row's index finds its file row.
pub(crate) fn describe(
    stage: &str,
    errored: &RecordBatch,
    origins: &[Origin],
    rows_are_input_rows: bool,
) -> Result<Vec<ErroredRow>, String> {
    let column = |name: &str| {
        errored
            .column_by_name(name)
            .ok_or_else(|| format!("the errored rows have no column '{name}'"))
    };
    let rows = column(ROW_IN_CALL)?
        .as_any()
        .downcast_ref::<UInt64Array>()
        .ok_or_else(|| format!("column '{ROW_IN_CALL}' of the errored rows is not uint64"))?;
    let text = |name: &str| -> Result<StringArray, String> {
        let array = column(name)?;
        as_strings(array.as_ref())
            .ok_or_else(|| format!("column '{name}' of the errored rows is not a string"))
    };
    let (types, messages) = (text(ERROR_TYPE)?, text(ERROR_MESSAGE)?);
    Ok((0..errored.num_rows())
        .map(|i| {
            let (file, row_group, row) =
                locate(origins, rows.value(i) as usize, rows_are_input_rows);
            ErroredRow {
                stage: stage.to_string(),
                file,
                row_group,
                row,
                error_type: types.value(i).to_string(),
                message: messages.value(i).to_string(),
            }
        })
        .collect())
}

/// A string column as a `StringArray` (string views copied into one).
fn as_strings(array: &dyn Array) -> Option<StringArray> {
    if let Some(s) = array.as_any().downcast_ref::<StringArray>() {
        return Some(s.clone());
    }
    let views = array
        .as_any()
        .downcast_ref::<arrow_array::StringViewArray>()?;
    Some(views.iter().collect())
}

/// Where row `row` of a call's batch came from.
fn locate(
    origins: &[Origin],
    row: usize,
    rows_are_input_rows: bool,
) -> (Option<String>, Option<usize>, Option<u64>) {
    if rows_are_input_rows {
        let mut first = 0;
        for origin in origins {
            let len = origin.rows.len();
            if row < first + len {
                let Some(p) = &origin.provenance else {
                    return (None, None, None);
                };
                let in_source_batch = (origin.rows.start + row - first) as u64;
                let file_row = p.first_row.map(|f| f + in_source_batch);
                return (Some(p.file.to_string()), Some(p.row_group), file_row);
            }
            first += len;
        }
    }
    // Only the input batches are known: name them when they are one file's row group.
    let mut places = origins
        .iter()
        .filter_map(|o| o.provenance.as_ref().map(|p| (p.file.clone(), p.row_group)));
    match places.next() {
        Some(place) if places.all(|p| p == place) => {
            (Some(place.0.to_string()), Some(place.1), None)
        }
        _ => (None, None, None),
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::Int64Array;
    use forebay_parquet::BatchProvenance;

    use super::*;

    fn origin(
        file: &str,
        row_group: usize,
        first_row: Option<u64>,
        rows: std::ops::Range<usize>,
    ) -> Origin {
        Origin {
            provenance: Some(BatchProvenance {
                file: file.into(),
                file_index: 0,
                row_group,
                row_group_first_row: 0,
                first_row,
                batch_index: 0,
            }),
            source_seq: 0,
            rows,
            ticket: None,
            position: None,
        }
    }

    #[test]
    fn errored_rows_are_marked_and_each_row_is_placed_in_its_file() {
        let input = RecordBatch::try_from_iter([(
            "id",
            Arc::new(Int64Array::from_iter_values(0..10)) as ArrayRef,
        )])
        .unwrap();
        let failures = [
            (2, "ValueError".to_string(), "bad row".to_string()),
            (7, "KeyError".to_string(), "'x'".to_string()),
        ];
        let errored = errored_rows_batch(&input, &failures).unwrap();
        assert!(is_errored_rows(&errored));
        assert!(!is_errored_rows(&input));
        // The call's batch: rows 100..105 of a.parquet, then rows 0..5 of b.parquet.
        let origins = [
            origin("a.parquet", 1, Some(100), 0..5),
            origin("b.parquet", 0, Some(0), 5..10),
        ];
        let rows = describe("f", &errored, &origins, true).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].file.as_deref(), rows[0].row_group, rows[0].row),
            (Some("a.parquet"), Some(1), Some(102))
        );
        assert_eq!(
            (rows[1].file.as_deref(), rows[1].row_group, rows[1].row),
            (Some("b.parquet"), Some(0), Some(7))
        );
        assert_eq!(rows[1].to_string(), "row 7 of b.parquet: KeyError: 'x'");
        // After another map, only a single input row group is named.
        let after_a_map = describe("f", &errored, &origins[..1], false).unwrap();
        assert_eq!(
            (
                after_a_map[0].file.as_deref(),
                after_a_map[0].row_group,
                after_a_map[0].row
            ),
            (Some("a.parquet"), Some(1), None)
        );
        let mixed = describe("f", &errored, &origins, false).unwrap();
        assert_eq!((mixed[0].file.as_deref(), mixed[0].row), (None, None));
        // A filtered scan (no first row) names the row group but not the row.
        let filtered = [origin("c.parquet", 3, None, 0..10)];
        let rows = describe("f", &errored, &filtered, true).unwrap();
        assert_eq!((rows[0].row_group, rows[0].row), (Some(3), None));
    }
}
