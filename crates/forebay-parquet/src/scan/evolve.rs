//! Schema evolution: files whose columns differ, read as one schema.
//!
//! ```text
//!  with_schema(T)        T is the dataset's schema, as given
//!  with_union_schema()   T = every file's columns by name, in order of first appearance,
//!                        each of the widest type its files hold (all footers read at build)
//!
//!  file's batch ──► for each column of T:  the file's column of that name, as is
//!                                          or widened (the rule below), or
//!                                          nulls where the file lacks it (T's field nullable)
//! ```
//!
//! The widening rule, the only casts made (never a narrowing, never a change of meaning):
//! integers to wider integers of either sign that hold every value (`uint32` → `int64`, not
//! `int32` → `uint32`), integers of up to 16 bits to `float32` and up to 32 bits to `float64`,
//! `float16` → `float32` → `float64`, strings and binaries between their plain, large and view
//! layouts, `date32` → `date64`, a timestamp to a finer unit of the same zone (a value that
//! would overflow is an error, not a wrong value), a decimal to one of the same scale and at
//! least its precision, and the `null` type to any. Anything else is an error naming the file,
//! the column and both types.

use std::sync::Arc;

use arrow_array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow_cast::{cast_with_options, CastOptions};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use futures::TryStreamExt;

use super::{DatasetInner, OpenedFile};
use crate::error::{column_not_found, ParquetError, Result};

/// Whether every value of `from` is a value of `to` (see the module docs).
pub(crate) fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    if from == to || *from == Null {
        return true;
    }
    let int_bits = |t: &DataType| match t {
        Int8 => Some((8, true)),
        Int16 => Some((16, true)),
        Int32 => Some((32, true)),
        Int64 => Some((64, true)),
        UInt8 => Some((8, false)),
        UInt16 => Some((16, false)),
        UInt32 => Some((32, false)),
        UInt64 => Some((64, false)),
        _ => None,
    };
    let unit_rank = |u: &TimeUnit| match u {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    };
    match (from, to) {
        (a, b) if int_bits(a).is_some() && int_bits(b).is_some() => {
            let ((fb, fs), (tb, ts)) = (int_bits(a).unwrap(), int_bits(b).unwrap());
            match (fs, ts) {
                (true, true) | (false, false) => tb > fb,
                (false, true) => tb > fb,
                (true, false) => false,
            }
        }
        (a, Float32) => int_bits(a).is_some_and(|(bits, _)| bits <= 16) || *a == Float16,
        (a, Float64) => {
            int_bits(a).is_some_and(|(bits, _)| bits <= 32) || matches!(a, Float16 | Float32)
        }
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => {
            // Plain offsets are 32-bit: only a layout without that limit is a widening.
            !matches!(to, Utf8)
        }
        (Binary | LargeBinary | BinaryView, Binary | LargeBinary | BinaryView) => {
            !matches!(to, Binary)
        }
        (Date32, Date64) => true,
        (Timestamp(fu, fz), Timestamp(tu, tz)) => fz == tz && unit_rank(tu) > unit_rank(fu),
        (Decimal128(fp, fs), Decimal128(tp, ts) | Decimal256(tp, ts)) => fs == ts && tp >= fp,
        (Decimal256(fp, fs), Decimal256(tp, ts)) => fs == ts && tp >= fp,
        _ => false,
    }
}

/// The type both `a` and `b` widen to, if one of them is it.
pub(crate) fn unify(a: &DataType, b: &DataType) -> Option<DataType> {
    if widens(a, b) {
        Some(b.clone())
    } else if widens(b, a) {
        Some(a.clone())
    } else {
        None
    }
}

/// The union of the files' schemas (`(path, schema)` in dataset order): columns by name in
/// order of first appearance, each of the type all its files widen to; a column some file
/// lacks is nullable.
pub(crate) fn union_schema(schemas: &[(String, SchemaRef)]) -> Result<SchemaRef> {
    let mut fields: Vec<(Field, String)> = Vec::new();
    for (path, schema) in schemas {
        for field in schema.fields() {
            match fields.iter_mut().find(|(f, _)| f.name() == field.name()) {
                None => fields.push((field.as_ref().clone(), path.clone())),
                Some((known, first)) => {
                    let Some(unified) = unify(known.data_type(), field.data_type()) else {
                        return Err(ParquetError::SchemaMismatch {
                            path: path.clone(),
                            first: first.clone(),
                            reason: format!(
                                "column '{}' is {} here and {} there; neither widens to the \
                                 other (see the widening rule of with_union_schema)",
                                field.name(),
                                field.data_type(),
                                known.data_type()
                            ),
                        });
                    };
                    let nullable = known.is_nullable() || field.is_nullable();
                    *known = known
                        .clone()
                        .with_data_type(unified)
                        .with_nullable(nullable);
                }
            }
        }
    }
    let in_every_file = |name: &str| {
        schemas
            .iter()
            .all(|(_, s)| s.fields().iter().any(|f| f.name() == name))
    };
    let fields: Vec<Field> = fields
        .into_iter()
        .map(|(f, _)| {
            let nullable = f.is_nullable() || !in_every_file(f.name());
            f.with_nullable(nullable)
        })
        .collect();
    Ok(Arc::new(Schema::new(fields)))
}

/// The dataset's schema when its files may differ, set before the scans: the schema given
/// (projected to the columns asked for; the first file checked against it), or the union of
/// every file's (each file's adapter set).
pub(super) async fn dataset_schema(inner: &Arc<DatasetInner>) -> Result<SchemaRef> {
    let columns = inner.file_columns.as_deref();
    if let Some(given) = &inner.options.schema {
        let schema = match columns {
            None => given.clone(),
            Some(columns) => project(given, columns, "the schema given")?,
        };
        let _ = inner.schema.set(schema.clone());
        inner.open(inner.schema_file).await?;
        return Ok(schema);
    }
    let opened: Vec<Arc<OpenedFile>> = inner
        .open_in_order((0..inner.files.len()).collect())
        .try_collect()
        .await?;
    let schemas: Vec<(String, SchemaRef)> = opened
        .iter()
        .map(|f| (f.entry.uri.to_string(), f.output_schema.clone()))
        .collect();
    let union = union_schema(&schemas)?;
    let union = match columns {
        None => union,
        Some(columns) => project(&union, columns, "any file")?,
    };
    let _ = inner.schema.set(union.clone());
    for file in &opened {
        let adapter = Adapter::new(&file.output_schema, union.clone(), &file.entry.uri)?;
        let _ = file.adapter.set(adapter);
    }
    Ok(union)
}

/// `schema`'s fields named `columns`, in that order (top-level names).
fn project(schema: &SchemaRef, columns: &[String], whose: &str) -> Result<SchemaRef> {
    let fields = columns
        .iter()
        .map(|name| {
            schema
                .field_with_name(name)
                .cloned()
                .map_err(|_| column_not_found(schema, name, whose))
        })
        .collect::<Result<Vec<Field>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// Where a column of the dataset's schema comes from in one file.
#[derive(Debug)]
enum Source {
    /// The file's column at this position of its batch, cast to the dataset's type if set.
    Column(usize, Option<DataType>),
    /// The file lacks it: nulls.
    Nulls,
}

/// How one file's batches become batches of the dataset's schema.
#[derive(Debug)]
pub(super) struct Adapter {
    target: SchemaRef,
    sources: Vec<Source>,
    path: String,
}

impl Adapter {
    /// The adapter of a file whose batches have `read` columns, to `target`; an error names
    /// the file and the column that cannot be adapted.
    pub(super) fn new(read: &Schema, target: SchemaRef, path: &str) -> Result<Adapter> {
        let mismatch = |reason: String| ParquetError::SchemaMismatch {
            path: path.to_string(),
            first: "the dataset's schema".into(),
            reason,
        };
        let mut sources = Vec::with_capacity(target.fields().len());
        for field in target.fields() {
            match read.index_of(field.name()) {
                Ok(i) => {
                    let from = read.field(i).data_type();
                    let to = field.data_type();
                    if !widens(from, to) {
                        return Err(mismatch(format!(
                            "column '{}' is {from} here, {to} in the dataset's schema, and {from} \
                             does not widen to {to}",
                            field.name()
                        )));
                    }
                    sources.push(Source::Column(i, (from != to).then(|| to.clone())));
                }
                Err(_) if field.is_nullable() => sources.push(Source::Nulls),
                Err(_) => {
                    return Err(mismatch(format!(
                        "the file has no column '{}', and the dataset's schema says it is not \
                         nullable (so it cannot be read as nulls)",
                        field.name()
                    )))
                }
            }
        }
        Ok(Adapter {
            target,
            sources,
            path: path.to_string(),
        })
    }

    /// The dataset's type of the file's column `name`, when it differs (statistics are cast
    /// like the values).
    pub(super) fn cast_of(&self, name: &str) -> Option<&DataType> {
        let i = self.target.index_of(name).ok()?;
        match &self.sources[i] {
            Source::Column(_, cast) => cast.as_ref(),
            Source::Nulls => None,
        }
    }

    /// `batch` (the file's columns) as a batch of the dataset's schema.
    pub(super) fn apply(&self, batch: &RecordBatch, row_group: usize) -> Result<RecordBatch> {
        let rows = batch.num_rows();
        let columns = self
            .sources
            .iter()
            .zip(self.target.fields())
            .map(|(source, field)| match source {
                Source::Column(i, None) => Ok(batch.column(*i).clone()),
                Source::Column(i, Some(to)) => {
                    widen(batch.column(*i), to).map_err(|e| ParquetError::SchemaMismatch {
                        path: self.path.clone(),
                        first: "the dataset's schema".into(),
                        reason: format!(
                            "column '{}' of row group {row_group} does not fit {to}: {e}",
                            field.name()
                        ),
                    })
                }
                Source::Nulls => Ok(new_null_array(field.data_type(), rows)),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        RecordBatch::try_new_with_options(
            self.target.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| crate::error::corrupt_from(&self.path, Some(row_group), e))
    }
}

/// `array` cast to `to`, failing (never nulling) where a value does not fit.
pub(super) fn widen(array: &ArrayRef, to: &DataType) -> std::result::Result<ArrayRef, String> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    cast_with_options(array, to, &options).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataType::*;

    #[test]
    fn widening_never_narrows_or_changes_meaning() {
        for (from, to) in [
            (Int8, Int64),
            (Int32, Int64),
            (UInt32, Int64),
            (UInt8, UInt16),
            (Int16, Float32),
            (Int32, Float64),
            (Float32, Float64),
            (Utf8, LargeUtf8),
            (Utf8, Utf8View),
            (Binary, LargeBinary),
            (Date32, Date64),
            (Null, Utf8),
            (Decimal128(10, 2), Decimal128(20, 2)),
            (
                Timestamp(TimeUnit::Millisecond, None),
                Timestamp(TimeUnit::Microsecond, None),
            ),
        ] {
            assert!(widens(&from, &to), "{from} -> {to}");
        }
        for (from, to) in [
            (Int64, Int32),
            (Int32, UInt32),
            (Int8, UInt64),
            (UInt64, Int64),
            (Int64, Float64),
            (Int32, Float32),
            (Float64, Float32),
            (LargeUtf8, Utf8),
            (Utf8, Binary),
            (Int64, Utf8),
            (Decimal128(10, 2), Decimal128(20, 3)),
            (
                Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                Timestamp(TimeUnit::Microsecond, None),
            ),
            (
                Timestamp(TimeUnit::Nanosecond, None),
                Timestamp(TimeUnit::Microsecond, None),
            ),
        ] {
            assert!(!widens(&from, &to), "{from} -> {to}");
        }
    }

    #[test]
    fn a_union_takes_columns_by_first_appearance_with_the_wider_type() {
        let a = Arc::new(Schema::new(vec![
            Field::new("id", Int32, false),
            Field::new("x", Utf8, false),
        ]));
        let b = Arc::new(Schema::new(vec![
            Field::new("y", Float32, false),
            Field::new("id", Int64, false),
        ]));
        let union = union_schema(&[("a".into(), a.clone()), ("b".into(), b)]).unwrap();
        let shown: Vec<(String, DataType, bool)> = union
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone(), f.is_nullable()))
            .collect();
        assert_eq!(
            shown,
            [
                ("id".into(), Int64, false),
                ("x".into(), Utf8, true),
                ("y".into(), Float32, true),
            ]
        );
        let c = Arc::new(Schema::new(vec![Field::new("id", Utf8, true)]));
        let err = union_schema(&[("a".into(), a), ("c".into(), c)]).unwrap_err();
        assert!(
            err.to_string()
                .contains("column 'id' is Utf8 here and Int32 there"),
            "{err}"
        );
    }

    #[test]
    fn a_value_that_does_not_fit_the_finer_unit_is_an_error_not_a_wrong_value() {
        let far: ArrayRef = Arc::new(arrow_array::TimestampSecondArray::from(vec![i64::MAX / 2]));
        let err = widen(&far, &Timestamp(TimeUnit::Nanosecond, None)).unwrap_err();
        assert!(err.contains("overflow"), "{err}");
    }
}
