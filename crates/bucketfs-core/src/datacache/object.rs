//! One cached object on disk: a sparse data file as large as the object, and a map file
//! that says which blocks of it are present, each with its checksum.
//!
//! The data file holds block `i` at offset `i * BLOCK_SIZE`, so a fully cached object is
//! a plain copy of it, which the kernel can read directly (FUSE passthrough). The map
//! file is a header naming the object (store, key, ETag, size) and one 8-byte record per
//! block: the block's CRC-32 and its length, written after the block's bytes; a zero
//! length means absent.
//!
//! Nothing here takes a lock: several daemons may write the same object at once, and
//! that is safe because every writer of block `i` writes the same bytes (the object is
//! named by its ETag), and a reader trusts a block only if its bytes match the record's
//! checksum. A block being written, a record written before its bytes reached the disk
//! (a crash), a file deleted by eviction under an open handle, or a flipped byte all read
//! as "absent", and the block is fetched from the store again.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::BLOCK_SIZE;

/// First bytes of every map file; the last digit is the format version.
const MAGIC: &[u8; 8] = b"BFSCMAP1";
/// Records start here; the header before holds the magic, block size, object size and
/// the object's identity.
const RECORDS_AT: u64 = 4096;
const RECORD_LEN: u64 = 8;
/// Where the map says "every block was checked, and the data file has not changed
/// since": the data file's mtime then (seconds, nanoseconds), and [`STAMP_MARK`].
const STAMP_AT: u64 = RECORDS_AT - 16;
const STAMP_MARK: &[u8; 4] = b"WHOL";

/// What names a cached object: its bytes are those of this version of this key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectId {
    /// The store's endpoint and bucket (`ObjectStore::location`).
    pub location: String,
    pub key: String,
    pub etag: String,
    pub size: u64,
}

impl ObjectId {
    /// The identity as stored in the map header (and hashed into the file names).
    pub(super) fn describe(&self) -> String {
        format!("{}\n{}\n{}\n{}", self.location, self.key, self.etag, self.size)
    }

    /// `objects/AB/CDEF…`: 128 bits of SHA-256 of the identity, in 256 directories.
    pub(super) fn stem(&self, objects: &Path) -> PathBuf {
        use sha2::Digest;
        let hash = hex::encode(&sha2::Sha256::digest(self.describe().as_bytes())[..16]);
        objects.join(&hash[..2]).join(&hash[2..])
    }

    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(BLOCK_SIZE)
    }

    /// Length of block `index` (the last one may be short).
    pub fn block_len(&self, index: u64) -> u64 {
        (self.size - index * BLOCK_SIZE).min(BLOCK_SIZE)
    }

    /// Bytes the map file takes.
    pub(super) fn map_len(&self) -> u64 {
        RECORDS_AT + self.blocks() * RECORD_LEN
    }
}

pub(super) fn data_path(stem: &Path) -> PathBuf {
    stem.with_extension("data")
}

pub(super) fn map_path(stem: &Path) -> PathBuf {
    stem.with_extension("map")
}

/// Open files of one cached object, for reading blocks.
pub struct CachedFiles {
    data: File,
    map: File,
    stem: PathBuf,
    /// The map's stamp as read at open (see [`CachedFiles::checked_whole_file`]).
    stamp: [u8; 16],
}

impl CachedFiles {
    /// The object's files, if a map naming exactly this object exists.
    pub(super) fn open(id: &ObjectId, stem: &Path) -> io::Result<Option<Self>> {
        let map = match File::open(map_path(stem)) {
            Ok(map) => map,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let Some(stamp) = header_names(&map, id)? else {
            return Ok(None);
        };
        let data = match File::open(data_path(stem)) {
            Ok(data) => data,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(Some(Self { data, map, stem: stem.to_owned(), stamp }))
    }

    /// Marks the object as just used (the map's mtime orders eviction). The daemon owns
    /// the files it made, so the read-only handle may set the time.
    pub(super) fn mark_used(&self) {
        let _ = self.map.set_modified(std::time::SystemTime::now());
    }

    /// Block `index`, if present and its bytes match its checksum.
    pub fn read_block(&self, id: &ObjectId, index: u64) -> io::Result<Option<Vec<u8>>> {
        let Some((checksum, len)) = self.record(index)? else {
            return Ok(None);
        };
        if len != id.block_len(index) {
            return Ok(None);
        }
        let mut bytes = vec![0; len as usize];
        if let Err(error) = self.data.read_exact_at(&mut bytes, index * BLOCK_SIZE) {
            return if error.kind() == io::ErrorKind::UnexpectedEof { Ok(None) } else { Err(error) };
        }
        Ok((crc32fast::hash(&bytes) == checksum).then_some(bytes))
    }

    /// Whether the map says block `index` is present (its bytes are not checked).
    pub fn has_block(&self, index: u64) -> io::Result<bool> {
        Ok(self.record(index)?.is_some())
    }

    /// Whether every block is present and checks out: the data file is then a whole
    /// copy of the object. Reads it all.
    pub fn is_whole(&self, id: &ObjectId) -> io::Result<bool> {
        for index in 0..id.blocks() {
            if self.read_block(id, index)?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the map lists every block (their bytes are not checked).
    pub fn lists_every_block(&self, id: &ObjectId) -> io::Result<bool> {
        let mut records = vec![0u8; (id.blocks() * RECORD_LEN) as usize];
        if self.map.read_exact_at(&mut records, RECORDS_AT).is_err() {
            return Ok(false);
        }
        Ok(records.chunks(RECORD_LEN as usize).enumerate().all(|(index, record)| {
            u64::from(u32::from_le_bytes(record[4..].try_into().unwrap_or_default())) == id.block_len(index as u64)
        }))
    }

    /// The data file, to be read as the whole object (FUSE passthrough), if every block
    /// was checked since the file last changed (see [`CachedFiles::check_whole`]):
    /// cheap, it reads the map and the file's mtime, not the data.
    pub fn checked_whole_file(&self, id: &ObjectId) -> io::Result<Option<File>> {
        let whole = self.lists_every_block(id)? && self.is_stamped()?;
        whole.then(|| self.data.try_clone()).transpose()
    }

    /// Whether the map's stamp says every block was checked since the data file last
    /// changed.
    pub fn is_stamped(&self) -> io::Result<bool> {
        let changed = stamp_of(self.data.metadata()?.modified()?);
        // Read at open; read again if it does not match, for a check made since.
        Ok(self.stamp == changed || read_stamp(&self.map)? == changed)
    }

    /// Checks every block of a fully listed object and, if all are sound and the data
    /// file did not change meanwhile, stamps the map with the file's mtime, so that
    /// later opens trust it without reading it ([`CachedFiles::checked_whole_file`]).
    /// A write to the file (a flipped byte, another mount's block) changes its mtime and
    /// voids the stamp. Returns whether the object is whole.
    pub fn check_whole(&self, id: &ObjectId) -> io::Result<bool> {
        let before = self.data.metadata()?.modified()?;
        if !self.lists_every_block(id)? || !self.is_whole(id)? {
            return Ok(false);
        }
        if self.data.metadata()?.modified()? != before {
            return Ok(false);
        }
        let map = OpenOptions::new().write(true).open(map_path(&self.stem))?;
        map.write_all_at(&stamp_of(before), STAMP_AT)?;
        Ok(true)
    }

    fn record(&self, index: u64) -> io::Result<Option<(u32, u64)>> {
        let mut record = [0u8; RECORD_LEN as usize];
        match self.map.read_exact_at(&mut record, RECORDS_AT + index * RECORD_LEN) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error),
        }
        let checksum = u32::from_le_bytes(record[..4].try_into().unwrap_or_default());
        let len = u64::from(u32::from_le_bytes(record[4..].try_into().unwrap_or_default()));
        Ok((len > 0).then_some((checksum, len)))
    }
}

/// Whether the object at `stem` is stamped as checked whole, and its data file has not
/// changed since (what `bucketfs cache status` counts as whole).
pub(super) fn is_checked_whole(stem: &Path) -> bool {
    let stamp = File::open(map_path(stem)).and_then(|map| read_stamp(&map));
    let changed = std::fs::metadata(data_path(stem)).and_then(|data| data.modified());
    matches!((stamp, changed), (Ok(stamp), Ok(changed)) if stamp == stamp_of(changed))
}

fn read_stamp(map: &File) -> io::Result<[u8; 16]> {
    let mut stamp = [0u8; 16];
    map.read_exact_at(&mut stamp, STAMP_AT)?;
    Ok(stamp)
}

fn stamp_of(time: std::time::SystemTime) -> [u8; 16] {
    let since = time.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut stamp = [0u8; 16];
    stamp[..8].copy_from_slice(&since.as_secs().to_le_bytes());
    stamp[8..12].copy_from_slice(&since.subsec_nanos().to_le_bytes());
    stamp[12..].copy_from_slice(STAMP_MARK);
    stamp
}

/// Writes block `index` of `id` (its bytes, `bytes`), creating the object's files if
/// needed: the bytes first, then the record that vouches for them.
pub(super) fn write_block(id: &ObjectId, stem: &Path, index: u64, bytes: &[u8]) -> io::Result<()> {
    debug_assert_eq!(bytes.len() as u64, id.block_len(index));
    let map = match OpenOptions::new().write(true).open(map_path(stem)) {
        Ok(map) => map,
        Err(error) if error.kind() == io::ErrorKind::NotFound => create_map(id, stem)?,
        Err(error) => return Err(error),
    };
    let data = OpenOptions::new().write(true).create(true).truncate(false).open(data_path(stem))?;
    if data.metadata()?.len() < id.size {
        data.set_len(id.size)?; // sparse: only written blocks take space
    }
    data.write_all_at(bytes, index * BLOCK_SIZE)?;
    let mut record = [0u8; RECORD_LEN as usize];
    record[..4].copy_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    record[4..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    map.write_all_at(&record, RECORDS_AT + index * RECORD_LEN)
}

/// Creates the map file whole (header, no block present) under a temporary name and
/// moves it in place unless another writer was first: a map is never seen half made,
/// and never replaced with one that forgets blocks.
fn create_map(id: &ObjectId, stem: &Path) -> io::Result<File> {
    if let Some(parent) = stem.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let temporary = stem.with_extension(format!("map.{}-{}", std::process::id(), rand::random::<u32>()));
    let file = OpenOptions::new().read(true).write(true).create_new(true).open(&temporary)?;
    let identity = id.describe();
    let mut header = Vec::with_capacity(RECORDS_AT as usize);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&BLOCK_SIZE.to_le_bytes());
    header.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    header.extend_from_slice(identity.as_bytes());
    if header.len() as u64 > STAMP_AT {
        let _ = std::fs::remove_file(&temporary);
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "object identity too long to cache"));
    }
    file.write_all_at(&header, 0)?;
    file.set_len(id.map_len())?;
    let placed = nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        &temporary,
        nix::fcntl::AT_FDCWD,
        &map_path(stem),
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    );
    match placed {
        Ok(()) => Ok(file),
        Err(nix::errno::Errno::EEXIST) => {
            let _ = std::fs::remove_file(&temporary);
            OpenOptions::new().write(true).open(map_path(stem))
        }
        Err(errno) => {
            let _ = std::fs::remove_file(&temporary);
            Err(errno.into())
        }
    }
}

/// The map's stamp, if its header names exactly `id` (a file of another format, block
/// size or object is not ours to read). One read of the header block.
fn header_names(map: &File, id: &ObjectId) -> io::Result<Option<[u8; 16]>> {
    let mut header = vec![0u8; RECORDS_AT as usize];
    let read = map.read_at(&mut header, 0)?;
    let identity = id.describe();
    let expected_len = 8 + 8 + 4 + identity.len();
    if read < RECORDS_AT as usize || &header[..8] != MAGIC {
        return Ok(None);
    }
    let block_size = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
    let identity_len = u32::from_le_bytes(header[16..20].try_into().unwrap_or_default()) as usize;
    let named =
        block_size == BLOCK_SIZE && identity_len == identity.len() && &header[20..expected_len] == identity.as_bytes();
    Ok(named.then(|| header[STAMP_AT as usize..RECORDS_AT as usize].try_into().unwrap_or_default()))
}
