//! The write-back log: files `--write-back` closed before storing them, kept on local
//! disk so that the next mount stores what a killed daemon could not.
//!
//! - **One log per daemon**, `<cache-dir>/bucketfs-write-back/BOOT-PID-START.log` (named
//!   as the upload journal's records, so a reused pid cannot pass for a dead daemon),
//!   append-only: a record is a JSON line (id, length, store, key, whether the file is
//!   new or which ETag it replaces, metadata) followed by the file's bytes. `close`
//!   returns once its record is appended and `fdatasync`ed: one sync per file, no file
//!   created or renamed, and closes on several threads share a sync.
//! - **Directory markers** written again with new attributes (`chmod` of a directory,
//!   see `fs::dir_markers`) are records too: an empty file whose key ends in `/`; a
//!   replay writes it over any marker of that key.
//! - **Done** is a line `{"done":ID}` appended (not synced: a lost one only makes the next
//!   mount find the bytes stored already); once no record is open, the log is emptied.
//! - **Replay** ([`WriteBackLog::replay`], at every mount, before it answers): each record
//!   of a dead daemon's log not marked done is stored where nothing changed since the
//!   close (a new file where the key is free, a replacement over the same ETag); where
//!   another client wrote the key meanwhile, that object stays and the file is stored as
//!   `KEY.conflict-TIME`; where the store holds these bytes already, nothing is stored. A
//!   torn last record (a power cut before `close` returned) is ignored. A log whose every
//!   record was handled is deleted; one with a record the store refused now stays whole
//!   for the next mount (replaying it again stores nothing twice). A mount replaying a
//!   log holds a `flock` on it; another mount starting meanwhile leaves that log alone.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::journal::{daemon_alive, this_daemon};
use crate::store::{Metadata, ObjectStore, StoreError};

/// A file closed with `--write-back` and not stored yet, whole.
#[derive(Clone, Debug)]
pub struct PendingFile {
    pub key: String,
    pub data: Bytes,
    pub metadata: Metadata,
    /// A new file: it must not replace an object another client created.
    pub create_only: bool,
    /// The ETag of the object it replaces (`O_TRUNC` of an existing file).
    pub replaces: Option<String>,
}

impl PendingFile {
    /// A directory marker (`prefix` ends in `/`) written again with new attributes.
    pub fn marker(prefix: String, metadata: Metadata) -> Self {
        Self { key: prefix, data: Bytes::new(), metadata, create_only: false, replaces: None }
    }

    fn is_marker(&self) -> bool {
        self.key.ends_with('/') && self.data.is_empty()
    }
}

/// A line of the log.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Line {
    Done { done: u64 },
    Record(Header),
}

/// The line before a file's bytes.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    id: u64,
    len: u64,
    location: String,
    key: String,
    create_only: bool,
    replaces: Option<String>,
    metadata: Metadata,
}

/// What a replay did with one record.
#[derive(Debug, PartialEq, Eq)]
pub enum Replayed {
    Stored,
    /// The store held these bytes already (the daemon died after storing them).
    AlreadyThere,
    /// Another client wrote the key meanwhile: stored under this key instead.
    Conflict(String),
}

#[derive(Debug)]
pub struct WriteBackLog {
    dir: PathBuf,
    /// This daemon's log, opened at its first record.
    log: Mutex<Option<Log>>,
}

#[derive(Debug)]
struct Log {
    file: File,
    next_id: u64,
    /// Records not done yet: at 0 the log is emptied.
    open: u64,
}

/// A record in the log; dropping it marks it done.
pub struct Recorded {
    log: Arc<WriteBackLog>,
    id: u64,
    kept: bool,
}

impl Recorded {
    /// The file could not be stored now (the store is unreachable): leave the record for
    /// the next mount.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Recorded {
    fn drop(&mut self) {
        if !self.kept {
            self.log.done(self.id);
        }
    }
}

impl WriteBackLog {
    /// The logs under `cache_dir` (the directory is created if needed).
    pub fn open(cache_dir: &Path) -> std::io::Result<Arc<Self>> {
        let dir = cache_dir.join("bucketfs-write-back");
        std::fs::create_dir_all(&dir)?;
        Ok(Arc::new(Self { dir, log: Mutex::new(None) }))
    }

    /// Appends `file` (to be stored at `location`) and syncs it; `None` (and a warning) if
    /// it cannot be written. Blocks on the disk: call it where a thread may wait.
    pub fn record(self: &Arc<Self>, location: String, file: &PendingFile) -> Option<Recorded> {
        let appended = {
            let mut log = self.log.lock();
            self.append(&mut log, location, file)
        };
        // Synced outside the lock: closes on other threads append meanwhile, and one
        // sync covers them all. A record that could not be synced is marked done when
        // `recorded` drops: the caller stores the file itself.
        let synced = appended.and_then(|(id, log_file)| {
            let recorded = Recorded { log: self.clone(), id, kept: false };
            log_file.sync_data()?;
            Ok(recorded)
        });
        synced
            .inspect_err(|error| {
                tracing::warn!(key = file.key, "cannot record the closed file in {}: {error}", self.dir.display());
            })
            .ok()
    }

    /// Appends `file`'s record; returns its id and a handle of the log to sync it by.
    fn append(&self, log: &mut Option<Log>, location: String, file: &PendingFile) -> std::io::Result<(u64, File)> {
        if log.is_none() {
            let path = self.dir.join(format!("{}.log", this_daemon()));
            let file = OpenOptions::new().create(true).append(true).open(&path)?;
            // The new name must survive a power cut too.
            File::open(&self.dir)?.sync_all()?;
            *log = Some(Log { file, next_id: 0, open: 0 });
        }
        let Some(log) = log.as_mut() else { return Err(std::io::Error::other("no log file")) };
        let id = log.next_id;
        let header = Header {
            id,
            len: file.data.len() as u64,
            location,
            key: file.key.clone(),
            create_only: file.create_only,
            replaces: file.replaces.clone(),
            metadata: file.metadata.clone(),
        };
        let mut record = serde_json::to_vec(&Line::Record(header))?;
        record.push(b'\n');
        record.extend_from_slice(&file.data);
        let handle = log.file.try_clone()?;
        log.file.write_all(&record)?;
        log.next_id += 1;
        log.open += 1;
        Ok((id, handle))
    }

    fn done(&self, id: u64) {
        let mut guard = self.log.lock();
        let Some(log) = guard.as_mut() else { return };
        log.open = log.open.saturating_sub(1);
        let result = if log.open == 0 {
            // Nothing left to store: start the log over.
            log.file.set_len(0)
        } else {
            serde_json::to_vec(&Line::Done { done: id }).map_err(std::io::Error::other).and_then(|mut line| {
                line.push(b'\n');
                log.file.write_all(&line)
            })
        };
        if let Err(error) = result {
            tracing::debug!("write-back log: marking record {id} done failed: {error} (a replay finds it stored)");
        }
    }

    /// Stores what the logs of daemons no longer running hold and did not store, in these
    /// stores (see the module documentation); returns how many files.
    pub async fn replay(&self, stores: &[Arc<dyn ObjectStore>]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut replayed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".log")) else {
                continue;
            };
            if daemon_alive(name) {
                continue;
            }
            // One mount replays a log at a time: two mounts of the bucket starting at once
            // would both store its files, and the second would see the first's as a conflict.
            let Ok(file) = File::open(&path) else { continue };
            let Ok(_replaying) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            let Ok(bytes) = std::fs::read(&path) else { continue };
            let records = parse(&bytes);
            let mut all_handled = true;
            for (header, data) in records {
                let Some(store) = stores.iter().find(|s| s.location() == header.location) else {
                    all_handled = false; // another bucket's: for its mount
                    continue;
                };
                let file = PendingFile {
                    key: header.key,
                    data,
                    metadata: header.metadata,
                    create_only: header.create_only,
                    replaces: header.replaces,
                };
                match replay(&**store, &file).await {
                    Ok(Replayed::Conflict(other)) => tracing::warn!(
                        key = file.key,
                        "a file closed before daemon {name} stopped was changed in the store since: \
                         the store's object stays, the file is stored as {other}"
                    ),
                    Ok(outcome) => {
                        tracing::info!(key = file.key, "a file closed before daemon {name} stopped: {outcome:?}")
                    }
                    Err(error) => {
                        tracing::warn!(
                            key = file.key,
                            "could not store a file closed before daemon {name} stopped: {error}"
                        );
                        all_handled = false;
                        continue;
                    }
                }
                replayed += 1;
            }
            if all_handled {
                let _ = std::fs::remove_file(&path);
            }
        }
        replayed
    }
}

/// The records of a log not marked done, in order; a torn last record is left out.
fn parse(bytes: &[u8]) -> Vec<(Header, Bytes)> {
    let mut records: Vec<(Header, Bytes)> = Vec::new();
    let mut done = std::collections::HashSet::new();
    let mut at = 0;
    while let Some(end) = bytes[at..].iter().position(|&b| b == b'\n').map(|n| at + n) {
        match serde_json::from_slice::<Line>(&bytes[at..end]) {
            Ok(Line::Done { done: id }) => {
                done.insert(id);
                at = end + 1;
            }
            Ok(Line::Record(header)) => {
                let data_end = end + 1 + header.len as usize;
                if data_end > bytes.len() {
                    break; // torn: its close never returned
                }
                let data = Bytes::copy_from_slice(&bytes[end + 1..data_end]);
                records.push((header, data));
                at = data_end;
            }
            Err(_) => break,
        }
    }
    records.retain(|(header, _)| !done.contains(&header.id));
    records
}

/// Stores `file` where nothing changed since it was closed; under a `.conflict-TIME` key
/// where another client wrote meanwhile; nothing where its bytes are stored already.
async fn replay(store: &dyn ObjectStore, file: &PendingFile) -> Result<Replayed, StoreError> {
    let key = file.key.as_str();
    let current = match store.head(key).await {
        Ok(info) => Some(info),
        Err(StoreError::NotFound) => None,
        Err(error) => return Err(error),
    };
    if let Some(info) = &current {
        let len = file.data.len() as u64;
        // An empty object is told apart by its metadata (a marker's attributes).
        let same_metadata = len > 0 || info.metadata.as_deref().is_some_and(|m| m.user == file.metadata.user);
        if same_metadata
            && info.size == len
            && (len == 0 || store.get_range(key, 0..len, info.etag.as_deref()).await? == file.data)
        {
            return Ok(Replayed::AlreadyThere);
        }
    }
    let unchanged = match &current {
        None => true, // created by nobody else, or the replaced object deleted: ours goes there
        // A marker's attributes go over any marker: every empty marker has the same bytes.
        Some(info) if file.is_marker() => info.size == 0,
        Some(info) => !file.create_only && info.etag.is_some() && info.etag == file.replaces,
    };
    if unchanged {
        match store.put(key, file.data.clone(), &file.metadata, current.is_none()).await {
            Ok(_) => return Ok(Replayed::Stored),
            Err(StoreError::AlreadyExists) => {} // created a moment ago: a conflict
            Err(error) => return Err(error),
        }
    }
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    for attempt in 0..100 {
        let other = match attempt {
            0 => format!("{key}.conflict-{stamp}"),
            n => format!("{key}.conflict-{stamp}-{n}"),
        };
        match store.put(&other, file.data.clone(), &file.metadata, true).await {
            Ok(_) => return Ok(Replayed::Conflict(other)),
            Err(StoreError::AlreadyExists) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(StoreError::AlreadyExists)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn pending(key: &str, data: &[u8], create_only: bool, replaces: Option<String>) -> PendingFile {
        let data = Bytes::copy_from_slice(data);
        PendingFile { key: key.into(), data, metadata: Metadata::default(), create_only, replaces }
    }

    /// A replay stores where nothing changed, keeps another client's newer object (ours
    /// goes to a `.conflict-` key), and does nothing where the bytes are there already.
    #[tokio::test]
    async fn a_replay_never_overwrites_another_clients_object() {
        let store =
            MemoryStore::with_keys([("replaced".to_owned(), b"old".to_vec()), ("theirs".to_owned(), b"v1".to_vec())]);
        let old = store.head("replaced").await.expect("head").etag;
        let v1 = store.head("theirs").await.expect("head").etag;
        store.put("theirs", b"v2 by someone else".to_vec());
        assert_eq!(replay(&store, &pending("new", b"ours", true, None)).await.expect("new"), Replayed::Stored);
        assert_eq!(
            replay(&store, &pending("replaced", b"ours", false, old)).await.expect("replaced"),
            Replayed::Stored
        );
        assert_eq!(replay(&store, &pending("new", b"ours", true, None)).await.expect("again"), Replayed::AlreadyThere);
        let Replayed::Conflict(other) = replay(&store, &pending("theirs", b"ours", false, v1)).await.expect("theirs")
        else {
            panic!("another client's object must stay");
        };
        assert!(other.starts_with("theirs.conflict-"), "{other}");
        let expected =
            [("new", &b"ours"[..]), ("replaced", b"ours"), ("theirs", b"v2 by someone else"), (&other, b"ours")];
        for (key, content) in expected {
            let len = content.len() as u64;
            assert_eq!(&store.get_range(key, 0..len, None).await.expect("get")[..], content, "{key}");
        }
    }

    /// A logged directory marker goes over the marker there (every marker has the same
    /// empty bytes: its attributes tell them apart), and is not stored again once there.
    #[tokio::test]
    async fn a_replayed_marker_writes_its_attributes_over_the_marker() {
        let store = MemoryStore::with_keys([("d/".to_owned(), Vec::new())]);
        let mut metadata = Metadata::default();
        metadata.user.insert("mode".into(), "16877".into());
        let marker = PendingFile::marker("d/".into(), metadata.clone());
        assert_eq!(replay(&store, &marker).await.expect("over the marker"), Replayed::Stored);
        let stored = store.head("d/").await.expect("head").metadata.expect("metadata");
        assert_eq!(stored.user, metadata.user);
        assert_eq!(replay(&store, &marker).await.expect("again"), Replayed::AlreadyThere);
        assert_eq!(replay(&store, &PendingFile::marker("e/".into(), metadata)).await.expect("new"), Replayed::Stored);
    }

    /// A dead daemon's log is stored by a replay, once; a log another mount is replaying
    /// (locked) is left alone.
    #[tokio::test]
    async fn a_dead_daemons_log_is_replayed_once_and_not_while_locked() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path()).expect("open");
        let header = Header {
            id: 0,
            len: 4,
            location: "memory".into(),
            key: "k".into(),
            create_only: true,
            replaces: None,
            metadata: Metadata::default(),
        };
        let mut record = serde_json::to_vec(&Line::Record(header)).expect("json");
        record.extend_from_slice(b"\nours");
        let path = log.dir.join("0-1-1.log"); // no such daemon
        std::fs::write(&path, &record).expect("dead daemon's log");
        let store = Arc::new(MemoryStore::default());
        let stores: Vec<Arc<dyn ObjectStore>> = vec![store.clone()];
        let held = File::open(&path).expect("open");
        let held = nix::fcntl::Flock::lock(held, nix::fcntl::FlockArg::LockExclusive).expect("lock");
        assert_eq!(log.replay(&stores).await, 0, "locked by another mount");
        assert!(store.head("k").await.is_err());
        drop(held);
        assert_eq!(log.replay(&stores).await, 1);
        assert_eq!(&store.get_range("k", 0..4, None).await.expect("stored")[..], b"ours");
        assert!(!path.exists(), "a log whose records were all stored is deleted");
        assert_eq!(log.replay(&stores).await, 0);
    }

    /// Records read back in order with their bytes (any bytes, newlines too); those marked
    /// done and a torn last record are left out; an emptied log holds nothing.
    #[test]
    fn the_log_reads_back_what_is_not_done() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path()).expect("open");
        let first = log.record("loc".into(), &pending("a", b"line\nbreak", true, None)).expect("a");
        let second = log.record("loc".into(), &pending("b", b"", false, Some("\"e\"".into()))).expect("b");
        let third = log.record("loc".into(), &pending("c", b"\x00\xff", true, None)).expect("c");
        let path = dir.path().join("bucketfs-write-back").join(format!("{}.log", this_daemon()));
        let keys = |bytes: &[u8]| parse(bytes).into_iter().map(|(h, d)| (h.key, d.to_vec())).collect::<Vec<_>>();
        let mut bytes = std::fs::read(&path).expect("log");
        bytes.truncate(bytes.len() - 1);
        let (a, b) = (("a".to_owned(), b"line\nbreak".to_vec()), ("b".to_owned(), Vec::new()));
        assert_eq!(keys(&bytes), [a.clone(), b], "a torn last record is left out");
        drop(second);
        let c = ("c".to_owned(), vec![0, 255]);
        assert_eq!(keys(&std::fs::read(&path).expect("log")), [a, c], "a record marked done is left out");
        drop((first, third));
        assert_eq!(std::fs::metadata(&path).expect("log").len(), 0, "emptied once nothing is open");
    }
}
