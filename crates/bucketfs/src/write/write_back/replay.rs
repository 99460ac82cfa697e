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
//! store is away waits one retry window, not one per file. Records of a bucket this mount
//! does not mount stay in their file for a mount of that bucket. A mount replaying a
//! daemon's logs holds a `flock` on each; another mount starting meanwhile leaves them.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use super::format::{self, Header};
use super::{PendingFile, WriteBackLog};
use crate::store::{ObjectStore, StoreError};
use crate::write::journal::daemon_alive;

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

/// The daemon a log file belongs to: `DAEMON.N.log`, `DAEMON.failed-ID.log` (and
/// `DAEMON.log`, as earlier versions named it).
pub(super) fn daemon_of(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?.strip_suffix(".log")?;
    name.split('.').next()
}

impl WriteBackLog {
    /// Stores what the logs of daemons no longer running hold and did not store, in these
    /// stores (see the module documentation); returns how many files.
    pub async fn replay(self: &Arc<Self>, stores: &[Arc<dyn ObjectStore>]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut by_daemon: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for path in entries.flatten().map(|entry| entry.path()) {
            let Some(daemon) = daemon_of(&path) else { continue };
            if daemon != self.daemon && !daemon_alive(daemon) {
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
            let Some(store) = stores.iter().find(|s| s.location() == header.location) else {
                left[file].push((header, data)); // another bucket's: for its mount
                continue;
            };
            let pending = PendingFile::from_record(header.clone(), data.clone());
            let key = &pending.key;
            let outcome = match unreachable.get(&header.location) {
                Some(error) => Err(format!("not tried, the store did not answer: {error}")),
                None => replay(&**store, &pending).await.map_err(|error| {
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
        for (path, left) in paths.iter().zip(left) {
            let result = if left.is_empty() { std::fs::remove_file(path) } else { rewrite(path, &left) };
            if let Err(error) = result {
                tracing::warn!("write-back log {}: {error}", path.display());
            }
        }
        replayed
    }

    /// Keeps a record of a stopped daemon that could not be stored as a failed record of
    /// this one.
    fn take_over_failed(&self, mut header: Header, data: &[u8], error: &str) -> std::io::Result<()> {
        header.id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let path = self.keep_failed_bytes(header.id, format::encode(&header, data)?, error)?;
        self.insert_failed(header.id, path, header, error, None);
        Ok(())
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
            let pending = PendingFile::from_record(header, data);
            match replay(&**store, &pending).await {
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

/// Stores `file` where nothing changed since it was closed; under a `.conflict-TIME` key
/// where another client wrote meanwhile; nothing where its bytes are stored already.
async fn replay(store: &dyn ObjectStore, file: &PendingFile) -> Result<Replayed, StoreError> {
    if file.delete {
        return replay_delete(store, file).await;
    }
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

/// Deletes `file.key` where it still holds the object the mount deleted (the same ETag,
/// or any object where the ETag was not known); another client's newer object stays.
async fn replay_delete(store: &dyn ObjectStore, file: &PendingFile) -> Result<Replayed, StoreError> {
    let current = match store.head(&file.key).await {
        Ok(info) => info,
        Err(StoreError::NotFound) => return Ok(Replayed::AlreadyThere),
        Err(error) => return Err(error),
    };
    if file.replaces.is_some() && current.etag != file.replaces {
        return Ok(Replayed::ChangedSince);
    }
    store.delete(&file.key).await?;
    Ok(Replayed::Stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::Metadata;

    fn pending(key: &str, data: &[u8], create_only: bool, replaces: Option<String>) -> PendingFile {
        let data = Bytes::copy_from_slice(data);
        PendingFile { key: key.into(), data, create_only, replaces, ..PendingFile::default() }
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
