//! A host names forebay's threads and sizes its own runtime before it starts (this test
//! binary is its own process, so forebay's runtime starts here).

use forebay_io::threads::{
    set_own_runtime_threads, set_thread_name_prefix, OwnRuntimeThreadsError,
};

fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_own_runtime_takes_the_hosts_prefix_and_thread_count() {
    assert_eq!(
        set_own_runtime_threads(0),
        Err(OwnRuntimeThreadsError::Zero)
    );
    set_own_runtime_threads(3).unwrap();
    set_thread_name_prefix("hostq-");
    assert_eq!(forebay_io::block_on(async { 7 }), 7);
    assert_eq!(
        set_own_runtime_threads(5),
        Err(OwnRuntimeThreadsError::AlreadyDecided(3))
    );
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("no /proc: thread names not checked");
        return;
    }
    let names = thread_names();
    let io = names.iter().filter(|n| *n == "hostq-io").count();
    assert_eq!(io, 3, "three workers named by the host's prefix: {names:?}");
    assert!(!names.iter().any(|n| n.starts_with("forebay")), "{names:?}");
}
