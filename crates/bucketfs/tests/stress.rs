//! Concurrency of one mount: many programs at once on one directory must not freeze it.
//! Each operation has a deadline (the request timeout); a deadlock in the namespace
//! (an `unlink` racing a `readdir`, a listing racing a failed lookup) shows up as an
//! operation that never returns.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// Threads listing (`ls -l`), `stat`ing, deleting and creating in one directory of
/// 1,500 entries for a few seconds, with a short metadata TTL so that caches expire while
/// they run: every operation returns within the request timeout, and the directory ends
/// as the operations left it.
#[test]
fn listing_stat_and_delete_in_one_directory_never_block() {
    let b = create_bucket("stress-dir");
    let objects: Vec<_> = (0..1500).map(|i| (format!("big/f{i:04}"), vec![b'x'; 10])).collect();
    put_many(&b, objects, 32);
    let mut m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0.3", "--read-timeout", "5"]).mount();
    let dir = m.join("big");
    let stop = Arc::new(AtomicBool::new(false));
    let operations = Arc::new(AtomicU64::new(0));
    let deleted = Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));

    let mut threads = Vec::new();
    for worker in 0..6u64 {
        let (dir, stop, operations, deleted) = (dir.clone(), stop.clone(), operations.clone(), deleted.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = Rng::new(worker + 1);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let what = match worker {
                    // ls -l: readdir, then stat of each entry
                    0 | 1 => {
                        for entry in std::fs::read_dir(&dir).expect("readdir").flatten() {
                            let _ = entry.metadata();
                        }
                        "ls -l"
                    }
                    // stat of names, listed or deleted
                    2 | 3 => {
                        for _ in 0..50 {
                            let _ = std::fs::metadata(dir.join(format!("f{:04}", rng.below(1500))));
                        }
                        "stat"
                    }
                    // rm of a few entries
                    4 => {
                        let i = rng.below(1500);
                        if std::fs::remove_file(dir.join(format!("f{i:04}"))).is_ok() {
                            deleted.lock().expect("set").insert(i);
                        }
                        "rm"
                    }
                    // new files
                    _ => {
                        let i = 1500 + rng.below(100);
                        let _ = std::fs::write(dir.join(format!("n{i:04}")), b"new");
                        "create"
                    }
                };
                operations.fetch_add(1, Ordering::Relaxed);
                assert!(started.elapsed() < Duration::from_secs(30), "{what} took {:?}", started.elapsed());
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    run_with_timeout("the stress threads", Duration::from_secs(60), move || {
        for thread in threads {
            thread.join().expect("a stress thread failed");
        }
    });
    assert!(operations.load(Ordering::Relaxed) > 20, "too few operations ran");
    m.assert_alive();
    let deleted = deleted.lock().expect("set").clone();
    assert!(!deleted.is_empty(), "some files were deleted");
    let keys = list_keys(&b, "big/");
    for i in deleted {
        assert!(!keys.contains(&format!("big/f{i:04}")), "f{i:04} was deleted but is still in the bucket");
    }
    // The mount agrees with the bucket once the TTL has passed.
    std::thread::sleep(Duration::from_millis(500));
    let mut shown: Vec<String> = std::fs::read_dir(&dir)
        .expect("readdir")
        .map(|e| format!("big/{}", e.expect("entry").file_name().to_string_lossy()))
        .collect();
    shown.sort();
    assert_eq!(shown, keys);
}
