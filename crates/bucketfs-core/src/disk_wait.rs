//! Where a request may wait for the local disk on the thread it runs on.
//!
//! A FUSE worker thread polls each request's work once itself (see `fuse`); work that
//! then only needs the local disk (a write-back record and its sync) is cheaper done
//! there than handed to a blocking thread and back: that costs two thread wake-ups per
//! close, more than the sync itself on this kind of machine (`close` of a small file
//! under `--write-back`: 400 µs against 470). So that a slow disk cannot hold up every
//! request, at most half the FUSE threads wait at once; others hand the work
//! off as before. The network is never waited for here: only work that names the disk
//! asks [`may_wait_here`].

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// FUSE worker threads that may wait for the disk at once: half of the mount's readers
/// (see [`set_request_threads`]), so that the other half keeps answering.
static MOST_WAITING: AtomicUsize = AtomicUsize::new(2);

static WAITING: AtomicUsize = AtomicUsize::new(0);

/// The mount reads requests on `threads` threads: half of them (at least one) may wait
/// for the disk at once.
pub fn set_request_threads(threads: usize) {
    MOST_WAITING.store((threads / 2).max(1), Ordering::Relaxed);
}

thread_local! {
    static ON_REQUEST_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (a FUSE worker's first poll of a request) with waiting for the disk
/// allowed on this thread.
pub fn on_request_thread<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON_REQUEST_THREAD.with(|on| on.set(self.0));
        }
    }
    let _restore = Restore(ON_REQUEST_THREAD.with(|on| on.replace(true)));
    f()
}

/// Leave to wait for the disk on this thread, held while waiting; `None` on the
/// runtime's threads (the uploads need them) or while enough FUSE threads wait already.
pub fn may_wait_here() -> Option<Waiting> {
    if !ON_REQUEST_THREAD.with(Cell::get) {
        return None;
    }
    WAITING
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| {
            (waiting < MOST_WAITING.load(Ordering::Relaxed)).then_some(waiting + 1)
        })
        .ok()
        .map(|_| Waiting)
}

/// One FUSE thread waiting for the disk.
pub struct Waiting;

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_request_threads_wait_and_only_so_many_at_once() {
        assert!(may_wait_here().is_none(), "not a request thread");
        on_request_thread(|| {
            let first = may_wait_here().expect("first");
            let second = may_wait_here().expect("second");
            assert!(may_wait_here().is_none(), "a third would leave too few threads answering");
            drop(first);
            let third = may_wait_here().expect("room again");
            drop((second, third));
        });
        assert!(may_wait_here().is_none(), "the flag ends with the poll");
    }
}
