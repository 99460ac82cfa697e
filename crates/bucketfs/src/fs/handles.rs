//! Open files: what a handle reads from or writes into, and who may commit it.
//!
//! A file open for reading is a [`Reader`]; a file open for writing is a [`Writer`],
//! shared by every descriptor of the file open for writing in this mount (as the
//! descriptors of a local file share its inode: what one writes, another reads,
//! truncates, or commits), and committed by the `close()` of a descriptor's opener (see
//! `Fs::flush`). "Opener" means the *process*:
//! the kernel tells FUSE which thread calls, and Go, Java, Node (libuv), Python thread
//! pools and `tokio::fs` routinely close a file on another thread than the one that
//! opened it, so every caller's thread id is resolved to its process ([`process_of`])
//! before it is compared. A forked child is another process: its close of an inherited
//! descriptor (at exit, or at exec) does not end the parent's file.

use std::collections::HashMap;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::namespace::Ino;
use crate::read::ReadHandle;
use crate::write::write_back::RecordHandle;
use crate::write::Output;

/// A file open for writing, through one descriptor or several.
pub(super) struct Writer {
    /// A new file (rather than an existing one being replaced).
    pub created: bool,
    pub ino: Ino,
    pub output: Output,
    /// Held by the upload that `close()` left running (`--write-back`): whoever must see
    /// the stored object waits for it by locking this (see `Fs::settle`).
    pub background: Arc<tokio::sync::Mutex<()>>,
    /// `close()` has handed the upload to the background.
    pub handed_off: AtomicBool,
    /// Its record in the write-back log, once handed off: a rename or a change of its
    /// attributes before its upload starts is noted there.
    pub write_back_record: parking_lot::Mutex<Option<RecordHandle>>,
    /// Starts the upload handed off at `close()` before its grace is over: someone waits
    /// for it (see `Fs::hand_off`).
    pub hurry: tokio::sync::Notify,
    /// The file was used again (its attributes changed, opened to read) after `close()`
    /// handed it off: its grace starts again (see `Fs::hand_off`).
    pub touched: tokio::sync::Notify,
    /// The metadata may hold an mtime or ctime from before the next write (the stored
    /// object's, or set by `utimens`/`chmod` while open), which that write must drop so
    /// that the commit stamps the time of the last write (see `Fs::write`).
    pub times_kept: AtomicBool,
    /// A commit of this file failed and its caller (`close`, `fsync`) was told: a later
    /// failure at release is no news (see `Fs::unstored`).
    pub failure_reported: AtomicBool,
    /// A newer writer of the same file was opened since this one was closed (its handle
    /// lingers until its upload or its release ends): what it holds is no longer the
    /// file's content, and a read must not be served from it (see [`WriterTable::current`]).
    superseded: AtomicBool,
}

impl Writer {
    pub fn new(created: bool, ino: Ino, output: Output, times_kept: bool) -> Self {
        Self {
            created,
            ino,
            output,
            background: Arc::default(),
            handed_off: AtomicBool::new(false),
            write_back_record: parking_lot::Mutex::new(None),
            hurry: tokio::sync::Notify::new(),
            touched: tokio::sync::Notify::new(),
            times_kept: AtomicBool::new(times_kept),
            failure_reported: AtomicBool::new(false),
            superseded: AtomicBool::new(false),
        }
    }
}

/// The files open for writing, by handle, and the handles of each inode: the operations
/// on one file find its writers without scanning all of them (under `--write-back`,
/// thousands of closed files may wait for their upload, each still a writer).
#[derive(Default)]
pub(super) struct WriterTable {
    by_handle: HashMap<u64, Arc<Writer>>,
    by_ino: HashMap<Ino, Vec<u64>>,
}

impl WriterTable {
    pub fn get(&self, handle: &u64) -> Option<&Arc<Writer>> {
        self.by_handle.get(handle)
    }

    /// `handle` writes through `writer`. A writer not yet in the table for its inode is
    /// the file's newest content: every other writer of that inode (closed, waiting for
    /// its upload or release) is superseded.
    pub fn insert(&mut self, handle: u64, writer: Arc<Writer>) {
        let ino = writer.ino;
        if !self.of(ino).any(|(_, w)| Arc::ptr_eq(w, &writer)) {
            for (_, older) in self.of(ino) {
                older.superseded.store(true, Ordering::Release);
            }
        }
        if let Some(old) = self.by_handle.insert(handle, writer) {
            self.forget(old.ino, handle);
        }
        self.by_ino.entry(ino).or_default().push(handle);
    }

    pub fn remove(&mut self, handle: &u64) -> Option<Arc<Writer>> {
        let writer = self.by_handle.remove(handle)?;
        self.forget(writer.ino, *handle);
        Some(writer)
    }

    fn forget(&mut self, ino: Ino, handle: u64) {
        if let Some(handles) = self.by_ino.get_mut(&ino) {
            handles.retain(|&h| h != handle);
            if handles.is_empty() {
                self.by_ino.remove(&ino);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_handle.len()
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<Writer>> {
        self.by_handle.values()
    }

    /// The handles open for writing `ino`, with their writers.
    pub fn of(&self, ino: Ino) -> impl Iterator<Item = (u64, &Arc<Writer>)> {
        let handles = self.by_ino.get(&ino).map(Vec::as_slice).unwrap_or_default();
        handles.iter().filter_map(|h| Some((*h, self.by_handle.get(h)?)))
    }

    /// The writer holding `ino`'s current content, if one is open or waits for its
    /// upload: not one superseded by a newer writer, whose handle may outlive it (and be
    /// listed first) for as long as its release takes.
    pub fn current(&self, ino: Ino) -> Option<&Arc<Writer>> {
        self.of(ino).map(|(_, w)| w).filter(|w| !w.superseded.load(Ordering::Acquire)).last()
    }

    /// Every handle sharing `writer` goes on with `next` (a writer of the same file).
    pub fn replace_shared(&mut self, writer: &Arc<Writer>, next: &Arc<Writer>) {
        for (_, shared) in self.by_handle.iter_mut().filter(|(_, w)| Arc::ptr_eq(w, writer)) {
            *shared = next.clone();
        }
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

    fn writer(ino: Ino) -> Arc<Writer> {
        use crate::memory::MemoryLimiter;
        use crate::store::{memory::MemoryStore, Metadata};
        use crate::write::staging::StagingConfig;
        use crate::write::Upload;
        let staging = StagingConfig { dir: std::env::temp_dir(), limit: MemoryLimiter::new(u64::MAX), journal: None };
        let store = Arc::new(MemoryStore::default());
        let upload =
            Upload::new(store, "k".into(), true, 5 << 20, MemoryLimiter::new(1 << 30), staging, Metadata::default());
        Arc::new(Writer::new(true, ino, Output::Streamed(upload), false))
    }

    /// The handles of an inode follow every insert, replace and remove.
    #[test]
    fn the_writer_table_finds_the_handles_of_each_inode() {
        let mut table = WriterTable::default();
        let (a, b) = (writer(7), writer(8));
        table.insert(1, a.clone());
        table.insert(2, a.clone());
        table.insert(3, b.clone());
        let handles = |table: &WriterTable, ino| table.of(ino).map(|(h, _)| h).collect::<Vec<_>>();
        assert_eq!((handles(&table, 7), handles(&table, 8)), (vec![1, 2], vec![3]));
        table.insert(2, b.clone()); // handle 2 now writes inode 8
        assert_eq!((handles(&table, 7), handles(&table, 8)), (vec![1], vec![3, 2]));
        assert!(table.remove(&1).is_some() && table.remove(&1).is_none());
        assert_eq!(handles(&table, 7), Vec::<u64>::new());
        let next = writer(8);
        table.replace_shared(&b, &next);
        assert!(table.of(8).all(|(_, w)| Arc::ptr_eq(w, &next)));
        assert_eq!(table.len(), 2);
    }

    /// A file rewritten with `--write-back`: the handle of the first content outlives its
    /// upload until its release ends, and may still be listed when the next one is closed
    /// and the file opened for reading. Reads go to the newest writer, or to the store
    /// once that one is gone, never to a superseded one.
    #[test]
    fn reads_go_to_the_newest_writer_of_a_file() {
        let mut table = WriterTable::default();
        let (first, second) = (writer(7), writer(7));
        table.insert(1, first.clone());
        table.insert(2, first.clone());
        assert!(table.current(7).is_some_and(|w| Arc::ptr_eq(w, &first)), "shared by two handles");
        table.insert(3, second.clone());
        assert!(table.current(7).is_some_and(|w| Arc::ptr_eq(w, &second)), "the newer content");
        table.remove(&3);
        assert!(table.current(7).is_none(), "the newest is stored: reads go to the object");
        assert_eq!(table.of(7).count(), 2, "the first one's handles stay until released");
    }

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
