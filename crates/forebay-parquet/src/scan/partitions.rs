//! Hive-style partition columns: values a file's directories give each of its rows.
//!
//! ```text
//!  listed: table/                 table/year=2024/region=eu/part-0.parquet
//!                                       └──────┬──────────┘
//!                       year = 2024 (int64), region = "eu" (string)
//!
//!  filter ──► per file, before its footer is read: terms on year/region decided
//!             (Predicate::with_constants) ──► False: the file is not read
//!                                         ──► the rest: bound to the file's columns
//!  file's batch (its own columns) ──► + year, region as constant columns ──► columns in
//!                                       the order asked for (else file's, then the keys)
//! ```
//!
//! The keys are the `key=value` directories between the directory (or a glob's literal
//! prefix) that was listed and the file, in order; other directories are ignored. Every
//! file has the same keys in the same order, or the dataset is an error naming two files
//! that differ. A key's column is int64 when every value of it is an integer, else a
//! string; a value is percent-decoded (`%3A` is `:`, as Hive, Spark and pyarrow write them),
//! and `__HIVE_DEFAULT_PARTITION__` or an empty value is null. A file named on its own
//! (not listed) has no partition values, as in pyarrow, so datasets mixing the two are an
//! error too. A file that has a column of a key's name is an error: which value would be
//! right is not knowable.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use arrow_array::{new_null_array, Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{Field, Schema, SchemaRef};
use percent_encoding::percent_decode_str;

use crate::error::{column_not_found, ParquetError, Result};
use crate::io::FileEntry;
use crate::predicate::{Predicate, Simplified};

/// The value Hive writes for a null partition value.
const HIVE_NULL: &str = "__HIVE_DEFAULT_PARTITION__";

/// A dataset's partition columns and each file's values of them.
pub(super) struct Partitions {
    /// The partition columns, in path order.
    pub(super) schema: SchemaRef,
    /// Per file (by index): its values, as a one-row batch of `schema`.
    values: Vec<RecordBatch>,
    /// Per file (by index): what the filter leaves to its rows.
    filters: Vec<FileFilter>,
    /// The columns asked for (`with_columns`), partition keys among them.
    requested: Option<Vec<String>>,
    /// The scan's output: its schema, and where each column comes from. Set once the
    /// dataset's schema of file columns is known (`finish`).
    output: OnceLock<Output>,
}

/// What the dataset's filter leaves to one file's rows.
#[derive(Debug, Clone)]
pub(super) enum FileFilter {
    /// No filter, or the partition values satisfy it: every row.
    All,
    /// The partition values rule the file out: no row (the file is not read).
    Excluded,
    /// The rows matching this predicate over the file's columns.
    Rows(Predicate),
}

/// The scan's output schema and how a batch of it is assembled.
struct Output {
    schema: SchemaRef,
    slots: Vec<Slot>,
}

/// Where a column of the output comes from.
#[derive(Clone, Copy)]
enum Slot {
    /// The file batch's column at this position.
    File(usize),
    /// The partition column at this position.
    Partition(usize),
}

impl Partitions {
    /// The partition columns of `files` (`None` when no file sits under a `key=value`
    /// directory), typed as `given` says where it names a key, what `filter` leaves to
    /// each file, and which of `columns` are partition keys.
    pub(super) fn discover(
        files: &[FileEntry],
        given: Option<&SchemaRef>,
        filter: Option<&Predicate>,
        columns: Option<&[String]>,
    ) -> Result<Option<Partitions>> {
        let pairs: Vec<Vec<(String, Option<String>)>> = files.iter().map(key_values).collect();
        let Some(with_keys) = pairs.iter().position(|p| !p.is_empty()) else {
            if let Some(field) = given.and_then(|g| g.fields().first().cloned()) {
                return Err(ParquetError::InvalidArgument(format!(
                    "hive_schema names the partition key '{}', but no file of the dataset sits \
                     under a key=value directory",
                    field.name()
                )));
            }
            return Ok(None);
        };
        let keys: Vec<&str> = pairs[with_keys].iter().map(|(k, _)| k.as_str()).collect();
        for (file, pairs_of_file) in files.iter().zip(&pairs) {
            let here: Vec<&str> = pairs_of_file.iter().map(|(k, _)| k.as_str()).collect();
            if here != keys {
                return Err(ParquetError::SchemaMismatch {
                    path: file.uri.to_string(),
                    first: files[with_keys].uri.to_string(),
                    reason: format!(
                        "its directories give the partition keys {here:?}, the other file's \
                         {keys:?}; every file of a hive-partitioned dataset sits under the same \
                         key=value directories (pass partitioning=None, Rust: leave \
                         with_hive_partitioning off, to read the files' own columns only)"
                    ),
                });
            }
        }
        if let Some(unknown) = given.and_then(|g| {
            g.fields()
                .iter()
                .find(|f| !keys.contains(&f.name().as_str()))
                .cloned()
        }) {
            return Err(ParquetError::InvalidArgument(format!(
                "hive_schema names the partition key '{}', which no directory gives (the \
                 files' keys: {keys:?})",
                unknown.name()
            )));
        }
        let mut key_columns = Vec::with_capacity(keys.len());
        let mut fields = Vec::with_capacity(keys.len());
        for (k, key) in keys.iter().enumerate() {
            let values = pairs.iter().map(|p| p[k].1.as_deref());
            let typed = given.and_then(|g| g.field_with_name(key).ok());
            let (column, field) = match typed {
                None => {
                    let column = column_of(values);
                    let nullable = column.null_count() > 0;
                    let field = Field::new(*key, column.data_type().clone(), nullable);
                    (column, field)
                }
                Some(field) => (typed_column(values, field, files)?, field.clone()),
            };
            key_columns.push(column);
            fields.push(field);
        }
        let schema = Arc::new(Schema::new(fields));
        let all = RecordBatch::try_new(schema.clone(), key_columns)
            .map_err(|e| ParquetError::InvalidArgument(format!("partition columns: {e}")))?;
        let values: Vec<RecordBatch> = (0..files.len()).map(|i| all.slice(i, 1)).collect();
        // Decided once per distinct set of values (a directory's files share them).
        let mut decided: HashMap<&[(String, Option<String>)], FileFilter> = HashMap::new();
        let mut filters = Vec::with_capacity(files.len());
        for ((file, values), pairs) in files.iter().zip(&values).zip(&pairs) {
            let Some(filter) = filter else {
                filters.push(FileFilter::All);
                continue;
            };
            if let Some(known) = decided.get(pairs.as_slice()) {
                filters.push(known.clone());
                continue;
            }
            let this = match filter.with_constants(values, &file.uri)? {
                Simplified::True => FileFilter::All,
                Simplified::False => FileFilter::Excluded,
                Simplified::Rows(rows) => FileFilter::Rows(rows),
            };
            decided.insert(pairs.as_slice(), this.clone());
            filters.push(this);
        }
        Ok(Some(Partitions {
            schema,
            values,
            filters,
            requested: columns.map(<[String]>::to_vec),
            output: OnceLock::new(),
        }))
    }

    fn is_key(&self, name: &str) -> bool {
        self.schema.index_of(name).is_ok()
    }

    /// The columns asked for that the files hold (the keys left out), or all (`None`).
    pub(super) fn file_columns(&self) -> Option<Vec<String>> {
        self.requested.as_ref().map(|columns| {
            columns
                .iter()
                .filter(|c| !self.is_key(c))
                .cloned()
                .collect()
        })
    }

    /// What the filter leaves to file `index`'s rows.
    pub(super) fn filter_of(&self, index: usize) -> &FileFilter {
        &self.filters[index]
    }

    /// Whether the filter is decided by partition values alone in every file (every row of
    /// a file matches or none does).
    pub(super) fn decide_the_filter(&self) -> bool {
        self.filters
            .iter()
            .all(|f| matches!(f, FileFilter::All | FileFilter::Excluded))
    }

    /// An error when the file (`path`, its schema `file_schema`) has a column of a key's
    /// name.
    pub(super) fn check_file(&self, file_schema: &Schema, path: &str) -> Result<()> {
        match self
            .schema
            .fields()
            .iter()
            .find(|key| file_schema.index_of(key.name()).is_ok())
        {
            None => Ok(()),
            Some(key) => Err(ParquetError::SchemaMismatch {
                path: path.to_string(),
                first: "its directories".into(),
                reason: format!(
                    "the file has a column '{0}' and sits under a '{0}=...' directory, so its \
                     rows would have two values of '{0}'; pass partitioning=None (Rust: leave \
                     with_hive_partitioning off) to read the file's own column",
                    key.name()
                ),
            }),
        }
    }

    /// Set the output from the dataset's schema of file columns (`files`): the columns in
    /// the order asked for, else the files' then the keys. Returns the output schema.
    pub(super) fn finish(&self, files: &SchemaRef) -> Result<SchemaRef> {
        let slot_of = |name: &str| -> Option<(Slot, Field)> {
            if let Ok(k) = self.schema.index_of(name) {
                return Some((Slot::Partition(k), self.schema.field(k).clone()));
            }
            let i = files.index_of(name).ok()?;
            Some((Slot::File(i), files.field(i).clone()))
        };
        let names: Vec<String> = match &self.requested {
            Some(columns) => columns.clone(),
            None => files
                .fields()
                .iter()
                .chain(self.schema.fields())
                .map(|f| f.name().clone())
                .collect(),
        };
        let mut slots = Vec::with_capacity(names.len());
        let mut fields = Vec::with_capacity(names.len());
        for name in &names {
            let (slot, field) =
                slot_of(name).ok_or_else(|| column_not_found(files, name, "any file"))?;
            slots.push(slot);
            fields.push(field);
        }
        let schema = Arc::new(Schema::new(fields));
        let output = self.output.get_or_init(|| Output {
            schema: schema.clone(),
            slots,
        });
        Ok(output.schema.clone())
    }

    /// The scan's output schema (after [`finish`](Self::finish)).
    pub(super) fn output_schema(&self) -> Option<SchemaRef> {
        self.output.get().map(|o| o.schema.clone())
    }

    /// A batch of file `index`'s own columns (the dataset's schema of them) as a batch of
    /// the output: its partition values added as constant columns.
    pub(super) fn assemble(
        &self,
        index: usize,
        batch: &RecordBatch,
        path: &str,
    ) -> Result<RecordBatch> {
        let output = self
            .output
            .get()
            .expect("the output is set when the dataset is built");
        let rows = batch.num_rows();
        let values = &self.values[index];
        let columns: Vec<ArrayRef> = output
            .slots
            .iter()
            .map(|slot| match *slot {
                Slot::File(i) => batch.column(i).clone(),
                Slot::Partition(k) => repeated(values.column(k), rows),
            })
            .collect();
        RecordBatch::try_new_with_options(
            output.schema.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| crate::error::corrupt_from(path, None, e))
    }
}

/// The `key=value` directories of a listed file, values decoded (`None`: null).
fn key_values(file: &FileEntry) -> Vec<(String, Option<String>)> {
    let Some(dirs) = file.listed_under.as_deref() else {
        return Vec::new();
    };
    dirs.split('/')
        .filter_map(|dir| dir.split_once('='))
        .filter(|(key, _)| !key.is_empty())
        .map(|(key, value)| {
            let decoded = percent_decode_str(value).decode_utf8_lossy().into_owned();
            let value = (!decoded.is_empty() && decoded != HIVE_NULL).then_some(decoded);
            (
                percent_decode_str(key).decode_utf8_lossy().into_owned(),
                value,
            )
        })
        .collect()
}

/// One key's values over the files: int64 when every value is an integer, else strings.
fn column_of<'a>(values: impl Iterator<Item = Option<&'a str>> + Clone) -> ArrayRef {
    let all_ints = values
        .clone()
        .all(|v| v.is_none_or(|v| v.parse::<i64>().is_ok()));
    if all_ints && values.clone().any(|v| v.is_some()) {
        Arc::new(Int64Array::from_iter(
            values.map(|v| v.map(|v| v.parse::<i64>().expect("checked"))),
        ))
    } else {
        Arc::new(StringArray::from_iter(values))
    }
}

/// One key's values over `files` parsed as `field` says (`hive_schema`): an error names
/// the first file whose value does not parse, or is null where the field is not nullable.
fn typed_column<'a>(
    values: impl Iterator<Item = Option<&'a str>> + Clone,
    field: &Field,
    files: &[FileEntry],
) -> Result<ArrayRef> {
    let strings: ArrayRef = Arc::new(StringArray::from_iter(values));
    let options = arrow_cast::CastOptions {
        safe: true,
        ..Default::default()
    };
    let typed =
        arrow_cast::cast_with_options(&strings, field.data_type(), &options).map_err(|e| {
            ParquetError::InvalidArgument(format!("hive_schema: key '{}': {e}", field.name()))
        })?;
    // A safe cast nulls what does not parse: a null here that was a value there.
    let bad = (0..typed.len()).find(|&i| {
        (typed.is_null(i) && !strings.is_null(i)) || (strings.is_null(i) && !field.is_nullable())
    });
    if let Some(i) = bad {
        let strings = strings
            .as_any()
            .downcast_ref::<StringArray>()
            .expect("strings");
        let reason = if strings.is_null(i) {
            "is null (__HIVE_DEFAULT_PARTITION__ or empty), and hive_schema says it is not \
             nullable"
                .to_string()
        } else {
            format!(
                "'{}' is not a value of type {}",
                strings.value(i),
                field.data_type()
            )
        };
        return Err(ParquetError::SchemaMismatch {
            path: files[i].uri.to_string(),
            first: "hive_schema".into(),
            reason: format!("its partition key '{}' {reason}", field.name()),
        });
    }
    Ok(typed)
}

/// A one-value array repeated `rows` times.
fn repeated(value: &ArrayRef, rows: usize) -> ArrayRef {
    if value.is_null(0) {
        return new_null_array(value.data_type(), rows);
    }
    if let Some(ints) = value.as_any().downcast_ref::<Int64Array>() {
        return Arc::new(Int64Array::from_value(ints.value(0), rows));
    }
    if let Some(strings) = value.as_any().downcast_ref::<StringArray>() {
        let v = strings.value(0);
        return Arc::new(StringArray::from_iter_values(std::iter::repeat_n(v, rows)));
    }
    // Other types (from a hive_schema): the one value taken `rows` times.
    let zeros = arrow_array::UInt32Array::from(vec![0u32; rows]);
    arrow_select::take::take(value.as_ref(), &zeros, None).expect("index 0 of a one-row array")
}

#[cfg(test)]
mod tests {
    use arrow_schema::DataType;

    use super::*;

    #[test]
    fn values_are_decoded_typed_and_null_for_hive_default() {
        let ints = column_of(
            ["2024", "-3", HIVE_NULL]
                .map(|v| (v != HIVE_NULL).then_some(v))
                .into_iter(),
        );
        assert_eq!(ints.data_type(), &DataType::Int64);
        assert_eq!(ints.null_count(), 1);
        let strings = column_of([Some("2024"), Some("07a")].into_iter());
        assert_eq!(strings.data_type(), &DataType::Utf8);
        let all_null = column_of([None, None].into_iter());
        assert_eq!(all_null.data_type(), &DataType::Utf8);
        let repeated = repeated(&strings.slice(1, 1), 3);
        let repeated = repeated.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(repeated.iter().collect::<Vec<_>>(), vec![Some("07a"); 3]);
    }
}
