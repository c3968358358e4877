//! What a file's schema becomes for the scan: dictionary and INT96 options applied, the
//! requested columns projected, the flat columns found, and its agreement with the first file.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::ParquetMetaData;

use super::FlatColumn;
use crate::error::{column_not_found, ParquetError, Result};
use crate::flat::FlatType;

/// Replace the named string/binary columns' types with `Dictionary(Int32, _)`.
pub(super) fn apply_dictionary_hints(
    schema: &SchemaRef,
    columns: &[String],
    path: &str,
) -> Result<SchemaRef> {
    if columns.is_empty() {
        return Ok(schema.clone());
    }
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    for name in columns {
        let idx = schema
            .index_of(name)
            .map_err(|_| column_not_found(schema, name, path))?;
        let field = &fields[idx];
        let value = match field.data_type() {
            DataType::Dictionary(_, _) => continue,
            t @ (DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary) => t.clone(),
            DataType::Utf8View => DataType::Utf8,
            DataType::BinaryView => DataType::Binary,
            other => {
                return Err(ParquetError::InvalidArgument(format!(
                    "{path}: column '{name}' has type {other}; only string and binary columns can be read as dictionaries"
                )))
            }
        };
        let dict = DataType::Dictionary(Box::new(DataType::Int32), Box::new(value));
        fields[idx] = field.clone().with_data_type(dict);
    }
    Ok(Arc::new(Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    )))
}

/// Give zoned timestamp columns the time zone the writer's embedded Arrow schema names where
/// arrow-rs left it out: a column written in seconds is stored in milliseconds (Parquet has
/// no seconds), and arrow-rs applies the embedded zone only when the units agree, reading
/// `timestamp[s, America/New_York]` as `timestamp[ms, UTC]`. pyarrow reads it as
/// `timestamp[ms, America/New_York]`: the instants are the same, the zone is the writer's.
pub(super) fn apply_embedded_time_zones(
    schema: &SchemaRef,
    metadata: &ParquetMetaData,
) -> SchemaRef {
    let Some(embedded) = embedded_arrow_schema(metadata) else {
        return schema.clone();
    };
    let mut changed = false;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|field| {
            let hint = embedded.field_with_name(field.name()).ok();
            match (field.data_type(), hint.map(|h| h.data_type())) {
                (DataType::Timestamp(unit, Some(_)), Some(DataType::Timestamp(h, Some(zone))))
                    if unit != h =>
                {
                    changed = true;
                    field
                        .as_ref()
                        .clone()
                        .with_data_type(DataType::Timestamp(*unit, Some(zone.clone())))
                }
                _ => field.as_ref().clone(),
            }
        })
        .collect();
    if !changed {
        return schema.clone();
    }
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The Arrow schema a writer embedded in the file (`ARROW:schema`), if it can be read.
fn embedded_arrow_schema(metadata: &ParquetMetaData) -> Option<Schema> {
    use base64::Engine;
    let encoded = metadata
        .file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == "ARROW:schema")?
        .value
        .as_ref()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    // An IPC message, with or without the continuation marker and length before it.
    let message = match bytes.get(..4) {
        Some([0xff, 0xff, 0xff, 0xff]) => bytes.get(8..)?,
        _ => bytes.get(4..)?,
    };
    let message = arrow_ipc::root_as_message(message).ok()?;
    arrow_ipc::convert::try_fb_to_schema(message.header_as_schema()?).ok()
}

/// Read INT96 leaves (top level or inside structs) as timestamps of `unit`.
pub(super) fn apply_int96_unit(
    schema: &SchemaRef,
    metadata: &ParquetMetaData,
    unit: TimeUnit,
) -> SchemaRef {
    let int96: Vec<Vec<String>> = metadata
        .file_metadata()
        .schema_descr()
        .columns()
        .iter()
        .filter(|c| c.physical_type() == parquet::basic::Type::INT96)
        .map(|c| c.path().parts().to_vec())
        .collect();
    if unit == TimeUnit::Nanosecond || int96.is_empty() {
        return schema.clone();
    }
    fn rewrite(
        field: &Field,
        path: &mut Vec<String>,
        int96: &[Vec<String>],
        unit: TimeUnit,
    ) -> Field {
        path.push(field.name().clone());
        let data_type = match field.data_type() {
            DataType::Timestamp(TimeUnit::Nanosecond, tz) if int96.contains(path) => {
                DataType::Timestamp(unit, tz.clone())
            }
            DataType::Struct(children) => DataType::Struct(
                children
                    .iter()
                    .map(|c| Arc::new(rewrite(c, path, int96, unit)))
                    .collect(),
            ),
            other => other.clone(),
        };
        path.pop();
        field.clone().with_data_type(data_type)
    }
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| rewrite(f, &mut Vec::new(), &int96, unit))
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// Columns whose Parquet type has no Arrow reading (pyarrow refuses them as well): integers
/// wider than 64 bits (polars writes `Int128` so). An error naming the column, not a corrupt
/// file.
pub(super) fn check_supported_types(
    schema: &parquet::schema::types::SchemaDescriptor,
    path: &str,
) -> Result<()> {
    use parquet::basic::LogicalType;
    for column in schema.columns() {
        if let Some(LogicalType::Integer(int)) = column.logical_type_ref() {
            let bit_width = int.bit_width;
            if bit_width > 64 {
                let sign = if int.is_signed { "signed" } else { "unsigned" };
                return Err(ParquetError::UnsupportedType {
                    path: path.to_string(),
                    column: Some(column.path().string()),
                    reason: format!("{sign} {bit_width}-bit: {}", crate::error::WIDE_INTEGERS),
                });
            }
        }
    }
    Ok(())
}

/// Map keys must be required (Parquet spec; pyarrow refuses such files too): a nullable key
/// cannot be represented in Arrow's map type, and arrow-rs would silently coerce it.
pub(super) fn check_map_keys_required(ty: &parquet::schema::types::Type, path: &str) -> Result<()> {
    use parquet::basic::{ConvertedType, LogicalType, Repetition};
    if !ty.is_group() {
        return Ok(());
    }
    let info = ty.get_basic_info();
    let is_map = matches!(info.logical_type_ref(), Some(LogicalType::Map))
        || matches!(
            info.converted_type(),
            ConvertedType::MAP | ConvertedType::MAP_KEY_VALUE
        );
    if is_map {
        if let Some(key_value) = ty.get_fields().first().filter(|kv| kv.is_group()) {
            if let Some(key) = key_value.get_fields().first() {
                let kinfo = key.get_basic_info();
                if kinfo.has_repetition() && kinfo.repetition() != Repetition::REQUIRED {
                    return Err(ParquetError::Corrupt {
                        path: path.to_string(),
                        row_group: None,
                        reason: format!(
                            "invalid schema: keys of map column '{}' must be required",
                            info.name()
                        ),
                        source: None,
                    });
                }
            }
        }
    }
    ty.get_fields()
        .iter()
        .try_for_each(|child| check_map_keys_required(child, path))
}

/// The selected roots (`decoded` is the schema of their decoded batch) that are flat columns
/// forebay's own decoders read (see `flat`).
pub(super) fn flat_columns(
    parquet_schema: &parquet::schema::types::SchemaDescriptor,
    selected_roots: &[usize],
    decoded: &Schema,
) -> Vec<FlatColumn> {
    let mut leaf_of_root = vec![None; parquet_schema.root_schema().get_fields().len()];
    for leaf in 0..parquet_schema.num_columns() {
        let root = parquet_schema.get_column_root_idx(leaf);
        // A root with several leaves is nested; `FlatType::of` refuses it anyway.
        leaf_of_root[root] = Some(leaf);
    }
    selected_roots
        .iter()
        .enumerate()
        .filter_map(|(position, &root)| {
            let leaf = leaf_of_root[root]?;
            let data_type = decoded.field(position).data_type();
            let ty = FlatType::of(&parquet_schema.column(leaf), data_type)?;
            Some(FlatColumn { position, leaf, ty })
        })
        .collect()
}

/// Map requested names onto Parquet leaves. Returns the mask and, per requested name, the
/// index of its top-level (root) column.
pub(super) fn resolve_projection(
    parquet_schema: &parquet::schema::types::SchemaDescriptor,
    arrow_schema: &Schema,
    columns: Option<&[String]>,
    path: &str,
) -> Result<(ProjectionMask, Vec<usize>)> {
    let root_names: Vec<&str> = parquet_schema
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name())
        .collect();
    let Some(columns) = columns else {
        return Ok((ProjectionMask::all(), (0..root_names.len()).collect()));
    };
    let mut leaves = Vec::new();
    let mut roots = Vec::new();
    for name in columns {
        let matched: Vec<usize> = match root_names.iter().position(|r| r == name) {
            // An exact top-level name wins (it may itself contain dots).
            Some(root) => (0..parquet_schema.num_columns())
                .filter(|&leaf| parquet_schema.get_column_root_idx(leaf) == root)
                .collect(),
            None => {
                let parts: Vec<&str> = name.split('.').collect();
                (0..parquet_schema.num_columns())
                    .filter(|&leaf| {
                        let path = parquet_schema.column(leaf).path().parts().to_vec();
                        path.len() >= parts.len() && parts.iter().zip(&path).all(|(a, b)| a == b)
                    })
                    .collect()
            }
        };
        let Some(&first) = matched.first() else {
            return Err(column_not_found(arrow_schema, name, path));
        };
        let root = parquet_schema.get_column_root_idx(first);
        if !roots.contains(&root) {
            roots.push(root);
        }
        leaves.extend(matched);
    }
    Ok((ProjectionMask::leaves(parquet_schema, leaves), roots))
}

pub(super) fn check_same_schema(
    first: &Schema,
    this: &Schema,
    path: &str,
    first_path: &str,
) -> Result<()> {
    let mismatch = |reason: String| ParquetError::SchemaMismatch {
        path: path.to_string(),
        first: first_path.to_string(),
        reason,
    };
    if first.fields().len() != this.fields().len() {
        let names = |s: &Schema| -> Vec<String> {
            s.fields().iter().map(|f| f.name().to_string()).collect()
        };
        let (here, there) = (names(this), names(first));
        let extra: Vec<&String> = here.iter().filter(|n| !there.contains(n)).collect();
        let missing: Vec<&String> = there.iter().filter(|n| !here.contains(n)).collect();
        let mut differences = Vec::new();
        if !extra.is_empty() {
            differences.push(format!("has {extra:?}, which the first file has not"));
        }
        if !missing.is_empty() {
            differences.push(format!("lacks {missing:?}, which the first file has"));
        }
        return Err(mismatch(format!(
            "{} selected columns here, {} in the first file: this file {}; pass columns=[...] \
             to read the columns every file has",
            here.len(),
            there.len(),
            differences.join(" and ")
        )));
    }
    let by_name = |s: &Schema| {
        let mut fields: Vec<(String, DataType)> = s
            .fields()
            .iter()
            .map(|f| (f.name().to_string(), f.data_type().clone()))
            .collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        fields
    };
    let names =
        |s: &Schema| -> Vec<String> { s.fields().iter().map(|f| f.name().to_string()).collect() };
    // (Nullability and metadata may differ: only names and types are compared.)
    if names(first) != names(this) && by_name(first) == by_name(this) {
        return Err(mismatch(format!(
            "the same columns in another order ({:?} here, {:?} in the first file); pass \
             schema=\"union\" (Rust: with_union_schema) to read every file's columns by name",
            names(this),
            names(first)
        )));
    }
    for (a, b) in first.fields().iter().zip(this.fields()) {
        if a.name() != b.name() || a.data_type() != b.data_type() {
            return Err(mismatch(format!(
                "column '{}' is {} here but '{}' {} in the first file",
                b.name(),
                b.data_type(),
                a.name(),
                a.data_type()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(fields: &[(&str, DataType, bool)]) -> Schema {
        Schema::new(
            fields
                .iter()
                .map(|(n, t, nullable)| Field::new(*n, t.clone(), *nullable))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn files_differing_only_in_nullability_are_the_same_and_reordered_ones_are_named() {
        let first = schema(&[("a", DataType::Int64, false), ("b", DataType::Utf8, true)]);
        let nullable = schema(&[("a", DataType::Int64, true), ("b", DataType::Utf8, true)]);
        assert!(check_same_schema(&first, &nullable, "2.parquet", "1.parquet").is_ok());
        let reordered = schema(&[("b", DataType::Utf8, true), ("a", DataType::Int64, true)]);
        let err = check_same_schema(&first, &reordered, "2.parquet", "1.parquet").unwrap_err();
        assert!(
            err.to_string().contains("same columns in another order"),
            "{err}"
        );
        let retyped = schema(&[("a", DataType::Int32, true), ("b", DataType::Utf8, true)]);
        let err = check_same_schema(&first, &retyped, "2.parquet", "1.parquet").unwrap_err();
        assert!(
            err.to_string().contains("column 'a' is Int32 here"),
            "{err}"
        );
    }
}
