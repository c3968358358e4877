//! A full disk, simulated with a size-limited file (RLIMIT_FSIZE): the spill fails with a
//! clean error naming the file, leaves no partial file and no location, and the area keeps
//! working for rounds that fit. Its own test binary: the limit applies to the whole process.

use bytes::Bytes;
use forebay_spill::{SpillArea, SpillConfig, SpillError, SpillObject};

#[test]
fn spill_beyond_the_file_size_limit_is_a_clean_error() {
    let dir = tempfile::tempdir().unwrap();
    let area = SpillArea::open(SpillConfig::new([dir.path()])).unwrap();
    // SAFETY (test only): ignore SIGXFSZ so an oversized write fails with EFBIG instead of
    // killing the process, then cap file sizes at 1 MiB.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let limit = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: libc::RLIM_INFINITY,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
    let big = SpillObject {
        id: 1,
        buffers: vec![
            Bytes::from(vec![7u8; 600 << 10]),
            Bytes::from(vec![8u8; 600 << 10]),
        ],
    };
    let err = area.spill(vec![big]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SpillError::Io { .. }), "{msg}");
    assert!(
        msg.contains(&dir.path().display().to_string()) && msg.contains("write"),
        "{msg}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "partial spill file removed: {left:?}");
    let stats = area.stats();
    assert_eq!((stats.failed_rounds, stats.objects_spilled), (1, 0));

    let small = SpillObject {
        id: 2,
        buffers: vec![Bytes::from(vec![9u8; 1000])],
    };
    let loc = area.spill(vec![small]).unwrap();
    assert_eq!(area.restore(&loc[0]).unwrap()[0], vec![9u8; 1000]);
}
