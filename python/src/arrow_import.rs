//! Importing the batches a user's function returns, without re-checking data we produced.
//!
//! A `RecordBatch` imported from Python must be validated in full before Rust code reads it
//! (an invalid UTF-8 string or an out-of-range offset would be undefined behaviour later),
//! and full validation is not free: for a 10,000-row text column it is a UTF-8 scan of every
//! string, ~0.2 ms per batch on the worker thread, which was half of the engine's own time
//! per batch in the sleep-bound benchmark. Most map functions return some of their input
//! columns unchanged (`{"id": batch["id"], "text": batch["text"], "embedding": ...}`). A
//! returned column that is a sub-range of an input column (the same buffers, its rows inside
//! the input's rows, no child arrays) is valid because the input was: only the other columns
//! are validated in full.

use std::panic::AssertUnwindSafe;

use arrow_array::{Array, RecordBatch};
use arrow_data::ArrayData;
use arrow_pyarrow::FromPyArrowUnchecked;
use arrow_schema::DataType;
use pyo3::prelude::*;

use crate::errors::StageError;

/// Import one batch a map function returned for `input`, validating in full every column
/// that is not a sub-range of one of `input`'s columns. Invalid data is a `StageError` (the
/// engine reports it as a bad output of the stage).
pub(crate) fn import_map_output(
    item: &Bound<'_, PyAny>,
    input: &RecordBatch,
) -> PyResult<RecordBatch> {
    // SAFETY: nothing reads the columns' values before the loop below has validated each one
    // in full, except those that are sub-ranges of `input`'s columns (see `is_sub_range_of`),
    // whose bytes were valid in `input` and are unchanged. The import itself only builds
    // arrays around the exported buffers; should a malformed export make that panic, the
    // panic is caught here and becomes an error.
    let imported = std::panic::catch_unwind(AssertUnwindSafe(|| unsafe {
        RecordBatch::from_pyarrow_bound_unchecked(item)
    }));
    let batch = imported.map_err(|_| {
        StageError::new_err("the returned batch is not valid Arrow data (malformed C Data export)")
    })??;
    let inputs: Vec<ArrayData> = input.columns().iter().map(|c| c.to_data()).collect();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let data = column.to_data();
        let checked = if inputs.iter().any(|src| is_sub_range_of(&data, src)) {
            data.validate()
        } else {
            data.validate_full()
        };
        checked.map_err(|e| {
            StageError::new_err(format!(
                "column {:?} of the returned batch is not valid Arrow data: {e}",
                field.name()
            ))
        })?;
    }
    Ok(batch)
}

/// Whether `out` shows rows of `src` through the same memory, so that its bytes are valid
/// because `src`'s are. Only string and binary columns are considered (other types cost
/// little to validate): their value bytes must be the very same buffers, and their offsets
/// or views a whole-element sub-range of `src`'s. Both are compared as arrow-rs normalises
/// them (offset 0, buffers cut to the rows shown).
fn is_sub_range_of(out: &ArrayData, src: &ArrayData) -> bool {
    let element_width = match out.data_type() {
        DataType::Utf8 | DataType::Binary => 4,
        DataType::LargeUtf8 | DataType::LargeBinary => 8,
        DataType::Utf8View | DataType::BinaryView => 16,
        _ => return false,
    };
    if out.data_type() != src.data_type()
        || out.offset() != 0
        || src.offset() != 0
        || out.buffers().len() != src.buffers().len()
        || out.buffers().is_empty()
    {
        return false;
    }
    let (out_index, src_index) = (&out.buffers()[0], &src.buffers()[0]);
    let start = out_index.as_ptr() as usize;
    let src_start = src_index.as_ptr() as usize;
    let index_inside = start >= src_start
        && (start - src_start).is_multiple_of(element_width)
        && start + out_index.len() <= src_start + src_index.len();
    let same_values = out.buffers()[1..]
        .iter()
        .zip(&src.buffers()[1..])
        .all(|(o, s)| o.as_ptr() == s.as_ptr() && o.len() == s.len());
    index_inside && same_values
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{StringArray, StringViewArray};

    use super::*;

    #[test]
    fn slices_of_the_input_are_sub_ranges_and_other_arrays_are_not() {
        let src = StringViewArray::from(vec!["a", "bb", "a string longer than twelve bytes"]);
        let src_data = src.to_data();
        assert!(is_sub_range_of(&src.slice(1, 2).to_data(), &src_data));
        assert!(is_sub_range_of(&src_data, &src_data));
        let copy = StringViewArray::from(vec!["a", "bb", "a string longer than twelve bytes"]);
        assert!(!is_sub_range_of(&copy.to_data(), &src_data));
        let narrower = src.slice(1, 1);
        assert!(!is_sub_range_of(&src_data, &narrower.to_data()));
        let other_type: Arc<dyn Array> = Arc::new(StringArray::from(vec!["a", "bb"]));
        assert!(!is_sub_range_of(&other_type.to_data(), &src_data));
        let offsets = StringArray::from(vec!["x", "yy", "zzz"]);
        assert!(is_sub_range_of(
            &offsets.slice(1, 2).to_data(),
            &offsets.to_data()
        ));
        assert!(!is_sub_range_of(
            &offsets.to_data(),
            &offsets.slice(1, 2).to_data()
        ));
    }
}
