//! A store whose drives fail: MinIO as an erasure set of 4 drives (2 data + 2 parity;
//! `scripts/start-store minio-erasure`) loses one drive in the middle of a read and one in
//! the middle of a write through the mount, and the program sees neither.
//!
//! Runs where `scripts/test-stores` names the store's drives
//! (`BUCKETFS_TEST_STORE_DRIVES`, on minio-erasure); elsewhere it skips itself, saying so.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use common::*;

/// A drive moved away (MinIO then finds its directory gone), moved back when dropped.
///
/// MinIO may recreate the directory of a drive it finds gone (and start formatting it):
/// that fresh directory is removed so the drive comes back whole.
struct DriveAway {
    drive: PathBuf,
    away: PathBuf,
}

impl DriveAway {
    fn take(drive: &PathBuf) -> Self {
        let away = drive.with_extension("away");
        std::fs::rename(drive, &away).unwrap_or_else(|e| panic!("moving {} away: {e}", drive.display()));
        DriveAway { drive: drive.clone(), away }
    }
}

impl Drop for DriveAway {
    fn drop(&mut self) {
        // A few tries: MinIO can make the directory again between the removal and the rename.
        for _ in 0..5 {
            if self.drive.exists() {
                if let Err(error) = std::fs::remove_dir_all(&self.drive) {
                    eprintln!("removing the directory MinIO made at {}: {error}", self.drive.display());
                }
            }
            match std::fs::rename(&self.away, &self.drive) {
                Ok(()) => return,
                Err(error) => eprintln!("moving {} back: {error}", self.drive.display()),
            }
        }
    }
}

/// Reads `path` in 1 MiB calls, calling `midway` once `at` bytes are read; the digest.
fn read_with(path: PathBuf, at: usize, midway: impl FnOnce()) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut read = Vec::new();
    let mut buffer = vec![0u8; MIB];
    let mut midway = Some(midway);
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok(sha256_hex(&read));
        }
        read.extend_from_slice(&buffer[..n]);
        if read.len() >= at {
            if let Some(midway) = midway.take() {
                midway();
            }
        }
    }
}

#[test]
fn a_drive_failing_in_the_middle_of_a_read_or_a_write_is_not_seen() {
    require_store_feature!(
        StoreFeature::FailingDrives,
        "needs an erasure set's drive directories (scripts/test-stores minio-erasure)"
    );
    let drives = store_drives().expect("drives");
    assert_eq!(drives.len(), 4, "{drives:?}");
    let b = create_bucket("drives");
    let data = gen_data(81, 256 * MIB);
    put(&b, "big", data.clone());
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0"]).mount();

    // Read: drive 2 goes away 64 MiB in (parts are read from the other three, or rebuilt
    // from parity).
    let drive = drives[1].clone();
    let mut away = None;
    let digest = read_with(m.join("big"), 64 * MIB, || away = Some(DriveAway::take(&drive)))
        .unwrap_or_else(|error| panic!("read with a drive gone: {error}\n{}", m.diagnostics()));
    assert!(away.is_some(), "the drive was taken mid-read");
    assert_eq!(digest, sha256_hex(&data), "the bytes read are the object's");
    drop(away);

    // Write: the same drive goes away 32 MiB into a 128 MiB file (3 of 4 drives are a write
    // quorum). The same one, because MinIO may still be healing it from the read: taking
    // another would leave two of four, below quorum, which bucketfs rightly reports.
    let written = gen_data(82, 128 * MIB);
    let mut file = std::fs::File::create(m.join("written")).expect("create");
    let mut away = None;
    for (i, chunk) in written.chunks(MIB).enumerate() {
        if i == 32 {
            away = Some(DriveAway::take(&drive));
        }
        file.write_all(chunk).unwrap_or_else(|error| panic!("write with a drive gone: {error}\n{}", m.diagnostics()));
    }
    let closed = run_with_timeout("close", Duration::from_secs(120), move || close(file));
    closed.unwrap_or_else(|error| panic!("close with a drive gone: {error}\n{}", m.diagnostics()));
    assert_eq!(sha256_hex(&get(&b, "written")), sha256_hex(&written), "stored whole with a drive gone");
    drop(away);
    assert_eq!(open_uploads(&b), 0, "no upload left");
}
