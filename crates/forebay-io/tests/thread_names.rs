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
    // A new thread takes its name once it runs (until then /proc shows its parent's): wait
    // for the workers to start, a while at most.
    let named = |names: &[String]| names.iter().filter(|n| *n == "hostq-io").count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut names = thread_names();
    while named(&names) < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        names = thread_names();
    }
    assert_eq!(
        named(&names),
        3,
        "three workers named by the host's prefix: {names:?}"
    );
    assert!(!names.iter().any(|n| n.starts_with("forebay")), "{names:?}");
}
