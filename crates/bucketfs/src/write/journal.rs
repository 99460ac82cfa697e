//! A record of the multipart uploads in progress, so that the uploads a killed daemon
//! left unfinished are aborted by the next mount of the same bucket (S3 keeps, and
//! bills, unfinished uploads until they are aborted); and of the files `--write-back`
//! closed before storing them, so that the next mount stores what a killed daemon could
//! not ([`Journal::record_write_back`]).
//!
//! One small file per upload under `<cache-dir>/bucketfs-uploads/`, holding the store,
//! key and upload id (percent-encoded, one per line), written and synced before the
//! upload is used (a power cut cannot lose it), and removed when the upload is completed
//! or aborted ([`super::multipart::MultipartUpload`] does both). Its name says which
//! daemon wrote it: the boot, the pid and the pid's start time, so a pid reused by
//! another process (or after a reboot) cannot pass for the daemon that is gone. A mount
//! aborts the uploads whose daemon is gone, for the buckets it mounts; others stay for a
//! mount of their bucket.
//!
//! A file closed with `--write-back` is one file under `<cache-dir>/bucketfs-write-back/`
//! (same naming): a JSON line (store, key, whether it is new or which ETag it replaces,
//! metadata), then the content; written under a temporary name, synced and renamed, so a
//! record is whole or absent. The next mount of the bucket stores it (see
//! [`Journal::replay_write_back`]): never over an object another client wrote meanwhile
//! (that one stays, and the file goes to `KEY.conflict-TIME`), and not twice (a replay
//! that finds the same bytes stored ends there).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

use crate::store::{Metadata, ObjectStore, StoreError};

#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    write_back_dir: PathBuf,
    next: AtomicU64,
}

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

/// The first line of a write-back record.
#[derive(serde::Serialize, serde::Deserialize)]
struct WriteBackHeader {
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

/// One recorded upload; dropping it removes the record.
pub struct Entry {
    path: Option<PathBuf>,
}

impl Entry {
    /// The upload is still open in the store: leave the record for the next mount.
    pub fn keep(mut self) {
        self.path = None;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Who this daemon is, as record names say it: `BOOT-PID-START`.
fn this_daemon() -> String {
    let pid = std::process::id();
    format!("{}-{pid}-{}", boot_id().unwrap_or_default(), start_time(pid).unwrap_or_default())
}

fn boot_id() -> Option<String> {
    Some(std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?.trim().replace('-', ""))
}

/// When process `pid` started (clock ticks since boot: field 22 of /proc/PID/stat).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the daemon named `BOOT-PID-START` still runs.
fn daemon_alive(name: &str) -> bool {
    let mut fields = name.split('-');
    let (Some(boot), Some(pid), Some(start)) = (fields.next(), fields.next(), fields.next()) else {
        return true; // not ours to judge
    };
    let Ok(pid) = pid.parse::<u32>() else { return true };
    boot_id().as_deref() == Some(boot) && start_time(pid).map(|t| t.to_string()).as_deref() == Some(start)
}

impl Journal {
    /// The journal under `cache_dir` (created if needed).
    pub fn open(cache_dir: &Path) -> std::io::Result<Self> {
        let dir = cache_dir.join("bucketfs-uploads");
        std::fs::create_dir_all(&dir)?;
        let write_back_dir = cache_dir.join("bucketfs-write-back");
        std::fs::create_dir_all(&write_back_dir)?;
        Ok(Self { dir, write_back_dir, next: AtomicU64::new(0) })
    }

    /// Records an upload started in `store`, synced to disk; `None` (and a warning) if it
    /// cannot be written.
    pub fn record(&self, store: &dyn ObjectStore, key: &str, upload_id: &str) -> Option<Entry> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{n}", this_daemon()));
        let text = [store.location().as_str(), key, upload_id]
            .iter()
            .map(|field| utf8_percent_encode(field, NON_ALPHANUMERIC).to_string() + "\n")
            .collect::<String>();
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&path)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            // The new name must survive a power cut too.
            std::fs::File::open(&self.dir)?.sync_all()
        };
        match write() {
            Ok(()) => Some(Entry { path: Some(path) }),
            Err(error) => {
                let _ = std::fs::remove_file(&path);
                tracing::warn!("cannot record upload {upload_id} of {key} in {}: {error}", self.dir.display());
                None
            }
        }
    }

    /// Records `file`, to be stored in `store`, synced to disk (content and name) before
    /// this returns; `None` (and a warning) if it cannot be written.
    pub fn record_write_back(&self, store: &dyn ObjectStore, file: &PendingFile) -> Option<Entry> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{n}", this_daemon());
        let (temporary, path) = (self.write_back_dir.join(format!(".{name}")), self.write_back_dir.join(&name));
        let header = WriteBackHeader {
            location: store.location(),
            key: file.key.clone(),
            create_only: file.create_only,
            replaces: file.replaces.clone(),
            metadata: file.metadata.clone(),
        };
        let write = || -> std::io::Result<()> {
            let mut out = std::fs::File::create(&temporary)?;
            serde_json::to_writer(&mut out, &header)?;
            out.write_all(b"\n")?;
            out.write_all(&file.data)?;
            out.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            std::fs::File::open(&self.write_back_dir)?.sync_all()
        };
        match write() {
            Ok(()) => Some(Entry { path: Some(path) }),
            Err(error) => {
                let _ = std::fs::remove_file(&temporary);
                let dir = self.write_back_dir.display();
                tracing::warn!(key = file.key, "cannot record the closed file in {dir}: {error}");
                None
            }
        }
    }

    /// Stores the files that `--write-back` daemons no longer running closed and had not
    /// stored, in these stores (see the module documentation); returns how many. A record
    /// whose store cannot be reached stays for the next mount.
    pub async fn replay_write_back(&self, stores: &[Arc<dyn ObjectStore>]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.write_back_dir) else { return 0 };
        let mut replayed = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else { continue };
            if name.starts_with('.') || daemon_alive(&name) {
                continue;
            }
            let Some((header, data)) = read_write_back(&path) else {
                tracing::warn!("unreadable write-back record {}: left as it is", path.display());
                continue;
            };
            let Some(store) = stores.iter().find(|s| s.location() == header.location) else { continue };
            let file = PendingFile {
                key: header.key,
                data,
                metadata: header.metadata,
                create_only: header.create_only,
                replaces: header.replaces,
            };
            match replay(&**store, &file).await {
                Ok(Replayed::Conflict(other)) => {
                    tracing::warn!(
                        key = file.key,
                        "a file closed before daemon {name} stopped was changed in the store since: \
                         the store's object stays, the file is stored as {other}"
                    );
                }
                Ok(outcome) => {
                    tracing::info!(key = file.key, "a file closed before daemon {name} stopped: {outcome:?}")
                }
                Err(error) => {
                    tracing::warn!(
                        key = file.key,
                        "could not store a file closed before daemon {name} stopped: {error}"
                    );
                    continue;
                }
            }
            replayed += 1;
            let _ = std::fs::remove_file(&path);
        }
        replayed
    }

    /// Aborts the uploads recorded by daemons no longer running, in these stores; returns
    /// how many were aborted.
    pub async fn recover(&self, stores: &[Arc<dyn ObjectStore>]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut aborted = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else { continue };
            if daemon_alive(&name) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let fields: Vec<String> =
                text.lines().map(|l| percent_decode_str(l).decode_utf8_lossy().into_owned()).collect();
            let [location, key, upload_id] = fields.as_slice() else { continue };
            let Some(store) = stores.iter().find(|s| s.location() == *location) else { continue };
            match store.abort_upload(key, upload_id).await {
                Ok(()) | Err(StoreError::NotFound) => {
                    tracing::info!(key, "aborted upload {upload_id} left by a daemon that stopped ({name})");
                    aborted += 1;
                    let _ = std::fs::remove_file(&path);
                }
                Err(error) => tracing::warn!(key, "could not abort upload {upload_id} left by {name}: {error}"),
            }
        }
        aborted
    }
}

fn read_write_back(path: &Path) -> Option<(WriteBackHeader, Bytes)> {
    let bytes = std::fs::read(path).ok()?;
    let end = bytes.iter().position(|&b| b == b'\n')?;
    let header = serde_json::from_slice(&bytes[..end]).ok()?;
    Some((header, Bytes::copy_from_slice(&bytes[end + 1..])))
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
        if info.size == len && (len == 0 || store.get_range(key, 0..len, info.etag.as_deref()).await? == file.data) {
            return Ok(Replayed::AlreadyThere);
        }
    }
    let unchanged = match &current {
        None => true, // created by nobody else, or the replaced object deleted: ours goes there
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
        for (key, content) in
            [("new", &b"ours"[..]), ("replaced", b"ours"), ("theirs", b"v2 by someone else"), (&other, b"ours")]
        {
            let len = content.len() as u64;
            assert_eq!(&store.get_range(key, 0..len, None).await.expect("get")[..], content, "{key}");
        }
    }

    #[test]
    fn this_daemon_is_alive_and_a_reused_pid_is_not() {
        let me = this_daemon();
        assert!(daemon_alive(&me), "{me}");
        let mut fields: Vec<String> = me.split('-').map(str::to_owned).collect();
        fields[2] = (fields[2].parse::<u64>().expect("start time") + 1).to_string();
        assert!(!daemon_alive(&fields.join("-")), "same pid, another start time");
        fields = me.split('-').map(str::to_owned).collect();
        fields[0] = "0".repeat(32);
        assert!(!daemon_alive(&fields.join("-")), "same pid and start time, another boot");
    }
}
