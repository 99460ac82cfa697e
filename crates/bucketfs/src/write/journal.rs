//! A record of the multipart uploads in progress, so that the uploads a killed daemon
//! left unfinished are aborted by the next mount of the same bucket (S3 keeps, and
//! bills, unfinished uploads until they are aborted).
//!
//! One small file per upload under `<cache-dir>/bucketfs-uploads/`, holding the store,
//! key and upload id (percent-encoded, one per line), written and synced before the
//! upload is used (a power cut cannot lose it), and removed when the upload is completed
//! or aborted ([`super::multipart::MultipartUpload`] does both). Its name says which
//! daemon wrote it: the boot, the pid and the pid's start time, so a pid reused by
//! another process (or after a reboot) cannot pass for the daemon that is gone. A mount
//! aborts the uploads whose daemon is gone, for the buckets it mounts; others stay for a
//! mount of their bucket.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use percent_encoding::{percent_decode_str, utf8_percent_encode, NON_ALPHANUMERIC};

use crate::store::{ObjectStore, StoreError};

#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    next: AtomicU64,
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
pub(super) fn this_daemon() -> String {
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
pub(super) fn daemon_alive(name: &str) -> bool {
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
        crate::private_dir::ensure(&dir)?;
        Ok(Self { dir, next: AtomicU64::new(0) })
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

#[cfg(test)]
mod tests {
    use super::*;

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
