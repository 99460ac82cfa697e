//! The saved index: one file per source in `CACHE_DIR/bucketfs-index/`, named after a
//! hash of the source (endpoint, bucket, prefix), so that the next mount of the same
//! source finds it and is ready without listing the bucket.
//!
//! Format: `BFSINDEX`, a format version (u32 LE), the CRC-32 of the body (u32 LE), then
//! the body: postcard (serde) of the source's identity, when it was listed, and the
//! index. A file of another version, of another source, truncated or corrupted is
//! refused with the reason (the mount warns and lists the bucket again). Written to a
//! temporary name, synced, then renamed: a crash leaves the old file or the new one.
//!
//! The cache directory may be shared by users (root's default `/var/tmp`): the index directory
//! is created `0700`, and an index file (or directory) that another user owns or could
//! write is refused, since its entries and modes would be shown as the bucket's.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::tree::SourceIndex;

const MAGIC: &[u8; 8] = b"BFSINDEX";
/// Raise on any change of the body's layout (`SourceIndex` and what it holds).
pub const FORMAT_VERSION: u32 = 2;

#[derive(Serialize)]
struct SavedRef<'a> {
    identity: &'a str,
    listed_at_ms: u64,
    index: &'a SourceIndex,
}

#[derive(Deserialize)]
struct Saved {
    identity: String,
    listed_at_ms: u64,
    index: SourceIndex,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("no saved index")]
    Missing,
    #[error("cannot read it: {0}")]
    Unreadable(std::io::Error),
    #[error("not an index file")]
    NotAnIndex,
    #[error("format version {0}, this bucketfs reads {FORMAT_VERSION}")]
    OtherVersion(u32),
    #[error("corrupted (checksum mismatch)")]
    Corrupt,
    #[error("undecodable: {0}")]
    Undecodable(postcard::Error),
    #[error("it indexes another source ({0})")]
    OtherSource(String),
    #[error("{0} is owned by another user or writable by others")]
    Untrusted(PathBuf),
}

/// Where the index of the source `identity` is saved under `cache_dir`.
pub fn path_for(cache_dir: &Path, identity: &str) -> PathBuf {
    let digest = Sha256::digest(identity.as_bytes());
    let name = hex::encode(&digest[..12]);
    cache_dir.join("bucketfs-index").join(format!("{name}.idx"))
}

/// Saves `index` of source `identity`, listed at `listed_at`.
pub fn save(path: &Path, identity: &str, listed_at: SystemTime, index: &SourceIndex) -> std::io::Result<()> {
    let listed_at_ms = listed_at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    let body = postcard::to_stdvec(&SavedRef { identity, listed_at_ms, index }).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        crate::private_dir::ensure(dir)?;
    }
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = File::create(&temporary)?;
    file.write_all(MAGIC)?;
    file.write_all(&FORMAT_VERSION.to_le_bytes())?;
    file.write_all(&crc32fast::hash(&body).to_le_bytes())?;
    file.write_all(&body)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

/// Loads the index of source `identity` saved at `path`, and when it was listed.
pub fn load(path: &Path, identity: &str) -> Result<(SourceIndex, SystemTime), LoadError> {
    let mut bytes = Vec::new();
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Err(LoadError::Missing),
        Err(error) => return Err(LoadError::Unreadable(error)),
    };
    check_trusted(path, &file.metadata().map_err(LoadError::Unreadable)?)?;
    if let Some(dir) = path.parent() {
        check_trusted(dir, &std::fs::metadata(dir).map_err(LoadError::Unreadable)?)?;
    }
    file.read_to_end(&mut bytes).map_err(LoadError::Unreadable)?;
    let header = MAGIC.len() + 8;
    if bytes.len() < header || &bytes[..MAGIC.len()] != MAGIC {
        return Err(LoadError::NotAnIndex);
    }
    let word = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let version = word(MAGIC.len());
    if version != FORMAT_VERSION {
        return Err(LoadError::OtherVersion(version));
    }
    let body = &bytes[header..];
    if crc32fast::hash(body) != word(MAGIC.len() + 4) {
        return Err(LoadError::Corrupt);
    }
    let saved: Saved = super::tree::decoding_shared(|| postcard::from_bytes(body)).map_err(LoadError::Undecodable)?;
    if saved.identity != identity {
        return Err(LoadError::OtherSource(saved.identity));
    }
    Ok((saved.index, SystemTime::UNIX_EPOCH + Duration::from_millis(saved.listed_at_ms)))
}

/// Only what this user owns and nobody else can write is trusted.
fn check_trusted(path: &Path, metadata: &std::fs::Metadata) -> Result<(), LoadError> {
    use std::os::unix::fs::MetadataExt;
    let ours = metadata.uid() == nix::unistd::geteuid().as_raw();
    if ours && metadata.mode() & 0o022 == 0 {
        Ok(())
    } else {
        Err(LoadError::Untrusted(path.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::namespace::index::build::index_of;
    use crate::namespace::index::tree::Indexed;
    use bucketfs_client::store::{Metadata, ObjectInfo};
    use std::sync::Arc;

    fn sample() -> SourceIndex {
        let keys: BTreeSet<String> = ["a/b/c", "a/d", "e", "f/"].iter().map(|k| k.to_string()).collect();
        let objects = keys
            .iter()
            .map(|key| ObjectInfo {
                key: key.clone(),
                size: 7,
                mtime: SystemTime::UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789),
                etag: Some("\"0123456789abcdef0123456789abcdef\"".into()),
                // A copy each: a load must share them again (see the test below).
                metadata: (key != "f/")
                    .then(|| Arc::new(Metadata { content_type: Some("text/plain".into()), ..Default::default() })),
            })
            .collect();
        index_of(objects, "")
    }

    #[test]
    fn a_saved_index_loads_as_it_was() {
        let dir = tempfile::tempdir().expect("dir");
        let path = path_for(dir.path(), "http://x/b/p/");
        let listed_at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
        let index = sample();
        save(&path, "http://x/b/p/", listed_at, &index).expect("save");
        let (loaded, when) = load(&path, "http://x/b/p/").expect("load");
        assert_eq!(when, listed_at);
        assert_eq!((loaded.files(), loaded.dirs()), (index.files(), index.dirs()));
        assert_eq!(loaded.lookup("a/", "d"), index.lookup("a/", "d"));
        assert!(matches!(loaded.lookup("", "f"), Some(Indexed::Dir { metadata: None })), "a marker, not fetched");
        let metadata_of = |prefix: &str, name: &str| match loaded.lookup(prefix, name) {
            Some(Indexed::File(object)) => object.metadata.expect("metadata"),
            other => panic!("{prefix}{name}: {other:?}"),
        };
        assert!(Arc::ptr_eq(&metadata_of("a/", "d"), &metadata_of("", "e")), "equal metadata loaded as one copy");
        assert!(matches!(load(&path, "http://x/other/"), Err(LoadError::OtherSource(_))));
    }

    #[test]
    fn damaged_or_foreign_files_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("i.idx");
        assert!(matches!(load(&path, "s"), Err(LoadError::Missing)));
        save(&path, "s", SystemTime::now(), &sample()).expect("save");
        let good = std::fs::read(&path).expect("read");
        let mut flipped = good.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x40;
        std::fs::write(&path, &flipped).expect("write");
        assert!(matches!(load(&path, "s"), Err(LoadError::Corrupt)));
        std::fs::write(&path, &good[..good.len() / 2]).expect("write");
        assert!(matches!(load(&path, "s"), Err(LoadError::Corrupt)));
        let mut old = good.clone();
        old[8] = 0;
        std::fs::write(&path, &old).expect("write");
        assert!(matches!(load(&path, "s"), Err(LoadError::OtherVersion(_))));
        std::fs::write(&path, b"hello").expect("write");
        assert!(matches!(load(&path, "s"), Err(LoadError::NotAnIndex)));
    }

    /// An index others could have written is not shown as the bucket's.
    #[test]
    fn an_index_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = path_for(dir.path(), "s");
        save(&path, "s", SystemTime::now(), &sample()).expect("save");
        let index_dir = path.parent().expect("index dir");
        let mode = std::fs::metadata(index_dir).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "the index directory is private");
        assert!(load(&path, "s").is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(matches!(load(&path, "s"), Err(LoadError::Untrusted(_))));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(index_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(matches!(load(&path, "s"), Err(LoadError::Untrusted(_))));
    }
}
