//! The write-back log: files `--write-back` closed before storing them, kept on local
//! disk so that the next mount stores what a killed daemon could not, and files whose
//! upload the store refused, kept until they are stored or the user discards them.
//!
//! - **Segments**: each daemon appends to `<cache-dir>/bucketfs-write-back/DAEMON.N.log`
//!   (DAEMON is `BOOT-PID-START`, as the upload journal's records, so a reused pid cannot
//!   pass for a dead daemon). A record is a JSON line (see `format`) followed by the
//!   file's bytes. `close` returns once its record is written: no file created or
//!   renamed, and a `kill -9` of the daemon loses none (the page cache holds it). The
//!   disk gets it within `--write-back-sync` (`sync`: one `fdatasync` a segment covers
//!   the records of that interval; zero syncs each before its close returns). Records
//!   are written over zeros laid [`ZEROS_AHEAD`] at a time past the last one, so most
//!   syncs change no file size and need no journal commit of the file system (measured
//!   here: half the time of an append's); a record's checksum tells a torn one from a
//!   whole one. Once a segment is past its size, records go to the next
//!   one; a segment whose records are all done is deleted, so the disk holds what is not
//!   stored yet and at most one segment more.
//! - **Directory markers** written again with new attributes (`chmod` of a directory,
//!   see `fs::dir_markers`) are records too: an empty file whose key ends in `/`; a
//!   replay writes it over any marker of that key.
//! - **Done** is a line `{"done":ID}` written after the last line of its segment (not
//!   synced: a lost one only makes the next mount find the bytes stored already).
//! - **Amended**: a file renamed or given new attributes before it was stored (rsync sets
//!   its temporary file's times and mode, then renames it) gets a line
//!   `{"amended":ID,…}` after the last line of its segment, synced as records are: a
//!   replay stores it at its last name with its last attributes.
//! - **The limit** (`--write-back-limit`) counts the bytes of records not done, failed
//!   ones included: a close waits for room while uploads run, and is stored before it
//!   returns (the caller hears the outcome) where failed records leave no room for it.
//! - **Failed**: a record the store refused (after the store's own retries) moves to a
//!   file of its own, `DAEMON.failed-ID.log`, which ends with the error. It is reported
//!   ([`WriteBackLog::failed`], `bucketfs status`) and stays until [`WriteBackLog::retry_failed`]
//!   stores it or [`WriteBackLog::discard_failed`] drops it (`bucketfs write-back`); the
//!   next mount tries it again.
//! - **Replay** (`replay`, at every mount, before it answers): the records of dead
//!   daemons are stored in the order of their closes, where nothing changed since.

mod format;
mod replay;
mod sync;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::journal::{this_daemon, Journal};
use super::liveness::Liveness;
use bucketfs_client::store::Metadata;
pub use format::{Amendment, RenamedOver};
use format::{DataFile, Header, Line};
pub use replay::Replayed;
use sync::Syncer;

/// The bytes of a pending file: in memory up to one part; above, in a local file (a
/// staging file at close, the record's data file in a replay), never all in memory.
#[derive(Clone, Debug)]
pub enum Contents {
    Memory(Bytes),
    /// The first `len` bytes of `file`.
    File {
        file: Arc<File>,
        len: u64,
    },
}

impl Default for Contents {
    fn default() -> Self {
        Contents::Memory(Bytes::new())
    }
}

impl Contents {
    pub fn len(&self) -> u64 {
        match self {
            Contents::Memory(bytes) => bytes.len() as u64,
            Contents::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A file closed with `--write-back` and not stored yet, whole; or a delete not sent yet.
#[derive(Clone, Debug, Default)]
pub struct PendingFile {
    pub key: String,
    pub data: Contents,
    pub metadata: Metadata,
    /// A new file: it must not replace an object another client created.
    pub create_only: bool,
    /// The ETag of the object it replaces (`O_TRUNC` of an existing file); of a delete,
    /// the object it deletes (if known: a replay deletes only that one).
    pub replaces: Option<String>,
    /// Not a file: the key is to be deleted (`unlink`, `rmdir`; see `fs::deletes`).
    pub delete: bool,
}

impl PendingFile {
    /// A directory marker (`prefix` ends in `/`) written again with new attributes.
    pub fn marker(prefix: String, metadata: Metadata) -> Self {
        Self { key: prefix, metadata, ..Self::default() }
    }

    /// The delete of `key`, which holds the object of ETag `etag` (if known).
    pub fn delete(key: String, etag: Option<String>) -> Self {
        Self { key, replaces: etag, delete: true, ..Self::default() }
    }

    fn is_marker(&self) -> bool {
        !self.delete && self.key.ends_with('/') && self.data.is_empty()
    }

    /// A record read back whose bytes followed its header (see [`WriteBackLog::contents`]
    /// for one with a data file).
    fn from_record(header: Header, data: Contents) -> Self {
        Self {
            key: header.key,
            data,
            metadata: header.metadata,
            create_only: header.create_only,
            replaces: header.replaces,
            delete: header.delete,
        }
    }
}

/// A failed file, as reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedFile {
    pub key: String,
    /// The store, as `ObjectStore::location` names it.
    pub location: String,
    pub bytes: u64,
    /// A delete, not a file.
    pub delete: bool,
    pub error: String,
}

/// Room in the log, in KiB (a semaphore counts in `u32`).
type Room = OwnedSemaphorePermit;

/// Locks: `log` and `failed` are never held together.
#[derive(Debug)]
pub struct WriteBackLog {
    dir: PathBuf,
    daemon: String,
    /// Whether the daemons whose records are here run.
    liveness: Liveness,
    /// The limit, in KiB.
    limit_kib: u32,
    /// A segment past this size takes no more records.
    segment_bytes: u64,
    /// What the limit leaves, in KiB: each record not done holds its part.
    room: Arc<Semaphore>,
    /// Numbers records in the order of their closes (failed ones taken over too).
    next_id: AtomicU64,
    /// Where a replay records the multipart uploads of files over one part.
    journal: std::sync::OnceLock<Arc<Journal>>,
    /// What this mount mounts, as (store location, key prefix): a replay stores only
    /// records under one of them, so a mount of another prefix of the same bucket (with
    /// other credentials) never stores files it does not show. Unset: every key.
    mounted: std::sync::OnceLock<Vec<(String, String)>>,
    /// The segment appends go to, opened at the first record.
    log: Mutex<Option<Log>>,
    failed: Mutex<BTreeMap<u64, Failed>>,
    /// KiB the failed records hold, stranded ones included: a close waiting for room
    /// gives up when they leave none for it.
    failed_kib: watch::Sender<u32>,
    /// KiB of failed records that could not be kept apart: they stay in their segments
    /// (for the next mount) and hold their part of the limit until this daemon exits.
    stranded_kib: AtomicU32,
    /// Segments written and not synced yet.
    syncer: Syncer,
}

/// Zeros written past the last record at a time: a record that fits in them is synced
/// without changing the file's size.
const ZEROS_AHEAD: u64 = 1 << 20;

/// The segment records are written to, and what is known of every segment of this daemon.
#[derive(Debug)]
struct Log {
    file: File,
    seq: u64,
    /// The current segment is zeros from its last line's end up to here.
    zeroed: u64,
    segments: BTreeMap<u64, Segment>,
}

#[derive(Debug, Default)]
struct Segment {
    /// Records not done yet: at 0 the segment is deleted (the current one once past it).
    open: u64,
    /// Where its last line ends: the next record or done mark goes there.
    end: u64,
}

#[derive(Debug)]
struct Failed {
    path: PathBuf,
    /// The data file holding its bytes, for a file over one part.
    data_file: Option<PathBuf>,
    report: FailedFile,
    kib: u32,
    /// Its part of the limit (none for a record taken over past the limit).
    room: Option<Room>,
}

/// A record in the log; dropping it marks it done.
pub struct Recorded {
    log: Arc<WriteBackLog>,
    id: u64,
    seq: u64,
    /// What changed since it was written.
    amended: Arc<Mutex<Amendment>>,
    /// Where the record is in its segment.
    offset: u64,
    len: u64,
    /// Its data file (a file over one part): deleted with the record once done.
    data_file: Option<PathBuf>,
    room: Option<Room>,
    kept: bool,
}

/// What amends a record while its upload waits elsewhere ([`Recorded::handle`]).
#[derive(Clone)]
pub struct RecordHandle {
    log: Arc<WriteBackLog>,
    id: u64,
    seq: u64,
    amended: Arc<Mutex<Amendment>>,
}

impl RecordHandle {
    /// The file changed before it was stored (the upload takes the change): said in the
    /// log, so that a replay stores it so, and kept for a failed record's file.
    pub fn amend(&self, amendment: Amendment) {
        self.amended.lock().and(amendment.clone());
        self.log.amended(self.seq, self.id, amendment);
    }
}

impl Recorded {
    pub fn handle(&self) -> RecordHandle {
        RecordHandle { log: self.log.clone(), id: self.id, seq: self.seq, amended: self.amended.clone() }
    }

    /// The store refused the file (after its own retries): kept as a failed record, to be
    /// reported and stored later (see the module documentation).
    pub async fn fail(self, error: String) {
        // A read, a write and syncs: off the runtime's threads, as the append.
        let _ = tokio::task::spawn_blocking(move || self.fail_now(&error)).await;
    }

    fn fail_now(mut self, error: &str) {
        let log = self.log.clone();
        if let Err(io) = log.keep_failed(&mut self, error) {
            tracing::warn!("write-back log: cannot keep a failed record apart ({io}); it stays for the next mount");
            self.kept = true;
            log.strand(self.room.take());
        } // else dropped here: done in its segment (its data file now the failed record's)
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if !self.kept {
            self.log.done(self.seq, self.id);
            if let Some(path) = &self.data_file {
                // After the done mark: a replay never finds a record not done without its bytes
                // (but after a power cut, which may keep either change).
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// The KiB a record of `bytes` takes from the limit (its header included, roughly).
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024) + 1).unwrap_or(u32::MAX)
}

impl WriteBackLog {
    /// The logs under `cache_dir` (the directory is created if needed), holding at most
    /// `limit` bytes of records not done, each synced within `sync_interval` of its close.
    pub fn open(cache_dir: &Path, limit: u64, sync_interval: Duration) -> std::io::Result<Arc<Self>> {
        let dir = cache_dir.join("bucketfs-write-back");
        crate::private_dir::ensure(&dir)?;
        let limit_kib = u32::try_from(limit / 1024).unwrap_or(u32::MAX).max(1);
        Ok(Arc::new(Self {
            dir,
            daemon: this_daemon(),
            liveness: Liveness::new(cache_dir),
            limit_kib,
            segment_bytes: (limit / 4).clamp(1 << 20, 64 << 20),
            room: Arc::new(Semaphore::new(limit_kib as usize)),
            next_id: AtomicU64::new(0),
            journal: std::sync::OnceLock::new(),
            mounted: std::sync::OnceLock::new(),
            log: Mutex::new(None),
            failed: Mutex::new(BTreeMap::new()),
            failed_kib: watch::Sender::new(0),
            stranded_kib: AtomicU32::new(0),
            syncer: Syncer::new(sync_interval),
        }))
    }

    /// Records the multipart uploads a replay starts in `journal` (the mount's).
    pub fn record_uploads_in(&self, journal: Arc<Journal>) {
        let _ = self.journal.set(journal);
    }

    /// Replays only records of keys this mount shows: under `prefix` of the store at
    /// `location`, for each pair.
    pub fn replay_only(&self, mounted: Vec<(String, String)>) {
        let _ = self.mounted.set(mounted);
    }

    /// Whether a replay by this mount may store `key` at `location`.
    fn mounts(&self, location: &str, key: &str) -> bool {
        self.mounted.get().is_none_or(|mounted| {
            mounted.iter().any(|(mounted_location, prefix)| mounted_location == location && key.starts_with(prefix))
        })
    }

    /// Appends `file` (to be stored at `location`), once the limit has room for it; it
    /// is synced within the sync interval (before this returns, for zero). `None` (the
    /// caller stores the file itself) where failed records leave no room, or the log
    /// cannot be written (with a warning).
    ///
    /// A file over one part is copied to a data file of its own first, which the record
    /// names with the CRC-32 of its bytes: the record's line then follows the data on
    /// disk within the same sync, and a replay that finds the bytes not matching (a power
    /// cut between the two) leaves the record out as torn.
    pub async fn record(self: &Arc<Self>, location: String, file: PendingFile) -> Option<Recorded> {
        let room = self.room_for(file.data.len()).await?;
        // On a FUSE thread's first poll, written and synced right there (see disk_wait);
        // not a copy of a large file, which would hold the thread for long.
        if let (Contents::Memory(_), Some(_waiting)) = (&file.data, crate::disk_wait::may_wait_here()) {
            return self.record_now(location, &file, room);
        }
        let log = self.clone();
        // An append and a sync: off the runtime's threads, which the uploads need.
        tokio::task::spawn_blocking(move || log.record_now(location, &file, room)).await.ok()?
    }

    /// Waits until records not done leave room for `bytes`; `None` if the failed ones
    /// never would.
    async fn room_for(&self, bytes: u64) -> Option<Room> {
        let wanted = kib(bytes);
        let mut failed = self.failed_kib.subscribe();
        loop {
            let failed_kib = *failed.borrow_and_update();
            if wanted > self.limit_kib.saturating_sub(failed_kib) {
                return None;
            }
            tokio::select! {
                room = self.room.clone().acquire_many_owned(wanted) => return room.ok(),
                changed = failed.changed() => changed.ok()?,
            }
        }
    }

    /// Appends now (and syncs, for a zero interval). Blocks on the disk.
    fn record_now(self: &Arc<Self>, location: String, file: &PendingFile, room: Room) -> Option<Recorded> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let data_file = match &file.data {
            Contents::File { file: source, len } => match self.write_data_file(id, source, *len) {
                Ok(data_file) => Some(data_file),
                Err(error) => {
                    tracing::warn!(key = file.key, "cannot copy the closed file to {}: {error}", self.dir.display());
                    return None;
                }
            },
            Contents::Memory(_) => None,
        };
        let appended = {
            let mut log = self.log.lock();
            self.append(&mut log, id, location, file, data_file.clone())
        };
        if appended.is_err() {
            if let Some(data_file) = &data_file {
                let _ = std::fs::remove_file(self.dir.join(&data_file.name));
            }
        }
        // Synced outside the lock: closes on other threads append meanwhile, and one
        // sync covers them all. A record that could not be synced is marked done when
        // `recorded` drops: the caller stores the file itself.
        let synced = appended.and_then(|(mut recorded, log_file)| {
            recorded.room = Some(room);
            self.syncer.written(recorded.seq, log_file)?;
            Ok(recorded)
        });
        synced
            .inspect_err(|error| {
                tracing::warn!(key = file.key, "cannot record the closed file in {}: {error}", self.dir.display());
            })
            .ok()
    }

    fn segment_path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{}.{seq}.log", self.daemon))
    }

    /// The name of record `id`'s data file.
    fn data_file_name(&self, id: u64) -> String {
        format!("{}.data-{id}{}", self.daemon, replay::DATA_SUFFIX)
    }

    /// Copies the first `len` bytes of `source` to record `id`'s data file, to be synced
    /// with the records (before the record's line, for a zero interval). Blocks on the disk.
    fn write_data_file(&self, id: u64, source: &File, len: u64) -> std::io::Result<DataFile> {
        let name = self.data_file_name(id);
        let path = self.dir.join(&name);
        let copied = (|| {
            let out = OpenOptions::new().write(true).create_new(true).open(&path)?;
            let crc = format::crc_of_file(source, len, Some(&out))?;
            self.syncer.written_data(out)?;
            self.syncer.written_data(File::open(&self.dir)?)?; // its name
            Ok(crc)
        })();
        match copied {
            Ok(crc) => Ok(DataFile { name, len, crc }),
            Err(error) => {
                let _ = std::fs::remove_file(&path);
                Err(error)
            }
        }
    }

    /// Writes `file`'s record after the last line of the current segment; returns it and
    /// a handle of its segment to sync it by.
    fn append(
        self: &Arc<Self>,
        log: &mut Option<Log>,
        id: u64,
        location: String,
        file: &PendingFile,
        data_file: Option<DataFile>,
    ) -> std::io::Result<(Recorded, File)> {
        // Past its size, or deleted (`remove_done_segments`): records go to a new one.
        let full =
            log.as_ref().is_some_and(|log| log.segments.get(&log.seq).is_none_or(|s| s.end >= self.segment_bytes));
        if log.is_none() || full {
            let seq = log.as_ref().map_or(0, |log| log.seq + 1);
            let segment = OpenOptions::new().write(true).create(true).truncate(true).open(self.segment_path(seq))?;
            // The new name must survive a power cut too.
            File::open(&self.dir)?.sync_all()?;
            let mut segments = BTreeMap::new();
            if let Some(full) = log.take() {
                segments = full.segments;
                if segments.get(&full.seq).is_some_and(|s| s.open == 0) {
                    // Every record in it is done, and none will be: delete it now.
                    segments.remove(&full.seq);
                    let _ = std::fs::remove_file(self.segment_path(full.seq));
                }
            }
            segments.insert(seq, Segment::default());
            *log = Some(Log { file: segment, seq, zeroed: 0, segments });
        }
        let Some(log) = log.as_mut() else { return Err(std::io::Error::other("no log file")) };
        let segment = log.segments.entry(log.seq).or_default();
        let inline: &[u8] = match &file.data {
            Contents::Memory(bytes) => bytes,
            Contents::File { .. } => &[], // in its data file
        };
        let data_path = data_file.as_ref().map(|data_file| self.dir.join(&data_file.name));
        let header = Header {
            id,
            len: inline.len() as u64,
            location,
            key: file.key.clone(),
            create_only: file.create_only,
            replaces: file.replaces.clone(),
            metadata: file.metadata.clone(),
            delete: file.delete,
            crc: None, // written by `encode`
            data_file,
        };
        let record = format::encode(&header, inline)?;
        let handle = log.file.try_clone()?;
        let offset = segment.end;
        log.file.write_all_at(&record, offset)?;
        segment.end += record.len() as u64;
        // Synced with this record: the next records overwrite these zeros. Only a saving:
        // if they cannot be written, the next record extends the file as an append does.
        if segment.end > log.zeroed && log.file.write_all_at(&vec![0; ZEROS_AHEAD as usize], segment.end).is_ok() {
            log.zeroed = segment.end + ZEROS_AHEAD;
        }
        segment.open += 1;
        let recorded = Recorded {
            log: self.clone(),
            id,
            seq: log.seq,
            amended: Arc::default(),
            offset,
            len: record.len() as u64,
            data_file: data_path,
            room: None,
            kept: false,
        };
        Ok((recorded, handle))
    }

    /// Writes `line` after the last line of segment `seq` (over the zeros of the current
    /// one); returns a handle of the segment, to sync it by.
    fn append_line(&self, log: &mut Log, seq: u64, line: &Line) -> std::io::Result<File> {
        let Some(segment) = log.segments.get_mut(&seq) else { return Err(std::io::Error::other("segment gone")) };
        let bytes = format::line(line)?;
        let file = if seq == log.seq {
            log.file.try_clone()?
        } else {
            OpenOptions::new().write(true).open(self.segment_path(seq))?
        };
        file.write_all_at(&bytes, segment.end)?;
        segment.end += bytes.len() as u64;
        Ok(file)
    }

    /// Record `id` of segment `seq` is to be stored as `amendment` says. Synced as records
    /// are: a `kill -9` after it loses nothing, a power cut within the sync interval may
    /// store the file as it was closed (SEMANTICS).
    fn amended(&self, seq: u64, id: u64, amendment: Amendment) {
        let appended = {
            let mut guard = self.log.lock();
            let Some(log) = guard.as_mut() else { return };
            if log.segments.get(&seq).is_none_or(|segment| segment.open == 0) {
                return; // done already: stored with the change, or being stored without it
            }
            self.append_line(log, seq, &Line::Amended { amended: id, amendment })
        };
        let synced = appended.and_then(|file| self.syncer.written(seq, file));
        if let Err(error) = synced {
            tracing::warn!(
                "write-back log: cannot note a change of record {id}: {error} (a replay would store it as closed)"
            );
        }
    }

    fn done(&self, seq: u64, id: u64) {
        let mut guard = self.log.lock();
        let Some(log) = guard.as_mut() else { return };
        let current = seq == log.seq;
        let Some(segment) = log.segments.get_mut(&seq) else { return };
        segment.open = segment.open.saturating_sub(1);
        let result = if segment.open > 0 || current {
            // Mark it done after the segment's last line.
            self.append_line(log, seq, &Line::Done { done: id }).map(drop)
        } else {
            log.segments.remove(&seq);
            std::fs::remove_file(self.segment_path(seq))
        };
        if let Err(error) = result {
            tracing::debug!("write-back log: marking record {id} done failed: {error} (a replay finds it stored)");
        }
    }

    /// At unmount, once uploads ended: deletes the segments whose records are all done,
    /// the current one included, so that only what the next mount must store stays, and
    /// syncs what stays.
    pub fn remove_done_segments(&self) {
        self.syncer.sync_now();
        let mut guard = self.log.lock();
        let Some(log) = guard.as_mut() else { return };
        log.segments.retain(|&seq, segment| {
            let keep = segment.open > 0;
            if !keep {
                let _ = std::fs::remove_file(self.segment_path(seq));
            }
            keep
        });
    }

    /// Copies `recorded` to a failed record's file of its own (synced), which takes over
    /// its room.
    fn keep_failed(&self, recorded: &mut Recorded, error: &str) -> std::io::Result<()> {
        let mut bytes = vec![0; usize::try_from(recorded.len).map_err(std::io::Error::other)?];
        File::open(self.segment_path(recorded.seq))?.read_exact_at(&mut bytes, recorded.offset)?;
        let parsed = format::parse(&bytes);
        let Some((mut header, data)) = parsed.records.into_iter().next() else {
            return Err(std::io::Error::other("the record does not read back"));
        };
        let amendment = recorded.amended.lock().clone();
        if amendment.key.is_some() || amendment.metadata.is_some() {
            header.amend(amendment);
            bytes = format::encode(&header, &data)?;
        }
        let path = self.keep_failed_bytes(recorded.id, bytes, error)?;
        tracing::warn!(key = header.key, "kept in the write-back log until it is stored or discarded: {error}");
        recorded.data_file = None; // the failed record's now (named in its header)
        self.insert_failed(recorded.id, path, header, error, recorded.room.take());
        Ok(())
    }

    /// Writes a failed record's file: the record's bytes and the error, synced.
    fn keep_failed_bytes(&self, id: u64, mut bytes: Vec<u8>, error: &str) -> std::io::Result<PathBuf> {
        let path = self.dir.join(format!("{}.failed-{id}.log", self.daemon));
        bytes.extend(format::line(&Line::Failed { failed: id, error: error.to_owned() })?);
        let mut file = File::create(&path)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        File::open(&self.dir)?.sync_all()?;
        Ok(path)
    }

    /// Notes a failed record kept in `path`; it holds `room` (taken now if `None`, where
    /// the limit has it: a record taken over from a stopped daemon).
    fn insert_failed(&self, id: u64, path: PathBuf, header: Header, error: &str, room: Option<Room>) {
        let kib = kib(header.bytes());
        let room = room.or_else(|| self.room.clone().try_acquire_many_owned(kib).ok());
        let data_file = header.data_file.as_ref().map(|data_file| self.dir.join(&data_file.name));
        let report = FailedFile {
            key: header.key.clone(),
            location: header.location.clone(),
            bytes: header.bytes(),
            delete: header.delete,
            error: error.to_owned(),
        };
        let mut all = self.failed.lock();
        all.insert(id, Failed { path, data_file, report, kib, room });
        self.publish_failed_kib(&all);
    }

    fn remove_failed(&self, ids: &[u64]) {
        let mut all = self.failed.lock();
        for id in ids {
            if let Some(failed) = all.remove(id) {
                let _ = std::fs::remove_file(&failed.path);
                if let Some(data_file) = &failed.data_file {
                    let _ = std::fs::remove_file(data_file);
                }
            }
        }
        self.publish_failed_kib(&all);
    }

    /// A failed record left in its segment: its bytes stay on disk, so its part of the
    /// limit is never given back (`forget`), and closes waiting for room count it.
    fn strand(&self, room: Option<Room>) {
        if let Some(room) = room {
            let kib = u32::try_from(room.num_permits()).unwrap_or(u32::MAX);
            room.forget();
            self.stranded_kib.fetch_add(kib, Ordering::Relaxed);
            self.publish_failed_kib(&self.failed.lock());
        }
    }

    fn publish_failed_kib(&self, all: &BTreeMap<u64, Failed>) {
        let kept: u32 = all.values().map(|f| f.kib).sum();
        self.failed_kib.send_replace(kept.saturating_add(self.stranded_kib.load(Ordering::Relaxed)));
    }

    /// The daemons whose records are here (this one's too).
    pub fn daemons(&self) -> std::collections::HashSet<String> {
        let paths = std::fs::read_dir(&self.dir).into_iter().flatten().flatten().map(|entry| entry.path());
        paths.filter_map(|path| Some(replay::daemon_of(&path)?.to_owned())).collect()
    }

    /// Where the logs are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The records kept as failed, in the order of their closes.
    pub fn failed(&self) -> Vec<FailedFile> {
        self.failed.lock().values().map(|failed| failed.report.clone()).collect()
    }

    /// Bytes of records not done (failed ones included), and the limit.
    pub fn usage(&self) -> (u64, u64) {
        let held = u64::from(self.limit_kib).saturating_sub(self.room.available_permits() as u64);
        let past_limit: u64 = self.failed.lock().values().filter(|f| f.room.is_none()).map(|f| u64::from(f.kib)).sum();
        ((held + past_limit) * 1024, u64::from(self.limit_kib) * 1024)
    }

    /// Drops the failed records of these keys (of every key if `keys` is empty); returns
    /// their keys.
    pub fn discard_failed(&self, keys: &[String]) -> Vec<String> {
        let dropped: Vec<(u64, String)> = self
            .failed
            .lock()
            .iter()
            .filter(|(_, failed)| keys.is_empty() || keys.contains(&failed.report.key))
            .map(|(id, failed)| (*id, failed.report.key.clone()))
            .collect();
        self.remove_failed(&dropped.iter().map(|(id, _)| *id).collect::<Vec<_>>());
        dropped.into_iter().map(|(_, key)| key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pending(key: &str, data: &[u8]) -> PendingFile {
        let data = Bytes::copy_from_slice(data);
        PendingFile { key: key.into(), data: Contents::Memory(data), create_only: true, ..PendingFile::default() }
    }

    fn keys(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        format::parse(bytes).records.into_iter().map(|(h, d)| (h.key, d.to_vec())).collect()
    }

    fn files(log: &WriteBackLog) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&log.dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().replace(&log.daemon, "D"))
            .collect();
        names.sort();
        names
    }

    /// Records read back in order with their bytes (any bytes, newlines too); those marked
    /// done and a torn last record are left out; a log whose records are all done holds
    /// nothing to store.
    #[tokio::test]
    async fn the_log_reads_back_what_is_not_done() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, Duration::ZERO).expect("open");
        let first = log.record("loc".into(), pending("a", b"line\nbreak")).await.expect("a");
        let second = log.record("loc".into(), pending("b", b"")).await.expect("b");
        let third = log.record("loc".into(), pending("c", b"\x00\xff")).await.expect("c");
        let path = log.segment_path(0);
        let mut bytes = std::fs::read(&path).expect("log");
        let (a, b) = (("a".to_owned(), b"line\nbreak".to_vec()), ("b".to_owned(), Vec::new()));
        let c = ("c".to_owned(), vec![0, 255]);
        assert_eq!(keys(&bytes), [a.clone(), b.clone(), c.clone()]);
        let last_byte = bytes.iter().rposition(|&byte| byte == 0xff).expect("c's last byte");
        bytes[last_byte] = 0; // that page never reached the disk
        assert_eq!(keys(&bytes), [a.clone(), b], "a torn last record is left out");
        drop(second);
        assert_eq!(keys(&std::fs::read(&path).expect("log")), [a, c], "a record marked done is left out");
        drop((first, third));
        assert_eq!(keys(&std::fs::read(&path).expect("log")), [], "every record done");
    }

    /// A file over one part is copied to a data file that its record names (the segment
    /// holds only the header line), read back whole; done, the data file goes; failed, it
    /// stays with the failed record, counted in full, until discarded.
    #[tokio::test]
    async fn a_large_record_keeps_its_bytes_in_a_data_file() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, Duration::ZERO).expect("open");
        let bytes: Vec<u8> = (0..(6 << 20) + 7).map(|i: u32| (i % 251) as u8).collect();
        let staging = tempfile::tempfile().expect("staging file");
        staging.write_all_at(&bytes, 0).expect("write");
        staging.write_all_at(b"past the file's length", bytes.len() as u64).expect("write");
        let large = |key: &str| PendingFile {
            key: key.into(),
            data: Contents::File { file: Arc::new(staging.try_clone().expect("dup")), len: bytes.len() as u64 },
            create_only: true,
            ..PendingFile::default()
        };
        let first = log.record("loc".into(), large("big")).await.expect("recorded");
        let second = log.record("loc".into(), large("other")).await.expect("recorded");
        assert_eq!(files(&log), ["D.0.log", "D.data-0.bytes", "D.data-1.bytes"]);
        assert!(std::fs::metadata(log.segment_path(0)).expect("segment").len() < 4 << 20, "only headers inline");
        let records = format::parse(&std::fs::read(log.segment_path(0)).expect("segment")).records;
        let (header, inline) = &records[0];
        assert!(inline.is_empty());
        let Contents::File { file, len } = log.contents(header, inline).expect("whole") else { panic!("in a file") };
        let mut read = vec![0; len as usize];
        file.read_exact_at(&mut read, 0).expect("read");
        assert!(read == bytes, "the data file holds the file's bytes, and only those");
        assert!(log.usage().0 >= 2 * bytes.len() as u64, "counted in full: {:?}", log.usage());
        drop(first);
        assert_eq!(files(&log), ["D.0.log", "D.data-1.bytes"], "done: its data file goes");
        second.fail("refused".into()).await;
        assert_eq!(files(&log), ["D.0.log", "D.data-1.bytes", "D.failed-1.log"], "kept with the failed record");
        assert_eq!(log.failed()[0].bytes, bytes.len() as u64);
        assert_eq!(log.discard_failed(&[]), ["other"]);
        assert_eq!(files(&log), ["D.0.log"]);
        assert_eq!(log.usage().0, 0);
    }

    /// A rename of a logged file over another says what it replaced: a replay then stores
    /// the file over that version only (the rsync and editor pattern: a temporary file
    /// renamed over the original), or where the key is free if the rename replaced
    /// nothing. Before, such a record was replayed as a conflict copy beside the old bytes.
    #[tokio::test]
    async fn a_rename_over_an_object_is_recorded_as_replacing_that_version() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, Duration::ZERO).expect("open");
        let over_object = log.record("loc".into(), pending(".f.tmp", b"new bytes")).await.expect("f");
        over_object.handle().amend(Amendment::renamed("f".into(), Some(RenamedOver::Object("\"v1\"".into()))));
        let over_nothing = log.record("loc".into(), pending(".g.tmp", b"g")).await.expect("g");
        over_nothing.handle().amend(Amendment::renamed("g".into(), Some(RenamedOver::Nothing)));
        let records = format::parse(&std::fs::read(log.segment_path(0)).expect("log")).records;
        let read: Vec<_> =
            records.iter().map(|(h, _)| (h.key.as_str(), h.create_only, h.replaces.as_deref())).collect();
        assert_eq!(read, [("f", false, Some("\"v1\"")), ("g", true, None)]);
    }

    /// A record amended before it was stored (renamed, then given new attributes, in
    /// either order and more than once) reads back as its last amendments made it: at the
    /// last key, no longer create-only, with the last metadata; its bytes unchanged. A
    /// failed record's file keeps the amendments too; a discarded record reads back as none.
    #[tokio::test]
    async fn an_amended_record_reads_back_as_amended() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, Duration::ZERO).expect("open");
        let renamed = log.record("loc".into(), pending(".a.tmp", b"bytes of a")).await.expect("a");
        let untouched = log.record("loc".into(), pending("b", b"bytes of b")).await.expect("b");
        let mode = |mode: &str| Metadata { user: [("mode".to_owned(), mode.to_owned())].into(), ..Metadata::default() };
        let handle = renamed.handle();
        handle.amend(Amendment { metadata: Some(mode("33184")), ..Amendment::default() });
        handle.amend(Amendment { key: Some(".a.tmp2".into()), ..Amendment::default() });
        handle.amend(Amendment { key: Some("a".into()), ..Amendment::default() });
        let records = format::parse(&std::fs::read(log.segment_path(0)).expect("log")).records;
        let read: Vec<_> = records
            .iter()
            .map(|(h, d)| (h.key.as_str(), h.create_only, h.metadata.user.get("mode").cloned(), d.to_vec()))
            .collect();
        assert_eq!(
            read,
            [("a", false, Some("33184".to_owned()), b"bytes of a".to_vec()), ("b", true, None, b"bytes of b".to_vec())]
        );
        let removed = log.record("loc".into(), pending("c", b"bytes of c")).await.expect("c");
        removed.handle().amend(Amendment { discarded: true, ..Amendment::default() });
        let after = format::parse(&std::fs::read(log.segment_path(0)).expect("log")).records;
        assert_eq!(after.len(), 2, "a discarded record is not stored by a replay");
        drop(removed);
        renamed.fail("refused".into()).await;
        assert_eq!(log.failed().iter().map(|f| f.key.as_str()).collect::<Vec<_>>(), ["a"], "kept as amended");
        let kept = std::fs::read_dir(&log.dir)
            .expect("dir")
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains("failed"));
        let kept = format::parse(&std::fs::read(kept.expect("a failed record's file").path()).expect("read")).records;
        assert_eq!(kept[0].0.metadata.user.get("mode").map(String::as_str), Some("33184"));
        drop(untouched);
    }

    /// What a power cut can leave of the current segment: every page either as it was at
    /// the last sync or as last written. Every record closed before that sync and not
    /// done reads back, a record marked done before it does not, a record closed after it
    /// may or may not, and no bytes but those of a record are ever read back as it.
    #[test]
    fn a_power_cut_loses_no_synced_record_and_reads_back_no_wrong_bytes() {
        use proptest::prelude::*;
        #[derive(Clone, Debug)]
        enum Op {
            Record { len: usize },
            Done { which: usize },
            Sync,
        }
        let op = prop_oneof![
            3 => prop_oneof![0..64usize, 0..(300usize << 10)].prop_map(|len| Op::Record { len }),
            2 => any::<usize>().prop_map(|which| Op::Done { which }),
            2 => Just(Op::Sync),
        ];
        let pages = proptest::collection::vec(any::<bool>(), 1024);
        proptest!(ProptestConfig::with_cases(64), |(ops in proptest::collection::vec(op, 1..40), pages in pages)| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                #[derive(Clone, Copy, PartialEq, Debug)]
                enum State { NotSynced, Open, DoneBeforeSync, DoneAfterSync }
                let dir = tempfile::tempdir().expect("dir");
                // Never synced by the thread within the test: only by `Op::Sync`.
                let log = WriteBackLog::open(dir.path(), 1 << 30, Duration::from_secs(3600)).expect("open");
                let mut written: Vec<(String, Vec<u8>, State)> = Vec::new();
                let mut open: Vec<(usize, Recorded)> = Vec::new();
                let mut synced = Vec::new();
                for op in ops {
                    match op {
                        Op::Record { len } => {
                            let key = format!("k{}", written.len());
                            let data: Vec<u8> = (0..len).map(|i| (i * 7 + written.len()) as u8).collect();
                            let recorded = log.record("loc".into(), pending(&key, &data)).await.expect("record");
                            open.push((written.len(), recorded));
                            written.push((key, data, State::NotSynced));
                        }
                        Op::Done { which } if !open.is_empty() => {
                            let (index, recorded) = open.remove(which % open.len());
                            drop(recorded);
                            written[index].2 = State::DoneAfterSync;
                        }
                        Op::Done { .. } => {}
                        Op::Sync => {
                            log.syncer.sync_now();
                            for entry in &mut written {
                                entry.2 = match entry.2 {
                                    State::NotSynced => State::Open,
                                    State::DoneAfterSync => State::DoneBeforeSync, // that sync covered its mark
                                    other => other,
                                };
                            }
                            synced = std::fs::read(log.segment_path(0)).unwrap_or_default();
                        }
                    }
                }
                if written.is_empty() {
                    return Ok(());
                }
                let last = std::fs::read(log.segment_path(0)).expect("segment");
                let page = 4096;
                let mut cut = vec![0u8; synced.len().max(last.len())];
                for (n, chunk) in cut.chunks_mut(page).enumerate() {
                    let from = if pages[n % pages.len()] { &last } else { &synced };
                    let at = n * page;
                    for (i, byte) in chunk.iter_mut().enumerate() {
                        *byte = from.get(at + i).copied().unwrap_or(0);
                    }
                }
                let read = keys(&cut);
                let mut previous = None;
                for (key, data) in &read {
                    let index: usize = key[1..].parse().expect("a key written");
                    prop_assert_eq!(data, &written[index].1, "the bytes of {}", key);
                    prop_assert!(written[index].2 != State::DoneBeforeSync, "{} was done before the last sync", key);
                    prop_assert!(previous < Some(index), "in order");
                    previous = Some(index);
                }
                for (key, _, state) in &written {
                    if *state == State::Open {
                        prop_assert!(read.iter().any(|(k, _)| k == key), "{} is open, synced and lost", key);
                    }
                }
                drop(open);
                Ok(())
            })?;
        });
    }

    /// The sync thread syncs a record within the interval of its close, with no other
    /// call (here 1 s: the record is still waiting just after its close).
    #[tokio::test]
    async fn the_sync_thread_syncs_within_the_interval() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, Duration::from_secs(1)).expect("open");
        let _a = log.record("loc".into(), pending("a", b"a")).await.expect("a");
        assert!(!log.syncer.is_idle(), "a record waits for its sync");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !log.syncer.is_idle() {
            assert!(std::time::Instant::now() < deadline, "not synced after 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Past its size a segment takes no more records; one whose records are all done is
    /// deleted (the current one at unmount); a failed record moves to a file of its own,
    /// reported, until discarded.
    #[tokio::test]
    async fn segments_are_deleted_once_done_and_failed_records_kept_apart() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 4 << 20, Duration::ZERO).expect("open"); // 1 MiB segments
        let big = vec![7; 600 << 10];
        let a = log.record("loc".into(), pending("a", &big)).await.expect("a");
        let b = log.record("loc".into(), pending("b", &big)).await.expect("b");
        let c = log.record("loc".into(), pending("c", &big)).await.expect("c");
        assert_eq!(files(&log), ["D.0.log", "D.1.log"]);
        drop(a);
        assert_eq!(files(&log), ["D.0.log", "D.1.log"], "b is still in segment 0");
        b.fail("refused".into()).await;
        assert_eq!(files(&log), ["D.1.log", "D.failed-1.log"], "segment 0 deleted, b kept apart");
        let failed = log.failed();
        assert_eq!((failed[0].key.as_str(), failed[0].bytes, failed[0].error.as_str()), ("b", 600 << 10, "refused"));
        let kept_bytes = std::fs::read(log.dir.join(format!("{}.failed-1.log", log.daemon))).expect("read");
        assert!(kept_bytes.ends_with(b"{\"failed\":1,\"error\":\"refused\"}\n"), "the file says why");
        let kept = format::parse(&kept_bytes);
        assert_eq!(kept.records[0].1.len(), 600 << 10);
        drop(c);
        assert_eq!(files(&log), ["D.1.log", "D.failed-1.log"], "the current segment stays, with nothing to store");
        assert_eq!(keys(&std::fs::read(log.segment_path(1)).expect("segment")), []);
        assert!(log.usage().0 >= 600 << 10, "the failed record counts");
        assert!(log.discard_failed(&["other".into()]).is_empty());
        assert_eq!(log.discard_failed(&["b".into()]), ["b"]);
        assert_eq!(files(&log), ["D.1.log"]);
        assert_eq!(log.usage().0, 0);
        log.remove_done_segments(); // unmount
        assert!(files(&log).is_empty(), "{:?}", files(&log));
        let d = log.record("loc".into(), pending("d", b"d")).await.expect("d");
        assert_eq!(files(&log), ["D.2.log"], "a record after that starts a new segment");
        log.remove_done_segments();
        assert_eq!(files(&log), ["D.2.log"], "d is not stored");
        assert_eq!(keys(&std::fs::read(log.segment_path(2)).expect("segment")), [("d".to_owned(), b"d".to_vec())]);
        drop(d);
    }

    /// A close waits while records not done fill the limit, and is refused (stored by its
    /// caller) where failed records leave no room for it.
    #[tokio::test]
    async fn a_close_waits_for_room_and_failed_records_leave_none() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 100 << 10, Duration::ZERO).expect("open");
        let data = vec![1; 60 << 10];
        assert!(log.record("loc".into(), pending("too big", &vec![0; 200 << 10])).await.is_none());
        let first = log.record("loc".into(), pending("a", &data)).await.expect("a");
        let waiting = tokio::spawn({
            let log = log.clone();
            let data = data.clone();
            async move { log.record("loc".into(), pending("b", &data)).await.is_some() }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "no room while a is not stored");
        first.fail("refused".into()).await;
        let refused = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("not waiting for ever");
        assert!(!refused.expect("joined"), "the failed record leaves no room");
        log.discard_failed(&[]);
        assert!(log.record("loc".into(), pending("c", &data)).await.is_some(), "room again");
    }

    /// A failed record that cannot be copied apart (here its segment is gone) stays
    /// counted: its bytes are still on disk for the next mount, so the limit never gets
    /// them back and a close that needs them is refused rather than left waiting.
    #[tokio::test]
    async fn a_failed_record_left_in_its_segment_keeps_its_room() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 100 << 10, Duration::ZERO).expect("open");
        let data = vec![1; 60 << 10];
        let first = log.record("loc".into(), pending("a", &data)).await.expect("a");
        std::fs::remove_file(log.segment_path(0)).expect("remove the segment");
        first.fail("refused".into()).await;
        assert!(log.failed().is_empty(), "not kept apart");
        assert!(log.usage().0 >= 60 << 10, "still counted: {:?}", log.usage());
        let second = log.record("loc".into(), pending("b", &data));
        let refused = tokio::time::timeout(Duration::from_secs(10), second).await.expect("not waiting for ever");
        assert!(refused.is_none(), "no room left for b");
    }
}
