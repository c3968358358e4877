//! Spill throughput as ratios measured the DESIGN.md way: for each object size, the four
//! writers run interleaved, the order rotating every round (vectored, concat, raw,
//! raw_hinted; concat, raw, raw_hinted, vectored; ...), and the medians are compared, so
//! drift of this shared machine hits all of them alike; "paired" is the median over rounds
//! of raw time / vectored time within the same round. Same bytes (a 128 MiB round), same
//! file system, one fdatasync per file each.
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
    let area = SpillArea::open(SpillConfig::new([dir.join("area")]).with_sync(SyncPolicy::PerFile))
        .unwrap();
    let raw_source = vec![7u8; ROUND_BYTES];
    println!("spill of a 128 MiB round, fdatasync per file, medians of {rounds} interleaved runs");
    println!(
        "{:>12} {:>11} {:>11} {:>11} {:>14} {:>14} {:>16} {:>14} {:>16}",
        "object size",
        "vectored ms",
        "concat ms",
        "raw ms",
        "vectored/raw",
        "paired",
        "concat/vectored",
        "raw_hinted ms",
        "vectored/hinted"
    );
    for size in SIZES {
        let objects: Vec<SpillObject> = (0..ROUND_BYTES / size)
            .map(|i| SpillObject {
                id: i as u64,
                buffers: vec![Bytes::from(vec![(i % 251) as u8 + 1; size])],
            })
            .collect();
        let (mut vectored, mut concat, mut raw, mut raw_hinted) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
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
        // The raw write again, in 4 MiB writes each followed by the writeback hint the spill
        // writer gives (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): how much of the spill's
        // margin over `raw` is the hint, and what the spill costs against the same trick.
        let run_raw_hinted = || {
            use std::os::fd::AsRawFd;
            let t = Instant::now();
            let path = dir.join("raw_hinted.bin");
            let mut f = std::fs::File::create(&path).unwrap();
            for (k, piece) in raw_source.chunks(4 << 20).enumerate() {
                f.write_all(piece).unwrap();
                // SAFETY: a plain syscall on our own file descriptor.
                unsafe {
                    libc::sync_file_range(
                        f.as_raw_fd(),
                        (k * (4 << 20)) as _,
                        piece.len() as _,
                        libc::SYNC_FILE_RANGE_WRITE,
                    )
                };
            }
            f.sync_data().unwrap();
            drop(f);
            std::fs::remove_file(&path).unwrap();
            t.elapsed().as_secs_f64() * 1e3
        };
        for round in 0..rounds {
            // Rotate who goes first: the writer after a delete can pay for the file
            // system's background work on the freed blocks, so no writer may always follow
            // the same one.
            for k in 0..4 {
                match (round + k) % 4 {
                    0 => vectored.push(run_vectored()),
                    1 => concat.push(run_concat()),
                    2 => raw.push(run_raw()),
                    _ => raw_hinted.push(run_raw_hinted()),
                }
            }
        }
        // Paired ratio: raw time / vectored time of the same round, median over rounds.
        let paired = median(raw.iter().zip(&vectored).map(|(r, v)| r / v).collect());
        let (v, c, r, h) = (
            median(vectored),
            median(concat),
            median(raw),
            median(raw_hinted),
        );
        // Throughput ratio vectored/raw = raw time / vectored time.
        println!(
            "{:>12} {:>11.1} {:>11.1} {:>11.1} {:>13.1}% {:>13.1}% {:>15.2}x {:>14.1} {:>15.1}%",
            size,
            v,
            c,
            r,
            100.0 * r / v,
            100.0 * paired,
            c / v,
            h,
            100.0 * h / v
        );
    }
}
