//! Storing logged files later: the records of daemons no longer running (at every mount,
//! before it answers) and the failed records the user retries, with one rule — a file is
//! stored where nothing changed since its close (a new file where the key is free, a
//! replacement over the same ETag); where another client wrote the key meanwhile, that
//! object stays and the file is stored as `KEY.conflict-TIME`; where the store holds
//! these bytes already (a daemon killed after storing them), nothing is stored.
//!
//! A dead daemon's records are replayed in the order of their closes, across its
//! segments and failed files (a rename or delete logged after a write comes after it).
//! One the store refuses is taken over as a failed record of this daemon (reported,
//! retried by the user or the next mount); once a store stays unreachable past its retry
//! window, its remaining records are taken over untried, so a mount starting while the
//! store is away waits one retry window, not one per file. Records of a bucket or prefix
//! this mount does not mount stay in their file for a mount of it. A mount replaying a
//! daemon's logs holds a `flock` on each; another mount starting meanwhile leaves them.
//! A record whose data file is missing or does not match its checksum is left out as
//! torn (a power cut within the sync interval; or stored already, its done mark lost),
//! and data files no record names any more are deleted with their daemon's logs.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::format::{self, Header};
use super::{Contents, PendingFile, WriteBackLog};
use crate::memory::MemoryLimiter;
use crate::write::journal::Journal;
use crate::write::staging::store_file;
use bucketfs_client::store::{ObjectInfo, ObjectStore, StoreError, WriteCondition};

/// What a replay did with one record.
#[derive(Debug, PartialEq, Eq)]
pub enum Replayed {
    Stored,
    /// The store held these bytes already (the daemon died after storing them).
    AlreadyThere,
    /// Another client wrote the key meanwhile: stored under this key instead.
    Conflict(String),
    /// A delete of an object another client replaced meanwhile: its object stays.
    ChangedSince,
}

/// The daemon a file of the log belongs to: `DAEMON.N.log`, `DAEMON.failed-ID.log` (and
/// `DAEMON.log`, as earlier versions named it), `DAEMON.data-ID.bytes`.
pub(super) fn daemon_of(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    let name = name.strip_suffix(".log").or_else(|| name.strip_suffix(DATA_SUFFIX))?;
    name.split('.').next()
}

/// How the data files of large records end (`WriteBackLog::data_file_name`).
pub(super) const DATA_SUFFIX: &str = ".bytes";

fn is_data_file(path: &Path) -> bool {
    path.to_str().is_some_and(|name| name.ends_with(DATA_SUFFIX))
}

impl WriteBackLog {
    /// Stores what the logs of daemons no longer running hold and did not store, in these
    /// stores (see the module documentation); returns how many files.
    pub async fn replay(self: &Arc<Self>, stores: &[Arc<dyn ObjectStore>]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut by_daemon: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for path in entries.flatten().map(|entry| entry.path()) {
            let Some(daemon) = daemon_of(&path) else { continue };
            if daemon != self.daemon && !self.liveness.runs(daemon) {
                by_daemon.entry(daemon.to_owned()).or_default().push(path);
            }
        }
        let mut replayed = 0;
        for (daemon, mut paths) in by_daemon {
            paths.sort(); // the order of the closes is the records' ids, not the files'
            replayed += self.replay_daemon(&daemon, paths, stores).await;
        }
        replayed
    }

    async fn replay_daemon(
        self: &Arc<Self>,
        daemon: &str,
        paths: Vec<PathBuf>,
        stores: &[Arc<dyn ObjectStore>],
    ) -> usize {
        let (data_files, paths): (Vec<PathBuf>, Vec<PathBuf>) = paths.into_iter().partition(|p| is_data_file(p));
        let mut _locks = Vec::new();
        for path in &paths {
            let Ok(file) = File::open(path) else { return 0 };
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => _locks.push(lock),
                Err(_) => return 0, // another mount is replaying it
            }
        }
        // Every record of every file, in the order of the closes (a failed record is in its
        // segment too if the daemon died between keeping it and marking it done: once).
        let mut records: Vec<(usize, Header, Bytes)> = Vec::new();
        for (file, path) in paths.iter().enumerate() {
            let Ok(bytes) = std::fs::read(path) else { return 0 };
            records.extend(format::parse(&bytes).records.into_iter().map(|(header, data)| (file, header, data)));
        }
        records.sort_by_key(|(_, header, _)| header.id);
        records.dedup_by_key(|(_, header, _)| header.id);
        let mut left: Vec<Vec<(Header, Bytes)>> = vec![Vec::new(); paths.len()];
        let mut unreachable: HashMap<String, String> = HashMap::new();
        let mut replayed = 0;
        for (file, header, data) in records {
            let store = stores.iter().find(|s| s.location() == header.location);
            let Some(store) = store.filter(|_| self.mounts(&header.location, &header.key)) else {
                left[file].push((header, data)); // another bucket's or prefix's: for its mount
                continue;
            };
            let contents = match self.contents(&header, &data) {
                Ok(contents) => contents,
                Err(torn) => {
                    tracing::warn!(
                        key = header.key,
                        "a file closed before daemon {daemon} stopped is left out: {torn}"
                    );
                    continue;
                }
            };
            let pending = PendingFile::from_record(header.clone(), contents);
            let key = &pending.key;
            let outcome = match unreachable.get(&header.location) {
                Some(error) => Err(format!("not tried, the store did not answer: {error}")),
                None => self.replay_one(store, &pending).await.map_err(|error| {
                    if error.is_transient() {
                        unreachable.insert(header.location.clone(), error.to_string());
                    }
                    error.to_string()
                }),
            };
            match outcome {
                Ok(Replayed::Conflict(other)) => tracing::warn!(
                    key,
                    "a file closed before daemon {daemon} stopped was changed in the store since: \
                     the store's object stays, the file is stored as {other}"
                ),
                Ok(outcome) if pending.delete => {
                    tracing::info!(key, "a delete made before daemon {daemon} stopped: {outcome:?}")
                }
                Ok(outcome) => tracing::info!(key, "a file closed before daemon {daemon} stopped: {outcome:?}"),
                Err(error) => {
                    tracing::warn!(key, "could not store a file closed before daemon {daemon} stopped: {error}");
                    if let Err(io) = self.take_over_failed(header.clone(), &data, &error) {
                        tracing::warn!(key, "write-back log: cannot keep it as failed ({io}); it stays where it is");
                        left[file].push((header, data));
                    }
                    continue;
                }
            }
            replayed += 1;
        }
        let still_named: Vec<String> =
            left.iter().flatten().filter_map(|(header, _)| Some(header.data_file.as_ref()?.name.clone())).collect();
        for (path, left) in paths.iter().zip(left) {
            let result = if left.is_empty() { std::fs::remove_file(path) } else { rewrite(path, &left) };
            if let Err(error) = result {
                tracing::warn!("write-back log {}: {error}", path.display());
            }
        }
        for path in data_files {
            let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
            if !still_named.iter().any(|named| named == name) {
                let _ = std::fs::remove_file(&path); // stored, taken over, or torn
            }
        }
        replayed
    }

    /// The bytes of a record read back: `inline`, or its data file, checked against its
    /// length and checksum; why not, for a torn one.
    pub(super) fn contents(&self, header: &Header, inline: &Bytes) -> Result<Contents, String> {
        let Some(data_file) = &header.data_file else { return Ok(Contents::Memory(inline.clone())) };
        let path = self.dir.join(&data_file.name);
        let file = File::open(&path).map_err(|error| format!("its bytes ({}): {error}", path.display()))?;
        let crc = format::crc_of_file(&file, data_file.len, None)
            .map_err(|error| format!("its bytes ({}): {error}", path.display()))?;
        if crc != data_file.crc {
            return Err(format!("its bytes ({}) are not those closed (a power cut?)", path.display()));
        }
        Ok(Contents::File { file: Arc::new(file), len: data_file.len })
    }

    /// Keeps a record of a stopped daemon that could not be stored as a failed record of
    /// this one (its data file too, renamed as this daemon's).
    fn take_over_failed(&self, mut header: Header, data: &[u8], error: &str) -> std::io::Result<()> {
        header.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some(data_file) = &mut header.data_file {
            let name = self.data_file_name(header.id);
            std::fs::rename(self.dir.join(&data_file.name), self.dir.join(&name))?;
            data_file.name = name;
        }
        let path = self.keep_failed_bytes(header.id, format::encode(&header, data)?, error)?;
        self.insert_failed(header.id, path, header, error, None);
        Ok(())
    }

    /// [`replay`] with the multipart uploads of large files recorded in the mount's journal.
    async fn replay_one(&self, store: &Arc<dyn ObjectStore>, file: &PendingFile) -> Result<Replayed, StoreError> {
        replay(store, self.journal.get().map(|journal| &**journal), file).await
    }

    /// Tries to store the failed records again, in order (see the module documentation);
    /// returns the keys stored and how many records are left. After a store did not
    /// answer within its retry window, its other records are left untried.
    pub async fn retry_failed(&self, stores: &[Arc<dyn ObjectStore>]) -> (Vec<String>, usize) {
        let failed: Vec<(u64, PathBuf, String)> = self
            .failed
            .lock()
            .iter()
            .map(|(id, failed)| (*id, failed.path.clone(), failed.report.location.clone()))
            .collect();
        let mut stored = Vec::new();
        let mut unreachable = Vec::new();
        for (id, path, location) in failed {
            let Some(store) = stores.iter().find(|s| s.location() == location) else { continue };
            if unreachable.contains(&location) {
                continue;
            }
            let Ok(bytes) = tokio::fs::read(&path).await else { continue };
            let Some((header, data)) = format::parse(&bytes).records.into_iter().next() else { continue };
            let contents = match self.contents(&header, &data) {
                Ok(contents) => contents,
                Err(error) => {
                    tracing::warn!(key = header.key, "a failed file cannot be retried: {error}");
                    continue;
                }
            };
            let pending = PendingFile::from_record(header, contents);
            match self.replay_one(store, &pending).await {
                Ok(outcome) => {
                    tracing::info!(key = pending.key, "a failed file retried: {outcome:?}");
                    stored.push((id, pending.key));
                }
                Err(error) => {
                    tracing::warn!(key = pending.key, "a failed file retried: {error}");
                    if error.is_transient() {
                        unreachable.push(location);
                    }
                    if let Some(failed) = self.failed.lock().get_mut(&id) {
                        failed.report.error = error.to_string();
                    }
                }
            }
        }
        self.remove_failed(&stored.iter().map(|(id, _)| *id).collect::<Vec<_>>());
        (stored.into_iter().map(|(_, key)| key).collect(), self.failed.lock().len())
    }
}

/// Replaces a log file by one holding only `records` (the atomic rename keeps either).
fn rewrite(path: &Path, records: &[(Header, Bytes)]) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for (header, data) in records {
        bytes.extend(format::encode(header, data)?);
    }
    let temporary = path.with_extension("rewrite");
    let mut file = File::create(&temporary)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    File::open(path.parent().unwrap_or(Path::new(".")))?.sync_all()
}

/// Whether the object `key` (version `etag`) holds exactly `contents` (of its size): a
/// large file compared a part's worth at a time.
async fn holds(
    store: &dyn ObjectStore,
    key: &str,
    etag: Option<&str>,
    contents: &Contents,
) -> Result<bool, StoreError> {
    use std::os::unix::fs::FileExt;
    match contents {
        Contents::Memory(data) => Ok(store.get_range(key, 0..data.len() as u64, etag).await? == *data),
        Contents::File { file, len } => {
            const STEP: u64 = 8 << 20;
            let mut at = 0;
            while at < *len {
                let end = (at + STEP).min(*len);
                let stored = store.get_range(key, at..end, etag).await?;
                let mut local = vec![0; (end - at) as usize];
                file.read_exact_at(&mut local, at).map_err(|error| StoreError::Other {
                    message: format!("reading a write-back data file: {error}"),
                    request_id: None,
                })?;
                if stored != local {
                    return Ok(false);
                }
                at = end;
            }
            Ok(true)
        }
    }
}

/// Stores `contents` as the object `key` where `condition` holds: one PUT from memory,
/// or from the file (in parts above one).
async fn put(
    store: &Arc<dyn ObjectStore>,
    journal: Option<&Journal>,
    key: &str,
    file: &PendingFile,
    condition: &WriteCondition,
) -> Result<Option<String>, StoreError> {
    match &file.data {
        Contents::Memory(data) => store.put(key, data.clone(), &file.metadata, condition).await,
        Contents::File { file: local, len } => {
            // Parts in flight are bounded by the upload's own concurrency; a replay runs
            // before the mount has a memory budget to share.
            let memory = MemoryLimiter::new(u64::MAX);
            store_file(store, journal, key, local, *len, &file.metadata, condition, &memory).await
        }
    }
}

/// Whether the object at `key` holds `file` already: its size and bytes (and for an empty
/// object, its metadata: a marker's attributes).
async fn already_there(store: &dyn ObjectStore, info: &ObjectInfo, file: &PendingFile) -> Result<bool, StoreError> {
    let len = file.data.len();
    let same_metadata = len > 0 || info.metadata.as_deref().is_some_and(|m| m.user == file.metadata.user);
    Ok(same_metadata
        && info.size == len
        && (len == 0 || holds(store, &file.key, info.etag.as_deref(), &file.data).await?))
}

/// Stores `file` where nothing changed since it was closed; under a `.conflict-TIME` key
/// where another client wrote meanwhile; nothing where its bytes are stored already. The
/// write itself is conditional on what the HEAD saw (`If-None-Match: *` on a free key,
/// `If-Match` on the replaced version), so another client's write between the HEAD and
/// the PUT is kept too.
async fn replay(
    store: &Arc<dyn ObjectStore>,
    journal: Option<&Journal>,
    file: &PendingFile,
) -> Result<Replayed, StoreError> {
    if file.delete {
        return replay_delete(&**store, file).await;
    }
    let key = file.key.as_str();
    let current = match store.head(key).await {
        Ok(info) => Some(info),
        Err(StoreError::NotFound) => None,
        Err(error) => return Err(error),
    };
    if let Some(info) = &current {
        if already_there(&**store, info, file).await? {
            return Ok(Replayed::AlreadyThere);
        }
    }
    let over_what = |info: &ObjectInfo| info.etag.clone().map_or(WriteCondition::Any, WriteCondition::Replaces);
    let condition = match &current {
        None => Some(WriteCondition::Absent), // created by nobody else, or the replaced object deleted
        // A marker's attributes go over any marker: every empty marker has the same bytes.
        Some(info) if file.is_marker() => (info.size == 0).then(|| over_what(info)),
        Some(info) => (!file.create_only && info.etag.is_some() && info.etag == file.replaces).then(|| over_what(info)),
    };
    if let Some(condition) = condition {
        let mut outcome = put(store, journal, key, file, &condition).await;
        if matches!(outcome, Err(StoreError::NotFound)) && matches!(condition, WriteCondition::Replaces(_)) {
            // The replaced version was deleted between the HEAD and the PUT: the key is free.
            outcome = put(store, journal, key, file, &WriteCondition::Absent).await;
        }
        match outcome {
            Ok(_) => return Ok(Replayed::Stored),
            // Written a moment ago: another client's object, or ours (an attempt whose
            // answer was lost).
            Err(StoreError::AlreadyExists | StoreError::Changed) => match store.head(key).await {
                Ok(info) if already_there(&**store, &info, file).await? => return Ok(Replayed::AlreadyThere),
                Ok(_) | Err(StoreError::NotFound) => {}
                Err(error) => return Err(error),
            },
            Err(error) => return Err(error),
        }
    }
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    for attempt in 0..100 {
        let other = match attempt {
            0 => format!("{key}.conflict-{stamp}"),
            n => format!("{key}.conflict-{stamp}-{n}"),
        };
        match put(store, journal, &other, file, &WriteCondition::Absent).await {
            Ok(_) => return Ok(Replayed::Conflict(other)),
            Err(StoreError::AlreadyExists) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(StoreError::AlreadyExists)
}

/// Deletes `file.key` where it still holds the object the mount deleted (the same ETag,
/// also at the moment of the DELETE, or any object where the ETag was not known);
/// another client's newer object stays.
async fn replay_delete(store: &dyn ObjectStore, file: &PendingFile) -> Result<Replayed, StoreError> {
    let current = match store.head(&file.key).await {
        Ok(info) => info,
        Err(StoreError::NotFound) => return Ok(Replayed::AlreadyThere),
        Err(error) => return Err(error),
    };
    match &file.replaces {
        Some(etag) if current.etag.as_ref() != Some(etag) => Ok(Replayed::ChangedSince),
        Some(etag) => match store.delete_if_match(&file.key, etag).await {
            Ok(()) => Ok(Replayed::Stored),
            Err(StoreError::Changed) => Ok(Replayed::ChangedSince),
            Err(error) => Err(error),
        },
        None => store.delete(&file.key).await.map(|()| Replayed::Stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;
    use bucketfs_client::store::Metadata;

    fn pending(key: &str, data: &[u8], create_only: bool, replaces: Option<String>) -> PendingFile {
        let data = Bytes::copy_from_slice(data);
        PendingFile { key: key.into(), data: Contents::Memory(data), create_only, replaces, ..PendingFile::default() }
    }

    /// A replay stores where nothing changed, keeps another client's newer object (ours
    /// goes to a `.conflict-` key), and does nothing where the bytes are there already.
    #[tokio::test]
    async fn a_replay_never_overwrites_another_clients_object() {
        let store = Arc::new(MemoryStore::with_keys([
            ("replaced".to_owned(), b"old".to_vec()),
            ("theirs".to_owned(), b"v1".to_vec()),
        ]));
        let as_dyn: Arc<dyn ObjectStore> = store.clone();
        let old = store.head("replaced").await.expect("head").etag;
        let v1 = store.head("theirs").await.expect("head").etag;
        store.put("theirs", b"v2 by someone else".to_vec());
        assert_eq!(replay(&as_dyn, None, &pending("new", b"ours", true, None)).await.expect("new"), Replayed::Stored);
        assert_eq!(
            replay(&as_dyn, None, &pending("replaced", b"ours", false, old)).await.expect("replaced"),
            Replayed::Stored
        );
        assert_eq!(
            replay(&as_dyn, None, &pending("new", b"ours", true, None)).await.expect("again"),
            Replayed::AlreadyThere
        );
        let Replayed::Conflict(other) =
            replay(&as_dyn, None, &pending("theirs", b"ours", false, v1)).await.expect("theirs")
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

    /// Another client writes the key after the replay's HEAD and before its PUT or
    /// DELETE: the write is conditional on the version the HEAD saw, so their object stays
    /// (ours becomes the conflict copy; the delete is not done).
    #[tokio::test]
    async fn a_write_between_the_head_and_the_replay_is_kept() {
        let store = Arc::new(MemoryStore::with_keys([
            ("replaced".to_owned(), b"old".to_vec()),
            ("deleted".to_owned(), b"old".to_vec()),
        ]));
        let as_dyn: Arc<dyn ObjectStore> = store.clone();
        let someone_writes = |key: &'static str| -> bucketfs_client::store::memory::AnotherClientsWrite {
            Box::new(move |store: &MemoryStore| store.put(key, b"theirs, just now".to_vec()))
        };
        let old = store.head("replaced").await.expect("head").etag;
        *store.after_head.lock() = Some(someone_writes("replaced"));
        let replayed = replay(&as_dyn, None, &pending("replaced", b"ours", false, old)).await.expect("replayed");
        assert!(
            matches!(&replayed, Replayed::Conflict(other) if other.starts_with("replaced.conflict-")),
            "{replayed:?}"
        );
        assert_eq!(&store.get_range("replaced", 0..16, None).await.expect("get")[..], b"theirs, just now");

        let old = store.head("deleted").await.expect("head").etag;
        *store.after_head.lock() = Some(someone_writes("deleted"));
        let delete = PendingFile::delete("deleted".into(), old);
        assert_eq!(replay(&as_dyn, None, &delete).await.expect("replayed"), Replayed::ChangedSince);
        assert_eq!(&store.get_range("deleted", 0..16, None).await.expect("get")[..], b"theirs, just now");
    }

    /// A logged directory marker goes over the marker there (every marker has the same
    /// empty bytes: its attributes tell them apart), and is not stored again once there.
    #[tokio::test]
    async fn a_replayed_marker_writes_its_attributes_over_the_marker() {
        let store = Arc::new(MemoryStore::with_keys([("d/".to_owned(), Vec::new())]));
        let as_dyn: Arc<dyn ObjectStore> = store.clone();
        let mut metadata = Metadata::default();
        metadata.user.insert("mode".into(), "16877".into());
        let marker = PendingFile::marker("d/".into(), metadata.clone());
        assert_eq!(replay(&as_dyn, None, &marker).await.expect("over the marker"), Replayed::Stored);
        let stored = store.head("d/").await.expect("head").metadata.expect("metadata");
        assert_eq!(stored.user, metadata.user);
        assert_eq!(replay(&as_dyn, None, &marker).await.expect("again"), Replayed::AlreadyThere);
        assert_eq!(
            replay(&as_dyn, None, &PendingFile::marker("e/".into(), metadata)).await.expect("new"),
            Replayed::Stored
        );
    }

    /// A dead daemon's log is stored by a replay, once; a log another mount is replaying
    /// (locked) is left alone.
    #[tokio::test]
    async fn a_dead_daemons_log_is_replayed_once_and_not_while_locked() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        let header = Header {
            id: 0,
            len: 4,
            location: "memory".into(),
            key: "k".into(),
            create_only: true,
            replaces: None,
            metadata: Metadata::default(),
            delete: false,
            crc: None,
            data_file: None,
        };
        // As written before records had checksums: still replayed.
        let mut record = serde_json::to_vec(&format::Line::Record(header)).expect("json");
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

    /// A daemon `/proc` cannot see (another PID namespace on one hostPath) holds the lock
    /// of its mark: its segment is never replayed, however dead its PID looks, until the
    /// lock is let go.
    #[tokio::test]
    async fn a_segment_whose_daemon_holds_its_mark_is_never_replayed() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        let daemon = format!("{}-1-1", "0".repeat(32)); // /proc: no such daemon
        let path = dead_log(dir.path(), &format!("{daemon}.0.log"), &[header(0, "memory", "k", b"k")], b"");
        let marks = dir.path().join("bucketfs-running");
        crate::private_dir::ensure(&marks).expect("marks");
        let mark = File::create(marks.join(&daemon)).expect("mark");
        let running = nix::fcntl::Flock::lock(mark, nix::fcntl::FlockArg::LockExclusive).expect("lock");
        let store = Arc::new(MemoryStore::default());
        let stores: Vec<Arc<dyn ObjectStore>> = vec![store.clone()];
        assert_eq!(log.replay(&stores).await, 0, "its daemon runs");
        assert!(store.head("k").await.is_err() && path.exists(), "nothing stored, the segment kept");
        drop(running);
        assert_eq!(log.replay(&stores).await, 1, "stopped: replayed");
        assert_eq!(&store.get_range("k", 0..1, None).await.expect("stored")[..], b"k");
    }

    fn header(id: u64, location: &str, key: &str, data: &[u8]) -> Header {
        let (location, key) = (location.into(), key.into());
        let metadata = Metadata::default();
        Header {
            id,
            len: data.len() as u64,
            location,
            key,
            create_only: true,
            replaces: None,
            metadata,
            delete: false,
            crc: None,
            data_file: None,
        }
    }

    /// Writes log file `name` of a stopped daemon with these records (and `tail` after).
    fn dead_log(dir: &Path, name: &str, records: &[Header], tail: &[u8]) -> PathBuf {
        let mut bytes = Vec::new();
        for header in records {
            bytes.extend(format::encode(header, header.key.as_bytes()).expect("encode"));
        }
        bytes.extend_from_slice(tail);
        let path = dir.join("bucketfs-write-back").join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    }

    /// A stopped daemon's records are stored in the order of its closes across its
    /// segments and failed files, each once (a failed record still in its segment too);
    /// a record of a bucket this mount does not mount stays, alone, in its file.
    #[tokio::test]
    async fn records_replay_in_close_order_across_files_and_others_stay() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        let (first, second, third) = (
            header(0, "memory", "first", b"first"),
            header(1, "memory", "second", b"second"),
            header(2, "memory", "third", b"third"),
        );
        let elsewhere = header(3, "s3://other", "theirs", b"theirs");
        dead_log(dir.path(), "0-1-1.2.log", &[first, second.clone()], b"");
        let failed = format::line(&format::Line::Failed { failed: 1, error: "refused".into() }).expect("line");
        dead_log(dir.path(), "0-1-1.failed-1.log", &[second], &failed);
        let kept = dead_log(dir.path(), "0-1-1.0.log", &[third, elsewhere], b"");
        let store = Arc::new(MemoryStore::default());
        let stores: Vec<Arc<dyn ObjectStore>> = vec![store.clone()];
        assert_eq!(log.replay(&stores).await, 3);
        for (key, version) in [("first", 0), ("second", 1), ("third", 2)] {
            let etag = store.head(key).await.expect("stored").etag;
            assert_eq!(etag.as_deref(), Some(format!("\"v{version}\"").as_str()), "{key} stored in close order");
        }
        let files: Vec<_> = std::fs::read_dir(dir.path().join("bucketfs-write-back"))
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(files, std::slice::from_ref(&kept), "only the file with another bucket's record stays");
        let left = format::parse(&std::fs::read(&kept).expect("read")).records;
        assert_eq!(left.iter().map(|(h, _)| h.key.as_str()).collect::<Vec<_>>(), ["theirs"]);
        assert_eq!(log.replay(&stores).await, 0);
    }

    /// A mount replays only what it shows: a record under another prefix of the same
    /// bucket (another volume, with other credentials) stays for a mount of that prefix.
    #[tokio::test]
    async fn a_record_under_another_prefix_stays_for_the_mount_of_that_prefix() {
        let dir = tempfile::tempdir().expect("dir");
        let (mine, theirs) = (header(0, "memory", "mine/a", b"mine/a"), header(1, "memory", "theirs/b", b"theirs/b"));
        let log = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        dead_log(dir.path(), "0-1-1.0.log", &[mine, theirs], b"");
        let store = Arc::new(MemoryStore::default());
        let stores: Vec<Arc<dyn ObjectStore>> = vec![store.clone()];
        log.replay_only(vec![("memory".into(), "mine/".into())]);
        assert_eq!(log.replay(&stores).await, 1);
        assert!(store.head("theirs/b").await.is_err(), "another prefix's record is not stored");
        let theirs = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        theirs.replay_only(vec![("memory".into(), "theirs/".into())]);
        assert_eq!(theirs.replay(&stores).await, 1);
        assert_eq!(&store.get_range("theirs/b", 0..8, None).await.expect("stored")[..], b"theirs/b");
    }

    /// A stopped daemon's record of a file over one part is stored from its data file,
    /// once; one whose data file does not match its checksum (a power cut before its sync)
    /// is left out, stores nothing; both data files are deleted with the logs, and so is
    /// one no record names (the daemon killed while copying it).
    #[tokio::test]
    async fn a_large_record_is_stored_from_its_data_file_and_a_torn_one_left_out() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        let bytes: Vec<u8> = (0..(11 << 20) + 3).map(|i: u32| (i % 253) as u8).collect();
        let data_file = |name: &str, content: &[u8], crc: u32| {
            std::fs::write(dir.path().join("bucketfs-write-back").join(name), content).expect("data file");
            Some(format::DataFile { name: name.into(), len: content.len() as u64, crc })
        };
        let crc = crc32fast::hash(&bytes);
        let mut large = header(0, "memory", "large", b"");
        large.data_file = data_file("0-1-1.data-0.bytes", &bytes, crc);
        let mut torn = header(1, "memory", "torn", b"");
        torn.data_file = data_file("0-1-1.data-1.bytes", &bytes[..bytes.len() / 2], crc32fast::hash(b"other"));
        let mut records = Vec::new();
        for header in [large, torn] {
            records.extend(format::encode(&header, b"").expect("encode"));
        }
        std::fs::write(dir.path().join("bucketfs-write-back").join("0-1-1.0.log"), records).expect("log");
        data_file("0-1-1.data-2.bytes", b"a copy cut short", 0);
        let store = Arc::new(MemoryStore::default());
        let stores: Vec<Arc<dyn ObjectStore>> = vec![store.clone()];
        assert_eq!(log.replay(&stores).await, 1);
        let stored = store.get_range("large", 0..bytes.len() as u64, None).await.expect("stored");
        assert!(stored == bytes, "the bytes of the data file");
        assert!(store.head("torn").await.is_err(), "a torn record stores nothing");
        assert_eq!(std::fs::read_dir(dir.path().join("bucketfs-write-back")).expect("dir").count(), 0);
    }

    /// Records the store does not take are kept as failed records of this mount (after
    /// one unanswered request, the rest of that store untried), reported, and stored by
    /// a retry once the store answers; the stopped daemon's files are gone.
    #[tokio::test]
    async fn refused_records_are_taken_over_as_failed_and_retried() {
        let dir = tempfile::tempdir().expect("dir");
        let log = WriteBackLog::open(dir.path(), 1 << 30, std::time::Duration::ZERO).expect("open");
        dead_log(dir.path(), "0-1-1.0.log", &[header(0, "memory", "a", b"a"), header(1, "memory", "b", b"b")], b"");
        let store = Arc::new(MemoryStore::default());
        store.away.store(true, std::sync::atomic::Ordering::Relaxed);
        let stores: Vec<Arc<dyn ObjectStore>> = vec![store.clone()];
        assert_eq!(log.replay(&stores).await, 0);
        let failed = log.failed();
        assert_eq!(failed.iter().map(|f| f.key.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(failed[0].error.contains("away"), "{failed:?}");
        assert!(failed[1].error.starts_with("not tried"), "{failed:?}");
        assert!(log.usage().0 > 0);
        assert_eq!(log.retry_failed(&stores).await, (vec![], 2), "still away");
        store.away.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(log.retry_failed(&stores).await, (vec!["a".to_owned(), "b".to_owned()], 0));
        assert_eq!(&store.get_range("b", 0..1, None).await.expect("stored")[..], b"b");
        assert!(log.failed().is_empty());
        assert_eq!(std::fs::read_dir(dir.path().join("bucketfs-write-back")).expect("dir").count(), 0);
    }
}
