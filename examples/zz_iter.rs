use forebay::parquet::{DatasetSource, ParquetDataset};
fn main() {
    let files: Vec<String> = std::fs::read_dir("bench-data/sf5/lineitem")
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    let bs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(65536);
    for _ in 0..2 {
        let ds = ParquetDataset::builder(DatasetSource::uris(files.clone()))
            .with_batch_size(bs)
            .build()
            .unwrap();
        let t = std::time::Instant::now();
        let mut n = 0;
        for b in ds.scan() {
            n += b.unwrap().batch.num_rows();
        }
        println!("{n} {:.3}", t.elapsed().as_secs_f64());
    }
}
