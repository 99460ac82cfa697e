//! A record of the multipart uploads in progress, so that the uploads a killed daemon
//! left unfinished are aborted by the next mount of the same bucket (S3 keeps, and
//! bills, unfinished uploads until they are aborted).
//!
//! One small file per upload under `<cache-dir>/bucketfs-uploads/`, named after the
//! daemon's pid, holding the store, key and upload id (percent-encoded, one per line). It
//! is removed when the upload is completed or aborted. A mount aborts the uploads whose
//! daemon is gone, for the buckets it mounts; others stay for a mount of their bucket.

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
    path: PathBuf,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Journal {
    /// The journal under `cache_dir` (created if needed).
    pub fn open(cache_dir: &Path) -> std::io::Result<Self> {
        let dir = cache_dir.join("bucketfs-uploads");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir, next: AtomicU64::new(0) })
    }

    /// Records an upload started in `store`; `None` (and a warning) if it cannot be written.
    pub fn record(&self, store: &dyn ObjectStore, key: &str, upload_id: &str) -> Option<Entry> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{}-{n}", std::process::id()));
        let text = [store.location().as_str(), key, upload_id]
            .iter()
            .map(|field| utf8_percent_encode(field, NON_ALPHANUMERIC).to_string() + "\n")
            .collect::<String>();
        match std::fs::write(&path, text) {
            Ok(()) => Some(Entry { path }),
            Err(error) => {
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
            let Some(pid) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.split('-').next()?.parse().ok()) else {
                continue;
            };
            if process_alive(pid) {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let fields: Vec<String> =
                text.lines().map(|l| percent_decode_str(l).decode_utf8_lossy().into_owned()).collect();
            let [location, key, upload_id] = fields.as_slice() else { continue };
            let Some(store) = stores.iter().find(|s| s.location() == *location) else { continue };
            match store.abort_upload(key, upload_id).await {
                Ok(()) | Err(StoreError::NotFound) => {
                    tracing::info!(key, "aborted upload {upload_id} left by a daemon that stopped (pid {pid})");
                    aborted += 1;
                    let _ = std::fs::remove_file(&path);
                }
                Err(error) => tracing::warn!(key, "could not abort upload {upload_id} left by pid {pid}: {error}"),
            }
        }
        aborted
    }
}

fn process_alive(pid: i32) -> bool {
    // Signal 0 checks existence; EPERM means it exists but belongs to someone else.
    !matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH))
}
