//! Handles open for reading and of directories, and what a file unlinked while open
//! still shows: [`Handles`]. Files open for writing are `writers.rs`'s.
//!
//! A file open for reading is a [`Reader`]: the object, its content already here, or the
//! writer of a file being written here (read-your-writes). [`process_of`] names the
//! process of a calling thread, for the rule of who commits a file (see `writers.rs`).

use std::collections::HashMap;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use fuser::FileAttr;
use parking_lot::Mutex;

use super::dirs::OpenDirs;
use super::writers::Writer;
use crate::namespace::Ino;
use crate::read::ReadHandle;

/// The handles that are not for writing, and the numbers of all handles.
pub(super) struct Handles {
    /// Files open for reading, by handle.
    pub files: Mutex<HashMap<u64, (Ino, Reader)>>,
    pub dirs: OpenDirs,
    /// ETag each file had when last opened: if it is unchanged, the kernel may keep the
    /// pages it cached from an earlier open.
    pub opened_etags: Mutex<HashMap<Ino, String>>,
    /// Files unlinked while open: what `fstat` of a descriptor still open shows (link
    /// count 0, as on a local disk) until the last one is released.
    pub unlinked: Mutex<HashMap<Ino, FileAttr>>,
    next: AtomicU64,
}

impl Handles {
    pub fn new() -> Self {
        Self {
            files: Mutex::default(),
            dirs: OpenDirs::new(),
            opened_etags: Mutex::default(),
            unlinked: Mutex::default(),
            next: AtomicU64::new(1),
        }
    }

    /// A number no other handle (of a file, for reading or writing, or of a directory) has.
    pub fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether `ino` is open for reading.
    pub fn is_reading(&self, ino: Ino) -> bool {
        self.files.lock().values().any(|(open, _)| *open == ino)
    }
}

/// A file open for reading: the object in the store, its content already here (a small
/// file read with its metadata), or what a writer has written.
#[derive(Clone)]
pub(super) enum Reader {
    Object(Arc<ReadHandle>),
    Loaded(Bytes),
    Writer(Arc<Writer>),
}

/// An open file.
pub struct Opened {
    pub handle: u64,
    /// The kernel's cached pages of this file are still valid.
    pub keep_cache: bool,
    /// A local file the kernel may read in place of the object (FUSE passthrough).
    pub backing: Option<Backing>,
}

/// The data cache's whole, checked copy of version `etag` of an object opened for
/// reading: reads can go from the kernel to it without the daemon.
pub struct Backing {
    pub file: std::fs::File,
    pub etag: String,
}

/// The process (thread group) of thread `thread`, as FUSE names callers by thread id.
///
/// Asked of the kernel on every call rather than cached: a thread id is reused once its
/// thread is gone, and a stale entry would make one process's close commit (or not
/// commit) another's file. A process's first thread (every thread of a single-threaded
/// program such as `tar` or `cp`) is told by one `pidfd_open`; any other thread by
/// reading `/proc/THREAD/status`, ten times the cost, once per open for writing and
/// per close of a written file. A thread we cannot see (another pid namespace, FUSE's
/// 0) stands for itself.
pub fn process_of(thread: u32) -> u32 {
    if thread == 0 {
        return 0;
    }
    if leads_its_process(thread) {
        return thread;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{thread}/status")) else {
        return thread;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|tgid| tgid.trim().parse().ok())
        .unwrap_or(thread)
}

/// Whether `thread` is the first thread of its process (its id is the process id):
/// `pidfd_open` gives a descriptor for such a thread only (EINVAL for the others).
fn leads_its_process(thread: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(thread) else { return false };
    // SAFETY: pidfd_open takes two integers and returns a new descriptor, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    match i32::try_from(fd) {
        Ok(fd) if fd >= 0 => {
            // SAFETY: `fd` was just opened for us and is owned by nothing else.
            drop(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_resolves_to_its_process() {
        let process = std::process::id();
        let (thread, resolved) = std::thread::spawn(|| {
            let thread = nix::unistd::gettid().as_raw() as u32;
            (thread, process_of(thread))
        })
        .join()
        .expect("thread");
        assert_ne!(thread, process, "a spawned thread has its own id");
        assert_eq!(resolved, process);
        assert!(!super::leads_its_process(thread), "a spawned thread does not lead its process");
        assert!(super::leads_its_process(process));
        assert_eq!(process_of(process), process);
        assert_eq!(process_of(0), 0, "an unknown caller stands for itself");
    }
}
