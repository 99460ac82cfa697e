//! Small files read ahead from the data cache while a directory is walked.
//!
//! After a remount, `grep -r` or `cat *` over cached small files waits, per file, on a
//! cold read of its cache file (an inode and a block from disk) and then on the FUSE
//! round trips of open, read, flush and release, one after the other. Once a second file
//! of a directory is opened, the cache files of the next files listed there are read
//! here, several at a time on the blocking pool (the disk serves them in parallel), and
//! kept in memory until their open takes them. The walk then waits on the round trips
//! only.
//!
//! What is kept is tied to the ETag it was read at (a changed object is not served
//! from here), expires with the metadata TTL, and is bounded by [`BUDGET`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::cache::SmallObjects;
use crate::datacache::{DataCache, ObjectId, SMALL_OBJECT};
use crate::namespace::Ino;

/// Files read ahead of the one being opened.
pub const AHEAD: usize = 32;
/// Bytes kept at most: a window of the largest small files.
const BUDGET: usize = AHEAD * SMALL_OBJECT as usize;

pub struct SmallFilesAhead {
    cache: Arc<DataCache>,
    loaded: SmallObjects<Ino>,
    /// Files whose cache file is being read now.
    loading: Mutex<HashSet<Ino>>,
}

impl SmallFilesAhead {
    pub fn new(cache: Arc<DataCache>, ttl: Duration) -> Arc<Self> {
        Arc::new(Self { cache, loaded: SmallObjects::new(BUDGET, ttl), loading: Mutex::new(HashSet::new()) })
    }

    /// The content of `ino` at version `etag`, if it was read ahead.
    pub fn take(&self, ino: Ino, etag: &str) -> Option<Bytes> {
        let content = self.loaded.take(ino, etag);
        if content.is_some() {
            bucketfs_client::metrics::data_cache("small", true);
        }
        content
    }

    /// Reads the cache files of `next` (files about to be opened) that are small and
    /// neither kept nor being read already. Cache misses cost a failed open each.
    pub fn read_ahead(self: &Arc<Self>, next: impl IntoIterator<Item = (Ino, ObjectId)>) {
        for (ino, id) in next {
            if id.size == 0 || id.size > SMALL_OBJECT || self.loaded.contains(ino) || !self.loading.lock().insert(ino) {
                continue;
            }
            let ahead = self.clone();
            tokio::task::spawn_blocking(move || {
                if let Some(content) = ahead.cache.load_small(&id) {
                    ahead.loaded.insert(ino, id.etag, Bytes::from(content));
                }
                ahead.loading.lock().remove(&ino);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str, etag: &str, size: u64) -> ObjectId {
        ObjectId { location: "http://s3/b".into(), key: key.into(), etag: etag.into(), size }
    }

    async fn settled(ahead: &SmallFilesAhead) {
        for _ in 0..500 {
            if ahead.loading.lock().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("reads ahead never ended");
    }

    #[tokio::test]
    async fn cached_small_files_are_read_ahead_once_and_only_at_their_version() {
        let dir = tempfile::tempdir().expect("dir");
        let cache = DataCache::open(dir.path(), None).expect("open");
        cache.store_small(&id("a", "\"1\"", 3), b"abc");
        cache.store_small(&id("b", "\"1\"", 2), b"de");
        let ahead = SmallFilesAhead::new(cache, Duration::from_secs(60));
        let big = SMALL_OBJECT + 1;
        ahead.read_ahead([
            (1, id("a", "\"1\"", 3)),
            (2, id("b", "\"1\"", 2)),
            (3, id("c", "\"1\"", 5)),
            (4, id("d", "\"1\"", big)),
        ]);
        settled(&ahead).await;
        assert_eq!(ahead.take(1, "\"1\"").as_deref(), Some(&b"abc"[..]));
        assert_eq!(ahead.take(1, "\"1\""), None, "handed over once");
        assert_eq!(ahead.take(2, "\"2\""), None, "another version of b is not served");
        assert_eq!(ahead.take(3, "\"1\""), None, "c is not cached");
        assert_eq!(ahead.take(4, "\"1\""), None, "d is not a small file");
    }
}
