//! What a segment's fetch does: the bytes of a range from the data cache where its
//! blocks are there, from the store otherwise, and the blocks fetched from the store into
//! the cache once the readers have them.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::datacache::{CachedFiles, DataCache, ObjectId, BLOCK_SIZE, SMALL_OBJECT};
use bucketfs_client::store::{ObjectStore, RangeBody, StoreError};

/// One open file's view of the data cache: the object it reads, and its cache files once
/// they exist.
pub struct CacheLink {
    cache: Arc<DataCache>,
    id: ObjectId,
    files: Mutex<Option<Arc<CachedFiles>>>,
}

impl CacheLink {
    pub fn new(cache: Arc<DataCache>, id: ObjectId) -> Self {
        Self { cache, id, files: Mutex::new(None) }
    }

    /// The object's cache files, opened at the first call that finds them; none for a
    /// small object, kept in one file (see `small_content`).
    fn files(&self) -> Option<Arc<CachedFiles>> {
        if self.id.size <= SMALL_OBJECT {
            return None;
        }
        let mut files = self.files.lock();
        if files.is_none() {
            *files = self.cache.files(&self.id).map(Arc::new);
        }
        files.clone()
    }

    /// The whole content of a small object (see `datacache::small`), if cached.
    pub fn small_content(&self) -> Option<bytes::Bytes> {
        if self.id.size == 0 || self.id.size > SMALL_OBJECT {
            return None;
        }
        let content = self.cache.load_small(&self.id).map(bytes::Bytes::from);
        bucketfs_client::metrics::data_cache("small", content.is_some());
        content
    }

    /// The cache's data file as a whole, checked copy of the object, if it is one (for
    /// FUSE passthrough). An object whose every block is cached but not yet checked as a
    /// whole is checked in the background, for the next open.
    pub fn whole_file(self: &Arc<Self>) -> Option<std::fs::File> {
        let files = self.files()?;
        if let Ok(Some(file)) = files.checked_whole_file(&self.id) {
            return Some(file);
        }
        if files.lists_every_block(&self.id).unwrap_or(false) {
            let link = self.clone();
            tokio::task::spawn_blocking(move || link.check_whole(&files));
        }
        None
    }

    fn check_whole(&self, files: &CachedFiles) {
        self.cache.check_whole(&self.id, files);
    }
}

/// Fills `body` (bytes of `key` from `origin`) and finishes it. With a cache, whole
/// blocks present on disk are read from it; the others come from the shared cache if
/// there is one and it has them, else from the store (one GET per run of missing
/// blocks). The blocks fetched are then stored in the cache, and those from the store in
/// the shared cache, after the body is finished, so no reader waits on either.
///
/// `memory` is the fill's share of the body's reservation: given back before the readers
/// get their last bytes when nothing is left to do, else once the blocks are stored.
pub async fn fill<M>(
    store: Arc<dyn ObjectStore>,
    key: &str,
    origin: u64,
    body: &RangeBody,
    cache: Option<&Arc<CacheLink>>,
    memory: M,
) {
    let Some(link) = cache else {
        let result = store.get_range_into(key, origin, body, body.len()).await;
        drop(memory);
        body.finish(result);
        return;
    };
    let mut fetched = Fetched::default();
    let result = fill_from_caches_and_store(&*store, key, origin, body, link, &mut fetched).await;
    let complete = result.is_ok();
    // Taken before the readers get their bytes: a daemon told to exit once they have
    // them waits for this write (and the shared tier's writes it queues).
    let storing = link.cache.storing();
    body.finish(result);
    if complete {
        let to_share = whole_block_indices(link, &fetched.from_store);
        fetched.from_store.extend(fetched.from_shared);
        store_fetched_blocks(link, origin, body, &fetched.from_store, to_share, storing).await;
    }
    drop(memory);
}

/// The ranges (object offsets) a fill did not find in the local cache, by where they
/// came from.
#[derive(Default)]
struct Fetched {
    from_store: Vec<Range<u64>>,
    from_shared: Vec<Range<u64>>,
}

async fn fill_from_caches_and_store(
    store: &dyn ObjectStore,
    key: &str,
    origin: u64,
    body: &RangeBody,
    link: &Arc<CacheLink>,
    fetched: &mut Fetched,
) -> Result<(), StoreError> {
    let end = origin + body.len();
    // After one miss there, the rest of this range is not asked of the shared cache: an
    // object read first on this machine costs one miss, not one per block.
    let mut shared = link.cache.shared_tier().cloned();
    while body.received() < body.len() {
        let at = origin + body.received();
        let index = at / BLOCK_SIZE;
        let (cached, missing_until) = {
            let link = link.clone();
            tokio::task::spawn_blocking(move || look_up(&link, index, end)).await.unwrap_or((None, None))
        };
        bucketfs_client::metrics::data_cache("block", cached.is_some());
        let block_start = index * BLOCK_SIZE;
        if let Some(block) = cached {
            let to = (end - block_start).min(block.len() as u64) as usize;
            body.append(&block[(at - block_start) as usize..to]);
            continue;
        }
        let until = missing_until.unwrap_or(end).min(end);
        if let Some(tier) = shared.clone() {
            // The run's blocks reach the body as they come and check out; the first one
            // the tier does not have sends the rest of the run to the store.
            let reached = origin + tier.read_into(&link.id, origin, body, until - origin).await;
            if reached > at {
                fetched.from_shared.push(at..reached);
            }
            if reached < until {
                shared = None;
            }
            continue;
        }
        store.get_range_into(key, origin, body, until - origin).await?;
        if origin + body.received() < until {
            return Err(StoreError::Interrupted("the reader abandoned the read-ahead".into()));
        }
        fetched.from_store.push(at..until);
    }
    Ok(())
}
/// Block `index` if cached and sound; otherwise where the run of missing blocks from
/// it ends (the next block present, below `end`).
fn look_up(link: &CacheLink, index: u64, end: u64) -> (Option<Vec<u8>>, Option<u64>) {
    let Some(files) = link.files() else {
        return (None, None);
    };
    if let Ok(Some(block)) = files.read_block(&link.id, index) {
        return (Some(block), None);
    }
    let mut next = index + 1;
    while next * BLOCK_SIZE < end && !files.has_block(next).unwrap_or(false) {
        next += 1;
    }
    (None, Some(next * BLOCK_SIZE))
}

/// Stores the whole blocks inside `fetched` (object offsets) from the finished `body`; a
/// small object fetched whole, in its one file. Then blocks `to_share` go to the shared
/// tier, read back from the local cache (see `SharedCache`).
///
/// Both happen in one blocking task, which runs to its end even when the segment's task
/// is dropped at the await (the file closed once its readers had their bytes), and holds
/// `storing` until the blocks are stored and queued for the shared tier.
async fn store_fetched_blocks(
    link: &Arc<CacheLink>,
    origin: u64,
    body: &RangeBody,
    fetched: &[Range<u64>],
    to_share: Vec<u64>,
    storing: crate::datacache::Storing,
) {
    enum ToStore {
        Small(bytes::Bytes),
        Blocks(Vec<(u64, bytes::Bytes)>),
    }
    let to_store = if link.id.size <= SMALL_OBJECT {
        if !matches!((fetched, origin), ([range], 0) if *range == (0..link.id.size)) {
            return;
        }
        match body.slice(0..link.id.size).await {
            Ok(content) => ToStore::Small(content),
            Err(_) => return,
        }
    } else {
        let blocks = whole_blocks(link, origin, body, fetched).await;
        if blocks.is_empty() {
            return; // all from the local cache: nothing to store or share
        }
        ToStore::Blocks(blocks)
    };
    let link = link.clone();
    let _ = tokio::task::spawn_blocking(move || {
        match to_store {
            ToStore::Small(content) => link.cache.store_small(&link.id, &content),
            ToStore::Blocks(blocks) => {
                for (index, bytes) in blocks {
                    link.cache.store_block(&link.id, index, &bytes);
                }
                // The object may be whole now: check it once, so that the next open reads
                // it straight from the cache file.
                if let Some(files) = link.files() {
                    link.cache.check_once_complete(&link.id, &files);
                }
            }
        }
        link.cache.share_blocks(&link.id, to_share);
        drop(storing);
    })
    .await;
}

/// The blocks lying whole inside `ranges` (object offsets) of the finished `body`.
async fn whole_blocks(
    link: &CacheLink,
    origin: u64,
    body: &RangeBody,
    ranges: &[Range<u64>],
) -> Vec<(u64, bytes::Bytes)> {
    let mut blocks = Vec::new();
    for index in whole_block_indices(link, ranges) {
        let start = index * BLOCK_SIZE;
        let end = start + link.id.block_len(index);
        if let Ok(bytes) = body.slice(start - origin..end - origin).await {
            blocks.push((index, bytes));
        }
    }
    blocks
}

/// The numbers of the blocks lying whole inside `ranges` (object offsets).
fn whole_block_indices(link: &CacheLink, ranges: &[Range<u64>]) -> Vec<u64> {
    let mut indices = Vec::new();
    for range in ranges {
        let mut index = range.start.div_ceil(BLOCK_SIZE);
        while index * BLOCK_SIZE < range.end && index * BLOCK_SIZE + link.id.block_len(index) <= range.end {
            indices.push(index);
            index += 1;
        }
    }
    indices
}
