//! Everything the namespace knows about its directories, as one structure behind one
//! lock: the inode table, names known to be missing, files being written (pending),
//! names created here lately, complete listings and recent pages, and the per-directory
//! counters that decide when to list or batch.
//!
//! **What this mount did wins over what a LIST said.** A LIST is an answer from the
//! moment it was sent: a file created or removed through this mount while it was on its
//! way (or that a store whose listings lag has not caught up with) is not in it. So a
//! listing is never kept as it came: [`DirState::remember_listing`] adds the names being
//! written and those created here within the TTL, and leaves out those removed here.
//! (Kept as they came, `find` right after `tar x` missed a fifth of the files until the
//! listing expired, and a LOOKUP answered ENOENT for a directory `tar` had just made.)
//!
//! One lock, not one per map: operations such as "this entry is gone" touch several of
//! them at once (table, listing, pending names, missing names), and separate locks taken
//! in different orders by different operations froze the mount (an `unlink` racing a
//! `readdir`). Every critical section is a few map operations and never waits on I/O
//! (the guard cannot be held across an `.await`: it is not `Send`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::inode::{shrink_if_mostly_empty, Attributes, ChildName, Ino, InodeTable, Location, Node, ROOT_INO};
use super::subtree::SubtreeJobs;
use bucketfs_client::store::Metadata;

/// Largest directory whose complete listing is kept (names only, sorted).
pub(super) const MAX_CACHED_LISTING: usize = 100_000;
/// Most names kept in complete listings, all directories together, and most names known
/// to be missing. The TTL sweep keeps both to what was seen recently; these bounds hold
/// when the TTL is long (`--metadata-ttl 3600` on a bucket walked or probed at length).
/// When one is reached, what expires soonest goes first.
#[cfg(not(test))]
const MAX_KEPT_LISTING_NAMES: usize = 2_000_000;
#[cfg(not(test))]
const MAX_MISSING_NAMES: usize = 100_000;
/// Most names created here kept at once (see [`CreatedHere`]).
#[cfg(not(test))]
const MAX_CREATED_NAMES: usize = 100_000;
// Small in unit tests, so that they reach them.
#[cfg(test)]
const MAX_KEPT_LISTING_NAMES: usize = 1_000;
#[cfg(test)]
const MAX_MISSING_NAMES: usize = 100;
#[cfg(test)]
const MAX_CREATED_NAMES: usize = 100;

/// Names of a directory listed at one time, sorted, trusted until `until`.
struct CachedListing {
    until: Instant,
    names: Arc<Vec<String>>,
}

/// Complete listings of directories, by directory inode, holding at most
/// [`MAX_KEPT_LISTING_NAMES`] names together.
#[derive(Default)]
struct KeptListings {
    by_dir: HashMap<Ino, CachedListing>,
    /// Names in all of `by_dir`.
    names: usize,
}

impl KeptListings {
    fn get(&self, dir: Ino) -> Option<&CachedListing> {
        self.by_dir.get(&dir)
    }

    fn insert(&mut self, dir: Ino, listing: CachedListing) {
        self.remove(dir);
        self.names += listing.names.len();
        self.by_dir.insert(dir, listing);
        if self.names > MAX_KEPT_LISTING_NAMES {
            let mut by_expiry: Vec<(Instant, Ino)> = self.by_dir.iter().map(|(dir, l)| (l.until, *dir)).collect();
            by_expiry.sort_unstable();
            for (_, dir) in by_expiry {
                if self.names <= MAX_KEPT_LISTING_NAMES * 3 / 4 {
                    break;
                }
                self.remove(dir);
            }
        }
    }

    fn remove(&mut self, dir: Ino) {
        if let Some(listing) = self.by_dir.remove(&dir) {
            self.names -= listing.names.len();
        }
    }

    /// `name` now is (or is not) in `dir`, if its listing is kept.
    fn update(&mut self, dir: Ino, name: &str, present: bool) {
        let Some(listing) = self.by_dir.get_mut(&dir) else { return };
        let names = Arc::make_mut(&mut listing.names);
        match (names.binary_search_by(|n| n.as_str().cmp(name)), present) {
            (Err(at), true) => {
                names.insert(at, name.to_owned());
                self.names += 1;
            }
            (Ok(at), false) => {
                names.remove(at);
                self.names -= 1;
            }
            _ => {}
        }
    }

    fn retain_fresh(&mut self, now: Instant) {
        self.by_dir.retain(|_, listing| listing.until > now);
        self.names = self.by_dir.values().map(|l| l.names.len()).sum();
        shrink_if_mostly_empty(&mut self.by_dir);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_dir.len()
    }
}

/// A name known to be missing.
#[derive(Clone, Copy)]
struct Missing {
    until: Instant,
    /// This mount removed it (unlink, rmdir, rename away): until `until`, a listing from
    /// the store that still shows it is not believed. A store whose listings lag behind
    /// its deletes (SeaweedFS lists an emptied folder for 2 minutes) would otherwise show
    /// the name in `ls` while `stat` says ENOENT.
    removed_here: bool,
}

/// Names this mount created in each directory (or renamed into it) within the TTL, and
/// until when. Every listing of the directory shows them, whatever the store's LIST said
/// (see the module's doc). At most [`MAX_CREATED_NAMES`]: when names must go before
/// their time, a listing sent before that moment is not kept (it could lack them).
#[derive(Default)]
struct CreatedHere {
    by_dir: HashMap<Ino, HashMap<String, Instant>>,
    /// Names in all of `by_dir`.
    names: usize,
    /// When names were last dropped before their time.
    dropped_early_at: Option<Instant>,
}

impl CreatedHere {
    fn insert(&mut self, dir: Ino, name: &str, until: Instant, now: Instant) {
        if self.names >= MAX_CREATED_NAMES {
            self.retain_fresh(now);
        }
        if self.names >= MAX_CREATED_NAMES {
            // Rare (that many files made within one TTL): start again, and distrust the
            // listings that were on their way.
            self.by_dir.clear();
            self.names = 0;
            self.dropped_early_at = Some(now);
        }
        if self.by_dir.entry(dir).or_default().insert(name.to_owned(), until).is_none() {
            self.names += 1;
        }
    }

    fn remove(&mut self, dir: Ino, name: &str) {
        let Some(names) = self.by_dir.get_mut(&dir) else { return };
        if names.remove(name).is_some() {
            self.names -= 1;
        }
        if names.is_empty() {
            self.by_dir.remove(&dir);
        }
    }

    fn contains(&self, dir: Ino, name: &str, now: Instant) -> bool {
        self.by_dir.get(&dir).and_then(|names| names.get(name)).is_some_and(|until| *until > now)
    }

    /// The names created in `dir` that are still to be shown.
    fn names_in(&self, dir: Ino, now: Instant) -> impl Iterator<Item = &String> {
        self.by_dir.get(&dir).into_iter().flatten().filter(move |(_, until)| **until > now).map(|(name, _)| name)
    }

    /// Whether a listing whose LIST was sent at `sent` shows, with these names added,
    /// everything this mount created: not if names went early since.
    fn complete_since(&self, sent: Instant) -> bool {
        self.dropped_early_at.is_none_or(|dropped| sent > dropped)
    }

    fn forget_dir(&mut self, dir: Ino) {
        if let Some(names) = self.by_dir.remove(&dir) {
            self.names -= names.len();
        }
    }

    fn retain_fresh(&mut self, now: Instant) {
        self.by_dir.retain(|_, names| {
            names.retain(|_, until| *until > now);
            !names.is_empty()
        });
        self.names = self.by_dir.values().map(HashMap::len).sum();
        shrink_if_mostly_empty(&mut self.by_dir);
    }
}

/// What a per-directory counter counts.
#[derive(Clone, Copy)]
pub(super) enum Counted {
    /// Lookups that went to the store.
    StoreLookups,
    /// HEADs for the metadata of listed entries.
    MetadataFetches,
}

pub(super) struct DirState {
    pub inodes: InodeTable,
    /// (parent, name) known to be missing, until the instant given.
    missing: hashbrown::HashMap<(Ino, Box<str>), Missing>,
    /// Files created here whose upload has not finished: not in any LIST yet, but shown
    /// in their directory (read-your-writes). Directory inode → names.
    pending: HashMap<Ino, BTreeSet<String>>,
    /// Names created here within the TTL, shown by every listing (see the module's doc).
    created: CreatedHere,
    /// How long what the store says is trusted (`--metadata-ttl`), and so how long names
    /// created here are shown whatever a listing says.
    ttl: Duration,
    /// Complete listings of directories, by directory inode.
    listings: KeptListings,
    /// The page most recently listed of each directory still being listed: programs
    /// `stat` entries while they read the directory (`ls -l`), before the listing is
    /// complete, and metadata batches take their neighbours from here.
    recent_pages: HashMap<Ino, CachedListing>,
    /// Per directory and kind: (count, counting since).
    counters: HashMap<(Ino, u8), (u32, Instant)>,
    /// Directories in which a file was last opened for reading, and when.
    reads: HashMap<Ino, Instant>,
    /// Flat listings of subtrees running, and recent listings (see `subtree`).
    pub subtree_jobs: SubtreeJobs,
}

impl DirState {
    pub fn new(inodes: InodeTable, ttl: Duration) -> Self {
        Self {
            inodes,
            missing: hashbrown::HashMap::new(),
            pending: HashMap::new(),
            created: CreatedHere::default(),
            ttl,
            listings: KeptListings::default(),
            recent_pages: HashMap::new(),
            counters: HashMap::new(),
            reads: HashMap::new(),
            subtree_jobs: SubtreeJobs::default(),
        }
    }

    /// The entry (parent, name) if its attributes are still fresh.
    pub fn fresh_child(&self, parent: Ino, name: &str, now: Instant) -> Option<Node> {
        self.inodes.child(parent, name).filter(|node| node.fresh_at(now)).cloned()
    }

    pub fn known_missing(&self, parent: Ino, name: &str, now: Instant) -> bool {
        self.missing.get(&ChildName(parent, name)).is_some_and(|missing| missing.until > now)
    }

    /// Whether this mount removed (parent, name) recently (see [`Missing::removed_here`]).
    pub fn removed_here(&self, parent: Ino, name: &str, now: Instant) -> bool {
        self.missing.get(&ChildName(parent, name)).is_some_and(|missing| missing.removed_here && missing.until > now)
    }

    /// (parent, name) is missing until `until`; `removed_here` if this mount removed it.
    /// A store's answer that it is missing does not count for a name this mount created
    /// within the TTL: the question was sent before the name was stored.
    pub fn mark_missing(&mut self, parent: Ino, name: &str, until: Instant, removed_here: bool) {
        if !removed_here && self.created.contains(parent, name, Instant::now()) {
            return;
        }
        if self.missing.len() >= MAX_MISSING_NAMES {
            // The quarter that expires soonest goes (amortized: once per quarter filled).
            let mut expiries: Vec<Instant> = self.missing.values().map(|missing| missing.until).collect();
            let cut = MAX_MISSING_NAMES / 4;
            let (_, &mut threshold, _) = expiries.select_nth_unstable(cut);
            self.missing.retain(|_, missing| missing.until > threshold);
        }
        let removed_here = removed_here || self.removed_here(parent, name, Instant::now());
        self.missing.insert((parent, Box::from(name)), Missing { until, removed_here });
    }

    /// `dir`'s stored metadata is `metadata`, unless something more precise (a HEAD) is
    /// known already.
    /// (parent, name), if missing longer, is missing until `until` only.
    pub fn shorten_missing(&mut self, parent: Ino, name: &str, until: Instant) {
        if let Some(missing) = self.missing.get_mut(&ChildName(parent, name)) {
            missing.until = missing.until.min(until);
        }
    }

    pub fn set_metadata_if_unknown(&mut self, dir: Ino, metadata: Arc<Metadata>) {
        if let Some(node) = self.inodes.get_mut(dir) {
            node.metadata.get_or_insert(metadata);
        }
    }

    pub fn fresh_listing(&self, dir: Ino, now: Instant) -> Option<Arc<Vec<String>>> {
        self.listings.get(dir).filter(|l| l.until > now).map(|l| l.names.clone())
    }

    /// Whether a complete listing of `dir` of at most `most` names is held, fresh or
    /// expired: a directory listed whole (or made) by this mount lately.
    pub fn held_listing(&self, dir: Ino, most: usize) -> bool {
        self.listings.get(dir).is_some_and(|listing| listing.names.len() <= most)
    }

    /// Drops `dir`'s complete listing (it could not be listed again for a lookup).
    pub fn drop_listing(&mut self, dir: Ino) {
        self.listings.remove(dir);
    }

    /// The fresh complete listing of `dir`, else the last page listed of it.
    pub fn fresh_names(&self, dir: Ino, now: Instant) -> Option<Arc<Vec<String>>> {
        self.fresh_listing(dir, now)
            .or_else(|| self.recent_pages.get(&dir).filter(|p| p.until > now).map(|p| p.names.clone()))
    }

    /// Keeps `names`, what a listing of `dir` from the store found, as `dir`'s complete
    /// listing until `until` (its LIST was sent a TTL before): with what this mount did
    /// that the LIST may not show (see the module's doc), so that it is complete.
    pub fn remember_listing(&mut self, dir: Ino, until: Instant, mut names: Vec<String>) {
        let now = Instant::now();
        let sent = until.checked_sub(self.ttl).unwrap_or(until);
        if !self.created.complete_since(sent) {
            return;
        }
        names.retain(|name| !self.removed_here(dir, name, now));
        names.extend(self.shown_whatever_listed(dir));
        names.sort_unstable();
        names.dedup();
        self.listings.insert(dir, CachedListing { until, names: Arc::new(names) });
        self.recent_pages.remove(&dir);
    }

    /// A change made through the mount: `name` now is (or is not) in `dir`, also in its
    /// cached listing, which stays complete. (`tar x` into a new directory then costs no
    /// lookup request per file.)
    fn update_listing(&mut self, dir: Ino, name: &str, present: bool) {
        self.listings.update(dir, name, present);
    }

    /// Counts one more `what` in `dir`; returns how many there were within `ttl`.
    pub fn count(&mut self, what: Counted, dir: Ino, now: Instant, ttl: Duration) -> u32 {
        let (count, since) = self.counters.entry((dir, what as u8)).or_insert((0, now));
        if now.duration_since(*since) > ttl {
            (*count, *since) = (0, now);
        }
        *count = count.saturating_add(1);
        *count
    }

    pub fn note_read(&mut self, dir: Ino, now: Instant) {
        self.reads.insert(dir, now);
    }

    pub fn files_read_in(&self, dir: Ino, now: Instant, ttl: Duration) -> bool {
        self.reads.get(&dir).is_some_and(|at| now.duration_since(*at) <= ttl)
    }

    /// The names of `dir` shown whatever a listing of the store says: files being
    /// written, directories whose marker is not stored yet, and what this mount created
    /// within the TTL.
    pub fn shown_whatever_listed(&self, dir: Ino) -> BTreeSet<String> {
        let mut names = self.pending.get(&dir).cloned().unwrap_or_default();
        names.extend(self.created.names_in(dir, Instant::now()).cloned());
        names
    }

    /// Whether `dir` holds a name of [`DirState::shown_whatever_listed`].
    pub fn has_children_made_here(&self, dir: Ino) -> bool {
        self.pending.get(&dir).is_some_and(|names| !names.is_empty())
            || self.created.names_in(dir, Instant::now()).next().is_some()
    }

    fn remove_pending(&mut self, dir: Ino, name: &str) -> bool {
        self.pending.get_mut(&dir).is_some_and(|names| names.remove(name))
    }

    /// `ino` is no longer being written: its name comes from listings again, once a TTL
    /// has passed if it was `stored` ([`DirState::stored_here`]); at once if not (a
    /// replacement that failed leaves the object).
    pub fn settled(&mut self, ino: Ino, stored: bool) {
        if let Some((parent, name)) = self.inodes.get(ino).map(Node::parent_and_name) {
            self.remove_pending(parent, &name);
        }
        if stored {
            self.stored_here(ino);
        }
    }

    /// This mount stored a new version of `ino` (a commit, also of a file that was not
    /// being written, as after a `truncate` by name; a metadata rewrite): for the TTL no
    /// listing replaces its attributes, as for a name made here, since a LIST sent before
    /// the store ended, or one that lags, shows the version replaced, whose ETag the next
    /// open would pin (ESTALE).
    pub fn stored_here(&mut self, ino: Ino) {
        if let Some((parent, name)) = self.inodes.get(ino).map(Node::parent_and_name) {
            self.note_created(parent, &name);
        }
    }

    /// Keeps `ino` as this mount made it, whatever the store says, until
    /// [`DirState::release`]: a directory whose marker is not stored yet.
    pub fn hold(&mut self, ino: Ino) {
        let Some(node) = self.inodes.get_mut(ino) else { return };
        node.valid_until = None;
        let (parent, name) = node.parent_and_name();
        self.pending.entry(parent).or_default().insert(name);
    }

    /// Ends a [`DirState::hold`]: `ino` is trusted until `valid_until`, then asked for again.
    pub fn release(&mut self, ino: Ino, valid_until: Instant) {
        let Some(node) = self.inodes.get_mut(ino) else { return };
        node.valid_until = Some(valid_until);
        self.settled(ino, true);
    }

    /// Enters an entry created (or being written) here: shown at once, in the cached
    /// listing too.
    pub fn enter_created(
        &mut self,
        parent: Ino,
        name: &str,
        location: Location,
        attributes: Attributes,
        pending: bool,
    ) -> Node {
        self.missing.remove(&ChildName(parent, name));
        self.update_listing(parent, name, true);
        self.note_created(parent, name);
        if pending {
            self.pending.entry(parent).or_default().insert(name.to_owned());
        }
        self.inodes.upsert(parent, name, location, attributes)
    }

    /// `name` was created in `dir` (or renamed into it) through this mount.
    fn note_created(&mut self, dir: Ino, name: &str) {
        let now = Instant::now();
        if let Some(until) = now.checked_add(self.ttl).filter(|until| *until > now) {
            self.created.insert(dir, name, until, now);
        }
    }

    /// An entry of directory `dir` was created, removed or renamed: its mtime and ctime
    /// are now (see [`Node::touched`]).
    pub fn touch(&mut self, dir: Ino) {
        if let Some(node) = self.inodes.get_mut(dir) {
            node.touched = Some(SystemTime::now());
        }
    }

    /// Enters what the store says (parent, name) is, unless this mount made it.
    pub fn enter_found(&mut self, parent: Ino, name: &str, location: Location, attributes: Attributes) -> Node {
        self.missing.remove(&ChildName(parent, name));
        if let Some(made) = self.made_here_child(parent, name) {
            return made;
        }
        self.inodes.upsert(parent, name, location, attributes)
    }

    /// The entry (parent, name) as this mount made it, where the store's answer must not
    /// replace it: a file being written (the store has what it will replace), or an entry
    /// made here within the TTL whose attributes are still trusted (a LIST that lags
    /// still shows what was there before: a directory removed, then a file of its name).
    fn made_here_child(&self, parent: Ino, name: &str) -> Option<Node> {
        let node = self.inodes.child(parent, name)?;
        let now = Instant::now();
        let pending = self.pending.get(&parent).is_some_and(|names| names.contains(name));
        (pending || (self.created.contains(parent, name, now) && node.fresh_at(now))).then(|| node.clone())
    }

    /// Remembers a page of `dir`'s listing (names, sorted) for metadata batches.
    pub fn remember_page(&mut self, dir: Ino, until: Instant, mut names: Vec<String>) {
        names.sort_unstable();
        self.recent_pages.insert(dir, CachedListing { until, names: Arc::new(names) });
    }

    /// Forgets (parent, name) after it was deleted (or its creation failed): it is
    /// missing until `missing_until`.
    pub fn remove_entry(&mut self, parent: Ino, name: &str, missing_until: Instant) {
        self.entry_left(parent);
        self.update_listing(parent, name, false);
        if let Some(ino) = self.inodes.remove(parent, name) {
            self.listings.remove(ino);
        }
        self.remove_pending(parent, name);
        self.created.remove(parent, name);
        self.mark_missing(parent, name, missing_until, true);
    }

    /// An entry left directory `dir` through this mount (removed, or renamed away): `dir`
    /// stays as it is in its parent for the TTL, listed and found as a name made here. An
    /// implicit directory (no marker) so emptied has no key left for a LIST to show, yet
    /// it is there until `rmdir`, as on a local disk (a new mount no longer finds it).
    fn entry_left(&mut self, dir: Ino) {
        let Some(node) = self.inodes.get_mut(dir) else { return };
        let Location::Dir { prefix, .. } = &node.location else { return };
        if dir == ROOT_INO || prefix.is_empty() {
            return; // a source's root is no entry of a listed directory
        }
        if node.valid_until.is_some() {
            node.valid_until = Some(Instant::now() + self.ttl);
        }
        let (parent, name) = node.parent_and_name();
        self.note_created(parent, &name);
    }

    /// The kernel dropped `count` references to `ino`: once it holds none, the inode and
    /// what is kept about it as a directory go. Returns whether `ino` is gone.
    pub fn forget(&mut self, ino: Ino, count: u64) -> bool {
        if self.inodes.forget(ino, count) {
            self.forget_dir(ino);
        }
        self.inodes.get(ino).is_none()
    }

    /// Drops everything that expired before `now` (see [`InodeTable::sweep`]): what the
    /// kernel does not hold is kept only as long as it may be trusted, so a long-lived
    /// mount's memory follows its working set, not its history.
    pub fn sweep(&mut self, now: Instant, ttl: Duration) {
        for ino in self.inodes.sweep(now) {
            self.forget_dir(ino);
        }
        self.missing.retain(|_, missing| missing.until > now);
        self.created.retain_fresh(now);
        self.listings.retain_fresh(now);
        self.recent_pages.retain(|_, page| page.until > now);
        self.counters.retain(|_, (_, since)| now.duration_since(*since) <= ttl);
        self.reads.retain(|_, at| now.duration_since(*at) <= ttl);
        self.subtree_jobs.retain_recent(now, ttl);
        self.pending.retain(|_, names| !names.is_empty());
        shrink_if_mostly_empty(&mut self.missing);
        shrink_if_mostly_empty(&mut self.recent_pages);
        shrink_if_mostly_empty(&mut self.counters);
        shrink_if_mostly_empty(&mut self.reads);
        shrink_if_mostly_empty(&mut self.pending);
    }

    fn forget_dir(&mut self, ino: Ino) {
        self.listings.remove(ino);
        self.created.forget_dir(ino);
        self.recent_pages.remove(&ino);
        self.reads.remove(&ino);
        self.subtree_jobs.forget_dir(ino);
        self.counters.retain(|(dir, _), _| *dir != ino);
    }

    /// How many entries each kind of state holds (for tests and memory figures).
    #[cfg(test)]
    pub fn sizes(&self) -> [usize; 5] {
        [self.inodes.len(), self.missing.len(), self.listings.len(), self.recent_pages.len(), self.counters.len()]
    }

    /// See [`InodeTable::rename`]; the listings, pending and missing names follow.
    pub fn rename_entry(
        &mut self,
        from: (Ino, &str),
        to: (Ino, &str),
        old_key: &str,
        new_key: &str,
        missing_until: Instant,
    ) {
        self.touch(from.0);
        self.touch(to.0);
        self.entry_left(from.0);
        self.update_listing(from.0, from.1, false);
        self.update_listing(to.0, to.1, true);
        if let Some((_, Some(replaced))) = self.inodes.rename(from, to, old_key, new_key) {
            self.listings.remove(replaced);
        }
        if self.remove_pending(from.0, from.1) {
            self.pending.entry(to.0).or_default().insert(to.1.to_owned());
        }
        self.created.remove(from.0, from.1);
        self.note_created(to.0, to.1);
        self.missing.remove(&ChildName(to.0, to.1));
        self.mark_missing(from.0, from.1, missing_until, true);
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn state() -> DirState {
        DirState::new(
            InodeTable::new(Location::Dir { source: 0, prefix: String::new() }, SystemTime::now()),
            Duration::from_secs(5),
        )
    }

    /// With a long TTL nothing expires, yet missing names stay under their bound, and the
    /// ones that would expire first are the ones dropped.
    #[test]
    fn missing_names_are_bounded() {
        let mut state = state();
        let start = Instant::now() + Duration::from_secs(3600);
        for i in 0..10 * MAX_MISSING_NAMES {
            state.mark_missing(1, &format!("n{i}"), start + Duration::from_millis(i as u64), false);
        }
        assert!(state.missing.len() <= MAX_MISSING_NAMES, "{} missing names kept", state.missing.len());
        let last = format!("n{}", 10 * MAX_MISSING_NAMES - 1);
        assert!(state.known_missing(1, &last, Instant::now()), "the latest is kept");
        assert!(!state.known_missing(1, "n0", Instant::now()), "the soonest to expire went");
    }

    /// Kept listings hold at most their bound of names together (the soonest to expire
    /// go first), and changes through the mount count too.
    #[test]
    fn kept_listing_names_are_bounded() {
        let mut state = state();
        let start = Instant::now() + Duration::from_secs(3600);
        let per_dir = MAX_KEPT_LISTING_NAMES / 4;
        for dir in 0..20u64 {
            let names = (0..per_dir).map(|i| format!("f{i}")).collect();
            state.remember_listing(100 + dir, start + Duration::from_secs(dir), names);
            state.update_listing(100 + dir, "added", true);
            let total: usize = state.listings.by_dir.values().map(|l| l.names.len()).sum();
            assert_eq!(state.listings.names, total, "the count follows the listings");
            assert!(total <= MAX_KEPT_LISTING_NAMES, "{total} names kept");
        }
        assert!(state.fresh_listing(119, Instant::now()).is_some(), "the latest listing is kept");
        assert!(state.fresh_listing(100, Instant::now()).is_none(), "the soonest to expire went");
        assert!(state.listings.len() < 20);
    }

    fn file(state: &mut DirState, dir: Ino, name: &str) {
        let attributes =
            Attributes { size: 0, mtime: SystemTime::now(), etag: None, metadata: None, valid_until: None };
        state.enter_created(dir, name, Location::File { source: 0, key: name.into() }, attributes, false);
    }

    /// A store's late answer that a name is missing (a HEAD sent before this mount made
    /// it) does not hide the name; a removal here does.
    #[test]
    fn a_late_missing_answer_does_not_hide_a_name_made_here() {
        let mut state = state();
        let until = Instant::now() + Duration::from_secs(60);
        file(&mut state, 1, "made");
        state.mark_missing(1, "made", until, false);
        assert!(!state.known_missing(1, "made", Instant::now()), "made here within the TTL");
        state.remove_entry(1, "made", until);
        assert!(state.known_missing(1, "made", Instant::now()), "removed here");
        state.mark_missing(1, "other", until, false);
        assert!(state.known_missing(1, "other", Instant::now()), "not made here: as the store says");
    }

    /// A listing gets the names made here and loses those removed here, whatever its LIST
    /// said; once names made here had to be dropped before their time (more than the
    /// bound within one TTL), a listing sent before that is not kept at all.
    #[test]
    fn a_kept_listing_is_what_the_mount_made_of_it() {
        let mut state = state();
        let until = Instant::now() + Duration::from_secs(5); // sent now
        file(&mut state, 1, "made");
        file(&mut state, 1, "gone");
        state.remove_entry(1, "gone", until);
        state.remember_listing(1, until, vec!["gone".into(), "stored".into()]);
        let names = state.fresh_listing(1, Instant::now()).expect("kept");
        assert_eq!(*names, ["made", "stored"]);

        let sent_before = Instant::now() + Duration::from_secs(5);
        std::thread::sleep(Duration::from_millis(2));
        for i in 0..=MAX_CREATED_NAMES {
            file(&mut state, 2, &format!("f{i}"));
        }
        state.remember_listing(3, sent_before, vec!["x".into()]);
        assert!(state.fresh_listing(3, Instant::now()).is_none(), "sent before names went early");
        state.remember_listing(3, Instant::now() + Duration::from_secs(5), vec!["x".into()]);
        assert!(state.fresh_listing(3, Instant::now()).is_some(), "sent after");
    }
}
