//! Bodies of small objects, fetched along with their metadata and kept until opened.
//!
//! Stored attributes need a request per listed file anyway (LIST has no metadata). For a
//! small object a ranged GET costs what a HEAD costs (and S3 bills both as GETs), so the
//! namespace asks for the body too and leaves it here; the `open` that usually follows
//! (`grep -r`, `cat *`, a build reading sources) then needs no request. Entries are tied
//! to the ETag they were read at, expire with the metadata TTL, and the oldest are
//! dropped past a fixed byte budget. Keyed by whatever names a file to its user (the
//! namespace's inode numbers), so that this store of bytes needs nothing above it.

use std::hash::Hash;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lru::LruCache;
use parking_lot::Mutex;

pub struct SmallObjects<K> {
    entries: Mutex<Entries<K>>,
    capacity: usize,
    ttl: Duration,
}

struct Entries<K> {
    lru: LruCache<K, Entry>,
    bytes: usize,
}

struct Entry {
    etag: String,
    body: Bytes,
    until: Instant,
}

impl<K: Hash + Eq> SmallObjects<K> {
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        let entries = Entries { lru: LruCache::unbounded(), bytes: 0 };
        Self { entries: Mutex::new(entries), capacity, ttl }
    }

    /// Keeps `body`, the whole content of `key` at version `etag`.
    pub fn insert(&self, key: K, etag: String, body: Bytes) {
        if body.len() > self.capacity {
            return;
        }
        let mut entries = self.entries.lock();
        entries.bytes += body.len();
        let entry = Entry { etag, body, until: Instant::now() + self.ttl };
        if let Some(old) = entries.lru.put(key, entry) {
            entries.bytes -= old.body.len();
        }
        while entries.bytes > self.capacity {
            let Some((_, dropped)) = entries.lru.pop_lru() else { break };
            entries.bytes -= dropped.body.len();
        }
    }

    /// Whether something is kept for `key` (at any version; it may have expired).
    pub fn contains(&self, key: K) -> bool {
        self.entries.lock().lru.contains(&key)
    }

    /// The content of `key` if it was kept at version `etag` and is still fresh; handed
    /// over (the kernel's page cache keeps it from then on).
    pub fn take(&self, key: K, etag: &str) -> Option<Bytes> {
        let mut entries = self.entries.lock();
        let entry = entries.lru.pop(&key)?;
        entries.bytes -= entry.body.len();
        (entry.etag == etag && entry.until > Instant::now()).then_some(entry.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(len: usize) -> Bytes {
        Bytes::from(vec![7; len])
    }

    #[test]
    fn taken_once_and_only_at_the_same_version() {
        let cache = SmallObjects::<u64>::new(1000, Duration::from_secs(60));
        cache.insert(1, "a".into(), body(10));
        assert_eq!(cache.take(1, "b"), None, "another version");
        assert_eq!(cache.take(1, "a"), None, "a mismatch drops the entry");
        cache.insert(1, "a".into(), body(10));
        assert_eq!(cache.take(1, "a").map(|b| b.len()), Some(10));
        assert_eq!(cache.take(1, "a"), None, "handed over");
    }

    #[test]
    fn oldest_dropped_past_the_budget() {
        let cache = SmallObjects::<u64>::new(100, Duration::from_secs(60));
        for ino in 1..=5 {
            cache.insert(ino, "e".into(), body(30));
        }
        assert_eq!(cache.entries.lock().bytes, 90);
        assert!(cache.take(1, "e").is_none() && cache.take(2, "e").is_none());
        assert!(cache.take(3, "e").is_some() && cache.take(5, "e").is_some());
        cache.insert(9, "e".into(), body(101));
        assert!(cache.take(9, "e").is_none(), "larger than the whole budget");
        assert_eq!(cache.entries.lock().bytes, 30);
    }

    #[test]
    fn expires_with_the_metadata() {
        let cache = SmallObjects::<u64>::new(100, Duration::ZERO);
        cache.insert(1, "e".into(), body(10));
        assert!(cache.take(1, "e").is_none());
    }
}
