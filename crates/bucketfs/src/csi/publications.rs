//! The volumes this node has published, kept in the driver's state directory: one small
//! file per target path, saying which volume is mounted there and with which command
//! line. The bucketfs daemons outlive the driver's process; a restarted driver reads
//! these records (and the mount table) to answer a repeated `NodePublishVolume` as the
//! CSI spec asks: the same volume again is done, another one is refused. Also owns the
//! per-target locks that keep two calls for one target path from racing, and the
//! daemons' log files.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::Digest as _;

/// What is mounted at one target path. The secret is not part of it: it stays in the
/// daemon's environment, never on disk.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Publication {
    pub volume_id: String,
    pub target: PathBuf,
    /// The `bucketfs mount` arguments the daemon was started with.
    pub arguments: Vec<String>,
}

pub struct Publications {
    dir: PathBuf,
    locks: parking_lot::Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

impl Publications {
    /// Records under `state_dir` (created if missing), logs in `state_dir/logs`, the
    /// daemons' work files in `state_dir/work`: each only root can open (records name
    /// buckets, logs name keys, work files hold what pods wrote).
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        for dir in ["volumes", "logs", "work"] {
            bucketfs_core::private_dir::ensure(&state_dir.join(dir))?;
        }
        Ok(Self { dir: state_dir.to_owned(), locks: parking_lot::Mutex::new(HashMap::new()) })
    }

    /// Holds off every other call for `target` until the guard is dropped.
    pub async fn lock(&self, target: &Path) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self.locks.lock().entry(target.to_owned()).or_default().clone();
        lock.lock_owned().await
    }

    pub fn read(&self, target: &Path) -> Option<Publication> {
        let bytes = std::fs::read(self.record_path(target)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes the record whole or not at all (a temporary file renamed into place).
    pub fn write(&self, publication: &Publication) -> std::io::Result<()> {
        let path = self.record_path(&publication.target);
        let mut file = tempfile::NamedTempFile::new_in(self.dir.join("volumes"))?;
        file.write_all(&serde_json::to_vec_pretty(publication).map_err(std::io::Error::other)?)?;
        file.as_file().sync_all()?;
        file.persist(path).map_err(|error| error.error)?;
        Ok(())
    }

    pub fn remove(&self, target: &Path) -> std::io::Result<()> {
        match std::fs::remove_file(self.record_path(target)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// Where the daemon serving `target` logs (the node's disk, readable after the pod
    /// is gone).
    pub fn log_file(&self, target: &Path) -> PathBuf {
        self.dir.join("logs").join(format!("{}.log", Self::name(target)))
    }

    /// The `--cache-dir` of the daemons of volume `volume_id`, one per volume: a
    /// `--write-back` log or an upload left by a daemon that died is dealt with by the
    /// next mount of the same volume on this node, with that volume's credentials, and
    /// never by another volume's (another tenant's Secret, another prefix).
    /// Made (private) if missing.
    pub fn work_dir(&self, volume_id: &str) -> std::io::Result<PathBuf> {
        let dir = self.dir.join("work").join(Self::name(Path::new(volume_id)));
        bucketfs_core::private_dir::ensure(&dir)?;
        Ok(dir)
    }

    fn record_path(&self, target: &Path) -> PathBuf {
        self.dir.join("volumes").join(format!("{}.json", Self::name(target)))
    }

    /// A file name for a target path or a volume id (kubelet's are long and full of `/`).
    fn name(target: &Path) -> String {
        hex::encode(&sha2::Sha256::digest(target.as_os_str().as_encoded_bytes())[..12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_kept_per_target_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let publications = Publications::open(dir.path()).unwrap();
        let record = |target: &str, volume: &str| Publication {
            volume_id: volume.into(),
            target: target.into(),
            arguments: vec!["s3://b/".into(), target.into()],
        };
        publications.write(&record("/a", "v1")).unwrap();
        publications.write(&record("/b", "v2")).unwrap();
        // A second publish of the same target replaces its record.
        publications.write(&record("/a", "v3")).unwrap();
        assert_eq!(publications.read(Path::new("/a")), Some(record("/a", "v3")));
        assert_eq!(publications.read(Path::new("/b")), Some(record("/b", "v2")));
        publications.remove(Path::new("/a")).unwrap();
        publications.remove(Path::new("/a")).unwrap();
        assert_eq!(publications.read(Path::new("/a")), None);
        // A new driver on the same directory finds what the first one recorded.
        let reopened = Publications::open(dir.path()).unwrap();
        assert_eq!(reopened.read(Path::new("/b")), Some(record("/b", "v2")));
    }
}
