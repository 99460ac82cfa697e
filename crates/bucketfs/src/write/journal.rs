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
