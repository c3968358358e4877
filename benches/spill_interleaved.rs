//! Spill throughput as ratios measured the DESIGN.md way: for each object size, the three
//! writers run interleaved, the order rotating every round (vectored, concat, raw; concat,
//! raw, vectored; raw, vectored, concat; ...), and the medians are compared, so drift of
//! this shared machine hits all three alike; "paired" is the median over rounds of raw time
//! / vectored time within the same round. Same bytes
//! (a 128 MiB round), same file system, one fdatasync per file each.
//!
//! `cargo bench --bench spill_interleaved [-- ROUNDS]` (default 15 rounds)

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use bytes::Bytes;
use forebay::spill::{SpillArea, SpillConfig, SpillObject, SyncPolicy};

const ROUND_BYTES: usize = 128 << 20;
const SIZES: [usize; 6] = [64 << 10, 1 << 20, 8 << 20, 32 << 20, 64 << 20, 128 << 20];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(15);
    let dir = std::env::var_os("FOREBAY_SPILL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("spill-interleaved");
    std::fs::create_dir_all(&dir).unwrap();
    let area =
        SpillArea::open(SpillConfig::new([dir.join("area")]).with_sync(SyncPolicy::PerFile))
            .unwrap();
    let raw_source = vec![7u8; ROUND_BYTES];
    println!("spill of a 128 MiB round, fdatasync per file, medians of {rounds} interleaved runs");
    println!(
        "{:>12} {:>11} {:>11} {:>11} {:>14} {:>14} {:>16}",
        "object size", "vectored ms", "concat ms", "raw ms", "vectored/raw", "paired", "concat/vectored"
    );
    for size in SIZES {
        let objects: Vec<SpillObject> = (0..ROUND_BYTES / size)
            .map(|i| SpillObject {
                id: i as u64,
                buffers: vec![Bytes::from(vec![(i % 251) as u8 + 1; size])],
            })
            .collect();
        let (mut vectored, mut concat, mut raw) = (Vec::new(), Vec::new(), Vec::new());
        let run_vectored = || {
            let t = Instant::now();
            drop(area.spill(objects.clone()).unwrap());
            t.elapsed().as_secs_f64() * 1e3
        };
        let run_concat = || {
            let t = Instant::now();
            let path = dir.join("concat.bin");
            let mut f = std::fs::File::create(&path).unwrap();
            for o in &objects {
                let mut joined = Vec::with_capacity(64 + size);
                joined.extend_from_slice(&[0u8; 64]);
                joined.extend_from_slice(&o.buffers[0]);
                f.write_all(&joined).unwrap();
            }
            f.sync_data().unwrap();
            drop(f);
            std::fs::remove_file(&path).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        };
        let run_raw = || {
            let t = Instant::now();
            let path = dir.join("raw.bin");
            let mut f = std::fs::File::create(&path).unwrap();
            f.write_all(&raw_source).unwrap();
            f.sync_data().unwrap();
            drop(f);
            std::fs::remove_file(&path).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        };
        for round in 0..rounds {
            // Rotate who goes first: the writer after a delete can pay for the file
            // system's background work on the freed blocks, so no writer may always follow
            // the same one.
            for k in 0..3 {
                match (round + k) % 3 {
                    0 => vectored.push(run_vectored()),
                    1 => concat.push(run_concat()),
                    _ => raw.push(run_raw()),
                }
            }
        }
        // Paired ratio: raw time / vectored time of the same round, median over rounds.
        let paired = median(raw.iter().zip(&vectored).map(|(r, v)| r / v).collect());
        let (v, c, r) = (median(vectored), median(concat), median(raw));
        // Throughput ratio vectored/raw = raw time / vectored time.
        println!(
            "{:>12} {:>11.1} {:>11.1} {:>11.1} {:>13.1}% {:>13.1}% {:>15.2}x",
            size,
            v,
            c,
            r,
            100.0 * r / v,
            100.0 * paired,
            c / v
        );
    }
}
