//! The data cache on local disk (`--cache DIR`): blocks of objects read through any mount
//! that uses the same directory, kept across mounts, capped in bytes.
//!
//! - **Layout** (`DIR/bucketfs-cache-v1/`): `objects/AB/CDEF….data` and `….map`, one pair
//!   per object version (see [`object`]), named by a hash of the store, key, ETag and
//!   size: a changed object is another name, so old bytes are never served for it.
//!   `usage` holds the bytes the directory takes and the last cap a mount used.
//! - **Blocks** are [`BLOCK_SIZE`] (1 MiB): a block is the unit fetched, checked and
//!   written, so a random read through a cached mount fetches whole blocks.
//! - **The cap is hard**: a block is written only after its bytes were added to `usage`
//!   under an exclusive `flock` of that file, which every mount using the directory
//!   takes; when the total would pass the cap (or leave less than 5% of the disk free),
//!   whole objects are deleted, least recently used first (a map's mtime: set by every
//!   block written and every open of the object), until the total is 10% under it. The
//!   count is made again from the files at each eviction and at every mount, so a
//!   daemon killed between reserving and writing does not leak.
//! - **Shared safely**: files are created whole or moved in place, blocks are trusted
//!   only by checksum, and eviction only deletes files (a reader with an open file keeps
//!   reading the bytes it checked; see [`object`]).
//! - **Never in the way**: a failing or full cache disk turns into uncached reads, with
//!   one warning; nothing here fails a read.
//! - **Small objects** (up to 64 KiB) are one file each, header and content ([`small`]):
//!   one inode and one block to read for a file of a few KiB.
//! - **Memory**: none per cached block; the map files are the index.

mod object;
mod shared;
mod small;
mod tier_key;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

pub use object::{CachedFiles, ObjectId};
pub use shared::{SharedCache, TierUsage};
pub use small::SMALL_OBJECT;
pub use tier_key::TierKey;

/// Size of a cached block.
pub const BLOCK_SIZE: u64 = 1024 * 1024;
/// The directory inside `--cache DIR` that holds this format.
const ROOT: &str = "bucketfs-cache-v1";
/// Eviction frees down to this share of the cap, so that it runs rarely.
const EVICT_TO: f64 = 0.9;
/// Share of the disk left free whatever the cap.
const KEEP_FREE: f64 = 0.05;
/// Default cap: this share of the disk holding the cache.
const DEFAULT_SHARE: f64 = 0.10;

pub struct DataCache {
    objects: PathBuf,
    usage: PathBuf,
    cap: u64,
    /// A write failed: said once in the log, and reads go on uncached.
    warned: AtomicBool,
    /// Objects being checked whole (see [`DataCache::check_whole`]).
    checking: parking_lot::Mutex<std::collections::HashSet<PathBuf>>,
    /// Bytes this process counted in `usage` and is still writing: not on disk yet, so
    /// an eviction's recount from the files adds them (else each eviction forgot the
    /// blocks being written at that moment, and the cap drifted by as much).
    writing: AtomicU64,
    /// Fetched bytes on their way to the cache (see [`DataCache::storing`]): the daemon
    /// waits for them before it exits.
    storing: tokio::sync::watch::Sender<usize>,
    /// The shared cache behind this one (`--shared-cache`), if any: set once at mount.
    shared: std::sync::OnceLock<Arc<SharedCache>>,
}

/// Bytes fetched for the cache and not written to it yet; dropped once they are.
pub struct Storing(tokio::sync::watch::Sender<usize>);

impl Drop for Storing {
    fn drop(&mut self) {
        self.0.send_modify(|storing| *storing -= 1);
    }
}

/// One object's blocks in this cache, as the shared tier reads them when their turn
/// to be written there comes.
struct LocalCopy {
    cache: Arc<DataCache>,
    id: ObjectId,
}

impl shared::LocalBlocks for LocalCopy {
    fn has(&self, index: u64) -> bool {
        if self.id.size <= small::SMALL_OBJECT {
            return self.cache.cached_block(&self.id, index).is_some();
        }
        self.cache.files(&self.id).is_some_and(|files| files.has_block(index).unwrap_or(false))
    }

    fn read(&self, index: u64) -> Option<bytes::Bytes> {
        self.cache.cached_block(&self.id, index)
    }
}

/// What `bucketfs cache status` prints.
#[derive(Debug, PartialEq, Eq)]
pub struct Status {
    pub objects: u64,
    /// Objects whole in the cache and checked (read through FUSE passthrough).
    pub whole: u64,
    pub bytes: u64,
    /// The cap the last mount that wrote used.
    pub cap: Option<u64>,
}

impl DataCache {
    /// The cache in `dir` (created if needed), capped at `cap` bytes (default: 10% of the
    /// disk holding it). Counts what the directory holds now.
    pub fn open(dir: &Path, cap: Option<u64>) -> io::Result<Arc<Self>> {
        let root = dir.join(ROOT);
        let objects = root.join("objects");
        std::fs::create_dir_all(&objects)?;
        let usage = root.join("usage");
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&usage)?;
        let disk = Disk::of(&root)?;
        let cap = cap.unwrap_or((disk.size as f64 * DEFAULT_SHARE) as u64);
        let cache = Arc::new(Self {
            objects,
            usage,
            cap,
            warned: AtomicBool::new(false),
            checking: Default::default(),
            writing: AtomicU64::new(0),
            storing: tokio::sync::watch::Sender::new(0),
            shared: std::sync::OnceLock::new(),
        });
        cache.with_usage(|_, _| {
            let (_, bytes) = scan(&cache.objects)?;
            Ok(bytes)
        })?;
        Ok(cache)
    }

    /// Puts `tier` behind this cache: blocks missing here are asked there before the
    /// source, and blocks fetched from the source are written there.
    pub fn set_shared_tier(&self, tier: Arc<SharedCache>) {
        let _ = self.shared.set(tier);
    }

    pub fn shared_tier(&self) -> Option<&Arc<SharedCache>> {
        self.shared.get()
    }

    /// Writes blocks `indices` of `id`, just stored here, to the shared tier if there is
    /// one, in the background, each read back from here when its turn comes.
    pub fn share_blocks(self: &Arc<Self>, id: &ObjectId, indices: Vec<u64>) {
        let Some(tier) = self.shared_tier() else { return };
        if indices.is_empty() {
            return;
        }
        tier.put_blocks(id, &indices, Arc::new(LocalCopy { cache: self.clone(), id: id.clone() }));
    }

    /// Block `index` of `id` as cached here, checked; `None` if it is not (or no longer).
    fn cached_block(&self, id: &ObjectId, index: u64) -> Option<bytes::Bytes> {
        if id.size <= small::SMALL_OBJECT {
            return self.load_small(id).map(bytes::Bytes::from);
        }
        self.files(id)?.read_block(id, index).ok().flatten().map(bytes::Bytes::from)
    }

    /// Held by a fetch from before its readers get the bytes until they are written to
    /// the cache, so that a daemon exiting right after a program read a file (a plain
    /// `umount` just after `cat`) still leaves them in the cache.
    pub fn storing(&self) -> Storing {
        self.storing.send_modify(|storing| *storing += 1);
        Storing(self.storing.clone())
    }

    /// Waits until every fetch holding [`DataCache::storing`] has written its blocks, and
    /// the shared tier the blocks queued for it, for at most `limit`; whether they all
    /// were.
    pub async fn stored_all(&self, limit: std::time::Duration) -> bool {
        let started = tokio::time::Instant::now();
        let mut storing = self.storing.subscribe();
        let stored =
            tokio::time::timeout(limit, storing.wait_for(|storing| *storing == 0)).await.is_ok_and(|done| done.is_ok());
        match self.shared_tier() {
            // Then what they queued for the shared tier, in what is left of `limit`.
            Some(tier) => stored && tier.written_all(limit.saturating_sub(started.elapsed())).await,
            None => stored,
        }
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// The bytes the directory takes, as last recorded by any mount using it.
    pub fn bytes(&self) -> u64 {
        File::open(&self.usage).map_or(0, |file| read_usage(&file).0)
    }

    /// The files of `id` if some of it is cached; marks it recently used.
    pub fn files(&self, id: &ObjectId) -> Option<CachedFiles> {
        let stem = id.stem(&self.objects);
        match CachedFiles::open(id, &stem) {
            Ok(Some(files)) => {
                files.mark_used();
                Some(files)
            }
            Ok(None) => None,
            Err(error) => {
                self.warn_once("reading", &error);
                None
            }
        }
    }

    /// Checks every block of `id` (its `files`) and stamps it whole if all are sound (see
    /// [`CachedFiles::check_whole`]); one check of an object at a time, however many
    /// opens ask: each reads the whole object.
    pub fn check_whole(&self, id: &ObjectId, files: &CachedFiles) {
        let stem = id.stem(&self.objects);
        if !self.checking.lock().insert(stem.clone()) {
            return;
        }
        match files.check_whole(id) {
            Ok(true) => tracing::debug!(key = %id.key, "data cache: object whole and checked"),
            Ok(false) => {}
            Err(error) => tracing::debug!(key = %id.key, "data cache: checking the object failed: {error}"),
        }
        self.checking.lock().remove(&stem);
    }

    /// The content of the small object `id` (at most [`SMALL_OBJECT`] bytes), if cached
    /// and sound; marks it used.
    pub fn load_small(&self, id: &ObjectId) -> Option<Vec<u8>> {
        match small::load(id, &id.stem(&self.objects)) {
            Ok(content) => content,
            Err(error) => {
                self.warn_once("reading", &error);
                None
            }
        }
    }

    /// Stores the whole content of the small object `id`, as [`DataCache::store_block`]
    /// stores a block.
    pub fn store_small(&self, id: &ObjectId, content: &[u8]) {
        let stem = id.stem(&self.objects);
        let Some(_writing) = self.reserve(&stem, small::file_len(id)) else { return };
        if let Err(error) = small::store(id, &stem, content) {
            self.warn_once("writing", &error);
        }
    }

    /// Stores block `index` of `id`, unless neither the cap nor the disk leaves room for
    /// it even once the rest is evicted (a full disk, a cap smaller than a block), or the
    /// disk fails: both said once in the log, and the block is not cached.
    pub fn store_block(&self, id: &ObjectId, index: u64, bytes: &[u8]) {
        let stem = id.stem(&self.objects);
        let new_map = if object::map_path(&stem).exists() { 0 } else { id.map_len() };
        let Some(_writing) = self.reserve(&stem, bytes.len() as u64 + new_map) else { return };
        if let Err(error) = object::write_block(id, &stem, index, bytes) {
            self.warn_once("writing", &error);
        }
    }

    /// Stores the whole content of `id` (a file just written through a mount): in one
    /// file if small, else block by block, then checks it, so that the next open reads
    /// the cache file by passthrough. Blocks on the disk.
    pub fn store_whole(&self, id: &ObjectId, content: &[u8]) {
        if content.len() as u64 != id.size {
            return;
        }
        if id.size <= small::SMALL_OBJECT {
            return self.store_small(id, content);
        }
        for (index, block) in content.chunks(BLOCK_SIZE as usize).enumerate() {
            self.store_block(id, index as u64, block);
        }
        if let Some(files) = self.files(id) {
            self.check_once_complete(id, &files);
        }
    }

    /// Checks `id` whole (see [`DataCache::check_whole`]) if its map lists every block and
    /// no check stamped it yet: after the blocks that may have completed it were written.
    pub fn check_once_complete(&self, id: &ObjectId, files: &CachedFiles) {
        if files.lists_every_block(id).unwrap_or(false) && !files.is_stamped().unwrap_or(false) {
            self.check_whole(id, files);
        }
    }

    /// Counts `needed` more bytes for the object at `stem`, evicting others to make
    /// room; false (said once in the log) if there is none or counting failed.
    fn reserve(&self, stem: &Path, needed: u64) -> Option<Writing<'_>> {
        let mut room = true;
        let reserved = self.with_usage(|cache_dir_bytes, cap_room| {
            if cache_dir_bytes + needed <= cap_room {
                return Ok(cache_dir_bytes + needed);
            }
            let target = ((cap_room as f64 * EVICT_TO) as u64).saturating_sub(needed);
            let left = evict(&self.objects, target, stem)? + self.writing.load(Ordering::Relaxed);
            room = left + needed <= cap_room;
            Ok(if room { left + needed } else { left })
        });
        if let Err(error) = reserved {
            self.warn_once("counting", &error);
            return None;
        }
        if !room {
            let full = io::Error::new(io::ErrorKind::StorageFull, "no room for a block under the cap or on the disk");
            self.warn_once("making room", &full);
            return None;
        }
        self.writing.fetch_add(needed, Ordering::Relaxed);
        Some(Writing { cache: self, bytes: needed })
    }

    /// Runs `change` on the directory's byte count under the exclusive lock and saves
    /// what it returns. `change` gets the count and the room the cap and the disk leave.
    fn with_usage(&self, change: impl FnOnce(u64, u64) -> io::Result<u64>) -> io::Result<u64> {
        let locked = lock_usage(&self.usage)?;
        let (bytes, _) = read_usage(&locked);
        let disk_room = Disk::of(&self.objects)?.room_for_cache(bytes);
        let updated = change(bytes, self.cap.min(disk_room))?;
        write_usage(&locked, updated, self.cap)?;
        Ok(updated)
    }

    fn warn_once(&self, what: &str, error: &io::Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("data cache: {what} failed ({error}); reads go on without the cache where it fails");
        }
    }
}

/// The file system holding the cache, as this process can use it.
#[derive(Debug, Clone, Copy)]
struct Disk {
    /// Bytes used plus bytes available, as `df` counts its Use%: blocks reserved for
    /// another user (root's share, or a `resuid` reservation, which on our CI machines
    /// is most of the disk) are neither free for the cache nor part of its share.
    size: u64,
    available: u64,
}

impl Disk {
    fn of(path: &Path) -> io::Result<Self> {
        let stat = nix::sys::statvfs::statvfs(path)?;
        Ok(Self::from_blocks(
            stat.fragment_size() as u64,
            stat.blocks() as u64,
            stat.blocks_free() as u64,
            stat.blocks_available() as u64,
        ))
    }

    /// From `statvfs`'s counts: blocks of `unit` bytes in all, free, and free for us.
    fn from_blocks(unit: u64, blocks: u64, free: u64, available: u64) -> Self {
        let used = blocks.saturating_sub(free) * unit;
        Self { size: used + available * unit, available: available * unit }
    }

    /// The most the cache may take, holding `cache_bytes` now: those plus what is
    /// available, less the share of the disk always left free.
    fn room_for_cache(self, cache_bytes: u64) -> u64 {
        (cache_bytes + self.available).saturating_sub((self.size as f64 * KEEP_FREE) as u64)
    }
}

/// Objects and bytes in the cache at `dir` (for `bucketfs cache status`).
pub fn status(dir: &Path) -> io::Result<Status> {
    let root = dir.join(ROOT);
    if !root.exists() {
        return Ok(Status { objects: 0, whole: 0, bytes: 0, cap: None });
    }
    let found = objects_on_disk(&root.join("objects"))?;
    let (objects, bytes) = (found.len() as u64, found.iter().map(|f| f.bytes).sum());
    let whole = found.iter().filter(|f| f.small || object::is_checked_whole(&f.stem)).count() as u64;
    let cap = File::open(root.join("usage")).ok().map(|file| read_usage(&file).1).filter(|&cap| cap > 0);
    Ok(Status { objects, whole, bytes, cap })
}

/// Empties the cache at `dir`, under its lock: mounts using it go on reading (files
/// they have open stay readable until closed) and start filling it again.
pub fn clear(dir: &Path) -> io::Result<()> {
    let root = dir.join(ROOT);
    if !root.exists() {
        return Ok(());
    }
    let locked = lock_usage(&root.join("usage"))?;
    let objects = root.join("objects");
    let cleared = root.join(format!("objects.clearing-{}", std::process::id()));
    if objects.exists() {
        std::fs::rename(&objects, &cleared)?;
    }
    std::fs::create_dir_all(&objects)?;
    let (_, cap) = read_usage(&locked);
    write_usage(&locked, 0, cap)?;
    drop(locked);
    match std::fs::remove_dir_all(&cleared) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// The `usage` file, locked exclusively: every change of the count, eviction and clear
/// happens under this lock, whichever mount makes it.
fn lock_usage(path: &Path) -> io::Result<nix::fcntl::Flock<File>> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, errno)| io::Error::from(errno))
}

/// The `usage` record: the bytes the directory takes, and the cap of the last mount
/// that counted (for `bucketfs cache status`).
fn write_usage(file: &File, bytes: u64, cap: u64) -> io::Result<()> {
    let mut record = [0u8; 16];
    record[..8].copy_from_slice(&bytes.to_le_bytes());
    record[8..].copy_from_slice(&cap.to_le_bytes());
    file.write_all_at(&record, 0)
}

fn read_usage(file: &File) -> (u64, u64) {
    let mut record = [0u8; 16];
    let read = file.read_at(&mut record, 0).unwrap_or(0);
    if read < 16 {
        return (0, 0);
    }
    let bytes = u64::from_le_bytes(record[..8].try_into().unwrap_or_default());
    let cap = u64::from_le_bytes(record[8..].try_into().unwrap_or_default());
    (bytes, cap)
}

/// One cached object found on disk: its file stem, last use and bytes taken, and
/// whether it is a small object's one file.
struct Found {
    stem: PathBuf,
    used: SystemTime,
    bytes: u64,
    small: bool,
}

/// Every cached object (by its map file, or its one file if small), with its last use
/// and the bytes its files take.
fn objects_on_disk(objects: &Path) -> io::Result<Vec<Found>> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    for shard in std::fs::read_dir(objects)? {
        let Ok(shard) = shard else { continue };
        let Ok(entries) = std::fs::read_dir(shard.path()) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let small = match path.extension().and_then(|ext| ext.to_str()) {
                Some("map") => false,
                Some("one") => true,
                _ => continue,
            };
            let Ok(first) = entry.metadata() else { continue };
            let stem = path.with_extension("");
            let data = match small {
                true => 0,
                false => std::fs::metadata(object::data_path(&stem)).map(|m| m.blocks() * 512).unwrap_or(0),
            };
            let used = first.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push(Found { stem, used, bytes: first.blocks() * 512 + data, small });
        }
    }
    Ok(found)
}

/// Bytes counted in `usage` that are being written (see `DataCache::writing`).
struct Writing<'a> {
    cache: &'a DataCache,
    bytes: u64,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.cache.writing.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// (objects, bytes on disk) under `objects`.
fn scan(objects: &Path) -> io::Result<(u64, u64)> {
    let found = objects_on_disk(objects)?;
    Ok((found.len() as u64, found.iter().map(|f| f.bytes).sum()))
}

/// Deletes the least recently used objects until the rest take at most `target` bytes;
/// `writing` (the object a block is about to be written to) goes last. Returns the
/// bytes left.
fn evict(objects: &Path, target: u64, writing: &Path) -> io::Result<u64> {
    let mut found = objects_on_disk(objects)?;
    let mut total: u64 = found.iter().map(|f| f.bytes).sum();
    found.sort_by_key(|f| (f.stem == writing, f.used));
    for object in found {
        if total <= target {
            break;
        }
        // The map first: from then on the object reads as absent, whatever happens next.
        let _ = std::fs::remove_file(object::map_path(&object.stem));
        let _ = std::fs::remove_file(object::data_path(&object.stem));
        let _ = std::fs::remove_file(small::path(&object.stem));
        total = total.saturating_sub(object.bytes);
        tracing::debug!(object = %object.stem.display(), bytes = object.bytes, "data cache: evicted");
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str, size: u64) -> ObjectId {
        ObjectId { location: "http://s3/b".into(), key: key.into(), etag: "\"e1\"".into(), size }
    }

    fn bytes(len: u64, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Two readers store blocks at once: one has counted its block and not written it yet
    /// when the other's needs an eviction, which recounts from the files on disk. The
    /// block being written stays counted, so the cap holds once it is written.
    #[test]
    fn an_eviction_keeps_counting_blocks_being_written() {
        let dir = tempfile::tempdir().expect("dir");
        let cache = DataCache::open(dir.path(), Some(3 * BLOCK_SIZE + 64 * 1024)).expect("open");
        let a = id("a", BLOCK_SIZE);
        let being_written = cache.reserve(&a.stem(&cache.objects), BLOCK_SIZE).expect("room for a");
        let b = id("b", 2 * BLOCK_SIZE);
        cache.store_block(&b, 0, &bytes(BLOCK_SIZE, 1));
        cache.store_block(&b, 1, &bytes(BLOCK_SIZE, 2));
        cache.store_block(&id("c", BLOCK_SIZE), 0, &bytes(BLOCK_SIZE, 3)); // evicts b
        assert!(cache.files(&b).is_none(), "b was evicted");
        let counted = read_usage(&File::open(&cache.usage).expect("usage")).0;
        assert!(counted >= 2 * BLOCK_SIZE, "a's block (being written) and c's are counted: {counted}");
        drop(being_written);
    }

    /// A disk of 252 GB of which 160 GB are reserved for another user, 77 GB used and
    /// 15 GB available (a CI machine's): the cache's share is of the 92 GB this process
    /// reaches, so it may grow by 15 - 4.6 GB; counting the reserved blocks as disk kept
    /// 12.6 GB free and left it 2.4 GB, none once a build had taken them.
    #[test]
    fn reserved_blocks_are_not_part_of_the_disk() {
        const GB: u64 = 1_000_000_000;
        let blocks = |bytes: u64| bytes / 1000;
        let disk = Disk::from_blocks(1000, blocks(252 * GB), blocks(175 * GB), blocks(15 * GB));
        assert_eq!(disk.room_for_cache(0), 15 * GB - 46 * GB / 10);
        assert_eq!(disk.room_for_cache(GB), 16 * GB - 46 * GB / 10);
        let nearly_full = Disk::from_blocks(1000, blocks(252 * GB), blocks(163 * GB), blocks(3 * GB));
        assert_eq!(nearly_full.room_for_cache(GB), 0, "5% of the disk stays free");
    }

    #[test]
    fn blocks_written_are_read_back_and_survive_a_new_instance() {
        let dir = tempfile::tempdir().expect("dir");
        let cache = DataCache::open(dir.path(), Some(64 * BLOCK_SIZE)).expect("open");
        let object = id("a", BLOCK_SIZE + 10);
        assert!(cache.files(&object).is_none());
        cache.store_block(&object, 1, &bytes(10, 1));
        let files = cache.files(&object).expect("cached");
        assert_eq!(files.read_block(&object, 1).expect("read"), Some(bytes(10, 1)));
        assert_eq!(files.read_block(&object, 0).expect("read"), None);
        assert!(!files.is_whole(&object).expect("whole"));
        cache.store_block(&object, 0, &bytes(BLOCK_SIZE, 2));
        let again = DataCache::open(dir.path(), Some(64 * BLOCK_SIZE)).expect("reopen");
        let files = again.files(&object).expect("cached");
        assert!(files.is_whole(&object).expect("whole"));
        let other_version = ObjectId { etag: "\"e2\"".into(), ..object.clone() };
        assert!(again.files(&other_version).is_none(), "another ETag is another object");
        let status = status(dir.path()).expect("status");
        assert_eq!((status.objects, status.cap), (1, Some(64 * BLOCK_SIZE)));
        assert!(status.bytes >= BLOCK_SIZE, "{status:?}");
    }

    #[test]
    fn a_flipped_byte_reads_as_absent() {
        let dir = tempfile::tempdir().expect("dir");
        let cache = DataCache::open(dir.path(), Some(64 * BLOCK_SIZE)).expect("open");
        let object = id("a", 1000);
        cache.store_block(&object, 0, &bytes(1000, 3));
        let data = object::data_path(&object.stem(&cache.objects));
        let file = OpenOptions::new().write(true).open(data).expect("data");
        file.write_all_at(b"X", 500).expect("flip");
        let files = cache.files(&object).expect("cached");
        assert_eq!(files.read_block(&object, 0).expect("read"), None);
    }

    #[test]
    fn the_cap_holds_and_the_least_recently_used_go_first() {
        let dir = tempfile::tempdir().expect("dir");
        let cap = 4 * BLOCK_SIZE + 64 * 1024;
        let cache = DataCache::open(dir.path(), Some(cap)).expect("open");
        let keys = ["a", "b", "c", "d", "e", "f"];
        for (n, key) in keys.iter().enumerate() {
            cache.store_block(&id(key, BLOCK_SIZE), 0, &bytes(BLOCK_SIZE, n as u8));
            // Distinct last uses, and "a" used again after "d" was written.
            std::thread::sleep(std::time::Duration::from_millis(20));
            if *key == "d" {
                assert!(cache.files(&id("a", BLOCK_SIZE)).is_some());
            }
            assert!(status(dir.path()).expect("status").bytes <= cap, "over the cap after {key}");
        }
        let present: Vec<_> = keys.iter().filter(|key| cache.files(&id(key, BLOCK_SIZE)).is_some()).collect();
        assert!(present.contains(&&"f") && present.contains(&&"a"), "kept: {present:?}");
        assert!(!present.contains(&&"b") && !present.contains(&&"c"), "b, c least recently used: {present:?}");
        clear(dir.path()).expect("clear");
        assert_eq!(status(dir.path()).expect("status").objects, 0);
        assert!(cache.files(&id("f", BLOCK_SIZE)).is_none());
    }
}
