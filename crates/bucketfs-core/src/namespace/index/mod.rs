//! The listing index (`--index`): each source's whole tree, listed once (flat, in
//! parallel: `build`), kept in a compact form (`tree`), saved in the cache directory and
//! loaded by the next mount (`file`). Lookups and listings of indexed directories cost
//! no request; changes made through the mount enter it at once ([`Change`]); a refresh
//! lists the source again in the background (every `--index-refresh`, on SIGHUP, on
//! `bucketfs refresh`) and swaps the new tree in whole.
//!
//! Each source's index sits behind its own lock, taken for a few map operations and never
//! together with the namespace's `dir_state` lock.

mod build;
mod file;
pub mod tree;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use parking_lot::Mutex;

use super::Source;
use bucketfs_client::store::{ObjectInfo, ObjectStore, StoreError};
use tree::SourceIndex;
pub use tree::{Change, DirListing, Indexed};

/// Marker HEADs in flight after a listing (their metadata is the directories' stored
/// attributes, which a walk needs).
const MARKER_HEADS_IN_FLIGHT: usize = 8;
/// After a failed refresh, the next try comes this much later (or at the interval, if
/// shorter).
const RETRY_AFTER: Duration = Duration::from_secs(60);
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// Background HEADs for files' stored attributes in flight at once.
const ATTRIBUTE_HEADS_IN_FLIGHT: usize = 8;
/// A background pass saves the index after this many attributes fetched (and at its end).
const SAVE_EVERY_FETCHED: usize = 10_000;

/// A background HEAD: the key and what the store said.
type BackgroundHead = (String, Result<ObjectInfo, StoreError>);

/// `--index` settings.
#[derive(Clone, Debug)]
pub struct IndexOptions {
    /// Where indexes are saved (`DIR/bucketfs-index/`).
    pub cache_dir: PathBuf,
    /// How often each index is listed again.
    pub refresh_every: Duration,
    /// Files' stored attributes fetched in the background, HEADs per second (0: none;
    /// then on first `stat`).
    pub attributes_rate: u32,
}

/// The indexes of a mount's sources.
pub struct Indexes {
    slots: Vec<Slot>,
    refresh_every: Duration,
    attributes_rate: u32,
    /// One refresh at a time (periodic, SIGHUP, `bucketfs refresh`).
    refreshing: tokio::sync::Mutex<()>,
    /// Counts refreshes done: the background attribute pass starts again after each.
    refreshes: tokio::sync::watch::Sender<u64>,
}

struct Slot {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// Which source this is, in the saved file: endpoint, bucket and prefix.
    identity: String,
    file: PathBuf,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    index: Option<SourceIndex>,
    listed_at: Option<SystemTime>,
    /// Changes made while a refresh lists the source, to replay onto what it finds.
    replay: Option<Vec<Change>>,
}

/// What a refresh found, all sources together.
#[derive(Clone, Copy, Debug, Default)]
pub struct Refreshed {
    pub files: usize,
    pub dirs: usize,
    pub elapsed: Duration,
}

impl Indexes {
    /// The indexes of `sources`, each loaded from its saved file when there is a usable
    /// one (else listed by the first refresh).
    pub fn load(sources: &[Source], options: &IndexOptions) -> Self {
        let slots = sources
            .iter()
            .map(|source| {
                let identity = format!("{}/{}", source.store.location(), source.prefix);
                let file = file::path_for(&options.cache_dir, &identity);
                let started = Instant::now();
                let mut state = SlotState::default();
                match file::load(&file, &identity) {
                    Ok((index, listed_at)) => {
                        tracing::info!(
                            source = identity,
                            files = index.files(),
                            dirs = index.dirs(),
                            "saved index loaded in {:.2?}",
                            started.elapsed()
                        );
                        state.index = Some(index);
                        state.listed_at = Some(listed_at);
                    }
                    Err(file::LoadError::Missing) => {}
                    Err(why) => {
                        tracing::warn!(source = identity, file = %file.display(), "saved index not used ({why}); listing the source again");
                    }
                }
                Slot { store: source.store.clone(), prefix: source.prefix.clone(), identity, file, state: Mutex::new(state) }
            })
            .collect();
        Self {
            slots,
            refresh_every: options.refresh_every,
            attributes_rate: options.attributes_rate,
            refreshing: tokio::sync::Mutex::new(()),
            refreshes: tokio::sync::watch::Sender::new(0),
        }
    }

    /// What `name` in directory `prefix` of `source` is: `None` when the index does not
    /// cover that directory (not built yet); `Some(None)` when there is no such name.
    pub fn lookup(&self, source: usize, prefix: &str, name: &str) -> Option<Option<Indexed>> {
        let state = self.slots.get(source)?.state.lock();
        let index = state.index.as_ref()?;
        index.has_dir(prefix).then(|| index.lookup(prefix, name))
    }

    /// Whether every source's index is built (loaded or listed): then every directory of
    /// the mount is in one.
    pub fn all_built(&self) -> bool {
        self.slots.iter().all(|slot| slot.state.lock().index.is_some())
    }

    /// The listing of directory `prefix` of `source`, if the index covers it.
    pub fn dir(&self, source: usize, prefix: &str) -> Option<Arc<DirListing>> {
        self.slots.get(source)?.state.lock().index.as_ref()?.dir(prefix)
    }

    /// Changes once each refresh has swapped its trees in.
    pub fn refreshes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.refreshes.subscribe()
    }

    /// A change made through the mount in `source`.
    pub fn record(&self, source: usize, change: Change) {
        if let Some(slot) = self.slots.get(source) {
            slot.record(change);
        }
    }

    /// Lists every source again and swaps the new trees in (one refresh at a time: a
    /// caller arriving during one waits for it, then runs its own, so what it gets is at
    /// least as new as its call).
    pub async fn refresh(&self) -> Result<Refreshed, StoreError> {
        let _one_at_a_time = self.refreshing.lock().await;
        let started = Instant::now();
        let mut refreshed = Refreshed::default();
        // The sources side by side: each has its own store client and request limit.
        for counts in futures::future::join_all(self.slots.iter().map(Slot::refresh)).await {
            let (files, dirs) = counts?;
            refreshed.files += files;
            refreshed.dirs += dirs;
        }
        refreshed.elapsed = started.elapsed();
        self.refreshes.send_modify(|count| *count += 1);
        Ok(refreshed)
    }

    /// Fetches the stored attributes of the files the indexes lack, at most
    /// `--index-attributes-rate` HEADs per second, in passes over every directory: one
    /// when the mount starts, then one after each refresh (what a refresh finds
    /// unchanged keeps what was fetched). Runs forever (a task of the mount's runtime).
    pub async fn fetch_attributes_in_background(self: Arc<Self>) {
        if self.attributes_rate == 0 {
            return;
        }
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(self.attributes_rate)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refreshes = self.refreshes.subscribe();
        loop {
            refreshes.borrow_and_update();
            for slot in &self.slots {
                slot.fetch_attributes(&mut ticks).await;
            }
            if refreshes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Refreshes each index when it is older than the interval, forever (a task of the
    /// mount's runtime).
    pub async fn refresh_periodically(self: Arc<Self>) {
        // `--index-refresh 0`: list each source once if it has no saved index, then only
        // on request (SIGHUP, `bucketfs refresh`).
        let periodic = !self.refresh_every.is_zero();
        loop {
            let oldest = self.slots.iter().map(|slot| slot.state.lock().listed_at).min().flatten();
            match oldest.map(|at| at.elapsed().unwrap_or_default()) {
                Some(_) if !periodic => return,
                Some(age) if age < self.refresh_every => {
                    tokio::time::sleep(self.refresh_every - age).await;
                    continue;
                }
                _ => {}
            }
            match self.refresh().await {
                Ok(done) => {
                    tracing::info!(files = done.files, dirs = done.dirs, "index refreshed in {:.2?}", done.elapsed)
                }
                Err(error) => {
                    tracing::warn!("index refresh failed: {error}; trying again later");
                    let retry = if periodic { RETRY_AFTER.min(self.refresh_every) } else { RETRY_AFTER };
                    tokio::time::sleep(retry.max(MIN_RETRY_AFTER)).await;
                }
            }
        }
    }

    /// Saves every index (at unmount: the stored attributes fetched since the last
    /// refresh, and the changes made through the mount, are kept for the next mount).
    pub fn save_all(&self) {
        for slot in &self.slots {
            if let Some((index, listed_at)) = slot.snapshot() {
                save(&slot.file, &slot.identity, &index, listed_at);
            }
        }
    }

    /// One line per source: files, directories, age (the `bucketfs.index` attribute).
    pub fn status(&self) -> String {
        let mut lines = String::new();
        for slot in &self.slots {
            let state = slot.state.lock();
            let line = match (&state.index, state.listed_at) {
                (Some(index), Some(at)) => format!(
                    "{} files={} dirs={} age={}s\n",
                    slot.identity,
                    index.files(),
                    index.dirs(),
                    at.elapsed().unwrap_or_default().as_secs()
                ),
                _ => format!("{} building\n", slot.identity),
            };
            lines.push_str(&line);
        }
        lines
    }
}

impl Slot {
    fn record(&self, change: Change) {
        let mut state = self.state.lock();
        if let Some(index) = &mut state.index {
            index.apply(&change);
        }
        if let Some(replay) = &mut state.replay {
            replay.push(change);
        }
    }

    /// One pass of [`Indexes::fetch_attributes_in_background`] over this source.
    async fn fetch_attributes(&self, ticks: &mut tokio::time::Interval) {
        let prefixes = self.state.lock().index.as_ref().map(SourceIndex::dir_prefixes).unwrap_or_default();
        let mut heads = tokio::task::JoinSet::new();
        let (mut fetched, mut unsaved) = (0, 0);
        for prefix in prefixes {
            let keys = {
                let state = self.state.lock();
                let listing = state.index.as_ref().and_then(|index| index.dir(&prefix));
                listing.map(|listing| listing.files_without_metadata(&prefix)).unwrap_or_default()
            };
            for key in keys {
                ticks.tick().await;
                if heads.len() >= ATTRIBUTE_HEADS_IN_FLIGHT {
                    let found = self.take_head(heads.join_next().await);
                    (fetched, unsaved) = (fetched + found, unsaved + found);
                    if unsaved >= SAVE_EVERY_FETCHED {
                        self.save_snapshot().await;
                        unsaved = 0;
                    }
                }
                let store = self.store.clone();
                heads.spawn(async move {
                    let head = store.head(&key).await;
                    (key, head)
                });
            }
        }
        while let Some(done) = heads.join_next().await {
            fetched += self.take_head(Some(done));
        }
        if fetched > 0 {
            tracing::info!(source = self.identity, fetched, "stored attributes fetched in the background");
            self.save_snapshot().await;
        }
    }

    /// Enters what a background HEAD found; 1 if it found the object.
    fn take_head(&self, done: Option<Result<BackgroundHead, tokio::task::JoinError>>) -> usize {
        match done {
            Some(Ok((_, Ok(info)))) => {
                self.record(Change::File(info));
                1
            }
            Some(Ok((key, Err(StoreError::NotFound)))) => {
                self.record(Change::Remove { key }); // deleted since the listing
                0
            }
            Some(Ok((key, Err(error)))) => {
                tracing::debug!(key, "stored attributes not fetched: {error}"); // the next pass tries again
                0
            }
            _ => 0,
        }
    }

    /// The index as it is now, and when it was listed (a clone is one `Arc` per
    /// directory).
    fn snapshot(&self) -> Option<(SourceIndex, SystemTime)> {
        let state = self.state.lock();
        Some((state.index.clone()?, state.listed_at?))
    }

    /// Saves the index as it is now (a background pass's progress).
    async fn save_snapshot(&self) {
        if let Some((index, listed_at)) = self.snapshot() {
            self.save_off_runtime(index, listed_at).await;
        }
    }

    /// Saves `index`: writing a large one takes a while, so not on a runtime worker.
    async fn save_off_runtime(&self, index: SourceIndex, listed_at: SystemTime) {
        let (file, identity) = (self.file.clone(), self.identity.clone());
        let _ = tokio::task::spawn_blocking(move || save(&file, &identity, &index, listed_at)).await;
    }

    /// Lists the source and swaps the result in; returns its (files, directories).
    async fn refresh(&self) -> Result<(usize, usize), StoreError> {
        let listed_at = SystemTime::now();
        self.state.lock().replay = Some(Vec::new());
        let listed = build::list_source(&self.store, &self.prefix).await;
        let mut fresh = match listed {
            Ok(fresh) => fresh,
            Err(error) => {
                self.state.lock().replay = None;
                return Err(error);
            }
        };
        if let Some(old) = &self.state.lock().index {
            fresh.carry_metadata_from(old);
        }
        self.fetch_marker_metadata(&mut fresh).await;
        let saved = {
            let mut state = self.state.lock();
            for change in state.replay.take().unwrap_or_default() {
                fresh.apply(&change);
            }
            let saved = fresh.clone(); // cheap: one `Arc` per directory
            state.index = Some(fresh);
            state.listed_at = Some(listed_at);
            saved
        };
        let counts = (saved.files(), saved.dirs());
        self.save_off_runtime(saved, listed_at).await;
        Ok(counts)
    }

    /// HEADs the markers whose metadata the index does not know (a directory's mode,
    /// owner and times are in its marker): a walk then needs no request.
    async fn fetch_marker_metadata(&self, index: &mut SourceIndex) {
        let markers = index.markers_without_metadata();
        let heads = futures::stream::iter(markers.into_iter().map(|prefix| async move {
            let head = self.store.head(&prefix).await;
            (prefix, head)
        }))
        .buffer_unordered(MARKER_HEADS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
        for (prefix, head) in heads {
            match head {
                Ok(info) => index.apply(&Change::Attributes {
                    key: prefix,
                    metadata: Some(info.metadata.unwrap_or_default()),
                    etag: None,
                }),
                // Fetched when needed, as without an index.
                Err(error) => tracing::debug!(prefix, "marker metadata not fetched: {error}"),
            }
        }
    }
}

fn save(file: &std::path::Path, identity: &str, index: &SourceIndex, listed_at: SystemTime) {
    let started = Instant::now();
    match file::save(file, identity, listed_at, index) {
        Ok(()) => tracing::debug!(file = %file.display(), "index saved in {:.2?}", started.elapsed()),
        Err(error) => tracing::warn!(file = %file.display(), "cannot save the index: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use bucketfs_client::store::memory::MemoryStore;

    fn indexes(store: Arc<MemoryStore>, cache: &std::path::Path) -> Arc<Indexes> {
        let source = Source { mount_name: None, store, prefix: String::new() };
        let options =
            IndexOptions { cache_dir: cache.to_owned(), refresh_every: Duration::from_secs(300), attributes_rate: 0 };
        Arc::new(Indexes::load(&[source], &options))
    }

    fn object(key: &str) -> ObjectInfo {
        ObjectInfo { key: key.to_owned(), size: 1, mtime: SystemTime::UNIX_EPOCH, etag: None, metadata: None }
    }

    /// A change made through the mount while a refresh lists the source is not undone by
    /// the refresh: it is replayed onto what the listing found before the swap.
    #[tokio::test]
    async fn changes_during_a_refresh_survive_it() {
        let cache = tempfile::tempdir().expect("cache dir");
        let store = Arc::new(MemoryStore::with_keys(["d/a", "d/b"].map(|k| (k.to_owned(), b"x".to_vec()))));
        let indexes = indexes(store.clone(), cache.path());
        indexes.refresh().await.expect("first listing");
        assert!(matches!(indexes.lookup(0, "d/", "a"), Some(Some(Indexed::File(_)))));

        *store.list_latency.lock() = Duration::from_millis(200);
        let refreshing = tokio::spawn({
            let indexes = indexes.clone();
            async move { indexes.refresh().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await; // the refresh is listing
        indexes.record(0, Change::File(object("d/new")));
        indexes.record(0, Change::Remove { key: "d/a".into() });
        assert!(matches!(indexes.lookup(0, "d/", "new"), Some(Some(_))), "at once, in the index in use");
        refreshing.await.expect("joined").expect("refresh");
        assert!(matches!(indexes.lookup(0, "d/", "new"), Some(Some(_))), "kept by the refresh");
        assert!(matches!(indexes.lookup(0, "d/", "a"), Some(None)), "still removed after the refresh");
        assert!(matches!(indexes.lookup(0, "d/", "b"), Some(Some(_))));
        assert_eq!(indexes.lookup(0, "nowhere/", "x"), None, "a directory the index lacks");
    }

    /// `--index-refresh 0`: one listing when there is no saved index, then none until
    /// asked (the task ends instead of listing the bucket again and again).
    #[tokio::test]
    async fn no_periodic_refresh_with_an_interval_of_zero() {
        let cache = tempfile::tempdir().expect("cache dir");
        let store = Arc::new(MemoryStore::with_keys([("d/a".to_owned(), b"x".to_vec())]));
        let source = Source { mount_name: None, store: store.clone(), prefix: String::new() };
        let options =
            IndexOptions { cache_dir: cache.path().to_owned(), refresh_every: Duration::ZERO, attributes_rate: 0 };
        let indexes = Arc::new(Indexes::load(&[source], &options));
        let ended = tokio::time::timeout(Duration::from_secs(5), indexes.clone().refresh_periodically()).await;
        assert!(ended.is_ok(), "the refresh task ended after the first listing");
        assert!(indexes.dir(0, "").is_some(), "listed");
        let lists = store.lists.load(std::sync::atomic::Ordering::Relaxed);
        assert!(lists <= 2, "{lists} LISTs for one listing of one directory");
    }

    /// The saved index is loaded by the next mount of the same source.
    #[tokio::test]
    async fn a_refresh_saves_what_the_next_mount_loads() {
        let cache = tempfile::tempdir().expect("cache dir");
        let store = Arc::new(MemoryStore::with_keys([("d/a".to_owned(), b"x".to_vec())]));
        indexes(store.clone(), cache.path()).refresh().await.expect("listing");
        let next = indexes(store.clone(), cache.path());
        assert!(next.dir(0, "").is_some(), "loaded");
        assert!(matches!(next.lookup(0, "d/", "a"), Some(Some(Indexed::File(_)))));
    }
}
