//! The shared cache (`--shared-cache s3://BUCKET[/PREFIX]`): a second tier behind the
//! local data cache, in a store near the machines (a MinIO in the rack, an S3 Express
//! directory bucket), that every mount of every machine reads and fills. A block one
//! mount fetched from the source is written there in the background; a mount that misses
//! its local cache asks there before the source.
//!
//! Each block is one object named by what it holds: the source object's location, key,
//! ETag and size (hashed) and the block number, so a changed object never meets old
//! blocks. Its bytes are followed by a SHA-256 of the name and the bytes, so a corrupt,
//! cut or foreign object is a miss, and the block comes from the source. Everything lives
//! under PREFIX, which is what an S3 lifecycle rule needs to expire it.
//!
//! The tier never fails a read: a miss, an error or a slow answer sends the read to the
//! source. After an error it is left alone for [`PAUSE_AFTER_ERROR`], said once in the
//! log per pause; metrics count hits, misses, errors and blocks written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use sha2::Digest as _;

use super::ObjectId;
use crate::store::{Metadata, ObjectStore, StoreError};

/// How long the tier is skipped after a request to it failed.
const PAUSE_AFTER_ERROR: Duration = Duration::from_secs(30);
/// A block that takes longer than this to come from the tier is fetched from the source.
const GET_TIMEOUT: Duration = Duration::from_secs(2);
/// Blocks written to the tier at once, by this mount (the rest wait; none is dropped
/// unless [`MAX_WAITING`] are waiting).
const PUTS_IN_FLIGHT: usize = 8;
const MAX_WAITING: usize = 256;
const CHECKSUM_LEN: usize = 32;

pub struct SharedCache {
    store: Arc<dyn ObjectStore>,
    /// Empty, or ending in `/`.
    prefix: String,
    puts: Arc<tokio::sync::Semaphore>,
    waiting: Arc<std::sync::atomic::AtomicUsize>,
    paused_until: parking_lot::Mutex<Option<Instant>>,
}

impl SharedCache {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Arc<Self> {
        let prefix = prefix.trim_matches('/');
        Arc::new(Self {
            store,
            prefix: if prefix.is_empty() { String::new() } else { format!("{prefix}/") },
            puts: Arc::new(tokio::sync::Semaphore::new(PUTS_IN_FLIGHT)),
            waiting: Default::default(),
            paused_until: parking_lot::Mutex::new(None),
        })
    }

    /// Where the tier is, for logs.
    pub fn location(&self) -> String {
        format!("{}/{}", self.store.location(), self.prefix)
    }

    /// Block `index` of `id` from the tier, checked; `None` on a miss, an error, a
    /// corrupt block or a slow answer.
    pub async fn get_block(&self, id: &ObjectId, index: u64) -> Option<Bytes> {
        if self.paused() {
            return None;
        }
        let key = self.block_key(id, index);
        let len = id.block_len(index) + CHECKSUM_LEN as u64;
        let answer = tokio::time::timeout(GET_TIMEOUT, self.store.get_range(&key, 0..len, None)).await;
        let framed = match answer {
            Ok(Ok(framed)) => framed,
            Ok(Err(StoreError::NotFound)) => {
                crate::metrics::shared_cache("miss");
                return None;
            }
            Ok(Err(error)) => {
                self.pause(&format!("reading {key}: {error}"));
                return None;
            }
            Err(_) => {
                self.pause(&format!("reading {key}: no answer within {GET_TIMEOUT:?}"));
                return None;
            }
        };
        match unframe(&key, framed) {
            Some(block) => {
                crate::metrics::shared_cache("hit");
                Some(block)
            }
            None => {
                // Fetched from the source, then written again over it.
                crate::metrics::shared_cache("corrupt");
                tracing::debug!(key, "shared cache: a block failed its check; read from the source");
                None
            }
        }
    }

    /// Writes `blocks` of `id` (fetched from the source) to the tier in the background.
    pub fn put_blocks(self: &Arc<Self>, id: &ObjectId, blocks: Vec<(u64, Bytes)>) {
        for (index, bytes) in blocks {
            if self.paused() {
                return;
            }
            use std::sync::atomic::Ordering;
            if self.waiting.fetch_add(1, Ordering::Relaxed) >= MAX_WAITING {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                crate::metrics::shared_cache("put_dropped");
                continue;
            }
            let tier = self.clone();
            let key = self.block_key(id, index);
            tokio::spawn(async move {
                let _slot = tier.puts.clone().acquire_owned().await;
                tier.waiting.fetch_sub(1, Ordering::Relaxed);
                let framed = frame(&key, &bytes);
                match tier.store.put(&key, framed, &Metadata::default(), false).await {
                    Ok(_) => crate::metrics::shared_cache("put"),
                    Err(error) => tier.pause(&format!("writing {key}: {error}")),
                }
            });
        }
    }

    /// `PREFIX` + a hash of the object's identity + `/` + the block number.
    fn block_key(&self, id: &ObjectId, index: u64) -> String {
        let identity = sha2::Sha256::digest(id.describe().as_bytes());
        format!("{}{}/{index}", self.prefix, hex::encode(&identity[..20]))
    }

    fn paused(&self) -> bool {
        let mut paused = self.paused_until.lock();
        match *paused {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                *paused = None;
                tracing::info!(tier = self.location(), "shared cache: in use again");
                false
            }
            None => false,
        }
    }

    /// Leaves the tier alone for a while, after `why` (said in the log once per pause).
    pub fn pause(&self, why: &str) {
        crate::metrics::shared_cache("error");
        let mut paused = self.paused_until.lock();
        if paused.is_none() {
            tracing::warn!(
                tier = self.location(),
                "shared cache: {why}; reading from the source only for {}s",
                PAUSE_AFTER_ERROR.as_secs()
            );
        }
        *paused = Some(Instant::now() + PAUSE_AFTER_ERROR);
    }
}

/// The block's bytes, then SHA-256(key, bytes).
fn frame(key: &str, block: &[u8]) -> Bytes {
    let mut framed = BytesMut::with_capacity(block.len() + CHECKSUM_LEN);
    framed.extend_from_slice(block);
    framed.extend_from_slice(&checksum(key, block));
    framed.freeze()
}

/// The block inside `framed`, if its checksum is right for `key`.
fn unframe(key: &str, framed: Bytes) -> Option<Bytes> {
    let split = framed.len().checked_sub(CHECKSUM_LEN)?;
    let block = framed.slice(..split);
    (checksum(key, &block)[..] == framed[split..]).then_some(block)
}

fn checksum(key: &str, block: &[u8]) -> [u8; CHECKSUM_LEN] {
    let mut hash = sha2::Sha256::new();
    hash.update(key.as_bytes());
    hash.update([0]);
    hash.update(block);
    hash.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn object(etag: &str, size: u64) -> ObjectId {
        ObjectId { location: "http://s/b".into(), key: "data/x.bin".into(), etag: etag.into(), size }
    }

    #[test]
    fn a_block_is_only_read_back_whole_and_unchanged_under_its_own_name() {
        let framed = frame("p/k/0", b"block bytes");
        assert_eq!(unframe("p/k/0", framed.clone()).as_deref(), Some(&b"block bytes"[..]));
        // Another block's object, a flipped byte, a cut object: misses.
        assert_eq!(unframe("p/k/1", framed.clone()), None);
        let mut flipped = framed.to_vec();
        flipped[3] ^= 1;
        assert_eq!(unframe("p/k/0", flipped.into()), None);
        assert_eq!(unframe("p/k/0", framed.slice(..framed.len() - 1)), None);
        assert_eq!(unframe("p/k/0", Bytes::from_static(b"short")), None);
    }

    #[test]
    fn blocks_of_another_version_have_other_names() {
        let tier = SharedCache::new(Arc::new(MemoryStore::default()), "/team/cache/");
        let key = tier.block_key(&object("\"e1\"", 10), 3);
        assert!(key.starts_with("team/cache/") && key.ends_with("/3"), "{key}");
        assert_ne!(key, tier.block_key(&object("\"e2\"", 10), 3), "another ETag");
        assert_ne!(key, tier.block_key(&object("\"e1\"", 11), 3), "another size");
    }

    #[tokio::test]
    async fn blocks_written_are_read_back_and_a_corrupt_one_is_a_miss() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::new(store.clone(), "c");
        let id = object("\"e\"", 3 * 1024 * 1024);
        assert_eq!(tier.get_block(&id, 1).await, None, "nothing written yet");
        let block = Bytes::from(vec![7u8; 1024 * 1024]);
        tier.put_blocks(&id, vec![(1, block.clone())]);
        let mut read = None;
        for _ in 0..100 {
            read = tier.get_block(&id, 1).await;
            if read.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read, Some(block));
        store.put(&tier.block_key(&id, 1), vec![7u8; 1024 * 1024 + 32]);
        assert_eq!(tier.get_block(&id, 1).await, None, "a block that fails its check");
    }
}
