//! The directory tree: inode numbers ⇄ S3 keys, lookups, directory listings, the
//! metadata cache, and multiplexing of several sources under one mount.
//!
//! - **Sources.** A mount has one source at the root (`s3://bucket/prefix`) or several,
//!   each shown as a top-level directory (`s3://bucket/prefix=name`); then the root is a
//!   fixed directory holding one entry per source. Each source has its own store client.
//! - **Directories** are key prefixes: implicit (some key lies below `dir/`) or explicit
//!   (a `dir/` marker object). A name that is both an object and a prefix is a directory.
//! - **Metadata cache.** Attributes from LIST (readdir) and HEAD (lookup) are trusted for
//!   `metadata_ttl`; missing names are remembered as missing for the same time. So `ls -l`
//!   or `find` right after a listing costs no request per entry.
//! - **Listing cache.** A directory listed completely is listed again from memory for the
//!   same TTL (up to `MAX_CACHED_LISTING` names), and a name it does not contain is known
//!   to be missing. Changes made through the mount update it.
//!
//! The state is split by what it owns: `inode` (the table), `dir_state` (everything
//! known about directories, with the table, behind the one lock of [`Namespace`]),
//! `readdir` (directory streams), `metadata` (stored attributes fetched for listed
//! entries), `listing` (LIST pages → entries) and `names` (which keys can be names).

mod dir_state;
mod error;
pub mod index;
mod inode;
pub mod listing;
mod metadata;
pub mod names;
mod readdir;
mod subtree;
mod versions;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::cache::SmallObjects;
use bucketfs_client::store::{Metadata, ObjectInfo, ObjectStore, StoreError};
use dir_state::{Counted, DirState};
pub use error::NamespaceError;
use index::{Change, IndexOptions, Indexed, Indexes};
use inode::{Attributes, InodeTable};
pub use inode::{Copied, Ino, Location, Node, ROOT_INO};
use listing::Entry;
pub use readdir::{DirStream, Listed};
pub use versions::{History, VERSIONS_DIR};

/// After this many lookups in one directory go to the store within the TTL, the
/// directory is listed whole instead (`stat` of many names costs a few LISTs, not two
/// requests per name) — if the listing ends within `LISTING_BATCHES_FOR_LOOKUPS` pages.
const LOOKUPS_BEFORE_LISTING: u32 = 8;
const LISTING_BATCHES_FOR_LOOKUPS: usize = 10;
/// A directory whose complete listing expired is listed again at its first lookup that
/// misses if it held at most this many names (a page of a store's listing).
const RELIST_AT_FIRST_MISS_UP_TO: usize = 1000;
/// Bytes of small files kept until they are opened.
const SMALL_OBJECTS_BUDGET: usize = 32 << 20;
/// How often expired state is dropped ([`Namespace::sweep`]).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// Longest a name whose delete waits to be sent stays out of lookups and listings: the
/// delete lands or fails long before (a failure shows the name again), so this only
/// bounds what the missing names' table keeps.
const DELETE_HELD_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// One `s3://bucket/prefix` and where it appears in the mount.
pub struct Source {
    /// Top-level directory name when multiplexing; `None` for a source at the root.
    pub mount_name: Option<String>,
    pub store: Arc<dyn ObjectStore>,
    /// Key prefix, empty or ending in `/`.
    pub prefix: String,
}

/// A directory shown as this mount made it (see [`Namespace::hold_dir`]). Dropping it
/// keeps the hold: only [`HeldDir::release`] ends it, once what was held is stored.
pub struct HeldDir {
    state: Arc<Mutex<DirState>>,
    dir: Ino,
    ttl: Duration,
}

impl HeldDir {
    /// The directory is stored as shown: from now on the store is asked again, after the TTL.
    pub fn release(self) {
        self.state.lock().release(self.dir, Instant::now() + self.ttl);
    }
}

/// A name removed whose delete is not sent yet (see
/// [`Namespace::remove_entry_until_deleted`]).
pub struct HeldRemoval {
    state: Arc<Mutex<DirState>>,
    parent: Ino,
    name: String,
    ttl: Duration,
}

impl HeldRemoval {
    /// The delete ended: done, the name stays missing for the TTL, as after any delete;
    /// refused, the store's object shows again (the name, unless it was created again
    /// meanwhile, is looked up and listed anew), and the name is given back, for the
    /// kernel to forget it was missing.
    pub fn landed(self, deleted: bool) -> Option<(Ino, String)> {
        let until = if deleted { Instant::now() + self.ttl } else { Instant::now() };
        let mut state = self.state.lock();
        state.shorten_missing(self.parent, &self.name, until);
        if deleted {
            return None;
        }
        state.drop_listing(self.parent);
        Some((self.parent, self.name))
    }
}

pub struct Namespace {
    sources: Vec<Source>,
    /// The one lock: see `dir_state` (shared with the background flat listings).
    state: Arc<Mutex<DirState>>,
    /// Bodies of small files, read along with their metadata.
    small_objects: SmallObjects<Ino>,
    ttl: Duration,
    mounted_at: SystemTime,
    /// Whether walks list subtrees flat (see `subtree`).
    flat_listing: bool,
    /// Whether small files being read are fetched whole with their metadata (not when
    /// their content is on local disk: see [`Namespace::with_contents_on_disk`]).
    small_contents_with_metadata: bool,
    /// The listing index of each source (`--index`).
    indexes: Option<Arc<Indexes>>,
    /// Whether each directory has a `.versions` view (`--show-versions`; see `versions`).
    show_versions: bool,
}

impl Namespace {
    pub fn new(sources: Vec<Source>, ttl: Duration) -> Self {
        let mounted_at = SystemTime::now();
        let root_location = match sources.as_slice() {
            [single] if single.mount_name.is_none() => Location::Dir { source: 0, prefix: single.prefix.clone() },
            _ => Location::SourceList,
        };
        let mut inodes = InodeTable::new(root_location.clone(), mounted_at);
        if root_location == Location::SourceList {
            for (index, source) in sources.iter().enumerate() {
                let name = source.mount_name.clone().unwrap_or_default();
                let location = Location::Dir { source: index, prefix: source.prefix.clone() };
                inodes.upsert(ROOT_INO, &name, location, Attributes::dir(mounted_at, Some(Arc::default()), None));
            }
        }
        Self {
            sources,
            state: Arc::new(Mutex::new(DirState::new(inodes, ttl))),
            small_objects: SmallObjects::new(SMALL_OBJECTS_BUDGET, ttl),
            ttl,
            mounted_at,
            flat_listing: true,
            small_contents_with_metadata: true,
            indexes: None,
            show_versions: false,
        }
    }

    /// Serves the sources from listing indexes (`--index`), loading the saved ones now.
    /// Their refreshes run once [`Indexes::refresh_periodically`] is spawned.
    pub fn with_index(mut self, options: &IndexOptions) -> Self {
        self.indexes = Some(Arc::new(Indexes::load(&self.sources, options)));
        self
    }

    /// Shows a `.versions` view in each directory (see `versions`).
    pub fn with_versions(mut self, on: bool) -> Self {
        self.show_versions = on;
        self
    }

    pub fn indexes(&self) -> Option<&Arc<Indexes>> {
        self.indexes.as_ref()
    }

    /// A change made through the mount, for the index of `source` (if any).
    fn record(&self, source: usize, change: impl FnOnce() -> Change) {
        if let Some(indexes) = &self.indexes {
            indexes.record(source, change());
        }
    }

    /// What the index says `name` in `parent` (`prefix` of `source`) is, entered in the
    /// table; `None` when no index covers the directory.
    fn lookup_in_index(
        &self,
        parent: Ino,
        name: &str,
        source: usize,
        prefix: &str,
    ) -> Option<Result<Node, NamespaceError>> {
        let found = self.indexes.as_ref()?.lookup(source, prefix, name)?;
        let Some(indexed) = found else { return Some(Err(NamespaceError::NotFound)) };
        let (location, attributes) = self.indexed_entry(source, prefix, name, indexed, Some(self.valid_until()));
        Some(Ok(self.state.lock().enter_found(parent, name, location, attributes)))
    }

    fn indexed_entry(
        &self,
        source: usize,
        prefix: &str,
        name: &str,
        indexed: Indexed,
        valid_until: Option<Instant>,
    ) -> (Location, Attributes) {
        match indexed {
            Indexed::File(mut info) => {
                let key = std::mem::take(&mut info.key); // the attributes keep no key
                (Location::File { source, key }, Attributes::file(info, valid_until))
            }
            Indexed::Dir { metadata } => (
                Location::Dir { source, prefix: format!("{prefix}{name}/") },
                Attributes::dir(self.mounted_at, metadata, valid_until),
            ),
        }
    }

    /// Turns flat listings of walked subtrees on (the default) or off.
    pub fn with_flat_listing(mut self, on: bool) -> Self {
        self.flat_listing = on;
        self
    }

    /// Files' content is kept on local disk (`--cache`): a small file being read is not
    /// fetched along with its metadata (its open finds it on disk), and the metadata of
    /// files being read comes in batches by listing, as for `ls -l`.
    pub fn with_contents_on_disk(mut self, on: bool) -> Self {
        self.small_contents_with_metadata = !on;
        self
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The stores of every source.
    pub fn stores(&self) -> Vec<Arc<dyn ObjectStore>> {
        self.sources.iter().map(|source| source.store.clone()).collect()
    }

    pub fn store(&self, source: usize) -> &Arc<dyn ObjectStore> {
        &self.sources[source].store
    }

    pub fn node(&self, ino: Ino) -> Result<Node, NamespaceError> {
        self.state.lock().inodes.get(ino).cloned().ok_or(NamespaceError::NotFound)
    }

    /// Until when what the store says now may be trusted.
    fn valid_until(&self) -> Instant {
        Instant::now() + self.ttl
    }

    /// Finds `name` in directory `parent`, from the cache when fresh, else from the store.
    pub async fn lookup(&self, parent: Ino, name: &str) -> Result<Node, NamespaceError> {
        let parent_node = self.node(parent)?;
        let (source, prefix) = match &parent_node.location {
            Location::File { .. } => return Err(NamespaceError::NotDir),
            Location::SourceList => {
                let state = self.state.lock();
                return state.inodes.child(ROOT_INO, name).cloned().ok_or(NamespaceError::NotFound);
            }
            Location::History(history) => return self.lookup_history(parent, history, name).await,
            Location::Dir { source, prefix } => (*source, prefix.clone()),
        };
        if name == VERSIONS_DIR {
            if let Some(view) = self.versions_dir(parent, source, &prefix) {
                return Ok(view);
            }
        }
        if names::check_component(name).is_err() {
            return Err(if name.len() > names::MAX_NAME {
                NamespaceError::NameTooLong
            } else {
                NamespaceError::NotFound
            });
        }
        if prefix.len() + name.len() > names::MAX_KEY {
            return Err(NamespaceError::NotFound); // no key that long can exist
        }
        let now = Instant::now();
        {
            let state = self.state.lock();
            if let Some(node) = state.fresh_child(parent, name, now) {
                return Ok(node);
            }
        }
        if let Some(answer) = self.lookup_in_index(parent, name, source, &prefix) {
            return answer;
        }
        let listed_before = {
            let state = self.state.lock();
            if state.known_missing(parent, name, now) {
                return Err(NamespaceError::NotFound);
            }
            if let Some(names) = state.fresh_listing(parent, now) {
                if names.binary_search_by(|n| n.as_str().cmp(name)).is_err() {
                    return Err(NamespaceError::NotFound); // not in a complete, fresh listing
                }
            }
            // Without a TTL (`--metadata-ttl 0`) nothing is trusted, listings neither.
            !self.ttl.is_zero() && state.held_listing(parent, RELIST_AT_FIRST_MISS_UP_TO)
        };

        // A directory whose complete listing just expired (listed, or made and filled
        // here: `tar x` past the TTL) is listed again at once, one LIST for every name
        // asked next rather than a HEAD and a LIST per name (if it held one page).
        if listed_before || self.count(Counted::StoreLookups, parent, now) == LOOKUPS_BEFORE_LISTING {
            match self.list_whole(parent, name).await? {
                Some(found) => return found.ok_or(NamespaceError::NotFound), // listed completely just now
                None => self.state.lock().drop_listing(parent),              // too long to list for lookups
            }
        }

        self.lookup_in_store(parent, name, source, &prefix).await
    }

    /// What (parent, name) is, from the index if it covers `parent`, else from the store.
    async fn lookup_uncached(
        &self,
        parent: Ino,
        name: &str,
        source: usize,
        prefix: &str,
    ) -> Result<Node, NamespaceError> {
        match self.lookup_in_index(parent, name, source, prefix) {
            Some(answer) => answer,
            None => self.lookup_in_store(parent, name, source, prefix).await,
        }
    }

    /// Asks the store what (parent, name) is (`parent` being `prefix` of `source`), and
    /// enters the answer.
    async fn lookup_in_store(
        &self,
        parent: Ino,
        name: &str,
        source: usize,
        prefix: &str,
    ) -> Result<Node, NamespaceError> {
        let now = Instant::now();
        let store = self.store(source);
        let key = format!("{prefix}{name}");
        let dir_prefix = format!("{key}/");
        // Both questions at once: is there an object `key`, and is there anything below `key/`?
        let (head, children) = tokio::join!(store.head(&key), store.list(&dir_prefix, None, Some(1), true));
        let children = children?;
        let valid_until = Some(self.valid_until());
        if !children.objects.is_empty() || !children.prefixes.is_empty() {
            if head.is_ok() {
                tracing::warn!(key, "object not shown: a directory of the same name exists");
            }
            // A `dir/` marker lists first; only then is there metadata to fetch, unless
            // the listing carried it.
            let metadata = match children.objects.first().filter(|o| o.key == dir_prefix) {
                Some(ObjectInfo { metadata: Some(metadata), .. }) => metadata.clone(),
                Some(_) => self.marker_metadata(store, &dir_prefix).await?,
                None => Arc::default(),
            };
            let attributes = Attributes::dir(self.mounted_at, Some(metadata), valid_until);
            let location = Location::Dir { source, prefix: dir_prefix };
            return Ok(self.state.lock().enter_found(parent, name, location, attributes));
        }
        match head {
            Ok(info) => {
                let location = Location::File { source, key: info.key.clone() };
                Ok(self.state.lock().enter_found(parent, name, location, Attributes::file(info, valid_until)))
            }
            Err(StoreError::NotFound) => {
                self.state.lock().mark_missing(parent, name, now + self.ttl, false);
                Err(NamespaceError::NotFound)
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The attributes of `ino`, refreshed from the store when older than the TTL.
    pub async fn getattr(&self, ino: Ino) -> Result<Node, NamespaceError> {
        let node = self.node(ino).inspect_err(|_| {
            // The kernel asks only about inodes it holds: this one should be here.
            tracing::warn!(ino, "request for an inode the table no longer holds");
        })?;
        if node.fresh_at(Instant::now()) {
            return Ok(node);
        }
        self.expire(ino);
        let fresh = self.lookup(node.parent, &node.name).await?;
        if fresh.ino != ino {
            tracing::warn!(ino, now = fresh.ino, name = node.name, "the path of an inode now names another one");
            return Err(NamespaceError::NotFound); // the path now names something else
        }
        Ok(fresh)
    }

    /// Lists directory `dir`, one store page at a time.
    pub fn list(&self, dir: Ino) -> Result<DirStream, NamespaceError> {
        let node = self.node(dir).inspect_err(|_| {
            tracing::warn!(ino = dir, "listing of an inode the table no longer holds");
        })?;
        let (inner, history) = match node.location {
            Location::File { .. } | Location::History(History::Version { .. }) => return Err(NamespaceError::NotDir),
            Location::History(history) => (None, Some(history)),
            Location::SourceList => (None, None),
            Location::Dir { source, prefix } => (Some((source, prefix)), None),
        };
        let now = Instant::now();
        let (pending, cached) = {
            let mut state = self.state.lock();
            state.subtree_jobs.note_listed(dir, now);
            if let Some((source, prefix)) = &inner {
                // A walk got this far: a flat listing running over it may list further.
                state.subtree_jobs.note_reached(*source, prefix);
            }
            (state.shown_whatever_listed(dir), state.fresh_listing(dir, now).map(|names| (names, 0)))
        };
        Ok(DirStream {
            dir,
            parent: node.parent,
            inner,
            history,
            merger: None,
            token: None,
            done: false,
            pending,
            cached,
            indexed: None,
            collected: Some(Vec::new()),
            started: now,
        })
    }

    /// Whether `dir`'s listing comes from the index (`--index`, built): such a listing
    /// changes only through this mount or at a refresh, so the kernel may keep it.
    pub fn is_indexed_dir(&self, dir: Ino) -> bool {
        let Some(indexes) = self.indexes() else { return false };
        match self.node(dir).map(|node| node.location) {
            Ok(Location::Dir { source, prefix }) => indexes.dir(source, &prefix).is_some(),
            _ => false,
        }
    }

    /// Whether every directory is listed from the index: an `--index` mount whose
    /// indexes are all built, without the `.versions` views (listed from the store).
    pub fn lists_every_dir_from_the_index(&self) -> bool {
        !self.show_versions && self.indexes().is_some_and(|indexes| indexes.all_built())
    }

    /// The directories of indexed sources the kernel holds (with `--index` every source
    /// is indexed): what a refresh may have changed under the kernel's cached listings.
    pub fn held_indexed_dirs(&self) -> Vec<Ino> {
        if self.indexes().is_none() {
            return Vec::new();
        }
        self.state.lock().inodes.held_dirs()
    }

    /// Counts one more `what` in `dir`; returns how many there were within the TTL (0
    /// when nothing is cached, TTL 0).
    fn count(&self, what: Counted, dir: Ino, now: Instant) -> u32 {
        if self.ttl.is_zero() {
            return 0;
        }
        self.state.lock().count(what, dir, now, self.ttl)
    }

    /// Lists `dir` into the caches if it ends within a few pages. If it did, returns the
    /// entry `name` as listed (`None`: not there); else `None`.
    ///
    /// The answer comes from the listing itself, not from the caches after it: under load
    /// a listing can take longer than the TTL, and the entries of its first pages were
    /// then already stale when it ended (a lookup answered ENOENT for a listed name).
    async fn list_whole(&self, dir: Ino, name: &str) -> Result<Option<Option<Node>>, NamespaceError> {
        let mut stream = self.list(dir)?;
        let mut found = None;
        for _ in 0..LISTING_BATCHES_FOR_LOOKUPS {
            let batch = stream.next_batch(self).await?;
            found = found.or_else(|| batch.into_iter().find(|listed| listed.name == name).map(|listed| listed.node));
            if stream.is_done() {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    fn remember_listing(&self, dir: Ino, started: Instant, names: Vec<String>) {
        if !self.ttl.is_zero() {
            self.state.lock().remember_listing(dir, started + self.ttl, names);
        }
    }

    /// The directory `parent` as (source, key prefix), for creating entries in it.
    pub fn dir_location(&self, parent: Ino) -> Result<(usize, String), NamespaceError> {
        match self.node(parent)?.location {
            Location::Dir { source, prefix } => Ok((source, prefix)),
            Location::File { .. } | Location::History(History::Version { .. }) => Err(NamespaceError::NotDir),
            // The root of a multiplexed mount only holds the sources.
            Location::SourceList | Location::History(_) => Err(NamespaceError::ReadOnlyView),
        }
    }

    /// Checks that `name` can be created in `parent`; returns the key it would have.
    pub async fn new_entry_key(&self, parent: Ino, name: &str) -> Result<(usize, String), NamespaceError> {
        let (source, key) = self.entry_key(parent, name)?;
        match self.lookup(parent, name).await {
            Ok(_) => Err(NamespaceError::Exists),
            Err(NamespaceError::NotFound) => Ok((source, key)),
            Err(other) => Err(other),
        }
    }

    /// The (source, key) that `name` in `parent` has or would have.
    pub fn entry_key(&self, parent: Ino, name: &str) -> Result<(usize, String), NamespaceError> {
        let (source, prefix) = self.dir_location(parent)?;
        if names::check_component(name).is_err() {
            return Err(if name.len() > names::MAX_NAME {
                NamespaceError::NameTooLong
            } else {
                NamespaceError::InvalidName
            });
        }
        if prefix.len() + name.len() > names::MAX_KEY {
            return Err(NamespaceError::NameTooLong);
        }
        Ok((source, format!("{prefix}{name}")))
    }

    /// `(parent, name)` was renamed to `(new_parent, new_name)`, its key (for a directory:
    /// prefix) `old_key` to `new_key`; what was at the new name is gone. The inode keeps
    /// its number (the kernel moved its dentry already) and everything below a renamed
    /// directory moves with it.
    pub fn rename_entry(&self, from: (Ino, &str), to: (Ino, &str), old_key: &str, new_key: &str) {
        let missing_until = self.valid_until();
        self.state.lock().rename_entry(from, to, old_key, new_key, missing_until);
        if let Ok((source, _)) = self.dir_location(to.0) {
            self.record(source, || Change::Rename { from: old_key.to_owned(), to: new_key.to_owned() });
        }
    }

    /// Objects were copied inside the store (a directory rename, after [`Self::rename_entry`]):
    /// the files now at their new keys show the copies' ETags. Returns the inodes changed,
    /// with the copy each follows.
    pub fn follow_copies<'a>(&self, source: usize, copied: &'a [Copied]) -> Vec<(Ino, &'a Copied)> {
        for copy in copied {
            self.record(source, || Change::Attributes {
                key: copy.to.clone(),
                metadata: None,
                etag: Some(copy.etag.clone()),
            });
        }
        self.state.lock().inodes.follow_copies(copied)
    }

    /// Enters a file being written: shown at once, trusted until its upload finishes.
    pub fn enter_pending_file(
        &self,
        parent: Ino,
        name: &str,
        source: usize,
        key: String,
        metadata: Arc<Metadata>,
    ) -> Node {
        let location = Location::File { source, key };
        let mut state = self.state.lock();
        // An existing file opened for writing keeps the ETag of its object, which is what
        // its upload replaces: a close that stores nothing leaves that object as it was, a
        // rename over the file replaces it, an unlink deletes it.
        let stored = state.inodes.child(parent, name).filter(|node| node.location == location);
        let etag = stored.and_then(|node| node.etag.clone());
        let attributes =
            Attributes { size: 0, mtime: SystemTime::now(), etag, metadata: Some(metadata), valid_until: None };
        state.enter_created(parent, name, location, attributes, true)
    }

    /// A file being written was renamed: its upload now replaces what its new key holds,
    /// `etag` (`None`: nothing), which an unlink of it deletes and a replay must find.
    pub fn set_pending_replaces(&self, ino: Ino, etag: Option<String>) {
        if let Some(node) = self.state.lock().inodes.get_mut(ino) {
            node.etag = etag;
        }
    }

    /// `name` in `parent` (`key` of `source`) exists again in the store through this mount
    /// (an undelete): entered as `info` says, also in kept listings and the index.
    pub fn enter_restored(&self, parent: Ino, name: &str, source: usize, info: ObjectInfo) -> Node {
        self.record(source, || Change::File(info.clone()));
        let location = Location::File { source, key: info.key.clone() };
        let attributes = Attributes::file(info, Some(self.valid_until()));
        let node = self.state.lock().enter_created(parent, name, location, attributes, false);
        self.touch_dir(parent);
        node
    }

    /// Forgets what is cached about `ino`: the next `getattr` asks the store.
    pub fn expire(&self, ino: Ino) {
        if let Some(node) = self.state.lock().inodes.get_mut(ino) {
            if node.valid_until.is_some() {
                node.valid_until = Some(Instant::now());
            }
        }
    }

    /// The metadata `ino` now has in the store (or will have, for a file being written).
    pub fn set_metadata(&self, ino: Ino, metadata: Arc<Metadata>, etag: Option<Option<String>>) {
        let location = {
            let mut state = self.state.lock();
            let Some(node) = state.inodes.get_mut(ino) else { return };
            node.metadata = Some(metadata.clone());
            if let Some(etag) = &etag {
                node.etag = etag.clone();
            }
            let location = node.location.clone();
            if etag.is_some() {
                state.stored_here(ino); // a new version in the store (see `DirState::stored_here`)
            }
            location
        };
        if let Location::File { source, key } = location {
            self.record(source, || Change::Attributes { key, metadata: Some(metadata), etag });
        }
    }

    /// A file being written grew to `size`.
    pub fn set_pending_size(&self, ino: Ino, size: u64) {
        if let Some(node) = self.state.lock().inodes.get_mut(ino) {
            node.size = size;
            node.mtime = SystemTime::now();
        }
    }

    /// The upload of `ino` finished with this ETag and metadata: from now on it is an
    /// ordinary object.
    pub fn upload_done(&self, ino: Ino, etag: Option<String>, metadata: Arc<Metadata>) {
        let valid_until = self.valid_until();
        let mut state = self.state.lock();
        let Some(node) = state.inodes.get_mut(ino) else { return };
        node.etag = etag;
        node.metadata = Some(metadata);
        node.mtime = SystemTime::now();
        node.valid_until = Some(valid_until);
        let stored = node.clone();
        state.settled(ino, true);
        drop(state);
        if let Location::File { source, key } = stored.location {
            let info = ObjectInfo {
                key,
                size: stored.size,
                mtime: stored.mtime,
                etag: stored.etag,
                metadata: stored.metadata,
            };
            self.record(source, || Change::File(info));
        }
    }

    /// The upload replacing an existing object failed: the object is unchanged in the
    /// bucket, so what was shown while writing is dropped and read again from S3.
    pub fn upload_abandoned(&self, ino: Ino) {
        let mut state = self.state.lock();
        if let Some(node) = state.inodes.get_mut(ino) {
            node.valid_until = Some(Instant::now());
        }
        state.settled(ino, false);
    }

    /// An entry was created or removed in directory `dir` through this mount: its mtime
    /// and ctime are now. Renames do this themselves ([`Namespace::rename_entry`]); an
    /// entry found gone from the store (another client's change) does not.
    pub fn touch_dir(&self, dir: Ino) {
        self.state.lock().touch(dir);
    }

    /// The marker of `dir` was written with `metadata`, which holds the times
    /// [`Namespace::touch_dir`] kept in memory until `touched`: those are dropped unless
    /// an entry changed again meanwhile.
    pub fn set_marker_metadata(&self, dir: Ino, metadata: Arc<Metadata>, touched: Option<SystemTime>) {
        let location = {
            let mut state = self.state.lock();
            let Some(node) = state.inodes.get_mut(dir) else { return };
            node.metadata = Some(metadata.clone());
            if node.touched == touched {
                node.touched = None;
            }
            node.location.clone()
        };
        if let Location::Dir { source, prefix } = location {
            self.record(source, || Change::Attributes { key: prefix, metadata: Some(metadata), etag: None });
        }
    }

    /// Enters a directory just created in `parent`, its marker having `metadata`.
    pub fn enter_dir(&self, parent: Ino, name: &str, source: usize, prefix: String, metadata: Arc<Metadata>) -> Node {
        self.record(source, || Change::Dir { prefix: prefix.clone(), metadata: metadata.clone() });
        let attributes = Attributes::dir(SystemTime::now(), Some(metadata), Some(self.valid_until()));
        let mut state = self.state.lock();
        state.touch(parent);
        let node = state.enter_created(parent, name, Location::Dir { source, prefix }, attributes, false);
        // Just created, so empty: names in it are known to be missing without asking.
        if !self.ttl.is_zero() {
            state.remember_listing(node.ino, Instant::now() + self.ttl, Vec::new());
        }
        node
    }

    /// Shows directory `dir` as this mount made it (its metadata, its existence) rather
    /// than as the store has it, until the returned hold is released: for a marker
    /// written after `mkdir` or `chmod` returned (`--write-back`).
    pub fn hold_dir(&self, dir: Ino) -> HeldDir {
        self.state.lock().hold(dir);
        HeldDir { state: self.state.clone(), dir, ttl: self.ttl }
    }

    /// Whether directory `dir` holds an entry this mount made, whatever a listing of the
    /// store says: a file being written, or an entry created within the TTL and still there.
    pub fn has_children_made_here(&self, dir: Ino) -> bool {
        self.state.lock().has_children_made_here(dir)
    }

    /// Whether `dir` was listed whole within the TTL and every name of that listing has
    /// been removed through this mount since (`rm -r` lists each directory, then empties
    /// it): as sure as a lookup within the TTL is.
    pub fn listed_empty(&self, dir: Ino) -> bool {
        self.state.lock().fresh_listing(dir, Instant::now()).is_some_and(|names| names.is_empty())
    }

    /// Whether this mount removed (parent, name) within the TTL (see `dir_state::Missing`).
    pub fn removed_here(&self, parent: Ino, name: &str) -> bool {
        self.state.lock().removed_here(parent, name, Instant::now())
    }

    /// Forgets (parent, name) after it was deleted (or its creation failed): later lookups
    /// say ENOENT without asking the store, and listings leave it out, until the TTL passes.
    pub fn remove_entry(&self, parent: Ino, name: &str) {
        self.remove_entry_until(parent, name, self.valid_until());
    }

    /// [`Namespace::remove_entry`] for a name whose delete is sent later (`--write-back`):
    /// left out of lookups and listings until [`HeldRemoval::landed`], however long the
    /// store takes.
    pub fn remove_entry_until_deleted(&self, parent: Ino, name: &str) -> HeldRemoval {
        self.remove_entry_until(parent, name, Instant::now() + DELETE_HELD_AT_MOST);
        HeldRemoval { state: self.state.clone(), parent, name: name.to_owned(), ttl: self.ttl }
    }

    fn remove_entry_until(&self, parent: Ino, name: &str, missing_until: Instant) {
        self.state.lock().remove_entry(parent, name, missing_until);
        if let Ok((source, prefix)) = self.dir_location(parent) {
            self.record(source, || Change::Remove { key: format!("{prefix}{name}") });
        }
    }

    /// The kernel was given an entry for `ino` (lookup, create, readdirplus): it holds
    /// one more reference until it forgets it.
    pub fn add_lookup(&self, ino: Ino) {
        self.state.lock().inodes.add_lookup(ino);
    }

    /// The kernel was handed an entry for `node` (a lookup or READDIRPLUS reply) taken
    /// from the table earlier: see [`InodeTable::add_lookup_of`].
    pub fn add_lookup_of(&self, node: &Node) {
        self.state.lock().inodes.add_lookup_of(node);
    }

    /// The kernel dropped `count` references to `ino` (FUSE `forget`). Returns whether
    /// the inode is gone.
    pub fn forget(&self, ino: Ino, count: u64) -> bool {
        self.state.lock().forget(ino, count)
    }

    /// Drops what expired and nobody references (run every [`SWEEP_INTERVAL`]).
    pub fn sweep(&self) {
        self.state.lock().sweep(Instant::now(), self.ttl);
    }

    /// Enters a batch of `dir`'s entries, from the index or a listing, and remembers
    /// their names for metadata batches.
    fn enter_indexed(&self, dir: Ino, source: usize, prefix: &str, entries: Vec<(String, Indexed)>) -> Vec<Listed> {
        let valid_until = self.valid_until();
        let now = Instant::now();
        let mut state = self.state.lock();
        // What this mount removed within the TTL stays removed, whatever a lagging
        // listing still shows (see `dir_state::Missing`).
        let entries: Vec<(String, Indexed)> =
            entries.into_iter().filter(|(name, _)| !state.removed_here(dir, name, now)).collect();
        let names = entries.iter().map(|(name, _)| name.clone()).collect();
        state.remember_page(dir, valid_until, names);
        entries
            .into_iter()
            .map(|(name, indexed)| {
                let (location, attributes) = self.indexed_entry(source, prefix, &name, indexed, Some(valid_until));
                let node = state.enter_found(dir, &name, location, attributes);
                Listed { name, node }
            })
            .collect()
    }

    /// Enters a page of `dir`'s listing from the store.
    fn enter_listed(&self, dir: Ino, source: usize, prefix: &str, entries: Vec<Entry>) -> Vec<Listed> {
        let entries = entries.into_iter().map(|entry| (entry.name, Indexed::from(entry.kind))).collect();
        self.enter_indexed(dir, source, prefix, entries)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::metadata::METADATA_BATCH;
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;

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
    async fn a_walk_is_told_from_a_single_read_and_sees_the_files_listed_next() {
        let ns = namespace(&["d/a", "d/b", "d/c", "d/sub/x", "d/e", "other"]);
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.list(d.ino).expect("d").next_batch(&ns).await.expect("listed");
        let a = ns.lookup(d.ino, "a").await.expect("a");
        let names = |nodes: Vec<Node>| nodes.into_iter().map(|n| n.name.into_string()).collect::<Vec<_>>();
        assert_eq!(names(ns.files_listed_after(a.ino, 10)), ["b", "c", "e"], "files only, in order");
        assert_eq!(names(ns.files_listed_after(a.ino, 1)), ["b"]);
        let e = ns.lookup(d.ino, "e").await.expect("e");
        assert!(ns.files_listed_after(e.ino, 10).is_empty());
        assert!(!ns.note_read(a.ino), "the first file read in d");
        assert!(ns.note_read(e.ino), "the second: a walk");
        let other = ns.lookup(ROOT_INO, "other").await.expect("other");
        assert!(!ns.note_read(other.ino), "another directory");
    }

    #[tokio::test]
    async fn lookup_agrees_with_listing_on_file_versus_directory() {
        let ns = namespace(&["both", "both/inner", "plain", "marker/"]);
        assert!(ns.lookup(ROOT_INO, "both").await.expect("both").location.is_dir());
        assert!(!ns.lookup(ROOT_INO, "plain").await.expect("plain").location.is_dir());
        assert!(ns.lookup(ROOT_INO, "marker").await.expect("marker").location.is_dir());
        assert!(matches!(ns.lookup(ROOT_INO, "nothing").await, Err(NamespaceError::NotFound)));
        assert!(matches!(ns.lookup(ROOT_INO, "..").await, Err(NamespaceError::NotFound)));
    }

    #[tokio::test]
    async fn keys_that_cannot_be_names_are_hidden_and_siblings_stay() {
        let long = "l".repeat(1025);
        let long_key = format!("x/{long}");
        let ns = namespace(&["x//y", "x/sib", "p/./q", "p/../q", "p/sib2", &long_key, "/lead", "top"]);
        let names = |listed: Vec<Listed>| listed.into_iter().map(|l| l.name).collect::<Vec<_>>();
        let mut root = ns.list(ROOT_INO).expect("root");
        assert_eq!(names(root.next_batch(&ns).await.expect("root")), ["p", "top", "x"]);
        let x = ns.lookup(ROOT_INO, "x").await.expect("x");
        assert_eq!(names(ns.list(x.ino).expect("x").next_batch(&ns).await.expect("x")), ["sib"]);
        let p = ns.lookup(ROOT_INO, "p").await.expect("p");
        assert_eq!(names(ns.list(p.ino).expect("p").next_batch(&ns).await.expect("p")), ["sib2"]);
        assert!(matches!(ns.lookup(x.ino, &long).await, Err(NamespaceError::NameTooLong)));
        assert!(matches!(ns.lookup(x.ino, "").await, Err(NamespaceError::NotFound)));
    }

    /// As on AWS S3 (and s3fs): a name over 255 bytes is listed and can be looked up and
    /// created; a key over 1024 bytes cannot be created and cannot exist.
    #[tokio::test]
    async fn names_up_to_the_key_limit_are_shown_and_usable() {
        let long = "n".repeat(600);
        let ns = namespace(&[&format!("d/{long}"), "d/short"]);
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let listed = ns.list(d.ino).expect("d").next_batch(&ns).await.expect("d");
        assert_eq!(listed.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), [long.as_str(), "short"]);
        assert!(!ns.lookup(d.ino, &long).await.expect("600-byte name").location.is_dir());
        assert_eq!(ns.entry_key(d.ino, &"m".repeat(1022)).expect("key of 1024 bytes").1.len(), 1024);
        assert!(matches!(ns.entry_key(d.ino, &"m".repeat(1023)), Err(NamespaceError::NameTooLong)));
        assert!(matches!(ns.lookup(d.ino, &"m".repeat(1023)).await, Err(NamespaceError::NotFound)));
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
        assert!(matches!(ns.lookup(d.ino, "missing").await, Err(NamespaceError::NotFound)));
        assert_eq!(store.lists.load(Ordering::Relaxed), lists, "second listing and lookup from memory");
        assert_eq!(store.heads.load(Ordering::Relaxed), heads);
        // Changes through the mount update the cached listing.
        ns.enter_pending_file(d.ino, "c", 0, "d/c".into(), Arc::default());
        ns.remove_entry(d.ino, "a");
        let after = names(ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page"));
        assert_eq!(after, ["b", "c"]);
        assert_eq!(store.lists.load(Ordering::Relaxed), lists, "still from memory");
    }

    /// A listing that lags behind this mount's removals (SeaweedFS lists an emptied
    /// folder for minutes) does not bring a removed name back within the TTL; a name
    /// created again shows.
    #[tokio::test]
    async fn a_name_removed_here_stays_out_of_a_lagging_listing() {
        let (ns, _store) = namespace_and_store(["d/a", "d/b", "d/sub/x"].map(String::from));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.lookup(d.ino, "a").await.expect("a");
        ns.lookup(d.ino, "sub").await.expect("sub");
        // Removed through the mount; the store (not told here) still lists both.
        ns.remove_entry(d.ino, "a");
        ns.remove_entry(d.ino, "sub");
        let names = |listed: Vec<Listed>| listed.into_iter().map(|l| l.name).collect::<Vec<_>>();
        assert_eq!(names(ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page")), ["b"]);
        assert!(matches!(ns.lookup(d.ino, "a").await, Err(NamespaceError::NotFound)), "stat agrees with ls");
        ns.enter_dir(d.ino, "sub", 0, "d/sub/".into(), Arc::default());
        ns.expire(d.ino);
        let relisted = names(ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page"));
        assert_eq!(relisted, ["b", "sub"], "made again here: shown");
    }

    #[tokio::test]
    async fn listed_file_deleted_since_disappears_when_its_metadata_is_fetched() {
        let (ns, store) = namespace_and_store(["d/gone", "d/kept"].map(String::from));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        let gone = listed.iter().find(|l| l.name == "gone").expect("listed").node.clone();
        assert!(gone.metadata.is_none(), "a listing has no metadata");
        store.delete("d/gone").await.expect("delete behind the mount's back");
        assert!(matches!(ns.with_metadata(gone).await, Err(NamespaceError::NotFound)));
        let names: Vec<_> =
            ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page").into_iter().map(|l| l.name).collect();
        assert_eq!(names, ["kept"], "the cached listing forgot it");
        assert!(matches!(ns.lookup(d.ino, "gone").await, Err(NamespaceError::NotFound)));
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

    /// A listing (from the store or the index) of a directory while one of its files is
    /// being rewritten shows what is being written, not the object about to be replaced.
    #[tokio::test]
    async fn a_listing_does_not_override_a_file_being_written() {
        let ns = namespace(&["d/f", "d/g"]);
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let f = ns.lookup(d.ino, "f").await.expect("f");
        ns.enter_pending_file(d.ino, "f", 0, "d/f".into(), Arc::default());
        ns.set_pending_size(f.ino, 12345);
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        let shown = listed.iter().find(|l| l.name == "f").expect("listed");
        assert_eq!((shown.node.ino, shown.node.size), (f.ino, 12345), "the listing kept the write");
        assert_eq!(ns.getattr(f.ino).await.expect("getattr").size, 12345);
    }

    /// Names asked in a directory made and filled by this mount, after its listing
    /// expired: one LIST answers them all, no HEAD.
    #[tokio::test]
    async fn a_directory_listed_before_is_listed_again_at_its_first_miss() {
        let store = Arc::new(MemoryStore::with_keys(Vec::<(String, Vec<u8>)>::new()));
        let source = Source { mount_name: None, store: store.clone(), prefix: String::new() };
        let ns = Namespace::new(vec![source], Duration::from_millis(200));
        ns.enter_dir(ROOT_INO, "d", 0, "d/".into(), Arc::default());
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.list(d.ino).expect("d").next_batch(&ns).await.expect("listed, empty");
        tokio::time::sleep(Duration::from_millis(300)).await; // the listing expired
        let (heads, lists) = (store.heads.load(Ordering::Relaxed), store.lists.load(Ordering::Relaxed));
        for i in 0..5 {
            assert!(matches!(ns.lookup(d.ino, &format!("new{i}")).await, Err(NamespaceError::NotFound)));
        }
        assert_eq!(store.heads.load(Ordering::Relaxed) - heads, 0, "no HEAD");
        assert_eq!(store.lists.load(Ordering::Relaxed) - lists, 1, "one LIST for the five names");
    }

    #[tokio::test]
    async fn many_lookups_in_one_directory_list_it_instead() {
        let keys: Vec<String> = (0..100).map(|i| format!("d/f{i:03}")).collect();
        let (ns, store) = namespace_and_store(keys.iter().cloned());
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        for i in 0..100 {
            ns.lookup(d.ino, &format!("f{i:03}")).await.expect("file");
        }
        assert!(matches!(ns.lookup(d.ino, "nope").await, Err(NamespaceError::NotFound)));
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
    async fn forgotten_and_expired_entries_leave_memory() {
        let keys: Vec<String> = (0..500).map(|i| format!("d/f{i:03}")).collect();
        let store = Arc::new(MemoryStore::with_keys(keys.into_iter().map(|k| (k, b"x".to_vec()))));
        let source = Source { mount_name: None, store, prefix: String::new() };
        let ns = Namespace::new(vec![source], Duration::from_millis(50));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.add_lookup(d.ino);
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        assert_eq!(listed.len(), 500);
        let kept = listed[7].node.ino;
        ns.add_lookup(kept); // the kernel holds this one (readdirplus)
        ns.add_lookup(kept);
        let before = ns.state.lock().sizes()[0];
        assert_eq!(before, 502, "root, d and 500 files");
        ns.sweep();
        assert_eq!(ns.state.lock().sizes()[0], before, "nothing expired yet");
        tokio::time::sleep(Duration::from_millis(60)).await;
        ns.sweep();
        assert_eq!(ns.state.lock().sizes(), [3, 0, 0, 0, 0], "root, d and the referenced file; no listing, no counter");
        assert!(ns.state.lock().inodes.capacity() < 100, "the table gave back the room of 500 entries");
        ns.forget(kept, 1);
        assert!(ns.node(kept).is_ok(), "one reference left");
        ns.forget(kept, 1);
        assert!(ns.node(kept).is_err(), "forgotten by the kernel: gone");
        let again = ns.lookup(d.ino, "f007").await.expect("looked up again");
        assert_ne!(again.ino, kept, "a forgotten path gets a new number");
    }

    /// The kernel forgets its earlier references to an inode (FUSE `forget`) while a new
    /// lookup of the same name is answered with that inode: counted after the FORGET, the
    /// new reference brings the inode back, so the number the kernel holds resolves (it
    /// used to be gone for good: every operation on it ENOENT, whole directories missing
    /// from a `find` over a million keys).
    #[tokio::test]
    async fn a_reference_counted_after_a_forget_brings_the_inode_back() {
        let store = Arc::new(MemoryStore::with_keys([("d/f".to_owned(), b"x".to_vec())]));
        let ns =
            Namespace::new(vec![Source { mount_name: None, store, prefix: String::new() }], Duration::from_millis(50));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.add_lookup_of(&d);
        let first = ns.lookup(d.ino, "f").await.expect("f");
        ns.add_lookup_of(&first);
        let again = ns.lookup(d.ino, "f").await.expect("f again");
        assert_eq!(again.ino, first.ino);
        tokio::time::sleep(Duration::from_millis(60)).await; // expired: a FORGET removes it
        ns.forget(first.ino, 1); // the kernel's first reference, before the second is counted
        assert!(ns.node(first.ino).is_err(), "the race: the inode left the table");
        ns.add_lookup_of(&again);
        assert!(ns.node(again.ino).is_ok(), "the kernel's new reference resolves");
        assert_eq!(ns.lookup(d.ino, "f").await.expect("f").ino, again.ino, "and its name too");
        ns.forget(again.ino, 1);
        tokio::time::sleep(Duration::from_millis(60)).await;
        ns.sweep();
        assert!(ns.node(again.ino).is_err(), "gone once the kernel forgot that one too and it expired");
    }

    /// A lookup that lists the directory (after many store lookups in it) answers from
    /// that listing even when the listing took longer than the TTL, so that the entries
    /// of its first pages were stale when it ended (they were read back from the cache,
    /// and a listed name was ENOENT).
    #[tokio::test]
    async fn a_listing_slower_than_the_ttl_still_answers_the_lookup() {
        let keys = (0..2500).map(|i| format!("d/f{i:04}"));
        let store = Arc::new(MemoryStore::with_keys(keys.map(|k| (k, b"x".to_vec()))));
        let source = Source { mount_name: None, store: store.clone(), prefix: String::new() };
        let ns = Namespace::new(vec![source], Duration::from_millis(300));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        for i in 1..LOOKUPS_BEFORE_LISTING {
            ns.lookup(d.ino, &format!("f{:04}", 2400 + i)).await.expect("looked up one by one");
        }
        // Three pages at 200 ms each: the first page's entries expire before the last.
        *store.list_latency.lock() = Duration::from_millis(200);
        let lists_before = store.lists.load(Ordering::Relaxed);
        let found = ns.lookup(d.ino, "f0001").await.expect("a listed name is found");
        assert_eq!(&*found.name, "f0001");
        assert_eq!(store.lists.load(Ordering::Relaxed) - lists_before, 3, "found by listing the directory");
    }

    /// The metadata of an entry is fetched (its directory's marker HEAD, which can be
    /// slow) while nothing holds the entry: a sweep may drop it meanwhile. The entry
    /// still comes back, with its metadata (it came back ENOENT: directories missing from
    /// a `find` over 1 M keys under load).
    #[tokio::test]
    async fn metadata_of_an_entry_swept_meanwhile_still_comes_back() {
        let store = Arc::new(MemoryStore::with_keys([("d/sub/f".to_owned(), b"x".to_vec())]));
        let source = Source { mount_name: None, store, prefix: String::new() };
        let ns = Namespace::new(vec![source], Duration::from_millis(50));
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.add_lookup_of(&d);
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        let sub = listed.into_iter().find(|l| l.name == "sub").expect("sub listed").node;
        assert!(sub.metadata.is_none(), "a listing carries no metadata");
        tokio::time::sleep(Duration::from_millis(60)).await;
        ns.sweep();
        assert!(ns.node(sub.ino).is_err(), "swept: expired and not held");
        let completed = ns.with_metadata(sub.clone()).await.expect("still there");
        assert_eq!((completed.ino, completed.metadata.is_some()), (sub.ino, true));
        ns.add_lookup_of(&completed);
        assert!(ns.node(sub.ino).is_ok(), "the reference handed out brings it back");
    }

    /// The kernel forgets entries (memory pressure, `drop_caches`) of a directory whose
    /// complete listing is kept: fresh entries stay in the table until they expire, so a
    /// listing from the kept one still shows them all. Should the table lack some anyway,
    /// they are asked about in the store, never left out, and a lookup that lists the
    /// directory finds them (it answered ENOENT: `find` under load).
    #[tokio::test]
    async fn entries_forgotten_while_their_listing_is_kept_still_show() {
        let keys: Vec<String> = (0..20).map(|i| format!("d/f{i:02}")).collect();
        let ns = namespace_and_store(keys).0;
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        ns.add_lookup_of(&d);
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        for entry in &listed {
            ns.add_lookup_of(&entry.node);
            ns.forget(entry.node.ino, 1);
        }
        assert!(ns.node(listed[0].node.ino).is_ok(), "forgotten but fresh: still in the table");
        for entry in &listed[..10] {
            ns.state.lock().inodes.remove(d.ino, &entry.name); // lost, whatever the cause
        }
        for i in 0..LOOKUPS_BEFORE_LISTING as usize + 2 {
            let name = format!("f{i:02}");
            ns.lookup(d.ino, &name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for entry in &listed[..10] {
            ns.state.lock().inodes.remove(d.ino, &entry.name);
        }
        let again = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("from the kept listing");
        let names: Vec<&str> = again.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names.len(), 20, "every listed name, from the kept listing: {names:?}");
    }

    /// A walk looks up every directory and no file: the metadata batches of directories
    /// take directories only (files' HEADs were 90% of `find`'s requests), and those of
    /// files take files only.
    #[tokio::test]
    async fn metadata_batches_take_neighbours_of_the_same_kind() {
        let mut keys: Vec<String> = (0..100).map(|i| format!("d/f{i:03}")).collect();
        keys.extend((0..10).map(|i| format!("d/f{i:03}x/inner")));
        let (ns, store) = namespace_and_store(keys);
        let d = ns.lookup(ROOT_INO, "d").await.expect("d");
        let listed = ns.list(d.ino).expect("list").next_batch(&ns).await.expect("page");
        let heads_before = store.heads.load(Ordering::Relaxed);
        for dir in listed.iter().filter(|l| l.node.location.is_dir()).take(3) {
            ns.with_metadata(ns.node(dir.node.ino).expect("node")).await.expect("metadata");
        }
        let heads = store.heads.load(Ordering::Relaxed) - heads_before;
        assert_eq!(heads, 10, "the 10 directories' markers, no file: {heads} HEADs");
        let files_known = listed
            .iter()
            .filter(|l| !l.node.location.is_dir())
            .filter(|l| ns.node(l.node.ino).is_ok_and(|n| n.metadata.is_some()));
        assert_eq!(files_known.count(), 0);
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
