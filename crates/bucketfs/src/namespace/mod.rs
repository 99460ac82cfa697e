//! The directory tree: inode numbers ⇄ S3 keys, lookups, directory listings, the
//! metadata cache, and multiplexing of several sources under one mount.
//!
//! - **Sources.** A mount has one source at the root (`s3://bucket/prefix`) or several,
//!   each shown as a top-level directory (`s3://bucket/prefix=name`); then the root is a
//!   fixed directory holding one entry per source. Each source has its own store client.
//! - **Directories** are key prefixes: implicit (some key lies below `dir/`) or explicit
//!   (a `dir/` marker object). A name that is both an object and a prefix is a directory.
//! - **Inodes** are handed out on first sight of a (parent, name) and never reused while
//!   mounted, so an inode number names one path for the life of the mount. An entry whose
//!   type changes (file ⇄ directory) gets a new number.
//! - **Metadata cache.** Attributes from LIST (readdir) and HEAD (lookup) are trusted for
//!   `metadata_ttl`; missing names are remembered as missing for the same time. So `ls -l`
//!   or `find` right after a listing costs no request per entry.
//! - **Listing cache.** A directory listed completely is listed again from memory for the
//!   same TTL (up to `MAX_CACHED_LISTING` names), and a name it does not contain is known
//!   to be missing. Changes made through the mount update it.

pub mod listing;
pub mod names;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::{Mutex, RwLock};

use crate::cache::SmallObjects;
use crate::fs::error::FsError;
use crate::store::{Metadata, ObjectInfo, ObjectStore, StoreError};
use listing::{Entry, EntryKind, ListingMerger};

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// Largest directory whose complete listing is kept (names only, sorted).
const MAX_CACHED_LISTING: usize = 100_000;

/// After this many lookups in one directory go to the store within the TTL, the
/// directory is listed whole instead (`stat` of many names costs a few LISTs, not two
/// requests per name) — if the listing ends within `LISTING_BATCHES_FOR_LOOKUPS` pages.
const LOOKUPS_BEFORE_LISTING: u32 = 8;
const LISTING_BATCHES_FOR_LOOKUPS: usize = 10;

/// LIST carries no object metadata, so the stored attributes of a listed entry take a
/// HEAD. After this many such HEADs in one directory within the TTL (`ls -l`, `stat *`,
/// `grep -r` walking it), each one also fetches the next entries of the directory's
/// listing, `METADATA_BATCH` of them, `METADATA_CONCURRENCY` at a time.
const METADATA_FETCHES_BEFORE_BATCHING: u32 = 2;
const METADATA_BATCH: usize = 64;
/// Files up to this size are read whole when their metadata is fetched (see `cache`).
const SMALL_OBJECT: u64 = 64 * 1024;
/// Bytes of small files kept until they are opened.
const SMALL_OBJECTS_BUDGET: usize = 32 << 20;
const METADATA_CONCURRENCY: usize = 16;

struct CachedListing {
    until: Instant,
    names: Arc<Vec<String>>,
}

/// One `s3://bucket/prefix` and where it appears in the mount.
pub struct Source {
    /// Top-level directory name when multiplexing; `None` for a source at the root.
    pub mount_name: Option<String>,
    pub store: Arc<dyn ObjectStore>,
    /// Key prefix, empty or ending in `/`.
    pub prefix: String,
}

/// What an inode stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The root of a multiplexed mount: a fixed directory of sources.
    SourceList,
    /// A directory: all keys of `source` starting with `prefix` (empty or ending in `/`).
    Dir { source: usize, prefix: String },
    /// One object.
    File { source: usize, key: String },
}

impl Node {
    /// The directory holding this entry and its name there.
    pub fn parent_and_name(&self) -> (Ino, String) {
        (self.parent, self.name.clone())
    }
}

impl Location {
    pub fn is_dir(&self) -> bool {
        !matches!(self, Location::File { .. })
    }
}

/// An inode as the layers above see it: a snapshot, cheap to clone.
#[derive(Clone, Debug)]
pub struct Node {
    pub ino: Ino,
    pub location: Location,
    /// Object size, mtime and ETag for files; mtime only for directories.
    pub size: u64,
    pub mtime: SystemTime,
    pub etag: Option<String>,
    /// The object's (for a directory: its `dir/` marker's) metadata, once known: LIST
    /// does not return it. An implicit directory has empty metadata.
    pub metadata: Option<Arc<Metadata>>,
    parent: Ino,
    name: String,
    /// Until when the attributes may be used without asking the store again.
    valid_until: Option<Instant>,
}

#[derive(Default)]
struct InodeTable {
    nodes: HashMap<Ino, Node>,
    children: HashMap<(Ino, String), Ino>,
    next_ino: Ino,
}

impl InodeTable {
    /// Records what (parent, name) is now; keeps its inode number unless its type changed.
    fn upsert(&mut self, parent: Ino, name: &str, location: Location, info: Attributes) -> Node {
        let existing = self.children.get(&(parent, name.to_owned())).copied();
        let same_kind = existing.and_then(|ino| self.nodes.get(&ino)).filter(|n| n.location.is_dir() == location.is_dir());
        // A listing says nothing about metadata: keep what a HEAD told us while it is fresh.
        let metadata = match (&info.metadata, same_kind) {
            (None, Some(old)) if old.valid_until.is_none_or(|until| until > Instant::now()) => old.metadata.clone(),
            _ => info.metadata,
        };
        let ino = match same_kind {
            Some(old) => old.ino,
            None => {
                self.next_ino += 1;
                self.children.insert((parent, name.to_owned()), self.next_ino);
                self.next_ino
            }
        };
        let node = Node {
            ino,
            location,
            size: info.size,
            mtime: info.mtime,
            etag: info.etag,
            metadata,
            parent,
            name: name.to_owned(),
            valid_until: info.valid_until,
        };
        self.nodes.insert(ino, node.clone());
        node
    }
}

struct Attributes {
    size: u64,
    mtime: SystemTime,
    etag: Option<String>,
    metadata: Option<Arc<Metadata>>,
    valid_until: Option<Instant>,
}

impl Attributes {
    fn dir(mtime: SystemTime, metadata: Option<Arc<Metadata>>, valid_until: Option<Instant>) -> Self {
        Self { size: 0, mtime, etag: None, metadata, valid_until }
    }

    fn file(info: ObjectInfo, valid_until: Option<Instant>) -> Self {
        Self { size: info.size, mtime: info.mtime, etag: info.etag, metadata: info.metadata, valid_until }
    }
}

pub struct Namespace {
    sources: Vec<Source>,
    table: RwLock<InodeTable>,
    /// (parent, name) known to be missing, until the instant given.
    missing: Mutex<HashMap<(Ino, String), Instant>>,
    /// Files created here whose upload has not finished: not in any LIST yet, but shown
    /// in their directory (read-your-writes). Directory inode → names.
    pending: Mutex<HashMap<Ino, std::collections::BTreeSet<String>>>,
    /// Complete listings of directories, by directory inode.
    listings: Mutex<HashMap<Ino, CachedListing>>,
    /// The page most recently listed of each directory still being listed: programs
    /// `stat` entries while they read the directory (`ls -l`), before the listing is
    /// complete, and metadata batches take their neighbours from here.
    recent_pages: Mutex<HashMap<Ino, CachedListing>>,
    /// Lookups that went to the store, per directory: (count, counting since).
    store_lookups: Mutex<HashMap<Ino, (u32, Instant)>>,
    /// HEADs for the metadata of listed entries, per directory: (count, counting since).
    metadata_fetches: Mutex<HashMap<Ino, (u32, Instant)>>,
    /// Directories in which a file was last opened for reading, and when: small files
    /// there are read whole with their metadata (`fetch_file_metadata`).
    reads: Mutex<HashMap<Ino, Instant>>,
    /// Bodies of small files, read along with their metadata.
    small_objects: SmallObjects,
    ttl: Duration,
    mounted_at: SystemTime,
}

/// One entry of a directory listing, already entered in the inode table.
#[derive(Clone, Debug)]
pub struct Listed {
    pub name: String,
    pub node: Node,
}

impl Namespace {
    pub fn new(sources: Vec<Source>, ttl: Duration) -> Self {
        let mounted_at = SystemTime::now();
        let mut table = InodeTable { next_ino: ROOT_INO, ..Default::default() };
        let root_location = match sources.as_slice() {
            [single] if single.mount_name.is_none() => {
                Location::Dir { source: 0, prefix: single.prefix.clone() }
            }
            _ => Location::SourceList,
        };
        let fixed = || Attributes::dir(mounted_at, Some(Arc::default()), None);
        let root = Node {
            ino: ROOT_INO,
            location: root_location.clone(),
            size: 0,
            mtime: mounted_at,
            etag: None,
            metadata: Some(Arc::default()),
            parent: ROOT_INO,
            name: String::new(),
            valid_until: None,
        };
        table.nodes.insert(ROOT_INO, root);
        if root_location == Location::SourceList {
            for (index, source) in sources.iter().enumerate() {
                let name = source.mount_name.clone().unwrap_or_default();
                let location = Location::Dir { source: index, prefix: source.prefix.clone() };
                table.upsert(ROOT_INO, &name, location, fixed());
            }
        }
        Self {
            sources,
            table: RwLock::new(table),
            missing: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            listings: Mutex::new(HashMap::new()),
            recent_pages: Mutex::new(HashMap::new()),
            store_lookups: Mutex::new(HashMap::new()),
            metadata_fetches: Mutex::new(HashMap::new()),
            reads: Mutex::new(HashMap::new()),
            small_objects: SmallObjects::new(SMALL_OBJECTS_BUDGET, ttl),
            ttl,
            mounted_at,
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn store(&self, source: usize) -> &Arc<dyn ObjectStore> {
        &self.sources[source].store
    }

    pub fn node(&self, ino: Ino) -> Result<Node, FsError> {
        self.table.read().nodes.get(&ino).cloned().ok_or(FsError::NotFound)
    }

    /// Finds `name` in directory `parent`, from the cache when fresh, else from the store.
    pub async fn lookup(&self, parent: Ino, name: &str) -> Result<Node, FsError> {
        let parent_node = self.node(parent)?;
        let (source, prefix) = match &parent_node.location {
            Location::File { .. } => return Err(FsError::NotDir),
            Location::SourceList => {
                let table = self.table.read();
                let ino = table.children.get(&(ROOT_INO, name.to_owned())).ok_or(FsError::NotFound)?;
                return table.nodes.get(ino).cloned().ok_or(FsError::NotFound);
            }
            Location::Dir { source, prefix } => (*source, prefix.clone()),
        };
        if names::check_component(name).is_err() {
            return Err(if name.len() > names::NAME_MAX { FsError::NameTooLong } else { FsError::NotFound });
        }
        let now = Instant::now();
        if let Some(node) = self.cached_child(parent, name, now) {
            return Ok(node);
        }
        let missing_key = (parent, name.to_owned());
        if self.missing.lock().get(&missing_key).is_some_and(|until| *until > now) {
            return Err(FsError::NotFound);
        }
        if let Some(names) = self.fresh_listing(parent, now) {
            if names.binary_search_by(|n| n.as_str().cmp(name)).is_err() {
                return Err(FsError::NotFound); // not in a complete, fresh listing
            }
        }

        if self.many_lookups_in(parent, now) && self.list_whole(parent).await? {
            // Listed completely just now: the answer is in the cache.
            return self.cached_child(parent, name, Instant::now()).ok_or(FsError::NotFound);
        }

        let store = self.store(source);
        let key = format!("{prefix}{name}");
        let dir_prefix = format!("{key}/");
        // Both questions at once: is there an object `key`, and is there anything below `key/`?
        let (head, children) = tokio::join!(store.head(&key), store.list(&dir_prefix, None, Some(1)));
        let children = children?;
        let valid_until = Some(Instant::now() + self.ttl);
        if !children.objects.is_empty() || !children.prefixes.is_empty() {
            if head.is_ok() {
                tracing::warn!(key, "object not shown: a directory of the same name exists");
            }
            // A `dir/` marker lists first; only then is there metadata to fetch.
            let metadata = if children.objects.first().is_some_and(|o| o.key == dir_prefix) {
                self.marker_metadata(store, &dir_prefix).await?
            } else {
                Arc::default()
            };
            let attributes = Attributes::dir(self.mounted_at, Some(metadata), valid_until);
            return Ok(self.table.write().upsert(
                parent,
                name,
                Location::Dir { source, prefix: dir_prefix },
                attributes,
            ));
        }
        match head {
            Ok(info) => Ok(self.enter_file(parent, name, source, info, valid_until)),
            Err(crate::store::StoreError::NotFound) => {
                self.missing.lock().insert(missing_key, now + self.ttl);
                Err(FsError::NotFound)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The attributes of `ino`, refreshed from the store when older than the TTL.
    pub async fn getattr(&self, ino: Ino) -> Result<Node, FsError> {
        let node = self.node(ino)?;
        if node.valid_until.is_none_or(|until| until > Instant::now()) {
            return Ok(node);
        }
        self.expire(ino);
        let fresh = self.lookup(node.parent, &node.name).await?;
        if fresh.ino != ino {
            return Err(FsError::NotFound); // the path now names something else
        }
        Ok(fresh)
    }

    /// Lists directory `dir`, one store page at a time.
    pub fn list(&self, dir: Ino) -> Result<DirStream, FsError> {
        let node = self.node(dir)?;
        let inner = match node.location {
            Location::File { .. } => return Err(FsError::NotDir),
            Location::SourceList => None,
            Location::Dir { source, prefix } => Some((source, prefix)),
        };
        let pending = self.pending.lock().get(&dir).cloned().unwrap_or_default();
        let now = Instant::now();
        Ok(DirStream {
            dir,
            parent: node.parent,
            inner,
            merger: None,
            token: None,
            done: false,
            pending,
            cached: self.fresh_listing(dir, now).map(|names| (names, 0)),
            collected: Some(Vec::new()),
            started: now,
        })
    }

    /// Counts a lookup in `dir` that needs the store; true when it is time to list `dir`
    /// whole instead (once per TTL).
    fn many_lookups_in(&self, dir: Ino, now: Instant) -> bool {
        self.count_in(&self.store_lookups, dir, now) == LOOKUPS_BEFORE_LISTING
    }

    /// Counts one more store request for entries of `dir` in `counts`; returns how many
    /// there were within the TTL (0 when nothing is cached, TTL 0).
    fn count_in(&self, counts: &Mutex<HashMap<Ino, (u32, Instant)>>, dir: Ino, now: Instant) -> u32 {
        if self.ttl.is_zero() {
            return 0;
        }
        let mut counts = counts.lock();
        let (count, since) = counts.entry(dir).or_insert((0, now));
        if now.duration_since(*since) > self.ttl {
            (*count, *since) = (0, now);
        }
        *count = count.saturating_add(1);
        *count
    }

    /// Lists `dir` into the caches if it ends within a few pages; true if it did.
    async fn list_whole(&self, dir: Ino) -> Result<bool, FsError> {
        let mut stream = self.list(dir)?;
        for _ in 0..LISTING_BATCHES_FOR_LOOKUPS {
            stream.next_batch(self).await?;
            if stream.done {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn fresh_listing(&self, dir: Ino, now: Instant) -> Option<Arc<Vec<String>>> {
        let listings = self.listings.lock();
        listings.get(&dir).filter(|l| l.until > now).map(|l| l.names.clone())
    }

    fn remember_listing(&self, dir: Ino, started: Instant, mut names: Vec<String>) {
        if self.ttl.is_zero() {
            return;
        }
        names.sort_unstable();
        let listing = CachedListing { until: started + self.ttl, names: Arc::new(names) };
        self.listings.lock().insert(dir, listing);
        self.recent_pages.lock().remove(&dir);
    }

    /// A change made through the mount: `name` now is (or is not) in `dir`, also in its
    /// cached listing, which stays complete. (`tar x` into a new directory then costs no
    /// lookup request per file.)
    fn update_listing(&self, dir: Ino, name: &str, present: bool) {
        let mut listings = self.listings.lock();
        let Some(listing) = listings.get_mut(&dir) else { return };
        let names = Arc::make_mut(&mut listing.names);
        match (names.binary_search_by(|n| n.as_str().cmp(name)), present) {
            (Err(at), true) => names.insert(at, name.to_owned()),
            (Ok(at), false) => {
                names.remove(at);
            }
            _ => {}
        }
    }

    /// The directory `parent` as (source, key prefix), for creating entries in it.
    pub fn dir_location(&self, parent: Ino) -> Result<(usize, String), FsError> {
        match self.node(parent)?.location {
            Location::Dir { source, prefix } => Ok((source, prefix)),
            Location::File { .. } => Err(FsError::NotDir),
            // The root of a multiplexed mount only holds the sources.
            Location::SourceList => Err(FsError::ReadOnly),
        }
    }

    /// Checks that `name` can be created in `parent`; returns the key it would have.
    pub async fn new_entry_key(&self, parent: Ino, name: &str) -> Result<(usize, String), FsError> {
        let (source, key) = self.entry_key(parent, name)?;
        match self.lookup(parent, name).await {
            Ok(_) => Err(FsError::Exists),
            Err(FsError::NotFound) => Ok((source, key)),
            Err(other) => Err(other),
        }
    }

    /// The (source, key) that `name` in `parent` has or would have.
    pub fn entry_key(&self, parent: Ino, name: &str) -> Result<(usize, String), FsError> {
        let (source, prefix) = self.dir_location(parent)?;
        if names::check_component(name).is_err() {
            return Err(if name.len() > names::NAME_MAX { FsError::NameTooLong } else { FsError::Invalid("file name") });
        }
        Ok((source, format!("{prefix}{name}")))
    }

    /// `(parent, name)` was renamed to `(new_parent, new_name)`, its key (for a directory:
    /// prefix) `old_key` to `new_key`; what was at the new name is gone. The inode keeps
    /// its number (the kernel moved its dentry already) and everything below a renamed
    /// directory moves with it.
    pub fn rename_entry(&self, (parent, name): (Ino, &str), (new_parent, new_name): (Ino, &str), old_key: &str, new_key: &str) {
        self.update_listing(parent, name, false);
        self.update_listing(new_parent, new_name, true);
        let mut table = self.table.write();
        let Some(ino) = table.children.remove(&(parent, name.to_owned())) else { return };
        if let Some(replaced) = table.children.insert((new_parent, new_name.to_owned()), ino) {
            table.nodes.remove(&replaced);
        }
        let renamed_dir = old_key.ends_with('/');
        for node in table.nodes.values_mut() {
            if node.ino != ino && !renamed_dir {
                continue;
            }
            let key = match &mut node.location {
                Location::File { key, .. } => key,
                Location::Dir { prefix, .. } => prefix,
                Location::SourceList => continue,
            };
            if let Some(rest) = key.strip_prefix(old_key) {
                *key = format!("{new_key}{rest}");
            }
        }
        if let Some(node) = table.nodes.get_mut(&ino) {
            node.parent = new_parent;
            node.name = new_name.to_owned();
        }
        drop(table);
        let mut pending = self.pending.lock();
        if pending.get_mut(&parent).is_some_and(|names| names.remove(name)) {
            pending.entry(new_parent).or_default().insert(new_name.to_owned());
        }
        drop(pending);
        let mut missing = self.missing.lock();
        missing.remove(&(new_parent, new_name.to_owned()));
        missing.insert((parent, name.to_owned()), Instant::now() + self.ttl);
    }

    /// Enters a file being written: shown at once, trusted until its upload finishes.
    pub fn enter_pending_file(&self, parent: Ino, name: &str, source: usize, key: String, metadata: Arc<Metadata>) -> Node {
        self.missing.lock().remove(&(parent, name.to_owned()));
        self.update_listing(parent, name, true);
        self.pending.lock().entry(parent).or_default().insert(name.to_owned());
        let attributes =
            Attributes { size: 0, mtime: SystemTime::now(), etag: None, metadata: Some(metadata), valid_until: None };
        self.table.write().upsert(parent, name, Location::File { source, key }, attributes)
    }

    /// Forgets what is cached about `ino`: the next `getattr` asks the store.
    pub fn expire(&self, ino: Ino) {
        if let Some(node) = self.table.write().nodes.get_mut(&ino) {
            if node.valid_until.is_some() {
                node.valid_until = Some(Instant::now());
            }
        }
    }

    /// The metadata `ino` now has in the store (or will have, for a file being written).
    pub fn set_metadata(&self, ino: Ino, metadata: Arc<Metadata>, etag: Option<Option<String>>) {
        if let Some(node) = self.table.write().nodes.get_mut(&ino) {
            node.metadata = Some(metadata);
            if let Some(etag) = etag {
                node.etag = etag;
            }
        }
    }

    /// `node` with its metadata known: fetched with a HEAD if a listing is all we have.
    /// Entries of a directory that keeps needing this are fetched in batches (see
    /// [`METADATA_BATCH`]).
    pub async fn with_metadata(&self, node: Node) -> Result<Node, FsError> {
        if node.metadata.is_some() {
            return Ok(node);
        }
        let batch = self.metadata_batch(&node);
        let fetches = batch.into_iter().map(|(ino, location)| async move {
            let result = self.fetch_metadata(ino, &location).await;
            (ino, result)
        });
        let mut results = futures::stream::iter(fetches).buffer_unordered(METADATA_CONCURRENCY);
        let mut wanted = None;
        while let Some((ino, result)) = results.next().await {
            if ino == node.ino {
                wanted = Some(result);
            } else if let Err(error) = result {
                tracing::debug!(ino, "metadata of a neighbour not fetched: {error}");
            }
        }
        match wanted {
            Some(Ok(())) | None => self.node(node.ino),
            Some(Err(error)) => Err(error),
        }
    }

    /// The entries whose metadata to fetch along with `node`'s: `node` first, then, once
    /// its directory has needed many, the entries after it in the directory's listing.
    fn metadata_batch(&self, node: &Node) -> Vec<(Ino, Location)> {
        let mut batch = vec![(node.ino, node.location.clone())];
        let now = Instant::now();
        if self.count_in(&self.metadata_fetches, node.parent, now) < METADATA_FETCHES_BEFORE_BATCHING {
            return batch;
        }
        let recent_page = || {
            let pages = self.recent_pages.lock();
            pages.get(&node.parent).filter(|p| p.until > now).map(|p| p.names.clone())
        };
        let Some(names) = self.fresh_listing(node.parent, now).or_else(recent_page) else {
            return batch;
        };
        let start = names.partition_point(|n| n.as_str() <= node.name.as_str());
        let table = self.table.read();
        let unknown = names[start..].iter().filter_map(|name| {
            let child = table.nodes.get(table.children.get(&(node.parent, name.clone()))?)?;
            child.metadata.is_none().then(|| (child.ino, child.location.clone()))
        });
        batch.extend(unknown.take(METADATA_BATCH - 1));
        batch
    }

    async fn fetch_metadata(&self, ino: Ino, location: &Location) -> Result<(), FsError> {
        match location {
            Location::SourceList => self.set_metadata(ino, Arc::default(), None),
            Location::Dir { source, prefix } => {
                let metadata = self.marker_metadata(self.store(*source), prefix).await?;
                self.set_metadata(ino, metadata, None);
            }
            Location::File { source, key } => match self.fetch_file_metadata(ino, self.store(*source), key).await {
                Ok(info) => {
                    let mut table = self.table.write();
                    if let Some(node) = table.nodes.get_mut(&ino) {
                        node.size = info.size;
                        node.mtime = info.mtime;
                        node.etag = info.etag;
                        node.metadata = info.metadata;
                    }
                }
                Err(StoreError::NotFound) => {
                    // Deleted since it was listed.
                    let (parent, name) = self.node(ino)?.parent_and_name();
                    self.remove_entry(parent, &name);
                    return Err(FsError::NotFound);
                }
                Err(error) => return Err(error.into()),
            },
        }
        Ok(())
    }

    /// HEAD of the file `key` (`ino`). A small file in a directory whose files are being
    /// read (`grep -r`, `cat *`) is read whole instead, for about the same cost, and its
    /// content kept for the open that follows. Elsewhere (`ls -l`) that GET cost 14%
    /// more than a HEAD for 64-byte files, so it is not sent.
    async fn fetch_file_metadata(&self, ino: Ino, store: &Arc<dyn ObjectStore>, key: &str) -> Result<ObjectInfo, StoreError> {
        let (listed_size, parent) = self.table.read().nodes.get(&ino).map_or((0, ino), |node| (node.size, node.parent));
        if !(1..=SMALL_OBJECT).contains(&listed_size) || !self.files_read_in(parent) {
            return store.head(key).await;
        }
        match store.head_with_body(key, SMALL_OBJECT).await {
            Ok((info, body)) => {
                if let Some(etag) = info.etag.clone().filter(|_| body.len() as u64 == info.size) {
                    self.small_objects.insert(ino, etag, body);
                }
                Ok(info)
            }
            Err(StoreError::NotFound) => Err(StoreError::NotFound),
            // Replaced by an empty object since it was listed, which has no byte to GET.
            Err(_) => store.head(key).await,
        }
    }

    /// `ino` is being opened for reading: small files next to it will be read too.
    pub fn note_read(&self, ino: Ino) {
        if let Ok(node) = self.node(ino) {
            self.reads.lock().insert(node.parent, Instant::now());
        }
    }

    fn files_read_in(&self, dir: Ino) -> bool {
        self.reads.lock().get(&dir).is_some_and(|at| at.elapsed() <= self.ttl)
    }

    /// The content of `ino` at version `etag` if it was read along with its metadata and
    /// not opened since.
    pub fn take_small_object(&self, ino: Ino, etag: &str) -> Option<Bytes> {
        self.small_objects.take(ino, etag)
    }

    /// The metadata of the marker `prefix` (a key ending in `/`); empty if there is none.
    async fn marker_metadata(&self, store: &Arc<dyn ObjectStore>, prefix: &str) -> Result<Arc<Metadata>, FsError> {
        if prefix.is_empty() {
            return Ok(Arc::default()); // the bucket itself
        }
        match store.head(prefix).await {
            Ok(info) => Ok(info.metadata.unwrap_or_default()),
            Err(StoreError::NotFound) => Ok(Arc::default()),
            Err(error) => Err(error.into()),
        }
    }

    /// A file being written grew to `size`.
    pub fn set_pending_size(&self, ino: Ino, size: u64) {
        if let Some(node) = self.table.write().nodes.get_mut(&ino) {
            node.size = size;
            node.mtime = SystemTime::now();
        }
    }

    /// The upload of `ino` finished with this ETag and metadata: from now on it is an
    /// ordinary object.
    pub fn upload_done(&self, ino: Ino, etag: Option<String>, metadata: Arc<Metadata>) {
        let mut table = self.table.write();
        if let Some(node) = table.nodes.get_mut(&ino) {
            node.etag = etag;
            node.metadata = Some(metadata);
            node.mtime = SystemTime::now();
            node.valid_until = Some(Instant::now() + self.ttl);
            if let Some(names) = self.pending.lock().get_mut(&node.parent) {
                names.remove(&node.name);
            }
        }
    }

    /// The upload replacing an existing object failed: the object is unchanged in the
    /// bucket, so what was shown while writing is dropped and read again from S3.
    pub fn upload_abandoned(&self, ino: Ino) {
        let mut table = self.table.write();
        if let Some(node) = table.nodes.get_mut(&ino) {
            node.valid_until = Some(Instant::now());
            if let Some(names) = self.pending.lock().get_mut(&node.parent) {
                names.remove(&node.name);
            }
        }
    }

    /// Enters a directory just created in `parent`, its marker having `metadata`.
    pub fn enter_dir(&self, parent: Ino, name: &str, source: usize, prefix: String, metadata: Arc<Metadata>) -> Node {
        self.missing.lock().remove(&(parent, name.to_owned()));
        self.update_listing(parent, name, true);
        let attributes = Attributes::dir(SystemTime::now(), Some(metadata), Some(Instant::now() + self.ttl));
        let node = self.table.write().upsert(parent, name, Location::Dir { source, prefix }, attributes);
        // Just created, so empty: names in it are known to be missing without asking.
        self.remember_listing(node.ino, Instant::now(), Vec::new());
        node
    }

    /// Whether files are being written directly in directory `dir`.
    pub fn has_pending_children(&self, dir: Ino) -> bool {
        self.pending.lock().get(&dir).is_some_and(|names| !names.is_empty())
    }

    /// Forgets (parent, name) after it was deleted (or its creation failed): later lookups
    /// say ENOENT without asking the store, until the TTL passes.
    pub fn remove_entry(&self, parent: Ino, name: &str) {
        self.update_listing(parent, name, false);
        let mut table = self.table.write();
        if let Some(ino) = table.children.remove(&(parent, name.to_owned())) {
            table.nodes.remove(&ino);
            self.listings.lock().remove(&ino);
        }
        if let Some(names) = self.pending.lock().get_mut(&parent) {
            names.remove(name);
        }
        self.missing.lock().insert((parent, name.to_owned()), Instant::now() + self.ttl);
    }

    fn cached_child(&self, parent: Ino, name: &str, now: Instant) -> Option<Node> {
        let table = self.table.read();
        let ino = table.children.get(&(parent, name.to_owned()))?;
        let node = table.nodes.get(ino)?;
        node.valid_until.is_none_or(|until| until > now).then(|| node.clone())
    }

    fn enter_file(&self, parent: Ino, name: &str, source: usize, info: ObjectInfo, valid_until: Option<Instant>) -> Node {
        self.missing.lock().remove(&(parent, name.to_owned()));
        let key = info.key.clone();
        self.table.write().upsert(parent, name, Location::File { source, key }, Attributes::file(info, valid_until))
    }

    fn enter_listed(&self, dir: Ino, source: usize, prefix: &str, entries: Vec<Entry>) -> Vec<Listed> {
        let valid_until = Some(Instant::now() + self.ttl);
        let mut names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        names.sort_unstable();
        let page = CachedListing { until: Instant::now() + self.ttl, names: Arc::new(names) };
        self.recent_pages.lock().insert(dir, page);
        let mut missing = self.missing.lock();
        let mut table = self.table.write();
        entries
            .into_iter()
            .map(|entry| {
                missing.remove(&(dir, entry.name.clone()));
                let (location, attributes) = match entry.kind {
                    EntryKind::Dir => (
                        Location::Dir { source, prefix: format!("{prefix}{}/", entry.name) },
                        Attributes::dir(self.mounted_at, None, valid_until),
                    ),
                    EntryKind::File(info) => {
                        (Location::File { source, key: info.key.clone() }, Attributes::file(info, valid_until))
                    }
                };
                let node = table.upsert(dir, &entry.name, location, attributes);
                Listed { name: entry.name, node }
            })
            .collect()
    }
}

/// A directory being listed: yields entries page by page, so a directory of any size is
/// listed in memory proportional to one page.
pub struct DirStream {
    pub dir: Ino,
    pub parent: Ino,
    inner: Option<(usize, String)>,
    merger: Option<ListingMerger>,
    token: Option<String>,
    done: bool,
    /// Files being written here when listing started and not yet seen in the listing;
    /// shown after the listed entries.
    pending: std::collections::BTreeSet<String>,
    /// A fresh complete listing to serve from, and the position in it.
    cached: Option<(Arc<Vec<String>>, usize)>,
    /// Names listed so far from the store, to cache once complete (`None` past the cap).
    collected: Option<Vec<String>>,
    started: Instant,
}

impl DirStream {
    /// The next batch of entries; empty once the listing is complete.
    pub async fn next_batch(&mut self, namespace: &Namespace) -> Result<Vec<Listed>, FsError> {
        if self.done {
            return Ok(Vec::new());
        }
        let Some((source, prefix)) = self.inner.clone() else {
            self.done = true;
            let table = namespace.table.read();
            let mut sources: Vec<Listed> = table
                .children
                .iter()
                .filter(|((parent, _), _)| *parent == ROOT_INO)
                .filter_map(|((_, name), ino)| {
                    Some(Listed { name: name.clone(), node: table.nodes.get(ino)?.clone() })
                })
                .collect();
            sources.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(sources);
        };
        if let Some((names, position)) = &mut self.cached {
            let end = (*position + 1000).min(names.len());
            let batch: Vec<String> = names[*position..end].to_vec();
            *position = end;
            self.done = end == names.len();
            let mut listed = self.known_entries(namespace, batch);
            if self.done {
                listed.extend(self.take_pending(namespace));
            }
            return Ok(listed);
        }
        loop {
            let merger = self.merger.get_or_insert_with(|| ListingMerger::new(prefix.clone()));
            let page = namespace.store(source).list(&prefix, self.token.take(), None).await?;
            self.token = page.next_token.clone();
            self.done = self.token.is_none();
            let entries = merger.push_page(page);
            for entry in &entries {
                self.pending.remove(&entry.name);
            }
            if let Some(collected) = &mut self.collected {
                collected.extend(entries.iter().map(|e| e.name.clone()));
                if collected.len() > MAX_CACHED_LISTING {
                    self.collected = None;
                }
            }
            if !entries.is_empty() || self.done {
                let mut listed = namespace.enter_listed(self.dir, source, &prefix, entries);
                if self.done {
                    if let Some(names) = self.collected.take() {
                        namespace.remember_listing(self.dir, self.started, names);
                    }
                    listed.extend(self.take_pending(namespace));
                }
                return Ok(listed);
            }
        }
    }
}

impl DirStream {
    fn take_pending(&mut self, namespace: &Namespace) -> Vec<Listed> {
        let pending = std::mem::take(&mut self.pending);
        self.known_entries(namespace, pending)
    }

    /// The entries of this directory with these names, from the inode table.
    fn known_entries(&mut self, namespace: &Namespace, names: impl IntoIterator<Item = String>) -> Vec<Listed> {
        let table = namespace.table.read();
        names
            .into_iter()
            .filter_map(|name| {
                self.pending.remove(&name);
                let ino = table.children.get(&(self.dir, name.clone()))?;
                Some(Listed { node: table.nodes.get(ino)?.clone(), name })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::store::memory::MemoryStore;

    fn namespace(keys: &[&str]) -> Namespace {
        namespace_and_store(keys.iter().map(|k| k.to_string())).0
    }

    /// A namespace over one in-memory bucket holding `keys` (one byte each), and the store.
    fn namespace_and_store(keys: impl IntoIterator<Item = String>) -> (Namespace, Arc<MemoryStore>) {
        let store = Arc::new(MemoryStore::with_keys(keys.into_iter().map(|k| (k, b"x".to_vec()))));
        let source = Source { mount_name: None, store: store.clone(), prefix: String::new() };
        (Namespace::new(vec![source], Duration::from_secs(60)), store)
    }

    #[tokio::test]
    async fn lookup_agrees_with_listing_on_file_versus_directory() {
        let ns = namespace(&["both", "both/inner", "plain", "marker/"]);
        assert!(ns.lookup(ROOT_INO, "both").await.expect("both").location.is_dir());
        assert!(!ns.lookup(ROOT_INO, "plain").await.expect("plain").location.is_dir());
        assert!(ns.lookup(ROOT_INO, "marker").await.expect("marker").location.is_dir());
        assert!(matches!(ns.lookup(ROOT_INO, "nothing").await, Err(FsError::NotFound)));
        assert!(matches!(ns.lookup(ROOT_INO, "..").await, Err(FsError::NotFound)));
    }

    #[tokio::test]
    async fn keys_that_cannot_be_names_are_hidden_and_siblings_stay() {
        let long = "l".repeat(256);
        let long_key = format!("x/{long}");
        let ns = namespace(&["x//y", "x/sib", "p/./q", "p/../q", "p/sib2", &long_key, "/lead", "top"]);
        let names = |listed: Vec<Listed>| listed.into_iter().map(|l| l.name).collect::<Vec<_>>();
        let mut root = ns.list(ROOT_INO).expect("root");
        assert_eq!(names(root.next_batch(&ns).await.expect("root")), ["p", "top", "x"]);
        let x = ns.lookup(ROOT_INO, "x").await.expect("x");
        assert_eq!(names(ns.list(x.ino).expect("x").next_batch(&ns).await.expect("x")), ["sib"]);
        let p = ns.lookup(ROOT_INO, "p").await.expect("p");
        assert_eq!(names(ns.list(p.ino).expect("p").next_batch(&ns).await.expect("p")), ["sib2"]);
        assert!(matches!(ns.lookup(x.ino, &long).await, Err(FsError::NameTooLong)));
        assert!(matches!(ns.lookup(x.ino, "").await, Err(FsError::NotFound)));
    }

    #[tokio::test]
    async fn inode_numbers_are_stable_between_listing_and_lookup() {
        let ns = namespace(&["d/a", "d/b", "f"]);
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let mut stream = ns.list(d.ino).expect("list");
        let listed = stream.next_batch(&ns).await.expect("page");
        let a = ns.lookup(d.ino, "a").await.expect("a");
        assert_eq!(listed.iter().find(|l| l.name == "a").map(|l| l.node.ino), Some(a.ino));
        assert_eq!(ns.lookup(ROOT_INO, "d").await.expect("d").ino, d.ino);
    }

    #[tokio::test]
    async fn complete_listing_is_reused_within_the_ttl() {
        let (ns, store) = namespace_and_store(["d/a", "d/b"].map(String::from));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let names = |listed: Vec<Listed>| listed.into_iter().map(|l| l.name).collect::<Vec<_>>();
        let first = names(ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page"));
        let (lists, heads) = (store.lists.load(Ordering::Relaxed), store.heads.load(Ordering::Relaxed));
        let again = names(ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page"));
        assert_eq!(first, again);
        assert!(matches!(ns.lookup(d.ino, "missing").await, Err(FsError::NotFound)));
        assert_eq!(store.lists.load(Ordering::Relaxed), lists, "second listing and lookup from memory");
        assert_eq!(store.heads.load(Ordering::Relaxed), heads);
        // Changes through the mount update the cached listing.
        ns.enter_pending_file(d.ino, "c", 0, "d/c".into(), Arc::default());
        ns.remove_entry(d.ino, "a");
        let after = names(ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page"));
        assert_eq!(after, ["b", "c"]);
        assert_eq!(store.lists.load(Ordering::Relaxed), lists, "still from memory");
    }

    #[tokio::test]
    async fn listed_file_deleted_since_disappears_when_its_metadata_is_fetched() {
        let (ns, store) = namespace_and_store(["d/gone", "d/kept"].map(String::from));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        let gone = listed.iter().find(|l| l.name == "gone").expect("listed").node.clone();
        assert!(gone.metadata.is_none(), "a listing has no metadata");
        store.delete("d/gone").await.expect("delete behind the mount's back");
        assert!(matches!(ns.with_metadata(gone).await, Err(FsError::NotFound)));
        let names: Vec<_> = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page").into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["kept"], "the cached listing forgot it");
        assert!(matches!(ns.lookup(d.ino, "gone").await, Err(FsError::NotFound)));
    }

    #[tokio::test]
    async fn abandoned_overwrite_shows_the_stored_object_again() {
        let ns = namespace(&["f"]);
        let f = ns.lookup(ROOT_INO, "f").await.expect("f");
        ns.enter_pending_file(ROOT_INO, "f", 0, "f".into(), Arc::default());
        ns.set_pending_size(f.ino, 12345);
        ns.upload_abandoned(f.ino);
        let again = ns.getattr(f.ino).await.expect("still there");
        assert_eq!((again.ino, again.size), (f.ino, 1), "size from the store, not the failed write");
        let mut root = ns.list(ROOT_INO).expect("root");
        let listed = root.next_batch(&ns).await.expect("root");
        assert_eq!(listed.iter().filter(|l| l.name == "f").count(), 1, "listed once");
    }

    #[tokio::test]
    async fn many_lookups_in_one_directory_list_it_instead() {
        let keys: Vec<String> = (0..100).map(|i| format!("d/f{i:03}")).collect();
        let (ns, store) = namespace_and_store(keys.iter().cloned());
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        for i in 0..100 {
            ns.lookup(d.ino, &format!("f{i:03}")).await.expect("file");
        }
        assert!(matches!(ns.lookup(d.ino, "nope").await, Err(FsError::NotFound)));
        let heads = store.heads.load(Ordering::Relaxed);
        assert!(heads <= 1 + LOOKUPS_BEFORE_LISTING as usize, "{heads} HEADs for 100 lookups");
    }

    #[tokio::test]
    async fn metadata_is_fetched_in_batches_while_a_directory_is_being_read() {
        let keys: Vec<String> = (0..1500).map(|i| format!("d/f{i:04}")).collect();
        let (ns, store) = namespace_and_store(keys.iter().cloned());
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let mut stream = ns.list(d.ino).expect("list");
        let page = stream.next_batch(&ns).await.expect("first page"); // listing not complete
        let heads_before = store.heads.load(Ordering::Relaxed);
        for listed in &page[..10] {
            let node = ns.with_metadata(ns.node(listed.node.ino).expect("node")).await.expect("metadata");
            assert!(node.metadata.is_some());
        }
        let heads = store.heads.load(Ordering::Relaxed) - heads_before;
        assert_eq!(heads, 1 + METADATA_BATCH, "one alone, then a batch of neighbours: {heads} HEADs");
        let known = page.iter().filter(|l| ns.node(l.node.ino).is_ok_and(|n| n.metadata.is_some())).count();
        assert_eq!(known, heads, "each HEAD filled in one entry");
    }

    #[tokio::test]
    async fn multiplexed_root_lists_sources() {
        let one = Arc::new(MemoryStore::with_keys([("x".to_owned(), vec![1])]));
        let two = Arc::new(MemoryStore::with_keys([("pre/y".to_owned(), vec![2])]));
        let ns = Namespace::new(
            vec![
                Source { mount_name: Some("one".into()), store: one, prefix: String::new() },
                Source { mount_name: Some("two".into()), store: two, prefix: "pre/".into() },
            ],
            Duration::from_secs(1),
        );
        let mut root = ns.list(ROOT_INO).expect("root");
        let names: Vec<_> = root.next_batch(&ns).await.expect("root").into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["one", "two"]);
        let two = ns.lookup(ROOT_INO, "two").await.expect("two");
        let y = ns.lookup(two.ino, "y").await.expect("y");
        assert_eq!(y.location, Location::File { source: 1, key: "pre/y".into() });
    }
}
