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
//!
//! Blocks wait for their write to the tier as names only: their bytes are read from the
//! local cache when their turn comes, so a reader far faster than the near store queues
//! a whole large object (up to [`MAX_WAITING`] blocks) without holding it in memory.

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
/// Blocks waiting to be written or being written (names, not bytes: 16 GiB of blocks in
/// a few MB).
const MAX_WAITING: usize = 16 * 1024;
const CHECKSUM_LEN: usize = 32;
/// Bytes of the SHA-256 of an object's identity kept in its blocks' names.
const HASH_LEN: usize = 20;

/// What a shared tier holds (see [`SharedCache::usage`]).
#[derive(Debug, Default, PartialEq)]
pub struct TierUsage {
    /// Source objects with blocks there.
    pub objects: u64,
    pub blocks: u64,
    pub bytes: u64,
    /// When the oldest block was written.
    pub oldest: Option<std::time::SystemTime>,
    /// Keys under the prefix that are not named as blocks (not ours: left alone).
    pub other_keys: u64,
}

pub struct SharedCache {
    store: Arc<dyn ObjectStore>,
    /// Empty, or ending in `/`.
    prefix: String,
    puts: Arc<tokio::sync::Semaphore>,
    /// Blocks queued by [`SharedCache::put_blocks`] and not yet written (or given up).
    pending: tokio::sync::watch::Sender<usize>,
    paused_until: parking_lot::Mutex<Option<Instant>>,
}

impl SharedCache {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Arc<Self> {
        let prefix = prefix.trim_matches('/');
        Arc::new(Self {
            store,
            prefix: if prefix.is_empty() { String::new() } else { format!("{prefix}/") },
            puts: Arc::new(tokio::sync::Semaphore::new(PUTS_IN_FLIGHT)),
            pending: tokio::sync::watch::Sender::new(0),
            paused_until: parking_lot::Mutex::new(None),
        })
    }

    /// One LIST of the prefix, at mount: a bucket that does not exist or refuses us is
    /// an error; one that does not answer now pauses the tier (said in the log), which
    /// is used once it answers.
    pub async fn check(&self) -> Result<(), StoreError> {
        match self.store.list(&self.prefix, None, Some(1), false).await {
            Ok(_) => Ok(()),
            Err(error) if error.is_transient() => {
                self.pause(&format!("listing it at mount: {error}"));
                Ok(())
            }
            Err(error) => Err(error),
        }
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

    /// Writes blocks `indices` of `id` (fetched from the source) to the tier in the
    /// background, each read with `read_block` when its turn comes (from the local
    /// cache: `None` if it is no longer there, and then it is not written).
    pub fn put_blocks<R>(self: &Arc<Self>, id: &ObjectId, indices: Vec<u64>, read_block: R)
    where
        R: Fn(u64) -> Option<Bytes> + Clone + Send + Sync + 'static,
    {
        for index in indices {
            if self.paused() {
                return;
            }
            let Some(pending) = self.one_more_pending() else {
                crate::metrics::shared_cache("put_dropped");
                continue;
            };
            let tier = self.clone();
            let key = self.block_key(id, index);
            let read_block = read_block.clone();
            tokio::spawn(async move {
                let _pending = pending;
                let _slot = tier.puts.clone().acquire_owned().await;
                if tier.paused() {
                    return;
                }
                let framed = {
                    let key = key.clone();
                    tokio::task::spawn_blocking(move || read_block(index).map(|block| frame(&key, &block)))
                };
                let Some(framed) = framed.await.ok().flatten() else {
                    crate::metrics::shared_cache("put_gone");
                    return;
                };
                match tier.store.put(&key, framed, &Metadata::default(), false).await {
                    Ok(_) => crate::metrics::shared_cache("put"),
                    Err(error) => tier.pause(&format!("writing {key}: {error}")),
                }
            });
        }
    }

    /// What the tier holds under its prefix (`bucketfs cache status s3://...`): one
    /// listing of it.
    pub async fn usage(&self) -> Result<TierUsage, StoreError> {
        let mut usage = TierUsage::default();
        let mut last_object = String::new();
        self.each_page(|page| {
            for object in page {
                let Some(hash) = self.block_object(&object.key) else {
                    usage.other_keys += 1;
                    continue;
                };
                // Keys come in order, so one object's blocks come together.
                if hash != last_object {
                    usage.objects += 1;
                    last_object = hash.to_owned();
                }
                usage.blocks += 1;
                usage.bytes += object.size;
                usage.oldest = Some(usage.oldest.map_or(object.mtime, |oldest| oldest.min(object.mtime)));
            }
            Ok(())
        })
        .await?;
        Ok(usage)
    }

    /// Deletes every block under the prefix (`bucketfs cache clear s3://...`); keys that
    /// are not named as blocks are left alone. Returns the blocks deleted. Mounts using
    /// the tier go on, and fill it again.
    pub async fn clear(&self) -> Result<u64, StoreError> {
        let mut blocks = Vec::new();
        self.each_page(|page| {
            blocks.extend(page.iter().filter(|o| self.block_object(&o.key).is_some()).map(|o| o.key.clone()));
            Ok(())
        })
        .await?;
        for chunk in blocks.chunks(crate::store::MAX_DELETED_AT_ONCE) {
            if let Some((_, refused)) = self.store.delete_many(chunk).await?.into_iter().next() {
                return Err(refused);
            }
        }
        Ok(blocks.len() as u64)
    }

    async fn each_page(
        &self,
        mut take: impl FnMut(&[crate::store::ObjectInfo]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut token = None;
        loop {
            let page = self.store.list_recursive(&self.prefix, token, false).await?;
            take(&page.objects)?;
            match page.next_token {
                Some(next) => token = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// The object part (HASH) of `key` if it is named as a block: `PREFIX` `HASH/N`.
    fn block_object<'k>(&self, key: &'k str) -> Option<&'k str> {
        let (hash, index) = key.strip_prefix(&self.prefix)?.split_once('/')?;
        let named = hash.len() == 2 * HASH_LEN
            && hash.bytes().all(|b| b.is_ascii_hexdigit())
            && !index.is_empty()
            && index.bytes().all(|b| b.is_ascii_digit());
        named.then_some(hash)
    }

    /// Counts one more block pending, unless [`MAX_WAITING`] are; uncounted when the
    /// returned guard drops.
    fn one_more_pending(&self) -> Option<Pending> {
        let mut counted = false;
        self.pending.send_if_modified(|pending| {
            counted = *pending < MAX_WAITING;
            *pending += usize::from(counted);
            counted
        });
        counted.then(|| Pending(self.pending.clone()))
    }

    /// Waits until every block queued has been written (or given up), for at most
    /// `limit`: a daemon exiting right after a program read a file still shares it.
    /// Whether they all were.
    pub async fn written_all(&self, limit: Duration) -> bool {
        let mut pending = self.pending.subscribe();
        tokio::time::timeout(limit, pending.wait_for(|pending| *pending == 0)).await.is_ok_and(|done| done.is_ok())
    }

    /// `PREFIX` + a hash of the object's identity + `/` + the block number.
    fn block_key(&self, id: &ObjectId, index: u64) -> String {
        let identity = sha2::Sha256::digest(id.describe().as_bytes());
        format!("{}{}/{index}", self.prefix, hex::encode(&identity[..HASH_LEN]))
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

/// One block counted in [`SharedCache::pending`] while this lives.
struct Pending(tokio::sync::watch::Sender<usize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.send_modify(|pending| *pending -= 1);
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
        let written = block.clone();
        tier.put_blocks(&id, vec![1], move |_| Some(written.clone()));
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

    #[tokio::test]
    async fn a_block_gone_from_the_local_cache_before_its_turn_is_not_written() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::new(store.clone(), "c");
        let id = object("\"e\"", 3 * 1024 * 1024);
        tier.put_blocks(&id, vec![0, 2], |index| (index == 2).then(|| Bytes::from(vec![2u8; 1024 * 1024])));
        for _ in 0..100 {
            if tier.get_block(&id, 2).await.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(tier.get_block(&id, 2).await.is_some());
        assert_eq!(tier.get_block(&id, 0).await, None);
    }

    #[tokio::test]
    async fn usage_counts_and_clear_deletes_only_what_is_named_as_blocks() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::new(store.clone(), "team/cache");
        let (one, two) = (object("\"e1\"", 3 * 1024 * 1024), object("\"e2\"", 3 * 1024 * 1024));
        for (id, index) in [(&one, 0), (&one, 1), (&one, 2), (&two, 10)] {
            store.put(&tier.block_key(id, index), frame(&tier.block_key(id, index), &[1u8; 100]).to_vec());
        }
        // Not ours: outside the prefix, or under it but not named as a block.
        for key in ["team/other", "team/cache/notes.txt", "team/cache/abc/1", "data/x.bin"] {
            store.put(key, b"keep".to_vec());
        }
        let usage = tier.usage().await.unwrap();
        assert_eq!((usage.objects, usage.blocks, usage.bytes, usage.other_keys), (2, 4, 4 * 132, 2));
        assert!(usage.oldest.is_some());
        assert_eq!(tier.clear().await.unwrap(), 4);
        assert_eq!(tier.usage().await.unwrap().blocks, 0);
        for key in ["team/other", "team/cache/notes.txt", "team/cache/abc/1", "data/x.bin"] {
            assert!(store.head(key).await.is_ok(), "{key} was deleted");
        }
    }
}
