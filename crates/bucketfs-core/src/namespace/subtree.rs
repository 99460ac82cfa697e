//! Flat listings of subtrees: a walk (`find`, `ls -R`, `du`) gets the directories
//! below the one it reached from a few paged LISTs without delimiter (1,000 keys each,
//! whatever the directories), instead of one LIST per directory.
//!
//! **When.** A directory listed from the store while its parent was listed within the
//! TTL is a walk. Then its subtree, and those of the next [`SIBLINGS_AHEAD`]
//! subdirectories of its parent (a walk goes on to its siblings), are listed flat in the
//! background, each under its own prefix (`start-after` ranges of the parent instead made
//! `find` over the linux-5.12.13 shape 2.5x slower against MinIO: 10.1 s, not 4).
//! Each job lists at most [`PAGES_PER_JOB`] pages ahead of the walk through its subtree
//! (the end of the range of the furthest directory the walk read there: a flat listing
//! completes a directory only once past its whole subtree), and a job no walk entered
//! stops there. So a wasted window (`ls a; ls a/b` in a bucket of a million keys) costs a
//! bounded number of requests, while a walk through a large subtree gets all of it from
//! one paged listing: on the linux-5.12.13 shape with MinIO's cache warm, `find` took
//! 2.1 s with 73 LISTs (71 pages hold the tree) where jobs stopping after 8 pages
//! whatever the walk did took 4.5 s with 152 LISTs and 140 marker HEADs. A walk that goes
//! on past what the jobs listed reaches a directory they did not, and the next window
//! starts there: a read-ahead for directories.
//!
//! **What.** Keys arrive in key order, so a directory is complete once the listing has
//! passed its prefix: then its entries enter the inode table and its listing is kept, as
//! a delimited listing would have left them ([`SubtreeFiller`]). A directory whose range
//! holds no `dir/` marker key has no marker: its (empty) stored attributes are known
//! without a HEAD. A directory listed while a job covering it runs waits for the job to
//! pass it (or to stop), then reads the kept listing.
//!
//! **Stored attributes.** Where the store can list objects' metadata (MinIO), a job asks
//! for it only while programs want files' stored attributes (a file's metadata was
//! fetched within [`ATTRIBUTES_WANTED_FOR`]): `ls -lR` and `du` then get them with the
//! listing instead of a HEAD per file (on the linux-5.12.13 shape, `ls -lR` 10.9 s instead
//! of 30.1 s), while `find -name` keeps the bare listing, which costs MinIO 2.5x less.
//! The first window of a walk starts before any file is stat'ed, so it goes bare.
//!
//! The jobs are kept in [`DirState`] (the one lock); a job's progress is published on a
//! `watch` channel, so that waiters hold no lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use tokio::sync::{watch, Semaphore};

use super::dir_state::{DirState, MAX_CACHED_LISTING};
use super::inode::{shrink_if_mostly_empty, Attributes, Ino, Location};
use super::listing::EntryKind;
use super::names::check_component;
use super::Namespace;
use bucketfs_client::store::{ObjectInfo, ObjectStore};

/// Pages (1,000 keys each) one job lists at most.
const PAGES_PER_JOB: usize = 8;
/// Subdirectories of the parent after the one being listed whose subtrees are listed
/// with it.
const SIBLINGS_AHEAD: usize = 16;
/// Jobs running at once, per mount; a window finding this many running starts no more.
const JOBS_AT_ONCE: usize = 32;
/// Longest a job ahead of its walk waits for it (less if the TTL is shorter): it holds
/// one of the [`JOBS_AT_ONCE`] places and the partial directories it listed meanwhile.
const LONGEST_WAIT_FOR_THE_WALK: Duration = Duration::from_secs(30);
/// Flat LIST requests in flight at once, all jobs together.
const LISTS_IN_FLIGHT: usize = 8;
/// How long after a file's stored attributes were last fetched flat listings still ask
/// for objects' metadata.
const ATTRIBUTES_WANTED_FOR: Duration = Duration::from_secs(10);

/// How far a job got: every key up to `passed` has been listed, and every directory
/// whose range lies before it is complete (kept, unless too large). `stopped`: the job
/// ended (done, out of pages, or failed).
#[derive(Clone, Debug, Default)]
pub(super) struct Progress {
    passed: String,
    stopped: bool,
}

impl Progress {
    /// Whether the job is past the whole range of directory `prefix` (or ended).
    fn is_past(&self, prefix: &str) -> bool {
        self.stopped || (self.passed.as_str() > prefix && !self.passed.starts_with(prefix))
    }
}

/// One running job: the subtree `prefix` of `source`.
struct Running {
    source: usize,
    prefix: String,
    progress: watch::Receiver<Progress>,
    /// The furthest directory of the subtree a walk has read so far (see [`Job::run`]).
    reached: watch::Sender<String>,
}

/// The running jobs of a mount, and which directories were listed recently (how a walk
/// is recognized).
pub(super) struct SubtreeJobs {
    running: Vec<Running>,
    /// Directory → when a listing of it last started.
    listed: HashMap<Ino, Instant>,
    lists: Arc<Semaphore>,
    /// When a listed file's stored attributes were last fetched.
    file_attributes_wanted: Option<Instant>,
}

impl Default for SubtreeJobs {
    fn default() -> Self {
        Self {
            running: Vec::new(),
            listed: HashMap::new(),
            lists: Arc::new(Semaphore::new(LISTS_IN_FLIGHT)),
            file_attributes_wanted: None,
        }
    }
}

impl SubtreeJobs {
    /// A program wants the stored attributes of a listed file (`stat` of it).
    pub fn note_file_attributes_wanted(&mut self, now: Instant) {
        self.file_attributes_wanted = Some(now);
    }

    /// Whether flat listings should carry objects' metadata (see the module's doc).
    fn metadata_wanted(&self, now: Instant) -> bool {
        self.file_attributes_wanted.is_some_and(|at| now.duration_since(at) <= ATTRIBUTES_WANTED_FOR)
    }

    /// A listing of `dir` starts now.
    pub fn note_listed(&mut self, dir: Ino, now: Instant) {
        self.listed.insert(dir, now);
    }

    /// Whether a listing of `dir` started within `ttl` before `now`.
    fn listed_within(&self, dir: Ino, now: Instant, ttl: Duration) -> bool {
        self.listed.get(&dir).is_some_and(|at| now.duration_since(*at) <= ttl)
    }

    /// The running job whose subtree holds directory `prefix`.
    fn covering_job(&self, source: usize, prefix: &str) -> Option<&Running> {
        self.running.iter().find(|job| job.source == source && prefix.starts_with(job.prefix.as_str()))
    }

    /// The progress of a running job whose subtree holds directory `prefix`.
    fn covering(&self, source: usize, prefix: &str) -> Option<watch::Receiver<Progress>> {
        self.covering_job(source, prefix).map(|job| job.progress.clone())
    }

    fn start(&mut self, source: usize, prefix: &str) -> Option<(watch::Sender<Progress>, watch::Receiver<String>)> {
        if self.running.len() >= JOBS_AT_ONCE || self.covering(source, prefix).is_some() {
            return None;
        }
        let (sender, progress) = watch::channel(Progress::default());
        let (reached, reached_by_walk) = watch::channel(String::new());
        self.running.push(Running { source, prefix: prefix.to_owned(), progress, reached });
        Some((sender, reached_by_walk))
    }

    /// A walk reads directory `prefix` of `source`: the job covering it may list further.
    /// The walk needs that directory's whole range listed (a flat listing completes a
    /// directory only once past its subtree), so it counts as being at the range's end.
    pub fn note_reached(&self, source: usize, prefix: &str) {
        if let Some(job) = self.covering_job(source, prefix) {
            // The first key after every key starting with `prefix` ("a/" → "a0": '/' + 1).
            let end = format!("{}0", prefix.strip_suffix('/').unwrap_or(prefix));
            job.reached.send_if_modified(|reached| {
                let further = end.as_str() > reached.as_str();
                if further {
                    *reached = end;
                }
                further
            });
        }
    }

    fn end(&mut self, source: usize, prefix: &str) {
        self.running.retain(|job| !(job.source == source && job.prefix == prefix));
    }

    pub fn forget_dir(&mut self, dir: Ino) {
        self.listed.remove(&dir);
    }

    /// Drops the marks of listings older than `keep`.
    pub fn retain_recent(&mut self, now: Instant, keep: Duration) {
        self.listed.retain(|_, at| now.duration_since(*at) <= keep);
        shrink_if_mostly_empty(&mut self.listed);
    }
}

/// What a job needs, owned: it runs in the background, beyond the request that began it.
struct Job {
    state: Arc<Mutex<DirState>>,
    store: Arc<dyn ObjectStore>,
    source: usize,
    /// The subtree's root directory, and its key prefix.
    dir: Ino,
    prefix: String,
    ttl: Duration,
    mounted_at: SystemTime,
}

impl Job {
    /// Registers the job and runs it in the background; false if a job covers the
    /// subtree already or too many run.
    fn spawn(self) -> bool {
        let Some((progress, reached)) = self.state.lock().subtree_jobs.start(self.source, &self.prefix) else {
            return false;
        };
        tokio::spawn(self.run(progress, reached));
        true
    }

    /// Lists the subtree page by page, at most [`PAGES_PER_JOB`] pages ahead of the walk
    /// (`reached`: the furthest directory it read here): a walk that goes on through the
    /// subtree gets it from one paged listing, however large, and one that left costs
    /// those pages at most. A job no walk entered ends after those pages (the jobs of the
    /// siblings ahead must not hold the places of the next window's); one waiting for
    /// its walk as long as the TTL (what it listed would be stale by then), or 30 s at
    /// most, ends too.
    async fn run(self, progress: watch::Sender<Progress>, mut reached: watch::Receiver<String>) {
        let lists = self.state.lock().subtree_jobs.lists.clone();
        let mut filler = SubtreeFiller::new(Some(self.dir), self.prefix.clone());
        let mut token = None;
        // The last key of each page listed, in order.
        let mut page_ends: Vec<String> = Vec::new();
        let ahead = |reached: &str, page_ends: &[String]| {
            page_ends.len() - page_ends.partition_point(|end| end.as_str() < reached)
        };
        let mut why = "done";
        loop {
            if ahead(&reached.borrow(), &page_ends) >= PAGES_PER_JOB {
                if reached.borrow().is_empty() {
                    why = "no walk came";
                    break;
                }
                let caught_up = reached.wait_for(|reached| ahead(reached, &page_ends) < PAGES_PER_JOB);
                match tokio::time::timeout(self.ttl.min(LONGEST_WAIT_FOR_THE_WALK), caught_up).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => {
                        why = "the mount is going away";
                        break;
                    }
                    Err(_) => {
                        why = "the walk went elsewhere";
                        break;
                    }
                }
            }
            // Trusted for a TTL from when the LIST was sent: what changed after that
            // through this mount is added when kept (`DirState::remember_listing`).
            let (sent, page) = {
                let Ok(_permit) = lists.acquire().await else { break };
                let sent = Instant::now();
                let with_metadata = self.state.lock().subtree_jobs.metadata_wanted(sent);
                (sent, self.store.list_recursive(&self.prefix, token.take(), with_metadata).await)
            };
            let page = match page {
                Ok(page) => page,
                Err(error) => {
                    tracing::debug!(prefix = self.prefix, "flat listing stopped: {error}");
                    why = "a LIST failed";
                    break;
                }
            };
            let last_page = page.next_token.is_none();
            let passed = page.objects.last().map(|object| object.key.clone());
            {
                let mut state = self.state.lock();
                let mut sink = IntoDirState { state: &mut state, source: self.source, mounted_at: self.mounted_at };
                filler.push(&mut sink, &page.objects, sent + self.ttl);
                if last_page {
                    filler.finish(&mut sink);
                }
            }
            if let Some(passed) = passed {
                page_ends.push(passed.clone());
                progress.send_modify(|p| p.passed = passed);
            }
            if last_page {
                break;
            }
            token = page.next_token;
        }
        tracing::debug!(prefix = self.prefix, pages = page_ends.len(), "flat listing ended: {why}");
        self.state.lock().subtree_jobs.end(self.source, &self.prefix);
        progress.send_modify(|p| p.stopped = true);
    }
}

impl Namespace {
    /// The listing of directory `dir` (`prefix` of `source`) from a flat listing running
    /// over it: waits until the listing has passed it, then takes what it kept. `None`
    /// if no job covers it, or it stopped before (the caller lists it itself).
    pub(super) async fn listing_from_subtree_job(
        &self,
        dir: Ino,
        source: usize,
        prefix: &str,
    ) -> Option<Arc<Vec<String>>> {
        let mut progress = self.state.lock().subtree_jobs.covering(source, prefix)?;
        // An error means the job is gone (its sender dropped): nothing more to wait for.
        let _ = progress.wait_for(|p| p.is_past(prefix)).await;
        self.state.lock().fresh_listing(dir, Instant::now())
    }

    /// Directory `dir` (in `parent`) is being listed from the store. If that is part of
    /// a walk (its parent was listed within the TTL), lists its subtree and those of the
    /// next [`SIBLINGS_AHEAD`] subdirectories of its parent flat, in the background.
    pub(super) fn start_subtree_listings(&self, dir: Ino, parent: Ino) {
        if !self.flat_listing || self.ttl.is_zero() || parent == dir {
            return;
        }
        let now = Instant::now();
        let subtrees: Vec<(Ino, usize, String)> = {
            let state = self.state.lock();
            if !state.subtree_jobs.listed_within(parent, now, self.ttl) {
                return;
            }
            let (Some(names), Some(node)) = (state.fresh_names(parent, now), state.inodes.get(dir)) else { return };
            let from = names.partition_point(|name| name.as_str() < &*node.name);
            names[from..]
                .iter()
                .filter_map(|name| {
                    let child = state.inodes.child(parent, name)?;
                    let Location::Dir { source, prefix } = &child.location else { return None };
                    let known = state.fresh_listing(child.ino, now).is_some() && child.ino != dir;
                    (!known).then(|| (child.ino, *source, prefix.clone()))
                })
                .take(1 + SIBLINGS_AHEAD)
                .collect()
        };
        for (dir, source, prefix) in subtrees {
            let job = Job {
                state: self.state.clone(),
                store: self.store(source).clone(),
                source,
                dir,
                prefix,
                ttl: self.ttl,
                mounted_at: self.mounted_at,
            };
            if !job.spawn() && self.state.lock().subtree_jobs.running.len() >= JOBS_AT_ONCE {
                break;
            }
        }
    }
}

/// Where a flat listing puts the directories it completes: the namespace's state (a walk's
/// subtree jobs) or a listing index being built (`--index`). `Dir` is how the sink names
/// a directory the listing is in.
pub(super) trait FilledDirs {
    type Dir;
    /// The listing entered subdirectory `name` of `parent`, whose key prefix is `prefix`.
    fn open(&mut self, parent: &Self::Dir, name: &str, prefix: &str, valid_until: Instant) -> Self::Dir;
    /// The listing has passed directory `dir` (key prefix `prefix`): these are its
    /// entries, complete; `marker`: its `dir/` marker object, if there is one.
    fn close(
        &mut self,
        dir: Self::Dir,
        prefix: &str,
        entries: BTreeMap<String, EntryKind>,
        marker: Option<ObjectInfo>,
        valid_until: Instant,
    );
}

/// A directory whose range the listing is in.
struct OpenDir<D> {
    prefix: String,
    dir: D,
    entries: BTreeMap<String, EntryKind>,
    marker: Option<ObjectInfo>,
    /// Until when its listing may be trusted: from the page that opened it.
    valid_until: Instant,
}

/// Turns the keys of a flat listing of one subtree, page by page, into complete
/// directory listings (the same entries a delimited listing of each would give: see
/// `listing::ListingMerger`, whose rules hold here too), handed to a [`FilledDirs`].
pub(super) struct SubtreeFiller<D> {
    /// The directories the listing is in, outermost (the subtree's root) first.
    open: Vec<OpenDir<D>>,
    root: Option<(D, String)>,
}

impl<D> SubtreeFiller<D> {
    /// A filler for the subtree `prefix`, whose root directory the sink calls `dir`.
    pub fn new(dir: D, prefix: String) -> Self {
        Self { open: Vec::new(), root: Some((dir, prefix)) }
    }

    /// Takes the objects of one page, in key order.
    pub fn push<S: FilledDirs<Dir = D>>(&mut self, sink: &mut S, objects: &[ObjectInfo], valid_until: Instant) {
        if let Some((dir, prefix)) = self.root.take() {
            self.open.push(OpenDir { prefix, dir, entries: BTreeMap::new(), marker: None, valid_until });
        }
        for object in objects {
            self.push_key(sink, object, valid_until);
        }
    }

    fn push_key<S: FilledDirs<Dir = D>>(&mut self, sink: &mut S, object: &ObjectInfo, valid_until: Instant) {
        let key = object.key.as_str();
        while self.open.len() > 1 && !key.starts_with(self.open[self.open.len() - 1].prefix.as_str()) {
            self.close_innermost(sink);
        }
        let Some(top) = self.open.last() else { return };
        let Some(mut rest) = key.strip_prefix(top.prefix.as_str()) else { return };
        loop {
            let Some(top) = self.open.last_mut() else { return };
            match rest.split_once('/') {
                None if rest.is_empty() => {
                    top.marker = Some(object.clone()); // the key is the directory's `dir/` marker
                    return;
                }
                None => {
                    if check_component(rest).is_ok() {
                        // A directory of the same name would come later (`a` < `a/…`), and wins.
                        top.entries.insert(rest.to_owned(), EntryKind::File(object.clone()));
                    }
                    return;
                }
                Some((name, below)) => {
                    if check_component(name).is_err() {
                        return; // hidden, with everything below it (as in a delimited listing)
                    }
                    top.entries.insert(name.to_owned(), EntryKind::Dir);
                    let prefix = format!("{}{name}/", top.prefix);
                    let dir = sink.open(&top.dir, name, &prefix, valid_until);
                    self.open.push(OpenDir { prefix, dir, entries: BTreeMap::new(), marker: None, valid_until });
                    rest = below;
                }
            }
        }
    }

    /// The listing ended: every directory still open is complete.
    pub fn finish<S: FilledDirs<Dir = D>>(&mut self, sink: &mut S) {
        while !self.open.is_empty() {
            self.close_innermost(sink);
        }
    }

    /// The listing has passed the innermost open directory.
    fn close_innermost<S: FilledDirs<Dir = D>>(&mut self, sink: &mut S) {
        if let Some(dir) = self.open.pop() {
            sink.close(dir.dir, &dir.prefix, dir.entries, dir.marker, dir.valid_until);
        }
    }
}

/// A walk's flat listing fills the namespace's state: directories enter the inode table
/// as the listing reaches them, files and the kept listing once it has passed them. A
/// name this mount removed within the TTL is left out with all below it (`None`), as a
/// delimited listing leaves it out: the LIST was sent before the removal, or lags.
pub(super) struct IntoDirState<'a> {
    pub state: &'a mut DirState,
    pub source: usize,
    pub mounted_at: SystemTime,
}

impl FilledDirs for IntoDirState<'_> {
    type Dir = Option<Ino>;

    fn open(&mut self, parent: &Option<Ino>, name: &str, prefix: &str, valid_until: Instant) -> Option<Ino> {
        let parent = (*parent)?;
        if self.state.removed_here(parent, name, Instant::now()) {
            return None;
        }
        let location = Location::Dir { source: self.source, prefix: prefix.to_owned() };
        let attributes = Attributes::dir(self.mounted_at, None, Some(valid_until));
        Some(self.state.enter_found(parent, name, location, attributes).ino)
    }

    fn close(
        &mut self,
        dir: Option<Ino>,
        _prefix: &str,
        entries: BTreeMap<String, EntryKind>,
        marker: Option<ObjectInfo>,
        valid_until: Instant,
    ) {
        let Some(dir) = dir else { return }; // removed here
        match marker {
            None => self.state.set_metadata_if_unknown(dir, Arc::default()), // nothing stored
            Some(ObjectInfo { metadata: Some(metadata), .. }) => self.state.set_metadata_if_unknown(dir, metadata),
            Some(_) => {} // a marker whose metadata the listing did not carry: HEADed on stat
        }
        if entries.len() > MAX_CACHED_LISTING {
            return;
        }
        let mut names = Vec::with_capacity(entries.len());
        let now = Instant::now();
        for (name, kind) in entries {
            if self.state.removed_here(dir, &name, now) {
                continue; // the LIST was sent before this mount removed it, or lags
            }
            if let EntryKind::File(info) = kind {
                let location = Location::File { source: self.source, key: info.key.clone() };
                self.state.enter_found(dir, &name, location, Attributes::file(info, Some(valid_until)));
            }
            names.push(name);
        }
        self.state.remember_listing(dir, valid_until, names);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::namespace::inode::{InodeTable, ROOT_INO};
    use crate::namespace::listing::tests::expected_entries;

    /// The entries the state shows for directory `ino` from its kept listing.
    fn shown(state: &DirState, ino: Ino) -> BTreeMap<String, bool> {
        let names = state.fresh_listing(ino, Instant::now()).expect("a kept listing");
        names
            .iter()
            .map(|name| {
                let node = state.inodes.child(ino, name).expect("a listed name has an entry");
                (name.clone(), node.location.is_dir())
            })
            .collect()
    }

    /// The state of a mount of an empty root, with a TTL of a minute.
    fn empty_state() -> DirState {
        let root = Location::Dir { source: 0, prefix: String::new() };
        DirState::new(InodeTable::new(root, SystemTime::now()), Duration::from_secs(60))
    }

    fn sink(state: &mut DirState) -> IntoDirState<'_> {
        IntoDirState { state, source: 0, mounted_at: SystemTime::now() }
    }

    fn info(key: &str) -> ObjectInfo {
        ObjectInfo { key: key.to_owned(), size: 1, mtime: SystemTime::UNIX_EPOCH, etag: None, metadata: None }
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        let component = prop::sample::select(vec!["a", "b", "a-", "a.", ".", "", "a b"]);
        prop::collection::vec(component, 1..5).prop_map(|parts| parts.join("/"))
    }

    /// Walks the shown tree from the root and compares every directory with the model.
    fn check_tree(state: &DirState, keys: &BTreeSet<String>, ino: Ino, prefix: &str) -> Result<(), TestCaseError> {
        let shown = shown(state, ino);
        prop_assert_eq!(&shown, &expected_entries(keys, prefix), "directory {:?}", prefix);
        for (name, is_dir) in shown {
            if is_dir {
                let child = state.inodes.child(ino, &name).expect("entry").ino;
                check_tree(state, keys, child, &format!("{prefix}{name}/"))?;
            }
        }
        Ok(())
    }

    proptest! {
        /// Whatever the keys and however they are split into pages, every directory of
        /// the subtree shows what a delimited listing of it would.
        #[test]
        fn flat_listing_fills_every_directory_as_a_delimited_listing_would(
            keys in prop::collection::btree_set(key_strategy(), 0..40),
            page_size in 1usize..7,
        ) {
            let mut state = empty_state();
            let mut filler = SubtreeFiller::new(Some(ROOT_INO), String::new());
            let mut sink = sink(&mut state);
            let objects: Vec<ObjectInfo> = keys.iter().map(|k| info(k)).collect();
            let until = Instant::now() + Duration::from_secs(60);
            for page in objects.chunks(page_size) {
                filler.push(&mut sink, page, until);
            }
            if objects.is_empty() {
                filler.push(&mut sink, &[], until);
            }
            filler.finish(&mut sink);
            check_tree(&state, &keys, ROOT_INO, "")?;
        }
    }

    /// A directory is complete as soon as the listing has passed it, before the end;
    /// one without a marker needs no HEAD for its attributes, one with a marker does.
    #[test]
    fn directories_complete_as_the_listing_passes_them() {
        let mut state = empty_state();
        let mut filler = SubtreeFiller::new(Some(ROOT_INO), String::new());
        let until = Instant::now() + Duration::from_secs(60);
        filler.push(&mut sink(&mut state), &[info("a/1"), info("a/2"), info("b/"), info("b/x")], until);
        let a = state.inodes.child(ROOT_INO, "a").expect("a").clone();
        assert_eq!(shown(&state, a.ino).len(), 2, "passed: complete");
        assert!(a.metadata.is_some(), "no marker: attributes known");
        let b = state.inodes.child(ROOT_INO, "b").expect("b").ino;
        assert!(state.fresh_listing(b, Instant::now()).is_none(), "still in it");
        // A marker listed with its metadata (MinIO's listing extension) needs no HEAD.
        let stored = Arc::new(bucketfs_client::store::Metadata {
            user: [("mode".to_owned(), "16832".to_owned())].into(),
            listed: true,
            ..bucketfs_client::store::Metadata::default()
        });
        let listed_marker = ObjectInfo { metadata: Some(stored.clone()), ..info("c/") };
        filler.push(&mut sink(&mut state), &[listed_marker, info("c/x"), info("d")], until);
        assert_eq!(shown(&state, b).len(), 1);
        assert!(state.inodes.get(b).expect("b").metadata.is_none(), "a marker: its metadata is fetched");
        let c = state.inodes.child(ROOT_INO, "c").expect("c").clone();
        assert_eq!(c.metadata, Some(stored), "a marker listed with its metadata");
        assert!(state.fresh_listing(ROOT_INO, Instant::now()).is_none(), "the root ends with the listing");
        filler.finish(&mut sink(&mut state));
        assert_eq!(shown(&state, ROOT_INO).len(), 4);
    }

    /// A flat listing whose LIST was sent before this mount removed a file leaves it out.
    #[test]
    fn a_flat_listing_leaves_out_what_the_mount_removed() {
        let mut state = empty_state();
        let until = Instant::now() + Duration::from_secs(60);
        let mut filler = SubtreeFiller::new(Some(ROOT_INO), String::new());
        filler.push(&mut sink(&mut state), &[info("a/1")], until);
        let a = state.inodes.child(ROOT_INO, "a").expect("a").ino;
        state.remove_entry(a, "2", until); // removed here; the LIST below still has it
        filler.push(&mut sink(&mut state), &[info("a/2"), info("b")], until);
        assert_eq!(shown(&state, a).into_keys().collect::<Vec<_>>(), ["1"]);
        assert!(state.inodes.child(a, "2").is_none(), "not entered either");
    }

    /// A directory this mount removed, which a lagging LIST still holds keys of, stays
    /// out with all below it: `mkdir` of its name succeeds, as after a delimited listing.
    #[test]
    fn a_flat_listing_leaves_out_a_directory_the_mount_removed() {
        let mut state = empty_state();
        let until = Instant::now() + Duration::from_secs(60);
        state.remove_entry(ROOT_INO, "c", until); // `rmdir c` (or `rm -r`); the LIST lags
        let mut filler = SubtreeFiller::new(Some(ROOT_INO), String::new());
        filler.push(&mut sink(&mut state), &[info("a"), info("c/"), info("c/d/1"), info("e")], until);
        filler.finish(&mut sink(&mut state));
        assert_eq!(shown(&state, ROOT_INO).into_keys().collect::<Vec<_>>(), ["a", "e"]);
        assert!(state.inodes.child(ROOT_INO, "c").is_none(), "not entered");
        assert!(state.removed_here(ROOT_INO, "c", Instant::now()), "still removed here");
    }

    #[test]
    fn progress_is_past_a_directory_once_the_listing_left_its_range() {
        let at = |passed: &str| Progress { passed: passed.to_owned(), stopped: false };
        assert!(!at("a/b/c").is_past("a/b/"));
        assert!(!at("a/a").is_past("a/b/"));
        assert!(at("a/b0").is_past("a/b/"));
        assert!(at("a/c").is_past("a/b/"));
        assert!(Progress { passed: String::new(), stopped: true }.is_past("a/b/"));
    }
}
