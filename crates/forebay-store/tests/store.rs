//! forebay-store: round trips (bytes and Arrow, byte for byte), zero copy, eviction and
//! restore under a cap much smaller than the data, pins, deletes, attach over the socket,
//! and a client that disappears mid-write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::types::*;
use arrow_array::RecordBatch;
use arrow_array::*;
use arrow_buffer::OffsetBuffer;
use arrow_schema::*;
use forebay_store::{ErrorKind, Format, ObjectStore, StoreConfig};

fn config(capacity: usize, spill: &tempfile::TempDir) -> StoreConfig {
    StoreConfig::new(capacity).with_spill_dirs([spill.path()])
}

/// Deterministic pseudo-random bytes.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn bytes_round_trip_and_in_place_writes() {
    let spill = tempfile::tempdir().unwrap();
    let store = ObjectStore::new(config(8 << 20, &spill)).unwrap();
    for (i, len) in [0usize, 1, 63, 64, 65, 1000, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(i as u64, len);
        let id = store
            .put_bytes(b"meta!", &[&data[..len / 2], &data[len / 2..]])
            .unwrap();
        let obj = store.get(id).unwrap();
        assert_eq!(obj.data(), &data[..]);
        assert_eq!(obj.meta(), b"meta!");
        assert_eq!(obj.format(), Format::Bytes);
        assert_eq!(
            obj.data().as_ptr() as usize % 64,
            0,
            "data is 64-byte aligned"
        );
        assert_eq!(&obj.data_bytes()[..], &data[..]);
        assert_eq!(obj.data_buffer().as_slice(), &data[..]);
    }
    let mut w = store.create(4096).unwrap();
    let id = w.id();
    assert!(
        !store.contains(id).unwrap(),
        "unsealed objects are invisible"
    );
    assert_eq!(store.get(id).unwrap_err().kind(), ErrorKind::NotSealed);
    w.data_mut().copy_from_slice(&pattern(99, 4096));
    assert_eq!(w.seal().unwrap(), id);
    assert_eq!(store.get(id).unwrap().data(), &pattern(99, 4096)[..]);

    // An abandoned writer frees its memory.
    let before = store.stats().unwrap().bytes_used;
    let w = store.create(1 << 20).unwrap();
    assert!(store.stats().unwrap().bytes_used >= before + (1 << 20));
    drop(w);
    assert_eq!(store.stats().unwrap().bytes_used, before);
}

fn sample_batch(n: usize, seed: u64) -> RecordBatch {
    let ints = Int64Array::from_iter((0..n as i64).map(|i| {
        if i % 7 == 3 {
            None
        } else {
            Some(i * seed as i64)
        }
    }));
    let floats = Float64Array::from_iter_values((0..n).map(|i| i as f64 / 3.0));
    let strings = StringArray::from_iter((0..n).map(|i| {
        if i % 5 == 0 {
            None
        } else {
            Some(format!("id-{i}-{seed}-é"))
        }
    }));
    let large = LargeBinaryArray::from_iter_values((0..n).map(|i| vec![i as u8; i % 9]));
    let bools = BooleanArray::from_iter((0..n + 3).map(|i| Some(i % 3 == 0))).slice(3, n);
    let view = StringViewArray::from_iter_values((0..n).map(|i| "x".repeat(i % 20)));
    let fixed = FixedSizeBinaryArray::new(
        4,
        arrow_buffer::Buffer::from_vec(
            (0..n as u32)
                .flat_map(|i| i.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        None,
    );
    let list = ListArray::new(
        Arc::new(Field::new_list_field(DataType::Int32, false)),
        OffsetBuffer::from_lengths((0..n).map(|i| i % 4)),
        Arc::new(Int32Array::from_iter_values(
            0..(0..n).map(|i| i % 4).sum::<usize>() as i32,
        )),
        None,
    );
    let dict: DictionaryArray<Int32Type> = (0..n).map(|i| ["a", "bb", "ccc"][i % 3]).collect();
    let ts = TimestampMicrosecondArray::from_iter_values((0..n as i64).map(|i| i * 1_000_000))
        .with_timezone("UTC");
    let dec = Decimal128Array::from_iter_values((0..n as i128).map(|i| i * 101))
        .with_precision_and_scale(20, 2)
        .unwrap();
    let strukt = StructArray::from(vec![
        (
            Arc::new(Field::new("a", DataType::Int32, false)),
            Arc::new(Int32Array::from_iter_values(0..n as i32)) as ArrayRef,
        ),
        (
            Arc::new(Field::new("b", DataType::Utf8, true)),
            Arc::new(StringArray::from_iter_values((0..n).map(|i| i.to_string()))) as ArrayRef,
        ),
    ]);
    RecordBatch::try_from_iter_with_nullable(vec![
        ("ints", Arc::new(ints) as ArrayRef, true),
        ("floats", Arc::new(floats), true),
        ("strings", Arc::new(strings), true),
        ("large", Arc::new(large), true),
        ("bools", Arc::new(bools), true),
        ("view", Arc::new(view), true),
        ("fixed", Arc::new(fixed), true),
        ("list", Arc::new(list), true),
        ("dict", Arc::new(dict), true),
        ("ts", Arc::new(ts), true),
        ("dec", Arc::new(dec), true),
        ("struct", Arc::new(strukt), true),
    ])
    .unwrap()
}

#[test]
fn arrow_round_trip_is_exact_and_zero_copy() {
    let spill = tempfile::tempdir().unwrap();
    let store = ObjectStore::new(config(64 << 20, &spill)).unwrap();
    let batches = vec![
        sample_batch(1000, 1),
        sample_batch(10, 2),
        sample_batch(0, 3),
        sample_batch(4097, 4).slice(5, 3000),
    ];
    let schema = batches[0].schema();
    let id = store.put_arrow(&schema, &batches, b"table").unwrap();
    let obj = store.get(id).unwrap();
    assert_eq!(obj.format(), Format::ArrowIpc);
    assert_eq!(obj.meta(), b"table");
    let (got_schema, got) = obj.record_batches().unwrap();
    assert_eq!(got_schema.as_ref(), schema.as_ref());
    assert_eq!(got, batches);

    // Every buffer of every column points into the object's data region.
    let region = obj.data().as_ptr_range();
    let region = region.start as usize..region.end as usize;
    fn check(data: &arrow_data::ArrayData, region: &std::ops::Range<usize>) {
        for b in data.buffers() {
            let p = b.as_ptr() as usize;
            assert!(
                b.is_empty() || region.contains(&p),
                "buffer at {p:#x} outside the mapping"
            );
        }
        for c in data.child_data() {
            check(c, region);
        }
    }
    for b in &got {
        for c in b.columns() {
            check(&c.to_data(), &region);
        }
    }
    drop(obj);
    // The arrays keep the object pinned on their own.
    assert_eq!(store.stats().unwrap().pinned_objects, 1);
    drop(got);
    assert_eq!(store.stats().unwrap().pinned_objects, 0);

    // A stored Arrow object is a plain IPC stream: arrow's own reader reads it.
    let obj = store.get(id).unwrap();
    let reader =
        arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(obj.data().to_vec()), None)
            .unwrap();
    let read: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    assert_eq!(read, batches);

    // A bytes object is not an Arrow value.
    let b = store.put_bytes(&[], &[b"x"]).unwrap();
    assert!(store.get_arrow(b).is_err());
}

#[test]
fn eviction_and_restore_under_a_cap_ten_times_smaller() {
    let spill = tempfile::tempdir().unwrap();
    let cap = 4 << 20;
    let store = ObjectStore::new(config(cap, &spill)).unwrap();
    let sizes: Vec<usize> = (0..140).map(|i| 100_000 + (i * 7919) % 500_000).collect();
    let total: usize = sizes.iter().sum();
    assert!(total >= 10 * cap, "the test puts {total} bytes");
    let mut ids = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        ids.push(
            store
                .put_bytes(&(i as u32).to_le_bytes(), &[&pattern(i as u64, len)])
                .unwrap(),
        );
    }
    let s = store.stats().unwrap();
    assert!(s.spilled_objects > 0 && s.objects_on_disk > 0, "{s:?}");
    assert_eq!(s.objects, 140);
    assert!(s.bytes_used <= cap as u64);
    // Read everything back (in a different order), byte for byte.
    for i in (0..140).rev().chain(0..140) {
        let obj = store.get(ids[i]).unwrap();
        assert_eq!(obj.meta(), &(i as u32).to_le_bytes());
        assert!(
            obj.data() == &pattern(i as u64, sizes[i])[..],
            "object {i} differs"
        );
    }
    let s = store.stats().unwrap();
    assert!(s.restored_objects > 0, "{s:?}");

    // Eviction writes many objects per spill round (one file), not a file per object.
    let small_spill = tempfile::tempdir().unwrap();
    let small = ObjectStore::new(config(1 << 20, &small_spill)).unwrap();
    for i in 0..200u64 {
        small.put_bytes(&[], &[&pattern(i, 20_000)]).unwrap();
    }
    let on_disk = small.stats().unwrap().objects_on_disk;
    let files = std::fs::read_dir(small_spill.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".spill")
        })
        .count();
    assert!(on_disk >= 100 && files > 0, "{on_disk} objects on disk");
    assert!(
        (files as u64) < on_disk / 4,
        "{files} spill files for {on_disk} evicted objects"
    );
    drop(small);

    // Arrow values are evicted and restored too.
    let batch = sample_batch(20_000, 7);
    let id = store
        .put_arrow(&batch.schema(), std::slice::from_ref(&batch), &[])
        .unwrap();
    for (i, &len) in sizes.iter().enumerate().take(40) {
        store
            .put_bytes(&[], &[&pattern(1000 + i as u64, len)])
            .unwrap();
    }
    let (_, got) = store.get_arrow(id).unwrap();
    assert_eq!(got, vec![batch]);
}

#[test]
fn a_slice_of_a_view_array_stores_only_the_strings_it_references() {
    let spill = tempfile::tempdir().unwrap();
    let store = ObjectStore::new(config(64 << 20, &spill)).unwrap();
    // 100,000 strings of 42 bytes in the data buffers (4.2 MB); the slice uses 1,000 of them.
    let long: StringViewArray = (0..100_000)
        .map(|i| Some(format!("a string that is longer than twelve {i:06}")))
        .collect();
    let short: StringViewArray = (0..100_000).map(|i| Some(format!("s{}", i % 7))).collect();
    let batch = RecordBatch::try_from_iter([
        ("long", Arc::new(long) as ArrayRef),
        ("short", Arc::new(short) as ArrayRef),
    ])
    .unwrap();
    let slice = batch.slice(50_000, 1_000);
    let id = store
        .put_arrow(&slice.schema(), std::slice::from_ref(&slice), &[])
        .unwrap();
    let obj = store.get(id).unwrap();
    assert!(
        obj.data().len() < 200_000,
        "the object holds {} bytes for 1,000 strings of 42 bytes",
        obj.data().len()
    );
    let (_, got) = obj.record_batches().unwrap();
    assert_eq!(got, vec![slice]);

    // Views that share their bytes (as a dictionary decode makes them) are left as they are.
    let dictionary: StringViewArray = (0..2_000)
        .map(|i| Some(format!("a dictionary value longer than twelve {i:06}")))
        .collect();
    let indices = UInt32Array::from_iter_values((0..20_000).map(|i| i % 2_000));
    let shared = arrow_select::take::take(&dictionary, &indices, None).unwrap();
    let batch = RecordBatch::try_from_iter([("shared", shared)]).unwrap();
    let compacted = forebay_store::ipc::compact_views(&batch).unwrap();
    assert!(Arc::ptr_eq(batch.column(0), compacted.column(0)));
}

#[test]
fn pinned_objects_stay_and_a_full_store_fails_after_the_timeout() {
    let spill = tempfile::tempdir().unwrap();
    let cap = 1 << 20;
    let store =
        ObjectStore::new(config(cap, &spill).with_put_timeout(Duration::from_millis(300))).unwrap();
    let data = pattern(1, 300_000);
    let a = store.put_bytes(&[], &[&data]).unwrap();
    let pinned = store.get(a).unwrap();
    let addr = pinned.data().as_ptr();
    // Churn far more than the capacity through the store.
    for i in 0..40 {
        store.put_bytes(&[], &[&pattern(i + 10, 200_000)]).unwrap();
    }
    assert_eq!(pinned.data().as_ptr(), addr, "a pinned object never moves");
    assert!(pinned.data() == &data[..]);

    // Pin everything resident, then ask for more room than is free: wait, then fail.
    let b = store.put_bytes(&[], &[&pattern(2, 600_000)]).unwrap();
    let pinned_b = store.get(b).unwrap();
    let t = Instant::now();
    let err = store.put_bytes(&[], &[&pattern(3, 300_000)]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Full, "{err}");
    assert!(t.elapsed() >= Duration::from_millis(250));
    assert!(err.to_string().contains("pinned"), "{err}");

    // Releasing a pin from another thread lets a waiting put through.
    let waiter = {
        let store_path = store.path().to_path_buf();
        std::thread::spawn(move || {
            let client = ObjectStore::attach(&store_path).unwrap();
            client.put_bytes(&[], &[&pattern(4, 300_000)]).map(|_| ())
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    drop(pinned_b);
    waiter.join().unwrap().unwrap();

    // Larger than the store: a clear error at once.
    let err = store.create(2 << 20).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::TooLarge);
    drop(pinned);
}

#[test]
fn delete_of_a_pinned_object_frees_at_the_last_unpin() {
    let spill = tempfile::tempdir().unwrap();
    let store = ObjectStore::new(config(1 << 20, &spill)).unwrap();
    let id = store.put_bytes(&[], &[&pattern(5, 100_000)]).unwrap();
    let used = store.stats().unwrap().bytes_used;
    let view = store.get(id).unwrap().data_bytes();
    assert!(store.delete(id).unwrap());
    assert!(!store.delete(id).unwrap());
    assert!(!store.contains(id).unwrap());
    assert_eq!(store.get(id).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(store.stats().unwrap().bytes_used, used, "still pinned");
    assert!(view == pattern(5, 100_000));
    drop(view);
    assert_eq!(store.stats().unwrap().bytes_used, 0);
}

#[test]
fn attached_handles_share_objects_and_a_vanished_client_releases_everything() {
    let spill = tempfile::tempdir().unwrap();
    let store = ObjectStore::new(config(8 << 20, &spill)).unwrap();
    let client = ObjectStore::attach(store.path()).unwrap();
    assert!(!client.is_owner());
    assert_eq!(client.nonce(), store.nonce());

    let id = store.put_bytes(b"m", &[b"from the owner"]).unwrap();
    assert_eq!(client.get(id).unwrap().data(), b"from the owner");
    let batch = sample_batch(500, 9);
    let cid = client
        .put_arrow(&batch.schema(), std::slice::from_ref(&batch), &[])
        .unwrap();
    assert_eq!(store.get_arrow(cid).unwrap().1, vec![batch.clone()]);
    assert_eq!(client.get_arrow(cid).unwrap().1, vec![batch]);
    assert!(store.contains(cid).unwrap() && client.contains(id).unwrap());
    assert_eq!(client.stats().unwrap(), store.stats().unwrap());

    // A client process SIGKILLed while holding a pin and while writing an object.
    let used_before = store.stats().unwrap().bytes_used;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_that_pins_and_writes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "FOREBAY_STORE_CHILD",
            format!("{}|{id}", store.path().display()),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while !line.contains("CHILD READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited early");
    }
    let s = store.stats().unwrap();
    assert_eq!(s.pinned_objects, 1, "{s:?}");
    assert!(s.bytes_used >= used_before + (1 << 20), "{s:?}");
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGKILL) }, 0);
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = store.stats().unwrap();
        if s.pinned_objects == 0 && s.bytes_used == used_before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "owner did not release a dead client's state: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The store still works for the others.
    assert_eq!(client.get(id).unwrap().data(), b"from the owner");
    assert!(store.delete(id).unwrap());

    // The owner closing the store: attached handles get a clear error, never a hang.
    let dir = store.path().to_path_buf();
    drop(store);
    assert!(!dir.exists(), "the owner removes its files");
    let err = client.get(cid).unwrap_err();
    assert!(err.to_string().contains("owner"), "{err}");
    assert!(ObjectStore::attach(&dir).is_err());
}

#[test]
fn store_files_are_private_and_foreign_stores_are_refused() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let spill = tempfile::tempdir().unwrap();
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("store");
    let store = ObjectStore::new(config(1 << 20, &spill).with_dir(&dir)).unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    assert_eq!(
        std::fs::metadata(dir.join("arena")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(dir.join("store.sock")).unwrap().mode() & 0o777,
        0o600
    );
    // A second owner on the same directory is refused while the first lives.
    assert!(ObjectStore::new(config(1 << 20, &spill).with_dir(&dir)).is_err());

    // A directory open to others is refused.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = ObjectStore::attach(&dir).err().unwrap();
    assert!(err.to_string().contains("refusing to attach"), "{err}");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();

    // Owned by another user: refused (needs root to arrange).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        let err = ObjectStore::attach(&dir).err().unwrap();
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 0, 0) }, 0);
    }
    ObjectStore::attach(&dir).unwrap();
    drop(store);
    // A dead store's directory can be reused.
    let again = ObjectStore::new(config(1 << 20, &spill).with_dir(&dir)).unwrap();
    assert_eq!(again.stats().unwrap().objects, 0);
}

#[test]
fn concurrent_puts_and_gets_under_pressure() {
    let spill = tempfile::tempdir().unwrap();
    let store = Arc::new(ObjectStore::new(config(2 << 20, &spill)).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..60u64 {
                    let seed = t * 1000 + i;
                    let len = 20_000 + (seed as usize * 131) % 120_000;
                    mine.push((
                        store.put_bytes(&[], &[&pattern(seed, len)]).unwrap(),
                        seed,
                        len,
                    ));
                    let (id, s, l) = mine[(i as usize * 7) % mine.len()];
                    assert!(store.get(id).unwrap().data() == &pattern(s, l)[..]);
                }
                for (id, s, l) in mine {
                    assert!(store.get(id).unwrap().data() == &pattern(s, l)[..]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = store.stats().unwrap();
    assert_eq!(s.objects, 240);
    assert_eq!(s.pinned_objects, 0);
}

/// Runs only as the child of the test above: attach, pin, start writing, then wait to be
/// killed.
#[test]
fn child_that_pins_and_writes() {
    let Ok(arg) = std::env::var("FOREBAY_STORE_CHILD") else {
        return;
    };
    let (dir, id) = arg.split_once('|').unwrap();
    let store = ObjectStore::attach(dir).unwrap();
    let held = store.get(id.parse().unwrap()).unwrap();
    let mut w = store.create(1 << 20).unwrap();
    w.data_mut().fill(7);
    println!("CHILD READY");
    std::thread::sleep(Duration::from_secs(60));
    drop((held, w));
}
