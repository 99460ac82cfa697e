//! Files open for writing: the one table of them, each one's [`Phase`], who may commit
//! it, and what became of the uploads nobody waits for. Nothing else in `fs` keeps a file
//! open for writing; the operations ask this table.
//!
//! A file open for writing is a [`Writer`], shared by every descriptor of the file open
//! for writing in this mount (as the descriptors of a local file share its inode: what one
//! writes, another reads, truncates, or commits). Its output (`write::Output`) is a
//! streamed upload or a staging file; when the output refuses a write (`write::Move`),
//! the file goes on in a new writer under the same handles ([`Writers::move_on`]).
//!
//! A writer's life:
//!
//! ```text
//!   Open ──close by its opener, --write-back, whole in the log──▶ HandedOff
//!     │  ◀──written or cut again through a descriptor still open──   │ grace over, or hurried
//!     │     (taken back: its record is dropped, the next close         ▼
//!     │      logs it anew)                                         Uploading ──▶ Uploaded
//!     │ close/fsync without --write-back: committed, a caller
//!     │ hears the outcome; the writer stays Open until released
//!     ▼
//!   released (the last handle): committed if it was not, nobody hears ──▶ gone
//! ```
//!
//! A descriptor still open after its file was committed by a close (the opener closed a
//! duplicate: a shell's `dup2`) or whose writer a newer one superseded goes on in the
//! file's current writer when it is used again (`Fs::writer_to_change`), so that all the
//! descriptors of a file keep writing one file, as on a local disk.
//!
//! Only the opener's `close()` commits: "opener" is the *process*. The kernel tells FUSE
//! which thread calls, and Go, Java, Node (libuv), Python thread pools and `tokio::fs`
//! close a file on another thread than the one that opened it, so every caller's thread
//! is resolved to its process (`handles::process_of`) before it is compared. A forked
//! child is another process: its close of an inherited descriptor (at exit, or at exec)
//! does not end the parent's file.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Semaphore;

use super::error::FsError;
use crate::namespace::Ino;
use crate::write::write_back::{RecordHandle, Recorded};
use crate::write::Output;

/// Uploads that `close()` may leave running at once with `--write-back`; the next close
/// waits for one of them to end (this bounds the memory they hold).
const UPLOADS_AFTER_CLOSE: usize = 32;

/// Where a writer is in its life (see the module's drawing). It only moves forward.
#[derive(Clone)]
pub(super) enum Phase {
    /// Taking writes. A commit is made by its opener's close, `fsync`, or the last release.
    Open,
    /// Closed under `--write-back`, whole in the write-back log (`record`, where a rename
    /// or a change of attributes is noted too); its upload waits for the grace.
    HandedOff { record: RecordHandle },
    /// The upload after close is running (a rename may still redirect it, so the record
    /// stays at hand).
    Uploading { record: RecordHandle },
    /// The upload after close ended, stored or refused by the store (`failed`, why; the
    /// log keeps the file, and [`Writers::unstored`] reports it).
    Uploaded { failed: Option<String> },
}

/// A file open for writing, through one descriptor or several.
pub(super) struct Writer {
    /// A new file (rather than an existing one being replaced).
    pub created: bool,
    pub ino: Ino,
    pub output: Output,
    phase: Mutex<Phase>,
    /// Handed off: its record in the write-back log, which its upload marks done (or
    /// failed), or a take-back drops at once (see [`Writer::take_back`]). Locked only
    /// with `phase` held (phase first), so that the two change as one.
    record: Mutex<Option<Recorded>>,
    /// Held from the hand-off at close to the end of the upload after close: who must see
    /// the stored object waits for it by locking this (see `Fs::settle`).
    upload_running: Arc<tokio::sync::Mutex<()>>,
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
    /// failure at release is no news (see [`Writers::unstored`]).
    pub failure_reported: AtomicBool,
    /// A newer writer of the same file was opened since this one was closed (its handle
    /// lingers until its upload or its release ends): what it holds is no longer the
    /// file's content, and a read must not be served from it (see [`Writers::current`]).
    superseded: AtomicBool,
}

impl Writer {
    pub fn new(created: bool, ino: Ino, output: Output, times_kept: bool) -> Self {
        Self {
            created,
            ino,
            output,
            phase: Mutex::new(Phase::Open),
            record: Mutex::new(None),
            upload_running: Arc::default(),
            hurry: tokio::sync::Notify::new(),
            touched: tokio::sync::Notify::new(),
            times_kept: AtomicBool::new(times_kept),
            failure_reported: AtomicBool::new(false),
            superseded: AtomicBool::new(false),
        }
    }

    /// The same file going on in `output` (a move, see `write::Move`): a new writer, open.
    pub fn moved_to(&self, output: Output) -> Self {
        Self::new(self.created, self.ino, output, self.times_kept.load(Ordering::Acquire))
    }

    #[cfg(test)]
    pub fn phase(&self) -> Phase {
        self.phase.lock().clone()
    }

    /// `close()` handed it to the background: its upload runs after close (Open →
    /// HandedOff). Returns the guard the upload holds until it ends.
    pub async fn hand_off(&self, recorded: Recorded) -> tokio::sync::OwnedMutexGuard<()> {
        let running = self.upload_running.clone().lock_owned().await;
        let mut phase = self.phase.lock();
        *phase = Phase::HandedOff { record: recorded.handle() };
        *self.record.lock() = Some(recorded);
        running
    }

    /// HandedOff → Uploading: the grace is over. Returns the record its upload marks
    /// done or failed; `None` if it was taken back meanwhile ([`Writer::take_back`]):
    /// no upload.
    pub fn start_upload(&self) -> Option<Recorded> {
        let mut phase = self.phase.lock();
        let Phase::HandedOff { record } = &*phase else { return None };
        *phase = Phase::Uploading { record: record.clone() };
        self.record.lock().take()
    }

    /// HandedOff → Open: written or cut again through a descriptor still open before its
    /// upload started. Its record is marked done at once (a replay must not store the
    /// older content over what follows; the next close logs the file anew) and the upload
    /// waiting for its grace ends without storing. `false` if it was not waiting (open,
    /// uploading or uploaded).
    pub fn take_back(&self) -> bool {
        let mut phase = self.phase.lock();
        if !matches!(*phase, Phase::HandedOff { .. }) {
            return false;
        }
        *phase = Phase::Open;
        let record = self.record.lock().take();
        drop(phase);
        drop(record); // done in the log
        self.hurry.notify_one(); // the upload's task wakes, and ends
        true
    }

    /// A newer writer of its file was opened since (see [`Writers::current`]).
    pub fn is_superseded(&self) -> bool {
        self.superseded.load(Ordering::Acquire)
    }

    /// Uploading → Uploaded; `failed`: why the store refused it.
    pub fn end_upload(&self, failed: Option<String>) {
        *self.phase.lock() = Phase::Uploaded { failed };
    }

    /// Why the store refused its upload after close, if it did.
    pub fn upload_failure(&self) -> Option<String> {
        match &*self.phase.lock() {
            Phase::Uploaded { failed } => failed.clone(),
            _ => None,
        }
    }

    /// Closed under `--write-back` (handed off, uploading or uploaded): its upload is the
    /// background's, and the next open to write starts from what it stores.
    pub fn is_handed_off(&self) -> bool {
        !matches!(*self.phase.lock(), Phase::Open)
    }

    /// Its record in the write-back log, while its upload may still change what it stores.
    pub fn record(&self) -> Option<RecordHandle> {
        match &*self.phase.lock() {
            Phase::HandedOff { record } | Phase::Uploading { record } => Some(record.clone()),
            Phase::Open | Phase::Uploaded { .. } => None,
        }
    }

    /// Handed off and its upload not ended yet.
    fn upload_pending(&self) -> bool {
        matches!(*self.phase.lock(), Phase::HandedOff { .. } | Phase::Uploading { .. })
    }

    /// Waits until the upload after close ended (at once if there is none).
    pub async fn upload_ended(&self) {
        let _ = self.upload_running.lock().await;
    }
}

/// A handle open for writing: the writer it writes through, and the process that opened
/// it (its close commits).
struct OpenHandle {
    writer: Arc<Writer>,
    opener: u32,
}

/// Every file open for writing, by handle and by inode, and what the uploads after close
/// share: their room, and the failures nobody heard of.
pub(super) struct Writers {
    table: Mutex<Table>,
    /// With `--write-back`: room for uploads running after `close()`.
    upload_slots: Option<Arc<Semaphore>>,
    /// Files whose upload failed where no caller could hear of it (see [`Writers::unstored`]).
    unstored: Mutex<Unstored>,
    /// Held while a file moves between a streamed upload and a staging file under
    /// `--write-back` (see `Fs::staged_past_one_part`): other writes of it wait here.
    moving: tokio::sync::Mutex<()>,
}

/// The handles open for writing, and the handles of each inode: the operations on one
/// file find its writers without scanning all of them (under `--write-back`, thousands of
/// closed files may wait for their upload, each still a writer).
#[derive(Default)]
struct Table {
    by_handle: HashMap<u64, OpenHandle>,
    by_ino: HashMap<Ino, Vec<u64>>,
}

/// Uploads that failed after `close()` returned (`--write-back`, a commit at the last
/// release or at unmount), by key, until a later upload of the key succeeds. Bounded: past
/// [`Unstored::KEPT`] keys only their number is kept.
#[derive(Default)]
struct Unstored {
    failed: BTreeMap<String, String>,
    more: usize,
}

impl Unstored {
    const KEPT: usize = 10_000;
}

impl Table {
    /// The handles open for writing `ino`, with their writers.
    fn of(&self, ino: Ino) -> impl Iterator<Item = (u64, &Arc<Writer>)> {
        let handles = self.by_ino.get(&ino).map(Vec::as_slice).unwrap_or_default();
        handles.iter().filter_map(|h| Some((*h, &self.by_handle.get(h)?.writer)))
    }

    fn insert(&mut self, handle: u64, writer: Arc<Writer>, opener: u32) {
        let ino = writer.ino;
        // A writer not yet in the table for its inode is the file's newest content: every
        // other writer of that inode (closed, waiting for its upload or release) is superseded.
        if !self.of(ino).any(|(_, w)| Arc::ptr_eq(w, &writer)) {
            for (_, older) in self.of(ino) {
                older.superseded.store(true, Ordering::Release);
            }
        }
        if let Some(old) = self.by_handle.insert(handle, OpenHandle { writer, opener }) {
            self.forget(old.writer.ino, handle);
        }
        self.by_ino.entry(ino).or_default().push(handle);
    }

    fn remove(&mut self, handle: u64) -> Option<Arc<Writer>> {
        let open = self.by_handle.remove(&handle)?;
        self.forget(open.writer.ino, handle);
        Some(open.writer)
    }

    fn moved_already(&self, handle: u64, writer: &Arc<Writer>) -> Result<Option<Arc<Writer>>, NotOpen> {
        match self.by_handle.get(&handle) {
            Some(open) if Arc::ptr_eq(&open.writer, writer) => Ok(None),
            Some(open) => Ok(Some(open.writer.clone())),
            None => Err(NotOpen),
        }
    }

    fn move_on(&mut self, writer: &Arc<Writer>, next: &Arc<Writer>) {
        for open in self.by_handle.values_mut().filter(|open| Arc::ptr_eq(&open.writer, writer)) {
            open.writer = next.clone();
        }
    }

    fn forget(&mut self, ino: Ino, handle: u64) {
        if let Some(handles) = self.by_ino.get_mut(&ino) {
            handles.retain(|&h| h != handle);
            if handles.is_empty() {
                self.by_ino.remove(&ino);
            }
        }
    }
}

/// Each writer once, though several handles share it.
fn distinct<'a>(writers: impl Iterator<Item = &'a Arc<Writer>>) -> Vec<Arc<Writer>> {
    let mut found: Vec<Arc<Writer>> = Vec::new();
    for writer in writers {
        if !found.iter().any(|seen| Arc::ptr_eq(seen, writer)) {
            found.push(writer.clone());
        }
    }
    found
}

impl Writers {
    pub fn new(write_back: bool) -> Self {
        Self {
            table: Mutex::default(),
            upload_slots: write_back.then(|| Arc::new(Semaphore::new(UPLOADS_AFTER_CLOSE))),
            unstored: Mutex::default(),
            moving: tokio::sync::Mutex::new(()),
        }
    }

    /// `handle` writes through `writer`; `opener` (a process) commits it at its close.
    pub fn add(&self, handle: u64, writer: Arc<Writer>, opener: u32) {
        self.table.lock().insert(handle, writer, opener);
    }

    pub fn get(&self, handle: u64) -> Option<Arc<Writer>> {
        self.table.lock().by_handle.get(&handle).map(|open| open.writer.clone())
    }

    /// The process that opened `handle` for writing.
    pub fn opener(&self, handle: u64) -> Option<u32> {
        self.table.lock().by_handle.get(&handle).map(|open| open.opener)
    }

    /// Files open for writing (and closed ones whose upload or release has not ended).
    pub fn count(&self) -> usize {
        self.table.lock().by_handle.len()
    }

    /// The writer holding `ino`'s current content, if one is open or waits for its
    /// upload: not one superseded by a newer writer, whose handle may outlive it (and be
    /// listed first) for as long as its release takes.
    pub fn current(&self, ino: Ino) -> Option<Arc<Writer>> {
        let table = self.table.lock();
        table.of(ino).map(|(_, w)| w).filter(|w| !w.superseded.load(Ordering::Acquire)).last().cloned()
    }

    /// A new version of `ino` was stored past its writers (a truncation by name after
    /// their close): none of them holds the file's content any more.
    pub fn supersede_all(&self, ino: Ino) {
        for (_, writer) in self.table.lock().of(ino) {
            writer.superseded.store(true, Ordering::Release);
        }
    }

    /// The distinct writers of `ino`.
    pub fn of(&self, ino: Ino) -> Vec<Arc<Writer>> {
        distinct(self.table.lock().of(ino).map(|(_, w)| w))
    }

    /// The handles of `ino` whose writer is still open (not closed under `--write-back`),
    /// with their writers.
    pub fn open_of(&self, ino: Ino) -> Vec<(u64, Arc<Writer>)> {
        let table = self.table.lock();
        table.of(ino).filter(|(_, w)| !w.is_handed_off()).map(|(h, w)| (h, w.clone())).collect()
    }

    /// The distinct writers that `wanted` picks.
    pub fn all_where(&self, wanted: impl Fn(&Writer) -> bool) -> Vec<Arc<Writer>> {
        distinct(self.table.lock().by_handle.values().map(|open| &open.writer).filter(|w| wanted(w)))
    }

    /// A handle through which `writer` writes, if any is left.
    pub fn handle_of(&self, writer: &Arc<Writer>) -> Option<u64> {
        self.table.lock().of(writer.ino).find(|(_, w)| Arc::ptr_eq(w, writer)).map(|(h, _)| h)
    }

    /// Whether a handle other than `handle` writes through `writer`.
    pub fn shared_beyond(&self, handle: u64, writer: &Arc<Writer>) -> bool {
        self.table.lock().of(writer.ino).any(|(h, w)| h != handle && Arc::ptr_eq(w, writer))
    }

    /// Whether a handle other than `handle` is open for writing `ino`.
    pub fn open_beyond(&self, ino: Ino, handle: u64) -> bool {
        self.table.lock().of(ino).any(|(h, _)| h != handle)
    }

    /// Whether any handle is open for writing `ino`.
    pub fn is_open(&self, ino: Ino) -> bool {
        self.table.lock().of(ino).next().is_some()
    }

    /// Removes `handle` if another handle still shares its writer, as one step (of two
    /// releases at once exactly one is the last); `false` if it is the writer's last.
    pub fn release_shared(&self, handle: u64, writer: &Arc<Writer>) -> bool {
        let mut table = self.table.lock();
        if table.of(writer.ino).any(|(h, w)| h != handle && Arc::ptr_eq(w, writer)) {
            table.remove(handle);
            return true;
        }
        false
    }

    pub fn remove(&self, handle: u64) -> Option<Arc<Writer>> {
        self.table.lock().remove(handle)
    }

    /// The writer `handle` moved to while the caller waited to move `writer`: `None` if it
    /// still writes through `writer`.
    pub fn moved_already(&self, handle: u64, writer: &Arc<Writer>) -> Result<Option<Arc<Writer>>, NotOpen> {
        self.table.lock().moved_already(handle, writer)
    }

    /// Every handle of `writer` goes on with `next` (a writer of the same file).
    pub fn move_on(&self, writer: &Arc<Writer>, next: &Arc<Writer>) {
        self.table.lock().move_on(writer, next);
    }

    /// `handle` goes on with `writer` (of the same file), keeping its opener.
    pub fn join(&self, handle: u64, writer: &Arc<Writer>) -> Result<(), NotOpen> {
        let mut table = self.table.lock();
        let opener = table.by_handle.get(&handle).ok_or(NotOpen)?.opener;
        table.insert(handle, writer.clone(), opener);
        Ok(())
    }

    /// [`Writers::move_on`] if `handle` still writes through `writer`, as one step: else
    /// the writer it writes through now (another write moved it first).
    pub fn move_on_from(&self, handle: u64, writer: &Arc<Writer>, next: &Arc<Writer>) -> Result<Arc<Writer>, NotOpen> {
        let mut table = self.table.lock();
        if let Some(current) = table.moved_already(handle, writer)? {
            return Ok(current);
        }
        table.move_on(writer, next);
        Ok(next.clone())
    }

    /// With `--write-back`: room for one more upload after close.
    pub fn upload_slots(&self) -> Option<&Arc<Semaphore>> {
        self.upload_slots.as_ref()
    }

    /// Held while a file moves between a streamed upload and a staging file.
    pub async fn moving(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.moving.lock().await
    }

    /// The writers of `ino` closed under `--write-back`, whose uploads to wait for.
    pub fn handed_off_of(&self, ino: Ino) -> Vec<Arc<Writer>> {
        self.of(ino).into_iter().filter(|w| w.is_handed_off()).collect()
    }

    /// Hurries the uploads after close of `writers`, and waits until they ended.
    pub async fn hurry_and_wait(writers: Vec<Arc<Writer>>) {
        for writer in &writers {
            writer.hurry.notify_one();
        }
        for writer in writers {
            writer.upload_ended().await;
        }
    }

    /// Files closed whose upload after close has not ended, by inode.
    pub fn uploads_pending(&self) -> Vec<Ino> {
        self.all_where(|w| w.upload_pending()).iter().map(|w| w.ino).collect()
    }

    /// An upload of `key` nobody waited for failed with `error`.
    pub fn note_unstored(&self, key: String, error: String) {
        let mut unstored = self.unstored.lock();
        if unstored.failed.len() < Unstored::KEPT {
            unstored.failed.insert(key, error);
        } else {
            unstored.more += 1;
        }
    }

    /// `key` is stored (or was discarded on request): no longer reported.
    pub fn no_longer_unstored(&self, key: &str) {
        self.unstored.lock().failed.remove(key);
    }

    /// Files whose upload failed where no caller could hear of it, and why (key, error),
    /// and how many more failed past the ones kept: what the daemon reports as it exits.
    pub fn unstored(&self) -> (Vec<(String, String)>, usize) {
        let unstored = self.unstored.lock();
        (unstored.failed.iter().map(|(k, e)| (k.clone(), e.clone())).collect(), unstored.more)
    }
}

/// The handle is not open for writing (any more).
#[derive(Debug)]
pub(super) struct NotOpen;

impl From<NotOpen> for FsError {
    fn from(_: NotOpen) -> Self {
        FsError::BadHandle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(ino: Ino) -> Arc<Writer> {
        use crate::memory::MemoryLimiter;
        use crate::write::staging::StagingConfig;
        use crate::write::Upload;
        use bucketfs_client::store::{memory::MemoryStore, Metadata};
        let staging = StagingConfig { dir: std::env::temp_dir(), limit: MemoryLimiter::new(u64::MAX), journal: None };
        let store = Arc::new(MemoryStore::default());
        let upload =
            Upload::new(store, "k".into(), true, 5 << 20, MemoryLimiter::new(1 << 30), staging, Metadata::default());
        Arc::new(Writer::new(true, ino, Output::Streamed(upload), false))
    }

    fn handles(writers: &Writers, ino: Ino) -> Vec<u64> {
        writers.table.lock().of(ino).map(|(h, _)| h).collect()
    }

    /// The handles of an inode follow every insert, move and remove.
    #[test]
    fn the_table_finds_the_handles_of_each_inode() {
        let writers = Writers::new(false);
        let (a, b) = (writer(7), writer(8));
        writers.add(1, a.clone(), 100);
        writers.add(2, a.clone(), 100);
        writers.add(3, b.clone(), 200);
        assert_eq!((handles(&writers, 7), handles(&writers, 8)), (vec![1, 2], vec![3]));
        assert_eq!((writers.opener(1), writers.opener(3)), (Some(100), Some(200)));
        writers.add(2, b.clone(), 100); // handle 2 now writes inode 8
        assert_eq!((handles(&writers, 7), handles(&writers, 8)), (vec![1], vec![3, 2]));
        assert!(writers.remove(1).is_some() && writers.remove(1).is_none());
        assert_eq!(handles(&writers, 7), Vec::<u64>::new());
        let next = writer(8);
        writers.move_on(&b, &next);
        assert!(writers.of(8).iter().all(|w| Arc::ptr_eq(w, &next)));
        assert_eq!(writers.count(), 2);
        assert_eq!(writers.opener(2), Some(100), "a move keeps the opener");
    }

    /// A file rewritten with `--write-back`: the handle of the first content outlives its
    /// upload until its release ends, and may still be listed when the next one is closed
    /// and the file opened for reading. Reads go to the newest writer, or to the store
    /// once that one is gone, never to a superseded one.
    #[test]
    fn reads_go_to_the_newest_writer_of_a_file() {
        let writers = Writers::new(true);
        let (first, second) = (writer(7), writer(7));
        writers.add(1, first.clone(), 1);
        writers.add(2, first.clone(), 1);
        assert!(writers.current(7).is_some_and(|w| Arc::ptr_eq(&w, &first)), "shared by two handles");
        writers.add(3, second.clone(), 1);
        assert!(writers.current(7).is_some_and(|w| Arc::ptr_eq(&w, &second)), "the newer content");
        writers.remove(3);
        assert!(writers.current(7).is_none(), "the newest is stored: reads go to the object");
        assert_eq!(handles(&writers, 7).len(), 2, "the first one's handles stay until released");
    }

    /// Of two handles sharing a writer, the first release leaves the second, which is the last.
    #[test]
    fn only_the_last_release_of_a_shared_writer_is_the_last() {
        let writers = Writers::new(false);
        let shared = writer(7);
        writers.add(1, shared.clone(), 1);
        writers.add(2, shared.clone(), 1);
        assert!(writers.shared_beyond(1, &shared));
        assert!(writers.release_shared(1, &shared), "another handle shares it");
        assert!(!writers.release_shared(2, &shared), "the last one");
        assert!(writers.get(2).is_some(), "the last handle stays until its commit ends");
    }

    /// A writer's phase moves forward: open, handed off, uploading, uploaded (or back to
    /// open when taken back before its upload, see `Fs::writer_to_change`).
    #[test]
    fn a_writers_phase_moves_forward() {
        let w = writer(7);
        assert!(matches!(w.phase(), Phase::Open) && !w.is_handed_off() && w.record().is_none());
        assert!(w.start_upload().is_none(), "not handed off: no change");
        assert!(matches!(w.phase(), Phase::Open) && !w.take_back());
        w.end_upload(None);
        assert!(matches!(w.phase(), Phase::Uploaded { .. }) && w.is_handed_off() && w.record().is_none());
    }

    /// Past the kept number of failures only their count grows; a later store clears one.
    #[test]
    fn unstored_files_are_kept_up_to_a_bound() {
        let writers = Writers::new(true);
        for i in 0..Unstored::KEPT + 3 {
            writers.note_unstored(format!("k{i}"), "refused".into());
        }
        let (kept, more) = writers.unstored();
        assert_eq!((kept.len(), more), (Unstored::KEPT, 3));
        writers.no_longer_unstored("k0");
        assert_eq!(writers.unstored().0.len(), Unstored::KEPT - 1);
    }
}
