//! Every batch written to one dataset has the first batch's columns and types; when one
//! does not, the error names the columns that differ (not two schema dumps). A column of
//! Arrow's null type (what pyarrow and pandas infer for a column with no value, e.g. a model
//! that answered nothing for a whole batch) takes the first batch's type for that column.
//! "First" is the dataset's, shared by all its writer threads ([`DatasetSchema`]): a writer
//! whose first batch is all-null still writes the type the other writers' files have.

use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{new_null_array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, SchemaRef};

use crate::batch::EngineBatch;
use crate::error::{EngineError, Result};

const STAGE: &str = "write_parquet";

/// The schema of the first batch any writer of one dataset took (`None` before it).
#[derive(Default)]
pub(crate) struct DatasetSchema(Mutex<Option<SchemaRef>>);

/// Remember the dataset's first batch's schema in `first`; fail on a later batch whose
/// differs, after its all-null columns of the null type took the first batch's types.
pub(crate) fn check_schema(first: &DatasetSchema, batch: &mut EngineBatch) -> Result<()> {
    let known = {
        let mut first = first.0.lock().unwrap_or_else(PoisonError::into_inner);
        match first.as_ref() {
            Some(s) => Arc::clone(s),
            None => {
                *first = Some(batch.batch.schema());
                return Ok(());
            }
        }
    };
    if let Some(typed) = with_null_columns_typed(&known, &batch.batch) {
        batch.batch = typed;
    }
    let schema = batch.batch.schema();
    if known.fields() != schema.fields() {
        return Err(EngineError::BadOutput {
            stage: STAGE.into(),
            batch: batch.label(),
            reason: format!(
                "a batch's columns differ from the first batch's: {}; every batch written \
                 to one dataset needs the same columns and types (a pandas int column \
                 with a missing value becomes float64: cast it back, or fill the gaps)",
                schema_difference(&known, &schema)
            ),
        });
    }
    Ok(())
}

/// `batch` with its columns of the null type made null columns of `first`'s type for them,
/// when that makes its schema `first`'s; `None` when it would not.
fn with_null_columns_typed(first: &SchemaRef, batch: &RecordBatch) -> Option<RecordBatch> {
    let schema = batch.schema();
    if schema.fields() == first.fields() || schema.fields().len() != first.fields().len() {
        return None;
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns());
    for ((field, want), column) in schema
        .fields()
        .iter()
        .zip(first.fields())
        .zip(batch.columns())
    {
        if field.name() != want.name() {
            return None;
        }
        if field.data_type() == &DataType::Null && want.data_type() != &DataType::Null {
            if !want.is_nullable() {
                return None;
            }
            columns.push(new_null_array(want.data_type(), batch.num_rows()));
        } else if field == want {
            columns.push(column.clone());
        } else {
            return None;
        }
    }
    RecordBatch::try_new(Arc::clone(first), columns).ok()
}

/// What differs between the first batch's schema and a later one's, column by column.
fn schema_difference(first: &arrow_schema::Schema, later: &arrow_schema::Schema) -> String {
    let mut differences = Vec::new();
    for field in first.fields() {
        match later.field_with_name(field.name()) {
            Err(_) => differences.push(format!("'{}' is missing", field.name())),
            Ok(other) if other.data_type() != field.data_type() => differences.push(format!(
                "'{}' is {} (first batch: {})",
                field.name(),
                other.data_type(),
                field.data_type()
            )),
            Ok(other) if other.is_nullable() != field.is_nullable() => differences.push(format!(
                "'{}' is {}nullable (first batch: {}nullable)",
                field.name(),
                if other.is_nullable() { "" } else { "not " },
                if field.is_nullable() { "" } else { "not " }
            )),
            Ok(_) => {}
        }
    }
    for field in later.fields() {
        if first.field_with_name(field.name()).is_err() {
            differences.push(format!("'{}' is new", field.name()));
        }
    }
    if differences.is_empty() {
        let names = |s: &arrow_schema::Schema| {
            s.fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        };
        differences.push(format!(
            "the columns come in another order: {:?} (first batch: {:?})",
            names(later),
            names(first)
        ));
    }
    differences.join(", ")
}
