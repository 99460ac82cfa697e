//! Small objects (up to [`SMALL_OBJECT`]) in one file each: a header naming the object,
//! the content's CRC-32, then the content, written whole under a temporary name and moved
//! in place.
//!
//! A directory of small files read after a remount is bound by cold disk reads: the
//! two files of the block layout ([`super::object`]) cost two inodes and two blocks per
//! object, this one file one of each for a file of a few KiB (`grep -r` over 1,000 cached
//! files: see docs/SEMANTICS.md, "Data cache"). Such objects are read whole at open and
//! served from memory, so they need no block map and no passthrough.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::object::ObjectId;

/// Largest object kept in one file.
pub const SMALL_OBJECT: u64 = 64 * 1024;
const MAGIC: &[u8; 8] = b"BFSCONE1";

pub(super) fn path(stem: &Path) -> PathBuf {
    stem.with_extension("one")
}

/// Bytes the file of `id` takes (before rounding to the disk's blocks).
pub(super) fn file_len(id: &ObjectId) -> u64 {
    (MAGIC.len() + 4 + id.describe().len() + 4) as u64 + id.size
}

/// The content of `id`, if its file names exactly it and the content checks out.
pub(super) fn load(id: &ObjectId, stem: &Path) -> io::Result<Option<Vec<u8>>> {
    let mut file = match File::open(path(stem)) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut all = Vec::with_capacity(file_len(id) as usize);
    file.read_to_end(&mut all)?;
    // Marks it used (eviction order); the daemon owns the file it made.
    let _ = file.set_modified(std::time::SystemTime::now());
    let identity = id.describe();
    let content_at = MAGIC.len() + 4 + identity.len() + 4;
    if all.len() != content_at + id.size as usize || &all[..MAGIC.len()] != MAGIC {
        return Ok(None);
    }
    let identity_len = u32::from_le_bytes(all[8..12].try_into().unwrap_or_default()) as usize;
    if identity_len != identity.len() || &all[12..12 + identity_len] != identity.as_bytes() {
        return Ok(None);
    }
    let checksum = u32::from_le_bytes(all[content_at - 4..content_at].try_into().unwrap_or_default());
    let content = all.split_off(content_at);
    Ok((crc32fast::hash(&content) == checksum).then_some(content))
}

/// Writes the file of `id` whole, replacing any (a replaced file holds the same bytes, or
/// was damaged).
pub(super) fn store(id: &ObjectId, stem: &Path, content: &[u8]) -> io::Result<()> {
    if let Some(parent) = stem.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let identity = id.describe();
    let mut all = Vec::with_capacity(file_len(id) as usize);
    all.extend_from_slice(MAGIC);
    all.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    all.extend_from_slice(identity.as_bytes());
    all.extend_from_slice(&crc32fast::hash(content).to_le_bytes());
    all.extend_from_slice(content);
    let temporary = stem.with_extension(format!("one.{}-{}", std::process::id(), rand::random::<u32>()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)
        .and_then(|mut file| file.write_all(&all))
        .and_then(|()| std::fs::rename(&temporary, path(stem)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(etag: &str, size: u64) -> ObjectId {
        ObjectId { location: "http://s3/b".into(), key: "dir/small.txt".into(), etag: etag.into(), size }
    }

    #[test]
    fn content_round_trips_and_anything_else_reads_as_absent() {
        let dir = tempfile::tempdir().expect("dir");
        let stem = dir.path().join("ab").join("cdef");
        let content: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
        let object = id("\"e1\"", content.len() as u64);
        assert_eq!(load(&object, &stem).expect("load"), None);
        store(&object, &stem, &content).expect("store");
        assert_eq!(load(&object, &stem).expect("load"), Some(content.clone()));
        assert_eq!(load(&id("\"e2\"", content.len() as u64), &stem).expect("load"), None, "another version");

        let mut damaged = std::fs::read(path(&stem)).expect("read");
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        std::fs::write(path(&stem), &damaged).expect("damage");
        assert_eq!(load(&object, &stem).expect("load"), None, "a flipped byte");
        damaged.truncate(last);
        std::fs::write(path(&stem), &damaged).expect("truncate");
        assert_eq!(load(&object, &stem).expect("load"), None, "a truncated file");
    }
}
