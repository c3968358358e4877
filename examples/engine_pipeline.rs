//! A forebay pipeline built and run from Rust, without Python:
//! read Parquet → drop ids a checkpoint already holds → a Rust map on 2 workers →
//! write Parquet (atomic files), then stream the output back through `iter` in batches of
//! 10,000 rows, all under a 64 MiB memory cap.
//!
//! ```sh
//! cargo run --release --example engine_pipeline [DIR]
//! ```

use std::sync::Arc;

use arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use forebay::checkpoint::CheckpointIndex;
use forebay::engine::{IterOptions, MapStage, ParquetSink, Pipeline};
use forebay::reader::{DatasetSource, ParquetDataset};

const FILES: i64 = 4;
const ROWS_PER_FILE: i64 = 50_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = match std::env::args().nth(1) {
        Some(d) => std::path::PathBuf::from(d),
        None => std::env::temp_dir().join(format!("forebay-engine-example-{}", std::process::id())),
    };
    let input = dir.join("input");
    std::fs::create_dir_all(&input)?;
    for f in 0..FILES {
        write_input(&input.join(format!("part-{f}.parquet")), f * ROWS_PER_FILE)?;
    }

    // Ids 0..25,000 were finished by an earlier run.
    let mut done = CheckpointIndex::new(DataType::Int64, "id", 16)?;
    done.insert(&Int64Array::from_iter_values(0..25_000))?;
    let done = Arc::new(std::sync::RwLock::new(done));

    let dataset = ParquetDataset::builder(DatasetSource::uris([input.display().to_string()]))
        .with_columns(["id", "text"])
        .build()?;
    let text_length = MapStage::rust("text_length", |batch: RecordBatch| {
        let text = batch
            .column_by_name("text")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or("no text column")?;
        let lengths =
            Float64Array::from_iter_values(text.iter().map(|t| t.map_or(0, str::len) as f64));
        let mut fields = batch.schema().fields().to_vec();
        fields.push(Arc::new(Field::new("length", DataType::Float64, false)));
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(lengths));
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns,
        )?)
    })
    .with_concurrency(2)
    .with_batch_size(8192);

    let output = dir.join("output");
    let written = Pipeline::new(forebay::engine::Source::Parquet(dataset))
        .with_memory_limit(64 << 20)
        .map(MapStage::checkpoint_filter(done))
        .map(text_length)
        .write_parquet(ParquetSink::new(output.display().to_string()).with_rows_per_file(60_000))?;
    println!(
        "wrote {} rows in {} files ({} bytes) in {:.3} s",
        written.rows,
        written.files.len(),
        written.bytes,
        written.seconds
    );
    assert_eq!(written.rows as i64, FILES * ROWS_PER_FILE - 25_000);

    // Stream it back in batches of 10,000 rows.
    let back = ParquetDataset::open([output.display().to_string()])?;
    let mut rows = 0;
    let mut batches = 0;
    for batch in Pipeline::new(forebay::engine::Source::Parquet(back)).iter(IterOptions {
        batch_size: Some(10_000),
        ..Default::default()
    })? {
        rows += batch?.num_rows();
        batches += 1;
    }
    println!("read back {rows} rows in {batches} batches");
    assert_eq!(rows as u64, written.rows);
    if std::env::args().nth(1).is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(())
}

fn write_input(path: &std::path::Path, first: i64) -> Result<(), Box<dyn std::error::Error>> {
    let ids = Int64Array::from_iter_values(first..first + ROWS_PER_FILE);
    let text = StringArray::from_iter_values(
        (0..ROWS_PER_FILE).map(|i| format!("document {}", first + i)),
    );
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("text", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(text)])?;
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path)?, schema, None)?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(())
}
