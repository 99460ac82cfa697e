//! `disk_wait::set_request_threads` in a process of its own: how many FUSE threads may wait
//! for the disk at once is global to the process, so the unit tests keep the default.

use bucketfs_core::disk_wait::{may_wait_here, on_request_thread, set_request_threads};

/// Half of the mount's request threads may wait for the disk at once, and at least one.
#[test]
fn half_of_the_request_threads_may_wait_for_the_disk() {
    for (threads, may_wait) in [(6, 3), (8, 4), (3, 1), (1, 1)] {
        set_request_threads(threads);
        on_request_thread(|| {
            let waiting: Vec<_> = (0..may_wait)
                .map(|n| may_wait_here().unwrap_or_else(|| panic!("waiter {n} of {may_wait} ({threads} threads)")))
                .collect();
            assert!(may_wait_here().is_none(), "{threads} threads: no more than {may_wait} wait");
            drop(waiting);
            assert!(may_wait_here().is_some(), "{threads} threads: room again once they are done");
        });
    }
}
