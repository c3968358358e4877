use forebay_engine::training::DatasetLayout;
use forebay_parquet::{DatasetSource, ParquetDataset};
use std::time::Instant;

#[test]
#[ignore]
fn scratch() {
    let files: Vec<String> = (1..=8)
        .map(|i| format!("/work/main/bench-data/sf1/lineitem/lineitem.{i}.parquet"))
        .collect();
    let ds = ParquetDataset::builder(DatasetSource::uris(files.clone()))
        .with_batch_size(65536)
        .build()
        .unwrap();
    for _ in 0..2 {
        let t = Instant::now();
        let n: usize = ds.scan().map(|b| b.unwrap().batch.num_rows()).sum();
        println!("scan {n} {:?}", t.elapsed());
        let rr = ds.for_row_ranges();
        let layout = rr.row_group_layout().unwrap();
        for br in [8192u64, 32768, 131072] {
            let l = DatasetLayout::new(&layout, br);
            let blocks: Vec<_> = (0..l.blocks()).map(|i| l.block(i)).collect();
            let t = Instant::now();
            let n: usize = rr
                .scan_row_ranges(blocks.clone())
                .map(|b| b.unwrap().batch.num_rows())
                .sum();
            println!("ranges block {br} file order {n} {:?}", t.elapsed());
            let mut shuffled = blocks.clone();
            let mut x = 7u64;
            for i in (1..shuffled.len()).rev() {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                shuffled.swap(i, (x >> 33) as usize % (i + 1));
            }
            let t = Instant::now();
            let n: usize = rr
                .scan_row_ranges(shuffled)
                .map(|b| b.unwrap().batch.num_rows())
                .sum();
            println!("ranges block {br} shuffled {n} {:?}", t.elapsed());
        }
    }
}
