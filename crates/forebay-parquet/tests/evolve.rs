//! Files whose schemas differ, read as one: a union of their columns, or a schema given;
//! nulls where a file lacks a column, widening by a stated rule, errors naming the file.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampSecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use forebay_parquet::{DatasetSource, ParquetDataset, ParquetError, Predicate};
use parquet::arrow::ArrowWriter;

fn write(dir: &Path, name: &str, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let file = std::fs::File::create(dir.join(name)).unwrap();
    let mut w = ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Three generations of a table: `id` int32 then int64, `name` dropped, `score` added as
/// float32 then float64.
fn generations() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.parquet",
        vec![
            ("id", Arc::new(Int32Array::from(vec![1, 2]))),
            ("name", Arc::new(StringArray::from(vec!["a", "b"]))),
        ],
    );
    write(
        dir.path(),
        "b.parquet",
        vec![
            ("id", Arc::new(Int64Array::from(vec![3, 4]))),
            ("name", Arc::new(StringArray::from(vec!["c", "d"]))),
            ("score", Arc::new(Float32Array::from(vec![0.5, 1.5]))),
        ],
    );
    write(
        dir.path(),
        "c.parquet",
        vec![
            ("score", Arc::new(Float64Array::from(vec![2.5]))),
            ("id", Arc::new(Int32Array::from(vec![5]))),
        ],
    );
    dir
}

fn builder(dir: &tempfile::TempDir) -> forebay_parquet::ParquetDatasetBuilder {
    ParquetDataset::builder(DatasetSource::uris([dir.path().display().to_string()]))
}

fn read(dataset: &ParquetDataset) -> Result<RecordBatch, ParquetError> {
    let batches = dataset
        .scan()
        .blocking_iter()
        .map(|b| b.map(|b| b.batch))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(arrow_select::concat::concat_batches(&dataset.schema(), &batches).unwrap())
}

#[test]
fn files_differ_and_one_scan_reads_the_union_of_their_columns() {
    let dir = generations();
    // By default the files must agree: the second file is refused, as before.
    let strict = builder(&dir).build().unwrap();
    assert!(matches!(
        read(&strict),
        Err(ParquetError::SchemaMismatch { .. })
    ));

    let dataset = builder(&dir).with_union_schema().build().unwrap();
    let schema = dataset.schema();
    let fields: Vec<(&str, &DataType, bool)> = schema
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type(), f.is_nullable()))
        .collect();
    assert_eq!(
        fields,
        [
            ("id", &DataType::Int64, false),
            ("name", &DataType::Utf8, true),
            ("score", &DataType::Float64, true),
        ]
    );
    let all = read(&dataset).unwrap();
    let ids = all.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(ids.values(), &[1, 2, 3, 4, 5]);
    let names = all
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert_eq!(
        names.iter().collect::<Vec<_>>(),
        [Some("a"), Some("b"), Some("c"), Some("d"), None]
    );
    let scores = all
        .column(2)
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    assert_eq!(
        scores.iter().collect::<Vec<_>>(),
        [None, None, Some(0.5), Some(1.5), Some(2.5)]
    );
    assert_eq!(dataset.count_rows().unwrap(), 5);

    // Columns picked by name, in the order asked; a filter on a column every file has.
    let picked = builder(&dir)
        .with_union_schema()
        .with_columns(["score", "id"])
        .with_filter(Predicate::gt("id", 2))
        .build()
        .unwrap();
    let some = read(&picked).unwrap();
    assert_eq!(some.schema().field(0).name(), "score");
    let ids = some
        .column(1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap();
    assert_eq!(ids.values(), &[3, 4, 5]);

    // A filter on a column some file lacks: an error naming that file (not a guess at
    // how nulls compare).
    let partial = builder(&dir)
        .with_union_schema()
        .with_filter(Predicate::gt("score", 1.0))
        .build();
    let err = partial.and_then(|d| read(&d)).unwrap_err();
    assert!(err.to_string().contains("a.parquet"), "{err}");

    // The plan's statistics are of the dataset's types; a file without a column has only
    // nulls in it.
    let plan = dataset.plan().unwrap();
    let min_id = plan[0].columns[0].min.as_ref().unwrap();
    assert_eq!(min_id.data_type(), &DataType::Int64);
    assert_eq!(
        plan[2].columns[1].null_count,
        Some(1),
        "c.parquet has no name"
    );
}

#[test]
fn a_schema_given_is_what_every_file_is_read_as() {
    let dir = generations();
    let given = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("score", DataType::Float64, true),
        Field::new("comment", DataType::Utf8, true),
    ]));
    let dataset = builder(&dir).with_schema(given.clone()).build().unwrap();
    assert_eq!(dataset.schema(), given);
    let all = read(&dataset).unwrap();
    assert_eq!(all.num_rows(), 5);
    assert_eq!(all.column(2).null_count(), 5, "no file has 'comment'");

    // A type a file's column does not widen to: the scan says which file and column.
    let narrower = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, false)]));
    let err = read(&builder(&dir).with_schema(narrower).build().unwrap()).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("b.parquet") && message.contains("'id' is Int64 here, Int32"),
        "{message}"
    );
    // A column a file lacks that may not be null.
    let required = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]));
    let err = read(&builder(&dir).with_schema(required).build().unwrap()).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("c.parquet") && message.contains("no column 'name'"),
        "{message}"
    );
    // A column asked for that the schema does not have.
    let err = builder(&dir)
        .with_schema(given)
        .with_columns(["nope"])
        .build()
        .err()
        .unwrap();
    assert!(err.to_string().contains("'nope' not found"), "{err}");
}

#[test]
fn types_that_do_not_widen_and_values_that_do_not_fit_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.parquet",
        vec![("x", Arc::new(Int64Array::from(vec![1])))],
    );
    write(
        dir.path(),
        "b.parquet",
        vec![("x", Arc::new(StringArray::from(vec!["1"])))],
    );
    let err = builder(&dir).with_union_schema().build().err().unwrap();
    let message = err.to_string();
    assert!(
        message.contains("b.parquet") && message.contains("a.parquet") && message.contains("'x'"),
        "{message}"
    );

    // Seconds far in the future do not fit nanoseconds: an error, never a wrapped value.
    let dir = tempfile::tempdir().unwrap();
    let far = TimestampSecondArray::from(vec![1, 20_000_000_000]);
    write(dir.path(), "a.parquet", vec![("t", Arc::new(far))]);
    let nanos = Arc::new(Schema::new(vec![Field::new(
        "t",
        DataType::Timestamp(TimeUnit::Nanosecond, None),
        true,
    )]));
    let dataset = builder(&dir).with_schema(nanos).build().unwrap();
    let err = read(&dataset).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}
