//! Bounded waiting: a hung FUSE request fails the test instead of hanging the suite.

use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `f` on its own thread and panics if it does not finish within `timeout` (so that a
/// hung FUSE request fails the test instead of hanging the suite). A panic inside `f` is
/// propagated.
#[track_caller]
pub fn run_with_timeout<T: Send + 'static>(what: &str, timeout: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(timeout) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {timeout:?} (hung?)")
        }
    }
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
