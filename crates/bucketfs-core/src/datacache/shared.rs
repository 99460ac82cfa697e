//! The shared cache (`--shared-cache s3://BUCKET[/PREFIX]`): a second tier behind the
//! local data cache, in a store near the machines (a MinIO in the rack, an S3 Express
//! directory bucket), that every mount of every machine reads and fills. A block one
//! mount fetched from the source is written there in the background; a mount that misses
//! its local cache asks there before the source.
//!
//! Blocks are kept under a name made of what they hold: a hash of the source object's
//! location, key, ETag and size (and of this layout's version), so a changed object never
//! meets old blocks; the hash is keyed (`tier_key`). [`CHUNK_BLOCKS`] blocks in a row (a **chunk**, aligned) are one
//! object, `HASH/cN`, once the local cache has them all: an S3 store serves a few large
//! objects far faster than many small ones. A block whose chunk does not fill up within
//! [`CHUNK_WAIT`] (a reader that skips around) is an object of its own, `HASH/N`. In both,
//! each block is a **frame** sealed with the tier's key (`tier_key`: AES-256-GCM, its tag
//! covering the object's name and the block's number), so a corrupt, cut, forged or
//! foreign block is a miss and comes from the source, and the bucket holds no plaintext. Frames lie [`FRAME`] bytes apart, so a reader asks for exactly
//! the blocks it misses, and opens each as it arrives. Everything lives under PREFIX,
//! which is what an S3 lifecycle rule needs to expire it.
//!
//! The tier never fails a read: a miss, an error or a slow answer sends the read to the
//! source. After an error it is left alone for [`PAUSE_AFTER_ERROR`], said once in the
//! log per pause; metrics count hits, misses and errors, and blocks written.
//!
//! Chunks wait for their write to the tier as names only: their bytes are read from the
//! local cache when their turn comes, so a reader far faster than the near store queues
//! a whole large object (up to [`MAX_WAITING`] chunks) without holding it in memory.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

use super::tier_key::{TierKey, SEAL_LEN};
use super::{ObjectId, BLOCK_SIZE};
use bucketfs_client::store::{Metadata, ObjectStore, RangeBody, StoreError, WriteCondition};

/// How long the tier is skipped after a request to it failed.
const PAUSE_AFTER_ERROR: Duration = Duration::from_secs(30);
/// A block that takes longer than this to come from the tier is fetched from the source.
const GET_TIMEOUT: Duration = Duration::from_secs(2);
/// Blocks in one chunk, the tier's object for blocks read in a row: MinIO sends 1,024
/// objects of 1 MiB in 2.5x the time of 128 objects of 8 MiB, and the 128 as fast as one
/// object of 1 GiB (bench/results/issue34-shared-cache).
pub const CHUNK_BLOCKS: u64 = 8;
/// How long a chunk waits for the rest of its blocks to reach the local cache before the
/// blocks it has are written one object each.
const CHUNK_WAIT: Duration = Duration::from_secs(2);
/// Objects written to the tier at once, by this mount (the rest wait; none is dropped
/// unless [`MAX_WAITING`] chunks are waiting).
const PUTS_IN_FLIGHT: usize = 4;
/// Chunks waiting to be written or being written (names, not bytes: 16 GiB of blocks
/// in a few hundred KB).
const MAX_WAITING: usize = 2048;
/// A block in the tier: its sealed bytes, then its tag and nonce. Frames of a chunk lie
/// this far apart.
const FRAME: u64 = BLOCK_SIZE + SEAL_LEN;
/// Bytes of the keyed hash of an object's identity kept in its blocks' names.
const HASH_LEN: usize = 20;
/// Part of every name's hash: blocks of another layout are misses, not corrupt blocks.
const LAYOUT: &str = "chunks of 8 sealed blocks, AES-256-GCM";

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

/// The blocks of one object as the local cache holds them, for the tier's writes.
pub trait LocalBlocks: Send + Sync + 'static {
    /// Whether block `index` is there (cheap: not read).
    fn has(&self, index: u64) -> bool;
    /// Block `index`, checked; `None` if it is not there (or no longer).
    fn read(&self, index: u64) -> Option<Bytes>;
}

pub struct SharedCache {
    store: Arc<dyn ObjectStore>,
    key: TierKey,
    /// Empty, or ending in `/`.
    prefix: String,
    puts: Arc<tokio::sync::Semaphore>,
    /// Chunks queued by [`SharedCache::put_blocks`] and not yet written (or given up).
    pending: tokio::sync::watch::Sender<usize>,
    /// Chunks waiting for the rest of their blocks, by name: told when one more arrives.
    filling: parking_lot::Mutex<HashMap<String, Arc<Notify>>>,
    chunk_wait: Duration,
    paused_until: parking_lot::Mutex<Option<Instant>>,
}

/// What reading the frames of one object of the tier gave.
enum Frames {
    /// Blocks up to (not including) this one were taken.
    TakenUpTo(u64),
    /// The object is not there.
    Absent,
}

impl SharedCache {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str, key: TierKey) -> Arc<Self> {
        Self::with_chunk_wait(store, prefix, key, CHUNK_WAIT)
    }

    fn with_chunk_wait(store: Arc<dyn ObjectStore>, prefix: &str, key: TierKey, chunk_wait: Duration) -> Arc<Self> {
        let prefix = prefix.trim_matches('/');
        Arc::new(Self {
            store,
            key,
            prefix: if prefix.is_empty() { String::new() } else { format!("{prefix}/") },
            puts: Arc::new(tokio::sync::Semaphore::new(PUTS_IN_FLIGHT)),
            pending: tokio::sync::watch::Sender::new(0),
            filling: parking_lot::Mutex::new(HashMap::new()),
            chunk_wait,
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

    /// Fills `body` (bytes of `id` from object offset `origin`) from the tier, from what
    /// it has received up to `until` (an offset in the body). Each block's bytes go
    /// straight into the body and reach its readers once the block checks out. Stops at
    /// the first block the tier does not have, or that fails its check, or is slow.
    /// Returns how far the body was filled (`until` if the tier had it all).
    pub async fn read_into(&self, id: &ObjectId, origin: u64, body: &RangeBody, until: u64) -> u64 {
        let names = Names::of(self, id);
        let end = origin + until;
        while body.received() < until {
            let next = (origin + body.received()) / BLOCK_SIZE;
            let chunk = next / CHUNK_BLOCKS;
            let wanted = next..end.div_ceil(BLOCK_SIZE).min((chunk + 1) * CHUNK_BLOCKS);
            let chunk_key = names.chunk(chunk);
            let target = Target { id, body, origin, end };
            let read = match self.read_frames(&names, &chunk_key, chunk * CHUNK_BLOCKS, wanted.clone(), &target).await {
                Frames::TakenUpTo(read) => read,
                // Not a whole chunk there: the blocks may be, one object each.
                Frames::Absent => self.read_single_blocks(&names, wanted.clone(), &target).await,
            };
            if read < wanted.end {
                break;
            }
        }
        body.received()
    }

    async fn read_single_blocks(&self, names: &Names, blocks: Range<u64>, target: &Target<'_>) -> u64 {
        for index in blocks.clone() {
            match self.read_frames(names, &names.block(index), index, index..index + 1, target).await {
                Frames::TakenUpTo(read) if read > index => continue,
                Frames::TakenUpTo(_) => return index,
                Frames::Absent => {
                    bucketfs_client::metrics::shared_cache("miss");
                    return index;
                }
            }
        }
        blocks.end
    }

    /// Blocks `blocks` from the tier's object `key`, whose first frame holds block
    /// `first`, into `target`: one ranged GET of exactly their frames, each block handed
    /// to the body's readers as soon as it has arrived and checked out.
    async fn read_frames(
        &self,
        names: &Names,
        key: &str,
        first: u64,
        blocks: Range<u64>,
        target: &Target<'_>,
    ) -> Frames {
        if self.paused() {
            return Frames::TakenUpTo(blocks.start);
        }
        let frame_at = |index: u64| (index - first) * FRAME;
        let last = blocks.end - 1;
        let len = frame_at(last) + target.block_len(last) + SEAL_LEN - frame_at(blocks.start);
        let sink = FrameSink::new(target, &self.key, &names.hash, blocks.clone());
        let get = self.store.get_range_into(key, frame_at(blocks.start), &sink, len);
        tokio::pin!(get);
        // At least one more block must check out in every GET_TIMEOUT.
        let mut checked = blocks.start;
        let outcome = loop {
            tokio::select! {
                result = &mut get => break Some(result),
                () = tokio::time::sleep(GET_TIMEOUT) => {
                    let now = sink.next_block();
                    if now == checked {
                        break None;
                    }
                    checked = now;
                }
            }
        };
        let reached = sink.next_block();
        match outcome {
            _ if sink.found_corrupt() => {
                // Fetched from the source, then written again over it.
                bucketfs_client::metrics::shared_cache("corrupt");
                tracing::debug!(key, index = reached, "shared cache: a block did not open; read from the source");
            }
            Some(Err(StoreError::NotFound)) if reached == blocks.start => return Frames::Absent,
            Some(Ok(())) => {}
            Some(Err(_)) if sink.body_ended() => {}
            Some(Err(error)) => self.pause(&format!("reading {key}: {error}")),
            None => self.pause(&format!("reading {key}: no block within {GET_TIMEOUT:?}")),
        }
        Frames::TakenUpTo(reached)
    }

    /// Writes the chunks of blocks `indices` of `id` (fetched from the source, stored in
    /// the local cache) to the tier in the background. A chunk waits (up to
    /// `chunk_wait`) until `local` has all its blocks, and is then written as one object;
    /// otherwise the blocks it has are written one object each. A block no longer in
    /// `local` when its turn comes is not written.
    pub fn put_blocks(self: &Arc<Self>, id: &ObjectId, indices: &[u64], local: Arc<dyn LocalBlocks>) {
        let names = Names::of(self, id);
        for blocks in indices.chunk_by(|a, b| a / CHUNK_BLOCKS == b / CHUNK_BLOCKS) {
            if self.paused() {
                return;
            }
            let Some(first) = blocks.first() else { continue };
            let chunk = first / CHUNK_BLOCKS;
            let name = names.chunk(chunk);
            let (arrived, pending) = {
                let mut filling = self.filling.lock();
                if let Some(waiting) = filling.get(&name) {
                    // It takes the new blocks when its turn comes.
                    waiting.notify_one();
                    continue;
                }
                let Some(pending) = self.one_more_pending() else {
                    blocks.iter().for_each(|_| bucketfs_client::metrics::shared_cache("put_dropped"));
                    continue;
                };
                let arrived = Arc::new(Notify::new());
                filling.insert(name.clone(), arrived.clone());
                (arrived, pending)
            };
            tokio::spawn(self.clone().write_chunk(id.clone(), chunk, name, arrived, pending, local.clone()));
        }
    }

    async fn write_chunk(
        self: Arc<Self>,
        id: ObjectId,
        chunk: u64,
        name: String,
        arrived: Arc<Notify>,
        _pending: Pending,
        local: Arc<dyn LocalBlocks>,
    ) {
        let blocks = chunk * CHUNK_BLOCKS..((chunk + 1) * CHUNK_BLOCKS).min(id.blocks());
        let deadline = tokio::time::Instant::now() + self.chunk_wait;
        loop {
            let all_here = {
                let (local, blocks) = (local.clone(), blocks.clone());
                tokio::task::spawn_blocking(move || blocks.into_iter().all(|index| local.has(index)))
            };
            if all_here.await.unwrap_or(false) || tokio::time::timeout_at(deadline, arrived.notified()).await.is_err() {
                break;
            }
        }
        // Blocks that arrive from here on queue the chunk again.
        self.filling.lock().remove(&name);
        let Ok(_slot) = self.puts.clone().acquire_owned().await else { return };
        if self.paused() {
            return;
        }
        let read = tokio::task::spawn_blocking(move || blocks.map(|index| (index, local.read(index))).collect());
        let read: Vec<(u64, Option<Bytes>)> = read.await.unwrap_or_default();
        let names = Names::of(&self, &id);
        if read.iter().all(|(_, block)| block.is_some()) {
            let mut frames = BytesMut::with_capacity(read.len() * FRAME as usize);
            for (index, block) in &read {
                if !self.key.seal_into(&mut frames, &names.hash, *index, block.as_deref().unwrap_or_default()) {
                    return;
                }
            }
            self.put_object(&name, frames.freeze(), read.len()).await;
            return;
        }
        for (index, block) in read {
            let Some(block) = block else {
                bucketfs_client::metrics::shared_cache("put_gone");
                continue;
            };
            let mut frame = BytesMut::with_capacity(block.len() + SEAL_LEN as usize);
            if !self.key.seal_into(&mut frame, &names.hash, index, &block)
                || !self.put_object(&names.block(index), frame.freeze(), 1).await
            {
                return;
            }
        }
    }

    /// Whether it was written; pauses the tier if not.
    async fn put_object(&self, key: &str, frames: Bytes, blocks: usize) -> bool {
        match self.store.put(key, frames, &Metadata::default(), &WriteCondition::Any).await {
            Ok(_) => {
                (0..blocks).for_each(|_| bucketfs_client::metrics::shared_cache("put"));
                true
            }
            Err(error) => {
                self.pause(&format!("writing {key}: {error}"));
                false
            }
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
                usage.blocks += object.size.div_ceil(FRAME);
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
        let (mut keys, mut blocks) = (Vec::new(), 0);
        self.each_page(|page| {
            for object in page.iter().filter(|object| self.block_object(&object.key).is_some()) {
                keys.push(object.key.clone());
                blocks += object.size.div_ceil(FRAME);
            }
            Ok(())
        })
        .await?;
        for some in keys.chunks(bucketfs_client::store::MAX_DELETED_AT_ONCE) {
            if let Some((_, refused)) = self.store.delete_many(some).await?.into_iter().next() {
                return Err(refused);
            }
        }
        Ok(blocks)
    }

    async fn each_page(
        &self,
        mut take: impl FnMut(&[bucketfs_client::store::ObjectInfo]) -> Result<(), StoreError>,
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

    /// The object part (HASH) of `key` if it is named as a block or a chunk of them:
    /// `PREFIX` `HASH/N` or `HASH/cN`.
    fn block_object<'k>(&self, key: &'k str) -> Option<&'k str> {
        let (hash, number) = key.strip_prefix(&self.prefix)?.split_once('/')?;
        let number = number.strip_prefix('c').unwrap_or(number);
        let named = hash.len() == 2 * HASH_LEN
            && hash.bytes().all(|b| b.is_ascii_hexdigit())
            && !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit());
        named.then_some(hash)
    }

    /// Counts one more chunk pending, unless [`MAX_WAITING`] are; uncounted when the
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

    /// Waits until every chunk queued has been written (or given up), for at most
    /// `limit`: a daemon exiting right after a program read a file still shares it.
    /// Whether they all were.
    pub async fn written_all(&self, limit: Duration) -> bool {
        let mut pending = self.pending.subscribe();
        tokio::time::timeout(limit, pending.wait_for(|pending| *pending == 0)).await.is_ok_and(|done| done.is_ok())
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
        bucketfs_client::metrics::shared_cache("error");
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

/// One chunk counted in [`SharedCache::pending`] while this lives.
struct Pending(tokio::sync::watch::Sender<usize>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.send_modify(|pending| *pending -= 1);
    }
}

/// The names of one source object's blocks in the tier.
struct Names {
    /// `PREFIX` + `HASH/`.
    stem: String,
    /// A hash of the object's identity and of the layout, in hex.
    hash: String,
}

impl Names {
    fn of(tier: &SharedCache, id: &ObjectId) -> Self {
        let identity = [LAYOUT.as_bytes(), &[0], id.describe().as_bytes()].concat();
        let hash = hex::encode(&tier.key.name_hash(&identity).as_ref()[..HASH_LEN]);
        Self { stem: format!("{}{hash}/", tier.prefix), hash }
    }

    /// The object of chunk `number`: its blocks from `number * CHUNK_BLOCKS` on.
    fn chunk(&self, number: u64) -> String {
        format!("{}c{number}", self.stem)
    }

    /// The object of block `index` alone.
    fn block(&self, index: u64) -> String {
        format!("{}{index}", self.stem)
    }
}

/// Where the blocks of a tier read go: the bytes of `id` from object offset `origin` to
/// `end` are `body`'s (from what it has received on).
struct Target<'b> {
    id: &'b ObjectId,
    body: &'b RangeBody,
    origin: u64,
    end: u64,
}

impl Target<'_> {
    fn block_len(&self, index: u64) -> u64 {
        self.id.block_len(index)
    }
}

/// Takes a GET of consecutive frames, as they stream in: each frame is gathered, opened
/// with the tier's key once whole, and the part of its block the target covers goes to
/// the body's readers. At the first frame that does not open, it takes no more (the GET
/// ends) and none of that block is seen.
struct FrameSink<'t> {
    target: &'t Target<'t>,
    key: &'t TierKey,
    hash: &'t str,
    framing: parking_lot::Mutex<Framing>,
}

struct Framing {
    /// Bytes of the answer taken (where a GET cut short goes on from).
    taken: u64,
    /// The block whose frame comes next, and the one after the last asked for.
    index: u64,
    end: u64,
    /// The current frame's bytes so far.
    frame: Vec<u8>,
    corrupt: bool,
    /// The body took no more (it was ended: its reads are over).
    body_ended: bool,
    etag: Option<String>,
}

impl<'t> FrameSink<'t> {
    fn new(target: &'t Target<'t>, key: &'t TierKey, hash: &'t str, blocks: Range<u64>) -> Self {
        let framing = Framing {
            taken: 0,
            index: blocks.start,
            end: blocks.end,
            frame: Vec::new(),
            corrupt: false,
            body_ended: false,
            etag: None,
        };
        Self { target, key, hash, framing: parking_lot::Mutex::new(framing) }
    }

    /// The first block not yet in the body.
    fn next_block(&self) -> u64 {
        self.framing.lock().index
    }

    fn found_corrupt(&self) -> bool {
        self.framing.lock().corrupt
    }

    fn body_ended(&self) -> bool {
        self.framing.lock().body_ended
    }

    /// The frame is whole: its block goes to the body's readers if it opens.
    fn end_frame(&self, f: &mut Framing) -> bool {
        let Some(block) = self.key.open(self.hash, f.index, &mut f.frame) else {
            f.corrupt = true;
            return false;
        };
        let Target { body, origin, end, .. } = *self.target;
        let from = f.index * BLOCK_SIZE; // object offset of the block
        let want = origin + body.received(); // the body's next byte
        let (start, stop) = (from.max(want), (from + block.len() as u64).min(end));
        if start < stop {
            let piece = &block[(start - from) as usize..(stop - from) as usize];
            if !body.stage(0, piece) {
                f.body_ended = true; // nobody waits for more
                return false;
            }
            body.publish(piece.len() as u64);
        }
        bucketfs_client::metrics::shared_cache("hit");
        f.index += 1;
        f.frame.clear();
        true
    }
}

impl bucketfs_client::store::BodySink for FrameSink<'_> {
    fn received(&self) -> u64 {
        self.framing.lock().taken
    }
    fn etag(&self) -> Option<String> {
        self.framing.lock().etag.clone()
    }
    fn pin_etag(&self, etag: Option<&str>) {
        let mut framing = self.framing.lock();
        if framing.etag.is_none() {
            framing.etag = etag.map(str::to_owned);
        }
    }
    fn version_id(&self) -> Option<&str> {
        None
    }
    fn append(&self, mut chunk: &[u8]) -> bool {
        let mut framing = self.framing.lock();
        let f = &mut *framing;
        f.taken += chunk.len() as u64;
        while !chunk.is_empty() {
            if f.corrupt || f.body_ended || f.index >= f.end {
                return false;
            }
            let frame_len = (self.target.block_len(f.index) + SEAL_LEN) as usize;
            let (bytes, rest) = chunk.split_at(chunk.len().min(frame_len - f.frame.len()));
            chunk = rest;
            if f.frame.is_empty() {
                f.frame.reserve_exact(frame_len); // one allocation per read, reused frame after frame
            }
            f.frame.extend_from_slice(bytes);
            if f.frame.len() == frame_len && !self.end_frame(f) {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;

    const MIB: u64 = 1024 * 1024;

    fn test_key() -> TierKey {
        TierKey::from_file_content(b"the key of the tests' shared cache").expect("a key")
    }

    fn object(etag: &str, size: u64) -> ObjectId {
        ObjectId { location: "http://s/b".into(), key: "data/x.bin".into(), etag: etag.into(), size }
    }

    /// A local cache holding some blocks of one object; `gone` ones are listed but
    /// cannot be read (evicted between the check and the read).
    #[derive(Default)]
    struct Local {
        blocks: parking_lot::Mutex<HashMap<u64, Bytes>>,
        gone: Vec<u64>,
    }

    impl Local {
        fn with(id: &ObjectId, indices: impl IntoIterator<Item = u64>) -> Arc<Self> {
            let local = Arc::new(Self::default());
            indices.into_iter().for_each(|index| local.add(id, index));
            local
        }

        fn add(&self, id: &ObjectId, index: u64) {
            self.blocks.lock().insert(index, block_bytes(id, index));
        }
    }

    impl LocalBlocks for Local {
        fn has(&self, index: u64) -> bool {
            self.blocks.lock().contains_key(&index)
        }
        fn read(&self, index: u64) -> Option<Bytes> {
            (!self.gone.contains(&index)).then(|| self.blocks.lock().get(&index).cloned()).flatten()
        }
    }

    fn block_bytes(id: &ObjectId, index: u64) -> Bytes {
        Bytes::from(vec![index as u8 + 1; id.block_len(index) as usize])
    }

    /// The bytes of `id` at object offsets `range`, as [`block_bytes`] makes them.
    fn object_bytes(id: &ObjectId, range: Range<u64>) -> Vec<u8> {
        (range.start / BLOCK_SIZE..range.end.div_ceil(BLOCK_SIZE))
            .flat_map(|index| {
                block_bytes(id, index)
                    .to_vec()
                    .into_iter()
                    .enumerate()
                    .map(move |(at, b)| (index * BLOCK_SIZE + at as u64, b))
            })
            .filter(|(at, _)| range.contains(at))
            .map(|(_, b)| b)
            .collect()
    }

    /// What `read_into` fills for object offsets `range` (checked against the object's
    /// bytes): how far it got.
    async fn read_range(tier: &SharedCache, id: &ObjectId, range: Range<u64>) -> u64 {
        let body = RangeBody::new(range.end - range.start, None);
        let filled = tier.read_into(id, range.start, &body, body.len()).await;
        assert_eq!(filled, body.received(), "what it says it filled is what readers see");
        let got = body.slice(0..filled).await.expect("filled");
        assert!(got[..] == object_bytes(id, range.start..range.start + filled)[..], "the bytes of {range:?}");
        filled
    }

    /// The blocks `read_into` fills for `blocks` (checked), and where it stopped.
    async fn read(tier: &SharedCache, id: &ObjectId, blocks: Range<u64>) -> (Vec<u64>, u64) {
        let range = blocks.start * BLOCK_SIZE..(blocks.end * BLOCK_SIZE).min(id.size);
        let reached = range.start + read_range(tier, id, range.clone()).await;
        let stopped = if reached == range.end { blocks.end } else { reached / BLOCK_SIZE };
        ((blocks.start..stopped).collect(), stopped)
    }

    async fn written(tier: &SharedCache) {
        assert!(tier.written_all(Duration::from_secs(10)).await, "written within 10 s");
    }

    async fn keys(store: &MemoryStore) -> Vec<String> {
        let listed = store.list_recursive("", None, false).await.expect("list");
        let mut keys: Vec<String> = listed.objects.into_iter().map(|o| o.key).collect();
        keys.sort();
        keys
    }

    /// `frames` fed to a [`FrameSink`] in pieces of `step` bytes: the
    /// block it stopped at, whether it found a bad frame, and the bytes the body got.
    fn feed(id: &ObjectId, frames: &[u8], step: usize) -> (u64, bool, Bytes) {
        let body = RangeBody::new(id.size, None);
        let target = Target { id, body: &body, origin: 0, end: id.size };
        let key = test_key();
        let sink = FrameSink::new(&target, &key, "abc", 0..id.blocks());
        for piece in frames.chunks(step) {
            if !bucketfs_client::store::BodySink::append(&sink, piece) {
                break;
            }
        }
        let got = futures::executor::block_on(body.slice(0..body.received())).expect("received");
        (sink.next_block(), sink.found_corrupt(), got)
    }

    #[test]
    fn a_block_reaches_the_body_only_whole_and_unchanged_as_itself() {
        let id = object("\"e\"", 2 * MIB + 10); // blocks of 1 MiB, 1 MiB and 10 bytes
        let sealed = |key: &TierKey, hash: &str, number: &dyn Fn(u64) -> u64| {
            let mut frames = BytesMut::new();
            (0..3).for_each(|index| assert!(key.seal_into(&mut frames, hash, number(index), &block_bytes(&id, index))));
            frames.to_vec()
        };
        let frames = |hash: &str, number: &dyn Fn(u64) -> u64| sealed(&test_key(), hash, number);
        let whole = object_bytes(&id, 0..id.size);
        let good = frames("abc", &|index| index);
        for step in [3, 16, 4093, (FRAME + 1) as usize, good.len()] {
            let (next, corrupt, got) = feed(&id, &good, step);
            assert!(next == 3 && !corrupt && got[..] == whole[..], "pieces of {step}: stopped at {next}");
        }
        // A flipped byte of block 1 or of its tag or nonce: block 0 only.
        for at in [FRAME + 5, 2 * FRAME - 1] {
            let mut flipped = good.clone();
            flipped[at as usize] ^= 1;
            let (next, corrupt, got) = feed(&id, &flipped, 4093);
            assert!(next == 1 && corrupt && got[..] == whole[..MIB as usize], "flipped at {at}");
        }
        // Blocks of another object, under other numbers, or well framed with another key
        // (forged by someone who can write the bucket): nothing.
        let forged = sealed(&TierKey::from_file_content(b"a key the tier does not hold").expect("key"), "abc", &|i| i);
        for other in [frames("abd", &|index| index), frames("abc", &|index| index + 1), forged] {
            assert_eq!(feed(&id, &other, 4093), (0, true, Bytes::new()));
        }
        // A cut frame: the blocks before it.
        let (next, corrupt, got) = feed(&id, &good[..good.len() - 1], 4093);
        assert!(next == 2 && !corrupt && got.len() as u64 == 2 * MIB);
    }

    #[test]
    fn blocks_of_another_version_have_other_names() {
        let tier = SharedCache::new(Arc::new(MemoryStore::default()), "/team/cache/", test_key());
        let key = Names::of(&tier, &object("\"e1\"", 10)).chunk(3);
        assert!(key.starts_with("team/cache/") && key.ends_with("/c3"), "{key}");
        assert_ne!(key, Names::of(&tier, &object("\"e2\"", 10)).chunk(3), "another ETag");
        assert_ne!(key, Names::of(&tier, &object("\"e1\"", 11)).chunk(3), "another size");
        assert!(
            tier.block_object(&key).is_some()
                && tier.block_object(&Names::of(&tier, &object("\"e1\"", 10)).block(3)).is_some()
        );
    }

    #[tokio::test]
    async fn whole_chunks_are_one_object_each_and_read_back_from_any_block() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::new(store.clone(), "c", test_key());
        let id = object("\"e\"", 10 * MIB + 5); // chunks 0..8 and 8..11
        assert_eq!(read(&tier, &id, 0..11).await, (vec![], 0), "nothing written yet");
        tier.put_blocks(&id, &(0..11).collect::<Vec<_>>(), Local::with(&id, 0..11));
        written(&tier).await;
        let names = Names::of(&tier, &id);
        assert_eq!(keys(&store).await, [names.chunk(0), names.chunk(1)]);
        assert_eq!(read(&tier, &id, 0..11).await, ((0..11).collect(), 11));
        assert_eq!(read(&tier, &id, 5..10).await, ((5..10).collect(), 10), "from the middle of a chunk on");
        assert_eq!(tier.usage().await.unwrap().blocks, 11);

        // A block that fails its check stops the read there: it comes from the source.
        let mut damaged = store.get_range(&names.chunk(0), 0..8 * FRAME, None).await.unwrap().to_vec();
        damaged[(3 * FRAME + 100) as usize] ^= 1;
        store.put(&names.chunk(0), damaged);
        assert_eq!(read(&tier, &id, 1..11).await, (vec![1, 2], 3));
    }

    /// A read that starts or ends inside a block gets exactly its bytes; the whole blocks
    /// are still checked.
    #[tokio::test]
    async fn a_read_from_and_to_the_middle_of_blocks_gets_exactly_its_bytes() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::new(store.clone(), "c", test_key());
        let id = object("\"e\"", 10 * MIB + 5);
        tier.put_blocks(&id, &(0..11).collect::<Vec<_>>(), Local::with(&id, 0..11));
        written(&tier).await;
        for range in [2 * MIB + 100..5 * MIB + 1000, 7 * MIB + 3..9 * MIB, 100..101, 9 * MIB..10 * MIB + 5] {
            assert_eq!(read_range(&tier, &id, range.clone()).await, range.end - range.start, "{range:?}");
        }
        // A body whose first bytes arrived already is filled on from there.
        let body = RangeBody::new(3 * MIB, None);
        body.append(&object_bytes(&id, MIB..MIB + 700));
        assert_eq!(tier.read_into(&id, MIB, &body, 2 * MIB + 10).await, 2 * MIB + 10);
        assert!(body.slice(0..2 * MIB + 10).await.unwrap()[..] == object_bytes(&id, MIB..3 * MIB + 10)[..]);
    }

    /// A tier that sends no whole block within GET_TIMEOUT is left for the source, and
    /// left alone for a while (no second wait).
    #[tokio::test]
    async fn a_slow_tier_is_given_up_after_the_timeout_and_then_skipped() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::new(store.clone(), "c", test_key());
        let id = object("\"e\"", 8 * MIB);
        tier.put_blocks(&id, &(0..8).collect::<Vec<_>>(), Local::with(&id, 0..8));
        written(&tier).await;
        *store.body_pause.lock() = Duration::from_secs(30); // after each GET's first 64 KiB
        let started = Instant::now();
        assert_eq!(read(&tier, &id, 0..8).await, (vec![], 0), "nothing from a stalled tier");
        let waited = started.elapsed();
        assert!(waited >= GET_TIMEOUT && waited < GET_TIMEOUT * 3, "gave up after {waited:?}");
        let started = Instant::now();
        assert_eq!(read(&tier, &id, 0..8).await, (vec![], 0));
        assert!(started.elapsed() < Duration::from_millis(500), "paused: not asked again");
    }

    #[tokio::test]
    async fn a_chunk_waits_for_its_last_block_and_is_then_written_whole() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::with_chunk_wait(store.clone(), "c", test_key(), Duration::from_secs(30));
        let id = object("\"e\"", 20 * MIB);
        let local = Local::with(&id, 0..7);
        tier.put_blocks(&id, &(0..4).collect::<Vec<_>>(), local.clone());
        tier.put_blocks(&id, &(4..7).collect::<Vec<_>>(), local.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(keys(&store).await, Vec::<String>::new(), "block 7 is still to come");
        local.add(&id, 7);
        tier.put_blocks(&id, &[7], local.clone());
        written(&tier).await;
        assert_eq!(keys(&store).await, [Names::of(&tier, &id).chunk(0)]);
        assert_eq!(read(&tier, &id, 0..8).await, ((0..8).collect(), 8));
    }

    #[tokio::test]
    async fn blocks_of_a_chunk_that_does_not_fill_up_are_written_one_by_one() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::with_chunk_wait(store.clone(), "c", test_key(), Duration::from_millis(100));
        let id = object("\"e\"", 20 * MIB);
        // Block 4 is evicted from the local cache before its turn: not written.
        let local = Arc::new(Local { gone: vec![4], ..Local::default() });
        [2, 3, 4, 9].into_iter().for_each(|index| local.add(&id, index));
        tier.put_blocks(&id, &[2, 3, 4, 9], local);
        written(&tier).await;
        let names = Names::of(&tier, &id);
        let mut expected = [names.block(2), names.block(3), names.block(9)];
        expected.sort();
        assert_eq!(keys(&store).await, expected);
        assert_eq!(read(&tier, &id, 2..6).await, (vec![2, 3], 4), "block 4 is a miss");
        assert_eq!(read(&tier, &id, 9..10).await, (vec![9], 10));
        assert_eq!(read(&tier, &id, 0..3).await, (vec![], 0));
    }

    #[tokio::test]
    async fn usage_counts_and_clear_deletes_only_what_is_named_as_blocks() {
        let store = Arc::new(MemoryStore::default());
        let tier = SharedCache::with_chunk_wait(store.clone(), "team/cache", test_key(), Duration::from_millis(50));
        let (one, two) = (object("\"e1\"", 3 * MIB), object("\"e2\"", 30 * MIB));
        tier.put_blocks(&one, &[0, 1, 2], Local::with(&one, 0..3)); // one chunk of 3
        tier.put_blocks(&two, &[10], Local::with(&two, [10])); // one block alone
        written(&tier).await;
        // Not ours: outside the prefix, or under it but not named as a block.
        for key in ["team/other", "team/cache/notes.txt", "team/cache/abc/1", "data/x.bin"] {
            store.put(key, b"keep".to_vec());
        }
        let usage = tier.usage().await.unwrap();
        assert_eq!((usage.objects, usage.blocks, usage.bytes, usage.other_keys), (2, 4, 4 * FRAME, 2));
        assert!(usage.oldest.is_some());
        assert_eq!(tier.clear().await.unwrap(), 4);
        assert_eq!(tier.usage().await.unwrap().blocks, 0);
        for key in ["team/other", "team/cache/notes.txt", "team/cache/abc/1", "data/x.bin"] {
            assert!(store.head(key).await.is_ok(), "{key} was deleted");
        }
    }
}
