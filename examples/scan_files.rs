//! Scan Parquet files with forebay-parquet from Rust, without Python in the loop: for
//! profiling the reader (`perf record -g target/release/examples/scan_files ...`) and for
//! comparing it with other engines on the same files.
//!
//! `cargo run --release --example scan_files -- [--columns a,b] [--rounds N] FILE_OR_DIR...`

use std::time::Instant;

use forebay::reader::{DatasetSource, ParquetDataset};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut columns: Option<Vec<String>> = None;
    let mut rounds = 3;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--columns" => {
                let list = args.next().ok_or("--columns needs a value")?;
                columns = Some(list.split(',').map(str::to_string).collect());
            }
            "--rounds" => rounds = args.next().ok_or("--rounds needs a value")?.parse()?,
            _ => paths.push(arg),
        }
    }
    if paths.is_empty() {
        return Err("usage: scan_files [--columns a,b] [--rounds N] FILE_OR_DIR...".into());
    }
    for round in 0..rounds {
        let mut builder = ParquetDataset::builder(DatasetSource::uris(paths.clone()));
        if let Some(columns) = &columns {
            builder = builder.with_columns(columns.clone());
        }
        let dataset = builder.build()?;
        let start = Instant::now();
        let mut rows = 0;
        for batch in dataset.scan().blocking_iter() {
            rows += batch?.batch.num_rows();
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "round {round}: {rows} rows in {secs:.3} s ({:.1} M rows/s), {:.1} MB of column chunks read",
            rows as f64 / secs / 1e6,
            dataset.metrics().io.data_bytes as f64 / 1e6
        );
    }
    Ok(())
}
