//! A record of the multipart uploads in progress, so that the uploads a killed daemon
//! left unfinished are aborted by the next mount of the same bucket (S3 keeps, and
//! bills, unfinished uploads until they are aborted).
//!
//! One small file per upload under `<cache-dir>/bucketfs-uploads/`, holding the store,
//! key and upload id (percent-encoded, one per line), and removed when the upload is
//! completed or aborted ([`super::multipart::MultipartUpload`] does both). It is written
//! and synced (a power cut cannot lose it) *before* `CreateMultipartUpload` is sent,
//! with no id yet and the time instead: the store creates the upload before its answer
//! arrives, and a daemon killed in between leaves an upload no record could name. For
//! such a record the next mount aborts the uploads of its key that the store started
//! around that time ([`STARTED_WITHIN`]). Once the id is known it replaces the time. Its name says which
//! daemon wrote it: the boot, the pid and the pid's start time, so a pid reused by
//! another process (or after a reboot) cannot pass for the daemon that is gone. A mount
//! aborts the uploads whose daemon is gone, for the buckets it mounts; others stay for a
//! mount of their bucket.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

use super::liveness::{HeldMark, Liveness};
use bucketfs_client::store::{ObjectStore, StoreError};

/// For a record made before its upload's id came back: the uploads of its key started
/// this long after the record (by the store's clock) are taken to be its own. A start is
/// retried within `--retry-window` and each attempt within twice the read timeout.
pub const STARTED_WITHIN: Duration = Duration::from_secs(300);

/// ... and this long before it: the store's clock may be behind this machine's.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    next: AtomicU64,
    liveness: Liveness,
    /// This daemon's mark, held while the journal is (the mount's life).
    _running: Option<HeldMark>,
}

/// One recorded upload; dropping it removes the record.
pub struct Entry {
    path: Option<PathBuf>,
    dir: PathBuf,
    location: String,
    key: String,
}

impl Entry {
    /// The upload is still open in the store: leave the record for the next mount.
    pub fn keep(mut self) {
        self.path = None;
    }

    /// The store answered with the upload's id: the record names it (replaced in one
    /// rename; if that fails, the record made before the start still covers the upload).
    pub fn started(&mut self, upload_id: &str) {
        let Some(path) = &self.path else { return };
        let fresh = path.with_extension("new");
        let write = || -> std::io::Result<()> {
            write_synced(&fresh, &record_text(&[&self.location, &self.key, upload_id]))?;
            std::fs::rename(&fresh, path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        if let Err(error) = write() {
            let _ = std::fs::remove_file(&fresh);
            tracing::warn!(key = self.key, "cannot record upload {upload_id} in {}: {error}", self.dir.display());
        }
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
pub fn this_daemon() -> String {
    let pid = std::process::id();
    let start = start_time(pid).map(|(time, _)| time).unwrap_or_default();
    format!("{}-{pid}-{start}", boot_id().unwrap_or_default())
}

fn boot_id() -> Option<String> {
    Some(std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?.trim().replace('-', ""))
}

/// When process `pid` started (clock ticks since boot: field 22 of /proc/PID/stat), and
/// whether it has exited (a zombie, or dead, not reaped yet by its parent).
fn start_time(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after its end.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let exited = matches!(fields.next()?, "Z" | "X" | "x");
    Some((fields.nth(18)?.parse().ok()?, exited))
}

/// Whether the daemon named `BOOT-PID-START` still runs. A daemon killed and not reaped
/// yet (a zombie: its parent has not waited for it) runs no more.
pub fn daemon_alive(name: &str) -> bool {
    let mut fields = name.split('-');
    let (Some(boot), Some(pid), Some(start)) = (fields.next(), fields.next(), fields.next()) else {
        return true; // not ours to judge
    };
    let Ok(pid) = pid.parse::<u32>() else { return true };
    let running = start_time(pid).filter(|(_, exited)| !exited).map(|(time, _)| time.to_string());
    boot_id().as_deref() == Some(boot) && running.as_deref() == Some(start)
}

/// The daemons that left records in the journal: `BOOT-PID-START` of each `BOOT-PID-START-N`.
fn daemons_in(dir: &Path) -> std::collections::HashSet<String> {
    let names = std::fs::read_dir(dir).into_iter().flatten().flatten();
    names.filter_map(|entry| Some(entry.file_name().to_str()?.rsplit_once('-')?.0.to_owned())).collect()
}

impl Journal {
    /// The journal under `cache_dir` (created if needed).
    pub fn open(cache_dir: &Path) -> std::io::Result<Self> {
        let dir = cache_dir.join("bucketfs-uploads");
        crate::private_dir::ensure(&dir)?;
        Ok(Self { dir, next: AtomicU64::new(0), liveness: Liveness::new(cache_dir), _running: None })
    }

    /// The journal, with this daemon marked as running in its cache directory
    /// (`super::liveness`) for as long as the journal is held: what a mount does. Where
    /// the mark cannot be made, the daemon runs without one (with a warning), and others
    /// judge from `/proc` whether it runs.
    pub fn marked_running(mut self) -> Self {
        match self.liveness.hold() {
            Ok(mark) => self._running = Some(mark),
            Err(error) => tracing::warn!("cannot mark this daemon as running beside {}: {error}", self.dir.display()),
        }
        self
    }

    /// Who judges whether the daemons with records here run.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// Records that an upload of `key` is about to start in `store`, synced to disk, before
    /// it is asked for; [`Entry::started`] adds its id. `None` (and a warning) if it cannot
    /// be written.
    pub fn intend(&self, store: &dyn ObjectStore, key: &str) -> Option<Entry> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{n}", this_daemon()));
        let location = store.location();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis().to_string();
        let write = || -> std::io::Result<()> {
            write_synced(&path, &record_text(&[&location, key, "", &now]))?;
            // The new name must survive a power cut too.
            std::fs::File::open(&self.dir)?.sync_all()
        };
        match write() {
            Ok(()) => Some(Entry { path: Some(path), dir: self.dir.clone(), location, key: key.to_owned() }),
            Err(error) => {
                let _ = std::fs::remove_file(&path);
                tracing::warn!("cannot record an upload of {key} in {}: {error}", self.dir.display());
                None
            }
        }
    }

    /// The daemons whose uploads are recorded here (this one's too).
    pub fn daemons(&self) -> std::collections::HashSet<String> {
        daemons_in(&self.dir)
    }

    /// Aborts the uploads recorded by daemons no longer running, in these stores; returns
    /// how many were aborted.
    pub async fn recover(&self, stores: &[Arc<dyn ObjectStore>]) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut aborted = 0;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else { continue };
            let Some((daemon, _)) = name.rsplit_once('-') else { continue };
            if self.liveness.runs(daemon) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let fields: Vec<String> =
                text.lines().map(|l| percent_decode_str(l).decode_utf8_lossy().into_owned()).collect();
            let (location, key, upload) = match fields.as_slice() {
                [location, key, id] => (location, key, Recorded::Id(id.clone())),
                [location, key, id, millis] if id.is_empty() => {
                    let Ok(millis) = millis.parse() else { continue };
                    (location, key, Recorded::Intended(UNIX_EPOCH + Duration::from_millis(millis)))
                }
                _ => continue,
            };
            let Some(store) = stores.iter().find(|s| s.location() == *location) else { continue };
            let ids = match upload {
                Recorded::Id(id) => Ok(vec![id]),
                Recorded::Intended(at) => started_around(store.as_ref(), key, at).await,
            };
            let result = match ids {
                Ok(ids) => abort_all(store.as_ref(), key, &ids, &name).await.map(|count| aborted += count),
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => {
                    let _ = std::fs::remove_file(&path);
                }
                Err(error) => tracing::warn!(key, "could not abort the upload left by {name}: {error}"),
            }
        }
        aborted
    }
}

/// What a record knows of its upload.
enum Recorded {
    Id(String),
    /// Only when it was about to start.
    Intended(SystemTime),
}

/// The uploads of `key` the store started around `at` (see [`STARTED_WITHIN`]).
async fn started_around(store: &dyn ObjectStore, key: &str, at: SystemTime) -> Result<Vec<String>, StoreError> {
    let (from, to) = (at - CLOCK_MARGIN, at + STARTED_WITHIN);
    let open = store.open_uploads_of(key).await?;
    let around = open.into_iter().filter(|upload| upload.initiated.is_some_and(|when| from <= when && when <= to));
    Ok(around.map(|upload| upload.id).collect())
}

async fn abort_all(store: &dyn ObjectStore, key: &str, ids: &[String], daemon: &str) -> Result<usize, StoreError> {
    for id in ids {
        match store.abort_upload(key, id).await {
            Ok(()) | Err(StoreError::NotFound) => {
                tracing::info!(key, "aborted upload {id} left by a daemon that stopped ({daemon})")
            }
            Err(error) => return Err(error),
        }
    }
    Ok(ids.len())
}

/// A record's lines, percent-encoded.
fn record_text(fields: &[&str]) -> String {
    fields.iter().map(|field| utf8_percent_encode(field, NON_ALPHANUMERIC).to_string() + "\n").collect()
}

fn write_synced(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;
    use bucketfs_client::store::Metadata;

    /// A record of a daemon that is gone, holding `fields`.
    fn dead_daemons_record(journal: &Journal, n: u32, fields: &[&str]) {
        let dead = format!("{}-1-1-{n}", "0".repeat(32));
        write_synced(&journal.dir.join(dead), &record_text(fields)).expect("write a record");
    }

    fn millis_ago(ago: Duration) -> String {
        (SystemTime::now() - ago).duration_since(UNIX_EPOCH).expect("after 1970").as_millis().to_string()
    }

    /// A daemon killed after asking for an upload and before its id came back left a
    /// record with the time only: the next mount aborts the uploads of that key the store
    /// started around then, and no other (another key's, or one started long after).
    #[test]
    fn an_upload_whose_id_never_came_back_is_aborted_by_its_key_and_time() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = Journal::open(dir.path()).expect("journal");
        let memory = Arc::new(MemoryStore::default());
        let store: Arc<dyn ObjectStore> = memory.clone();
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        runtime.block_on(async {
            let location = store.location();
            let lost = store.start_upload("k", &Metadata::default()).await.expect("start");
            let other_key = store.start_upload("k2", &Metadata::default()).await.expect("start");
            dead_daemons_record(&journal, 0, &[&location, "k", "", &millis_ago(Duration::from_secs(2))]);
            // Another daemon's intent of `k2` long ago: the upload of `k2` now is not its own.
            dead_daemons_record(&journal, 1, &[&location, "k2", "", &millis_ago(Duration::from_secs(3600))]);
            assert_eq!(journal.recover(std::slice::from_ref(&store)).await, 1);
            let open = store.open_uploads_of("k").await.expect("list");
            assert!(open.iter().all(|upload| upload.id != lost), "the upload without a recorded id is aborted");
            let open = store.open_uploads_of("k2").await.expect("list");
            assert_eq!(open.iter().map(|upload| upload.id.as_str()).collect::<Vec<_>>(), [other_key.as_str()]);
        });
        assert_eq!(memory.open_uploads(), 1);
        assert_eq!(std::fs::read_dir(&journal.dir).expect("journal dir").count(), 0, "both records are done");
    }

    /// An upload started through the journal names its id once the store answered; a
    /// record left by a kill then is aborted by that id alone.
    #[test]
    fn a_record_names_its_upload_once_started() {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal = Journal::open(dir.path()).expect("journal");
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::default());
        let mut entry = journal.intend(store.as_ref(), "k").expect("recorded");
        let path = entry.path.clone().expect("a record file");
        let before: Vec<String> = std::fs::read_to_string(&path).expect("read").lines().map(str::to_owned).collect();
        assert_eq!((before.len(), before[2].as_str()), (4, ""), "no id yet, a time instead: {before:?}");
        entry.started("k#7");
        let after = std::fs::read_to_string(&path).expect("read");
        assert_eq!(after.lines().count(), 3);
        assert_eq!(percent_decode_str(after.lines().nth(2).expect("id")).decode_utf8_lossy(), "k#7");
        drop(entry);
        assert!(!path.exists(), "dropping the entry removes the record");
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

    /// A process killed and not yet reaped by its parent (as a supervisor restarting a
    /// daemon may leave it for a moment) is a zombie: it runs no more.
    #[test]
    fn a_killed_process_not_reaped_yet_is_not_alive() {
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("sleep");
        let pid = child.id();
        let (start, _) = start_time(pid).expect("its stat");
        let name = format!("{}-{pid}-{start}", boot_id().expect("boot id"));
        assert!(daemon_alive(&name), "running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
            .expect("kill");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while start_time(pid).is_some_and(|(_, exited)| !exited) {
            assert!(std::time::Instant::now() < deadline, "still running 10 s after SIGKILL");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(start_time(pid).is_some(), "not reaped yet: still in /proc");
        assert!(!daemon_alive(&name), "a zombie is not alive");
        child.wait().expect("reaped");
    }
}
