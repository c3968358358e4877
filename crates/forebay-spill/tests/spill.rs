//! forebay-spill: byte-exact round trips (preadv and mmap), every flipped byte and every
//! truncation detected, file lifetime, crash leftovers, many rounds through the bounded queue.

use std::collections::HashSet;

use forebay_spill::{
    DirectoryChoice, SpillArea, SpillConfig, SpillError, SpillLocation, SpillObject, SyncPolicy,
};

mod common;
use common::pattern;

fn object(id: u64, sizes: &[usize]) -> SpillObject {
    SpillObject {
        id,
        buffers: sizes
            .iter()
            .enumerate()
            .map(|(i, s)| pattern(id * 1000 + i as u64, *s))
            .collect(),
    }
}

fn assert_restores(area: &SpillArea, loc: &SpillLocation, want: &SpillObject) {
    let back = area.restore(loc).unwrap();
    assert_eq!(back.len(), want.buffers.len());
    for (b, w) in back.iter().zip(&want.buffers) {
        assert_eq!(&b[..], &w[..]);
    }
    let mapped = area.map(loc).unwrap();
    for (i, w) in want.buffers.iter().enumerate() {
        let b = mapped.buffer(i);
        assert_eq!(&b[..], &w[..]);
        if !b.is_empty() {
            assert_eq!(
                b.as_ptr() as usize % 64,
                0,
                "mapped buffers are 64-byte aligned"
            );
        }
    }
    assert_eq!(loc.object_id(), want.id);
}

#[test]
fn round_trips_of_many_sizes_and_buffer_counts() {
    let dir = tempfile::tempdir().unwrap();
    for sync in [SyncPolicy::None, SyncPolicy::PerFile, SyncPolicy::PerObject] {
        let area = SpillArea::open(SpillConfig::new([dir.path()]).with_sync(sync)).unwrap();
        let objects = vec![
            object(1, &[]),
            object(2, &[0]),
            object(3, &[1, 63, 64, 65]),
            object(4, &[4095, 0, 4097]),
            object(5, &[(1 << 20) + 3]),
            object(6, &vec![3; 1500]), // more buffers than IOV_MAX in one object
        ];
        let locations = area.spill(objects.clone()).unwrap();
        assert_eq!(locations.len(), objects.len());
        let files: HashSet<_> = locations.iter().map(|l| l.path().to_path_buf()).collect();
        assert_eq!(files.len(), 1, "one file per spill round");
        for (loc, obj) in locations.iter().zip(&objects) {
            assert_eq!(loc.offset() % 64, 0);
            assert_restores(&area, loc, obj);
        }
        // Caller-provided destinations.
        let mut a = vec![0u8; 4095];
        let mut b = vec![];
        let mut c = vec![0u8; 4097];
        area.restore_into(&locations[3], &mut [&mut a, &mut b, &mut c])
            .unwrap();
        assert_eq!(
            (&a[..], &c[..]),
            (&objects[3].buffers[0][..], &objects[3].buffers[2][..])
        );
        let err = area.restore_into(&locations[3], &mut [&mut a]).unwrap_err();
        assert!(
            matches!(err, SpillError::DestinationMismatch { .. }),
            "{err}"
        );
    }
}

/// The writer batches objects up to 512 KiB whole and streams larger ones in hashed steps
/// with their head written last, with writeback hints every 4 MiB under a sync policy: mix
/// both kinds, runs of empty objects, and sizes on either side of the step.
#[test]
fn large_and_small_objects_interleave_across_write_steps() {
    let dir = tempfile::tempdir().unwrap();
    const STEP: usize = 512 << 10;
    for sync in [SyncPolicy::None, SyncPolicy::PerFile, SyncPolicy::PerObject] {
        let area = SpillArea::open(SpillConfig::new([dir.path()]).with_sync(sync)).unwrap();
        let objects = vec![
            object(1, &[]),
            object(2, &[0]),
            object(3, &[STEP]),
            object(4, &[STEP + 1]),
            object(5, &[]),
            object(6, &[100, 200]),
            object(7, &[STEP - 300, 300]),
            object(8, &[(5 << 20) + 17, 0, 3, STEP * 2 - 1]),
            object(9, &[]),
            object(10, &[]),
            object(11, &[STEP / 3; 4]),
            object(12, &[(9 << 20) + 5]),
            object(13, &[1]),
        ];
        let locations = area.spill(objects.clone()).unwrap();
        for (loc, obj) in locations.iter().zip(&objects) {
            assert_restores(&area, loc, obj);
        }
    }
}

#[test]
fn every_flipped_byte_and_every_truncation_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let area = SpillArea::open(SpillConfig::new([dir.path()])).unwrap();
    let objects = vec![object(10, &[100, 0, 300]), object(11, &[7])];
    let locations = area.spill(objects).unwrap();
    let path = locations[0].path().to_path_buf();
    let pristine = std::fs::read(&path).unwrap();
    assert_eq!(
        pristine.len() as u64,
        locations.iter().map(|l| l.len()).sum::<u64>()
    );
    // Flip each byte of the file in turn: the object containing it must fail both ways.
    for i in 0..pristine.len() {
        let mut bad = pristine.clone();
        bad[i] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        let hit = locations
            .iter()
            .find(|l| (l.offset()..l.offset() + l.len()).contains(&(i as u64)))
            .unwrap();
        let e1 = area.restore(hit).unwrap_err();
        let e2 = area.map(hit).unwrap_err();
        for e in [&e1, &e2] {
            assert!(matches!(e, SpillError::Corrupt { .. }), "byte {i}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("offset {}", hit.offset())), "{msg}");
        }
        for other in locations.iter().filter(|l| l.offset() != hit.offset()) {
            area.restore(other).unwrap();
        }
    }
    // Truncate at every length: objects that no longer fit are reported, others still read.
    for cut in 0..pristine.len() {
        std::fs::write(&path, &pristine[..cut]).unwrap();
        for loc in &locations {
            let end = loc.offset() + loc.len();
            let r = area.restore(loc);
            let m = area.map(loc);
            if (cut as u64) < end {
                for e in [r.unwrap_err(), m.unwrap_err()] {
                    assert!(matches!(e, SpillError::Truncated { .. }), "cut {cut}: {e}");
                    assert!(e.to_string().contains(&format!("offset {}", loc.offset())));
                }
            } else {
                r.unwrap();
                m.unwrap();
            }
        }
    }
}

/// A streamed object (larger than a write step, head written after its payload) is as
/// well protected: flips in its head, at and around step boundaries, in padding and at its
/// last byte are all caught, and its neighbours (batched whole) still restore.
#[test]
fn flipped_bytes_in_a_streamed_object_are_detected() {
    const STEP: u64 = 512 << 10;
    let dir = tempfile::tempdir().unwrap();
    let area =
        SpillArea::open(SpillConfig::new([dir.path()]).with_sync(SyncPolicy::PerFile)).unwrap();
    let objects = vec![
        object(20, &[100]),
        object(21, &[STEP as usize + 1000, 700_001]),
        object(22, &[5]),
    ];
    let locations = area.spill(objects).unwrap();
    let path = locations[0].path().to_path_buf();
    let pristine = std::fs::read(&path).unwrap();
    let big = &locations[1];
    let first = big.offset() + 128; // header (64) + 2-entry table (16), padded to 128
    let second = first + (STEP + 1000).div_ceil(64) * 64;
    let mut positions: Vec<u64> = (big.offset()..first).collect(); // the whole head
    for p in [0, 1, STEP - 1, STEP, STEP + 1, STEP + 999] {
        positions.push(first + p);
    }
    positions.extend([first + STEP + 1000, second - 1]); // padding after buffer 0
    positions.extend([
        second,
        second + 350_000,
        second + 700_000,
        big.offset() + big.len() - 1,
    ]);
    for i in positions {
        let mut bad = pristine.clone();
        bad[i as usize] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        for e in [area.restore(big).unwrap_err(), area.map(big).unwrap_err()] {
            assert!(matches!(e, SpillError::Corrupt { .. }), "byte {i}: {e}");
            assert!(
                e.to_string().contains(&format!("offset {}", big.offset())),
                "{e}"
            );
        }
        area.restore(&locations[0]).unwrap();
        area.restore(&locations[2]).unwrap();
    }
}

#[test]
fn files_are_deleted_when_all_their_objects_are_freed() {
    let dir = tempfile::tempdir().unwrap();
    let area = SpillArea::open(SpillConfig::new([dir.path()])).unwrap();
    let mut locations = area
        .spill(vec![object(1, &[10]), object(2, &[20])])
        .unwrap();
    let path = locations[0].path().to_path_buf();
    let mapped = area.map(&locations[1]).unwrap();
    locations.remove(0);
    assert!(path.exists(), "one object still lives in the file");
    drop(locations);
    assert!(!path.exists(), "last object freed: file deleted");
    assert_eq!(
        &mapped.buffer(0)[..],
        &pattern(2000, 20)[..],
        "a mapping outlives the file name"
    );
    let s = area.stats();
    assert_eq!(
        (s.files_created, s.files_deleted, s.objects_spilled),
        (1, 1, 2)
    );
    assert_eq!(s.bytes_spilled, 30);
}

#[test]
fn leftovers_of_dead_processes_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = dir.path().join(format!("forebay-{dead}-0.spill"));
    std::fs::write(&stale, b"half a spill").unwrap();
    let live = dir.path().join(format!(
        "forebay-{}-0.spill",
        std::os::unix::process::parent_id()
    ));
    std::fs::write(&live, b"someone else's").unwrap();
    let unrelated = dir.path().join("notes.txt");
    std::fs::write(&unrelated, b"keep").unwrap();
    let area = SpillArea::open(SpillConfig::new([dir.path()])).unwrap();
    assert!(!stale.exists() && live.exists() && unrelated.exists());
    assert_eq!(area.stats().stale_files_removed, 1);
}

#[test]
fn many_rounds_through_a_small_queue_and_several_directories() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for choice in [DirectoryChoice::RoundRobin, DirectoryChoice::MostFreeSpace] {
        let area = SpillArea::open(
            SpillConfig::new(dirs.iter().map(|d| d.path()))
                .with_io_threads(2)
                .with_queue_depth(1)
                .with_directory_choice(choice),
        )
        .unwrap();
        let rounds: Vec<Vec<SpillObject>> = (0..40u64)
            .map(|r| {
                (0..3)
                    .map(|k| object(r * 10 + k, &[1000 + k as usize * 7, 5]))
                    .collect()
            })
            .collect();
        let pending: Vec<_> = rounds
            .iter()
            .map(|r| area.submit(r.clone()).unwrap())
            .collect();
        let mut used = HashSet::new();
        for (p, round) in pending.into_iter().zip(&rounds) {
            let locations = p.wait().unwrap();
            for (loc, obj) in locations.iter().zip(round) {
                used.insert(loc.path().parent().unwrap().to_path_buf());
                assert_restores(&area, loc, obj);
            }
        }
        if choice == DirectoryChoice::RoundRobin {
            assert_eq!(used.len(), 2, "round robin uses both directories");
        }
    }
    let err = SpillArea::open(SpillConfig::new(Vec::<std::path::PathBuf>::new()))
        .err()
        .unwrap();
    assert!(matches!(err, SpillError::InvalidArgument(_)));
}
