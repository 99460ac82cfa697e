//! Everything the namespace knows about its directories, as one structure behind one
//! lock: the inode table, names known to be missing, files being written (pending),
//! complete listings and recent pages, and the per-directory counters that decide when
//! to list or batch.
//!
//! One lock, not one per map: operations such as "this entry is gone" touch several of
//! them at once (table, listing, pending names, missing names), and separate locks taken
//! in different orders by different operations froze the mount (an `unlink` racing a
//! `readdir`). Every critical section is a few map operations and never waits on I/O
//! (the guard cannot be held across an `.await`: it is not `Send`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::inode::{shrink_if_mostly_empty, Attributes, Ino, InodeTable, Location, Node};

/// Largest directory whose complete listing is kept (names only, sorted).
pub(super) const MAX_CACHED_LISTING: usize = 100_000;

/// Names of a directory listed at one time, sorted, trusted until `until`.
struct CachedListing {
    until: Instant,
    names: Arc<Vec<String>>,
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
    missing: HashMap<(Ino, String), Instant>,
    /// Files created here whose upload has not finished: not in any LIST yet, but shown
    /// in their directory (read-your-writes). Directory inode → names.
    pending: HashMap<Ino, BTreeSet<String>>,
    /// Complete listings of directories, by directory inode.
    listings: HashMap<Ino, CachedListing>,
    /// The page most recently listed of each directory still being listed: programs
    /// `stat` entries while they read the directory (`ls -l`), before the listing is
    /// complete, and metadata batches take their neighbours from here.
    recent_pages: HashMap<Ino, CachedListing>,
    /// Per directory and kind: (count, counting since).
    counters: HashMap<(Ino, u8), (u32, Instant)>,
    /// Directories in which a file was last opened for reading, and when.
    reads: HashMap<Ino, Instant>,
}

impl DirState {
    pub fn new(inodes: InodeTable) -> Self {
        Self {
            inodes,
            missing: HashMap::new(),
            pending: HashMap::new(),
            listings: HashMap::new(),
            recent_pages: HashMap::new(),
            counters: HashMap::new(),
            reads: HashMap::new(),
        }
    }

    /// The entry (parent, name) if its attributes are still fresh.
    pub fn fresh_child(&self, parent: Ino, name: &str, now: Instant) -> Option<Node> {
        self.inodes.child(parent, name).filter(|node| node.fresh_at(now)).cloned()
    }

    pub fn known_missing(&self, parent: Ino, name: &str, now: Instant) -> bool {
        self.missing.get(&(parent, name.to_owned())).is_some_and(|until| *until > now)
    }

    pub fn mark_missing(&mut self, parent: Ino, name: &str, until: Instant) {
        self.missing.insert((parent, name.to_owned()), until);
    }

    pub fn fresh_listing(&self, dir: Ino, now: Instant) -> Option<Arc<Vec<String>>> {
        self.listings.get(&dir).filter(|l| l.until > now).map(|l| l.names.clone())
    }

    /// The fresh complete listing of `dir`, else the last page listed of it.
    pub fn fresh_names(&self, dir: Ino, now: Instant) -> Option<Arc<Vec<String>>> {
        self.fresh_listing(dir, now)
            .or_else(|| self.recent_pages.get(&dir).filter(|p| p.until > now).map(|p| p.names.clone()))
    }

    pub fn remember_listing(&mut self, dir: Ino, until: Instant, mut names: Vec<String>) {
        names.sort_unstable();
        self.listings.insert(dir, CachedListing { until, names: Arc::new(names) });
        self.recent_pages.remove(&dir);
    }

    /// A change made through the mount: `name` now is (or is not) in `dir`, also in its
    /// cached listing, which stays complete. (`tar x` into a new directory then costs no
    /// lookup request per file.)
    fn update_listing(&mut self, dir: Ino, name: &str, present: bool) {
        let Some(listing) = self.listings.get_mut(&dir) else { return };
        let names = Arc::make_mut(&mut listing.names);
        match (names.binary_search_by(|n| n.as_str().cmp(name)), present) {
            (Err(at), true) => names.insert(at, name.to_owned()),
            (Ok(at), false) => {
                names.remove(at);
            }
            _ => {}
        }
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

    pub fn pending_names(&self, dir: Ino) -> BTreeSet<String> {
        self.pending.get(&dir).cloned().unwrap_or_default()
    }

    pub fn has_pending(&self, dir: Ino) -> bool {
        self.pending.get(&dir).is_some_and(|names| !names.is_empty())
    }

    fn remove_pending(&mut self, dir: Ino, name: &str) -> bool {
        self.pending.get_mut(&dir).is_some_and(|names| names.remove(name))
    }

    /// `ino` is no longer being written: its name comes from listings again.
    pub fn settled(&mut self, ino: Ino) {
        if let Some((parent, name)) = self.inodes.get(ino).map(Node::parent_and_name) {
            self.remove_pending(parent, &name);
        }
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
        self.missing.remove(&(parent, name.to_owned()));
        self.update_listing(parent, name, true);
        if pending {
            self.pending.entry(parent).or_default().insert(name.to_owned());
        }
        self.inodes.upsert(parent, name, location, attributes)
    }

    /// An entry of directory `dir` was created, removed or renamed: its mtime and ctime
    /// are now (see [`Node::touched`]).
    pub fn touch(&mut self, dir: Ino) {
        if let Some(node) = self.inodes.get_mut(dir) {
            node.touched = Some(SystemTime::now());
        }
    }

    /// Enters what the store says (parent, name) is.
    pub fn enter_found(&mut self, parent: Ino, name: &str, location: Location, attributes: Attributes) -> Node {
        self.missing.remove(&(parent, name.to_owned()));
        self.inodes.upsert(parent, name, location, attributes)
    }

    /// Remembers a page of `dir`'s listing (names, sorted) for metadata batches.
    pub fn remember_page(&mut self, dir: Ino, until: Instant, mut names: Vec<String>) {
        names.sort_unstable();
        self.recent_pages.insert(dir, CachedListing { until, names: Arc::new(names) });
    }

    /// Forgets (parent, name) after it was deleted (or its creation failed): it is
    /// missing until `missing_until`.
    pub fn remove_entry(&mut self, parent: Ino, name: &str, missing_until: Instant) {
        self.update_listing(parent, name, false);
        if let Some(ino) = self.inodes.remove(parent, name) {
            self.listings.remove(&ino);
        }
        self.remove_pending(parent, name);
        self.mark_missing(parent, name, missing_until);
    }

    /// The kernel dropped `count` references to `ino`: once it holds none, the inode and
    /// what is kept about it as a directory go.
    pub fn forget(&mut self, ino: Ino, count: u64) {
        if self.inodes.forget(ino, count) {
            self.forget_dir(ino);
        }
    }

    /// Drops everything that expired before `now` (see [`InodeTable::sweep`]): what the
    /// kernel does not hold is kept only as long as it may be trusted, so a long-lived
    /// mount's memory follows its working set, not its history.
    pub fn sweep(&mut self, now: Instant, ttl: Duration) {
        for ino in self.inodes.sweep(now) {
            self.forget_dir(ino);
        }
        self.missing.retain(|_, until| *until > now);
        self.listings.retain(|_, listing| listing.until > now);
        self.recent_pages.retain(|_, page| page.until > now);
        self.counters.retain(|_, (_, since)| now.duration_since(*since) <= ttl);
        self.reads.retain(|_, at| now.duration_since(*at) <= ttl);
        self.pending.retain(|_, names| !names.is_empty());
        shrink_if_mostly_empty(&mut self.missing);
        shrink_if_mostly_empty(&mut self.listings);
        shrink_if_mostly_empty(&mut self.recent_pages);
        shrink_if_mostly_empty(&mut self.counters);
        shrink_if_mostly_empty(&mut self.reads);
        shrink_if_mostly_empty(&mut self.pending);
    }

    fn forget_dir(&mut self, ino: Ino) {
        self.listings.remove(&ino);
        self.recent_pages.remove(&ino);
        self.reads.remove(&ino);
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
        self.update_listing(from.0, from.1, false);
        self.update_listing(to.0, to.1, true);
        if let Some((_, Some(replaced))) = self.inodes.rename(from, to, old_key, new_key) {
            self.listings.remove(&replaced);
        }
        if self.remove_pending(from.0, from.1) {
            self.pending.entry(to.0).or_default().insert(to.1.to_owned());
        }
        self.missing.remove(&(to.0, to.1.to_owned()));
        self.mark_missing(from.0, from.1, missing_until);
    }
}
