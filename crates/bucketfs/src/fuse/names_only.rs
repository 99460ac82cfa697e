//! Which READDIRPLUS entries go to the kernel as names only, without an inode.
//!
//! A READDIRPLUS entry that carries a node id makes the kernel build an inode and a
//! dentry for it: worth it for a caller that goes on to stat or open what it listed (no
//! LOOKUP follows), wasted on one that wants only names and types (`find -name`,
//! `os.walk`, `fts` without stat). For a cold `find` over an indexed tree of 7,100 files
//! that building is about a fifth of its time. An entry with node id 0 hands `getdents`
//! the name, type and inode number and nothing else (the kernel's
//! `fuse_direntplus_link` skips it); using such a name later costs a LOOKUP, answered
//! from memory, about six times what its inode would have cost (25 µs against 4 here).
//!
//! The caller cannot say which it is, so we watch what it does, per thread (FUSE names
//! callers by thread; a thread id reused later only inherits a guess):
//! - a caller's first directory gets whole entries (`ls -l`, a program that lists one
//!   directory and opens what it found);
//! - from its second directory on, its files go as names only (directories stay whole:
//!   a walk goes into them), at most [`PROBE_ENTRIES`] in all until it has listed more
//!   than [`CONFIRMING_LISTINGS`] directories, without limit after that;
//! - a LOOKUP of a file in a directory last given names only marks the thread that was
//!   given them as one that uses its entries: whole entries for it from then on;
//! - that LOOKUP also drops the listings the kernel keeps of every directory given names
//!   only (with `--index` it keeps them: FOPEN_CACHE_DIR), so the next program to list
//!   them asks again and gets what its own rule says, not names left by another.
//!
//! So `du`, `ls -lR` or `rsync` pay at most [`PROBE_ENTRIES`] LOOKUPs more than with
//! whole entries (a few more after a `find` of the same tree), and a walker that does not
//! stat pays none. State is bounded: the [`CALLERS`] most recent threads and the [`DIRS`]
//! directories last given names only.

use std::num::NonZeroUsize;

use lru::LruCache;
use parking_lot::Mutex;

/// Names-only entries a caller may be given before it has shown, by listing more than
/// [`CONFIRMING_LISTINGS`] directories, that it does not look up what it lists.
pub const PROBE_ENTRIES: u64 = 256;
/// Listings after which a caller that looked up none of its names-only entries gets
/// names-only entries without limit.
pub const CONFIRMING_LISTINGS: u32 = 8;
/// Callers remembered (threads that listed a directory recently).
const CALLERS: usize = 1024;
/// Directories remembered as last given names only, and to whom (one whose memory is
/// lost keeps its names-only listing in the kernel until the kernel drops it).
const DIRS: usize = 8192;

/// What one caller (a thread) has shown.
#[derive(Default)]
struct Caller {
    /// Listings it started (READDIRPLUS at offset 0).
    listings: u32,
    /// Names-only entries it was given.
    given: u64,
    /// It looked up a file it had been given as a name only.
    uses_entries: bool,
}

struct State {
    callers: LruCache<u32, Caller>,
    /// Directory → the caller last given names-only entries of it.
    given_in: LruCache<u64, u32>,
}

pub struct NamesOnly {
    state: Mutex<State>,
    /// Off (`--whole-listings`): every entry goes whole.
    off: bool,
}

impl Default for NamesOnly {
    fn default() -> Self {
        let size = |n| NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN);
        let state = State { callers: LruCache::new(size(CALLERS)), given_in: LruCache::new(size(DIRS)) };
        Self { state: Mutex::new(state), off: false }
    }
}

impl NamesOnly {
    /// Never names only: every entry whole.
    pub fn never() -> Self {
        Self { off: true, ..Self::default() }
    }

    /// How many of the files in this READDIRPLUS answer to `caller` may go as names
    /// only; `starts_listing`: the answer is its listing's first (offset 0).
    pub fn allowance(&self, caller: u32, starts_listing: bool) -> u64 {
        if self.off {
            return 0;
        }
        let mut state = self.state.lock();
        let record = state.callers.get_or_insert_mut(caller, Caller::default);
        if starts_listing {
            record.listings = record.listings.saturating_add(1);
        }
        if record.uses_entries || record.listings < 2 {
            0
        } else if record.listings > CONFIRMING_LISTINGS {
            u64::MAX
        } else {
            PROBE_ENTRIES.saturating_sub(record.given)
        }
    }

    /// `caller` was given `count` names-only entries of `dir`.
    pub fn gave(&self, caller: u32, dir: u64, count: u64) {
        if count == 0 {
            return;
        }
        let mut state = self.state.lock();
        if let Some(record) = state.callers.get_mut(&caller) {
            record.given = record.given.saturating_add(count);
        }
        state.given_in.put(dir, caller);
    }

    /// The kernel looked up a file (not a directory) in `dir`: if `dir` was last given as
    /// names only, its caller uses what it lists, and the directories given names only
    /// so far are returned (forgotten here) for the kernel to drop its listings of them.
    pub fn looked_up_file_in(&self, dir: u64) -> Vec<u64> {
        let mut state = self.state.lock();
        let Some(&caller) = state.given_in.peek(&dir) else { return Vec::new() };
        if let Some(record) = state.callers.get_mut(&caller) {
            record.uses_entries = true;
        }
        let mut dirs = Vec::with_capacity(state.given_in.len());
        while let Some((dir, _)) = state.given_in.pop_lru() {
            dirs.push(dir);
        }
        dirs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One listing of `files` files by `caller`, in answers of `per_answer` entries;
    /// returns the names-only entries given.
    fn list(shapes: &NamesOnly, caller: u32, dir: u64, files: u64, per_answer: u64) -> u64 {
        // Even an empty directory is one answer (`.` and `..`).
        let (mut left, mut given, mut first) = (files, 0, true);
        loop {
            let this = left.min(per_answer);
            let names_only = shapes.allowance(caller, first).min(this);
            shapes.gave(caller, dir, names_only);
            given += names_only;
            left -= this;
            first = false;
            if left == 0 {
                return given;
            }
        }
    }

    #[test]
    fn a_first_listing_is_whole_and_a_walk_goes_names_only_from_its_second() {
        let shapes = NamesOnly::default();
        assert_eq!(list(&shapes, 7, 10, 12, 100), 0, "ls -l of one directory");
        assert_eq!(list(&shapes, 7, 11, 12, 100), 12);
        assert_eq!(list(&shapes, 8, 12, 12, 100), 0, "another thread starts whole");
    }

    #[test]
    fn a_caller_that_looks_up_what_it_was_given_gets_whole_entries_again() {
        let shapes = NamesOnly::default();
        list(&shapes, 7, 10, 5, 100);
        assert_eq!(list(&shapes, 7, 11, 5, 100), 5);
        assert!(shapes.looked_up_file_in(10).is_empty(), "10 was given whole: the lookup says nothing");
        assert_eq!(list(&shapes, 7, 12, 5, 100), 5);
        let mut dropped = shapes.looked_up_file_in(12);
        dropped.sort();
        assert_eq!(dropped, [11, 12], "every directory given names only, for the kernel to drop");
        assert!(shapes.looked_up_file_in(11).is_empty(), "and forgotten here");
        for dir in 13..30 {
            assert_eq!(list(&shapes, 7, dir, 5, 100), 0, "du, from its first lookup on");
        }
    }

    #[test]
    fn a_probe_is_bounded_until_the_walk_has_listed_enough_directories() {
        let shapes = NamesOnly::default();
        list(&shapes, 7, 1, 3, 100);
        assert_eq!(list(&shapes, 7, 2, 10_000, 200), PROBE_ENTRIES, "a big second directory");
        for dir in 3..=u64::from(CONFIRMING_LISTINGS) {
            assert_eq!(list(&shapes, 7, dir, 10_000, 200), 0, "the probe is spent");
        }
        assert_eq!(list(&shapes, 7, 100, 10_000, 200), 10_000, "a walk that looked nothing up");
    }

    #[test]
    fn never_gives_names_only() {
        let shapes = NamesOnly::never();
        for dir in 0..20 {
            assert_eq!(list(&shapes, 7, dir, 10, 100), 0);
        }
    }

    #[test]
    fn state_stays_bounded() {
        let shapes = NamesOnly::default();
        for caller in 0..(DIRS as u32 + 100) {
            list(&shapes, caller, u64::from(caller), 2, 100);
            list(&shapes, caller, u64::from(caller) + 1_000_000, 2, 100);
        }
        let state = shapes.state.lock();
        assert_eq!(state.callers.len(), CALLERS);
        assert_eq!(state.given_in.len(), DIRS);
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// A listing of `files` files by a caller, in answers of `per_answer`.
        List { caller: u32, files: u64, per_answer: u64 },
        /// A lookup of a file in the directory of the `n`th listing so far.
        LookUp { listing: usize },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0..3u32, 0..400u64, 1..300u64).prop_map(|(caller, files, per_answer)| Step::List { caller, files, per_answer }),
            1 => (0..50usize).prop_map(|listing| Step::LookUp { listing }),
        ]
    }

    proptest! {
        /// Against a model of the rule: whatever a caller does, it is given names only
        /// never in its first listing nor after it looked up one, and (until it
        /// has listed more than CONFIRMING_LISTINGS directories) at most PROBE_ENTRIES.
        #[test]
        fn names_only_entries_follow_the_rule(steps in proptest::collection::vec(step(), 1..60)) {
            let shapes = NamesOnly::default();
            // Model: per caller (listings, given, uses_entries); the directories given
            // names only since the last drop, and to whom.
            let mut callers = std::collections::HashMap::<u32, (u32, u64, bool)>::new();
            let mut given_in = std::collections::BTreeMap::<u64, u32>::new();
            let mut listings = 0;
            for step in steps {
                match step {
                    Step::List { caller, files, per_answer } => {
                        listings += 1;
                        let dir = listings;
                        let before = callers.get(&caller).copied().unwrap_or_default();
                        let given = list(&shapes, caller, dir, files, per_answer);
                        let listed = before.0 + 1;
                        if before.2 || listed < 2 {
                            prop_assert_eq!(given, 0);
                        } else if listed > CONFIRMING_LISTINGS {
                            prop_assert_eq!(given, files);
                        } else {
                            prop_assert_eq!(given, files.min(PROBE_ENTRIES.saturating_sub(before.1)));
                        }
                        callers.insert(caller, (listed, before.1 + given, before.2));
                        if given > 0 {
                            given_in.insert(dir, caller);
                        }
                    }
                    Step::LookUp { listing } => {
                        let dir = listing as u64 + 1;
                        let mut dropped = shapes.looked_up_file_in(dir);
                        dropped.sort();
                        // A directory given names only since the last drop: its caller is
                        // marked, and every such directory is handed back to be dropped.
                        match given_in.get(&dir) {
                            Some(caller) => {
                                if let Some(model) = callers.get_mut(caller) {
                                    model.2 = true;
                                }
                                prop_assert_eq!(dropped, given_in.keys().copied().collect::<Vec<_>>());
                                given_in.clear();
                            }
                            None => prop_assert!(dropped.is_empty()),
                        }
                    }
                }
            }
        }
    }
}
