//! The inode table: inode numbers ⇄ (parent, name), and what each stands for.
//!
//! Inodes are handed out on first sight of a (parent, name) and never reused while
//! mounted; an entry whose type changes (file ⇄ directory) gets a new number. The kernel
//! counts its references to each inode (lookups) and gives them back with `forget`: an
//! inode it no longer knows leaves the table, and so does one nobody referenced whose
//! attributes expired ([`InodeTable::sweep`]), so the table holds what the kernel holds
//! plus what was seen within the TTL, not everything ever listed. A path forgotten and
//! looked up again gets a new number. The table lives inside
//! [`super::dir_state::DirState`], behind the namespace's one lock.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::versions::History;
use bucketfs_client::store::{Metadata, ObjectInfo};

pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// What an inode stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The root of a multiplexed mount: a fixed directory of sources.
    SourceList,
    /// A directory: all keys of `source` starting with `prefix` (empty or ending in `/`).
    Dir { source: usize, prefix: String },
    /// One object.
    File { source: usize, key: String },
    /// A place in the read-only view of the bucket's versions (`--show-versions`).
    History(History),
}

impl Location {
    pub fn is_dir(&self) -> bool {
        !matches!(self, Location::File { .. } | Location::History(History::Version { .. }))
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
    /// For a directory: when an entry was last created, removed or renamed in it through
    /// this mount (its mtime and ctime). Kept here, not in the marker: writing the marker
    /// on every change would cost a PUT per file created by `tar x`. It outlives
    /// re-reads of the marker and is folded into the marker at its next metadata write.
    pub touched: Option<SystemTime>,
    pub(super) parent: Ino,
    /// Boxed, not a `String`: 8 bytes less make a boxed `Node` fit a 192-byte allocation.
    pub(super) name: Box<str>,
    /// Until when the attributes may be used without asking the store again; `None`
    /// for entries that never expire (the roots, files being written).
    pub(super) valid_until: Option<Instant>,
    /// References the kernel holds (entries it was given, less those it forgot).
    pub(super) lookups: u64,
}

impl Node {
    /// The directory holding this entry and its name there.
    pub fn parent_and_name(&self) -> (Ino, String) {
        (self.parent, self.name.to_string())
    }

    pub(super) fn fresh_at(&self, now: Instant) -> bool {
        self.valid_until.is_none_or(|until| until > now)
    }
}

/// One object this mount copied inside the store: from `from` at version `from_etag` to
/// `to`, where the same bytes have `etag` (a rename, or a metadata change that rewrote
/// the object onto itself).
#[derive(Clone, Debug)]
pub struct Copied {
    pub from: String,
    pub from_etag: Option<String>,
    pub to: String,
    pub etag: Option<String>,
}

/// Gives back a map's spare capacity once it holds less than a quarter of it.
pub(super) fn shrink_if_mostly_empty(map: &mut impl SpareRoom) {
    if map.capacity() > 4 * map.len() + 64 {
        map.shrink_to_fit();
    }
}

/// The maps [`shrink_if_mostly_empty`] shrinks: the standard library's, and hashbrown's
/// (the inode table's).
pub(super) trait SpareRoom {
    fn len(&self) -> usize;
    fn capacity(&self) -> usize;
    fn shrink_to_fit(&mut self);
}

impl<K: Hash + Eq, V, S: BuildHasher> SpareRoom for HashMap<K, V, S> {
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn shrink_to_fit(&mut self) {
        HashMap::shrink_to_fit(self)
    }
}

impl<K: Hash + Eq, V, S: BuildHasher> SpareRoom for hashbrown::HashMap<K, V, S> {
    fn len(&self) -> usize {
        hashbrown::HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        hashbrown::HashMap::capacity(self)
    }
    fn shrink_to_fit(&mut self) {
        hashbrown::HashMap::shrink_to_fit(self)
    }
}

/// A (parent, name) to look up in a map keyed by `(Ino, Box<str>)` ([`InodeTable::children`],
/// the missing names) without boxing the name; it hashes as the tuple it stands for.
#[derive(Hash)]
pub(super) struct ChildName<'a>(pub Ino, pub &'a str);

impl hashbrown::Equivalent<(Ino, Box<str>)> for ChildName<'_> {
    fn equivalent(&self, key: &(Ino, Box<str>)) -> bool {
        self.0 == key.0 && self.1 == &*key.1
    }
}

/// What the store (or a change made here) says of an entry.
pub(super) struct Attributes {
    pub size: u64,
    pub mtime: SystemTime,
    pub etag: Option<String>,
    pub metadata: Option<Arc<Metadata>>,
    pub valid_until: Option<Instant>,
}

impl Attributes {
    pub fn dir(mtime: SystemTime, metadata: Option<Arc<Metadata>>, valid_until: Option<Instant>) -> Self {
        Self { size: 0, mtime, etag: None, metadata, valid_until }
    }

    pub fn file(info: ObjectInfo, valid_until: Option<Instant>) -> Self {
        Self { size: info.size, mtime: info.mtime, etag: info.etag, metadata: info.metadata, valid_until }
    }
}

pub(super) struct InodeTable {
    /// Boxed: a map keeps room for about half as many entries again as it holds, and a
    /// `Node` is 184 bytes; a box in that room is 8 (a walk of the linux-5.12.13 shape:
    /// 713–716 bytes per entry of RSS instead of 952–995).
    ///
    /// hashbrown's maps, for their hasher (foldhash): SipHash was a tenth of the daemon's
    /// time in a cold `find` on an indexed mount.
    nodes: hashbrown::HashMap<Ino, Box<Node>>,
    /// (parent, name) → inode; names boxed, as in `Node`; looked up by [`ChildName`].
    children: hashbrown::HashMap<(Ino, Box<str>), Ino>,
    next_ino: Ino,
}

impl InodeTable {
    /// A table holding only the root, which stands for `root`.
    pub fn new(root: Location, mounted_at: SystemTime) -> Self {
        let node = Node {
            ino: ROOT_INO,
            location: root,
            size: 0,
            mtime: mounted_at,
            etag: None,
            metadata: Some(Arc::default()),
            touched: None,
            parent: ROOT_INO,
            name: Box::default(),
            valid_until: None,
            lookups: 0,
        };
        Self {
            nodes: hashbrown::HashMap::from([(ROOT_INO, Box::new(node))]),
            children: hashbrown::HashMap::new(),
            next_ino: ROOT_INO,
        }
    }

    pub fn get(&self, ino: Ino) -> Option<&Node> {
        self.nodes.get(&ino).map(|node| &**node)
    }

    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut Node> {
        self.nodes.get_mut(&ino).map(|node| &mut **node)
    }

    pub fn child(&self, parent: Ino, name: &str) -> Option<&Node> {
        self.nodes.get(self.children.get(&ChildName(parent, name))?).map(|node| &**node)
    }

    /// The entries of `parent` the table knows, in no order.
    pub fn children_of(&self, parent: Ino) -> impl Iterator<Item = (&str, &Node)> {
        self.children
            .iter()
            .filter(move |((of, _), _)| *of == parent)
            .filter_map(|((_, name), ino)| Some((&**name, &**self.nodes.get(ino)?)))
    }

    /// Records what (parent, name) is now; keeps its inode number unless its type changed.
    pub fn upsert(&mut self, parent: Ino, name: &str, location: Location, info: Attributes) -> Node {
        let existing = self.children.get(&ChildName(parent, name)).copied();
        let same_kind =
            existing.and_then(|ino| self.nodes.get(&ino)).filter(|n| n.location.is_dir() == location.is_dir());
        // A listing says nothing about metadata: keep what a HEAD told us while it is fresh.
        let metadata = match (&info.metadata, same_kind) {
            (None, Some(old)) if old.fresh_at(Instant::now()) => old.metadata.clone(),
            _ => info.metadata,
        };
        let (ino, lookups, touched) = match same_kind {
            Some(old) => (old.ino, old.lookups, old.touched),
            None => {
                self.next_ino += 1;
                self.children.insert((parent, Box::from(name)), self.next_ino);
                (self.next_ino, 0, None)
            }
        };
        let node = Node {
            ino,
            location,
            size: info.size,
            mtime: info.mtime,
            etag: info.etag,
            metadata,
            touched,
            parent,
            name: name.into(),
            valid_until: info.valid_until,
            lookups,
        };
        match self.nodes.get_mut(&ino) {
            Some(kept) => node.clone_into(kept),
            None => drop(self.nodes.insert(ino, Box::new(node.clone()))),
        }
        node
    }

    /// Entries the table has room for without growing (for tests of its memory).
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.nodes.capacity().max(self.children.capacity())
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The kernel was given an entry for `ino`.
    pub fn add_lookup(&mut self, ino: Ino) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups += 1;
        }
    }

    /// [`InodeTable::add_lookup`] for `node` as it was handed to the kernel. Between
    /// taking that snapshot and counting the reference, a FORGET of the kernel's earlier
    /// references (or a sweep, for an entry nobody held) may have removed the inode: it
    /// comes back as it was handed out, or the kernel would hold a number nothing resolves
    /// (every operation on it ENOENT: `find` skipped whole directories). Its name goes back
    /// too unless a newer entry holds it.
    pub fn add_lookup_of(&mut self, node: &Node) {
        if let Some(kept) = self.nodes.get_mut(&node.ino) {
            kept.lookups += 1;
            return;
        }
        let mut node = node.clone();
        node.lookups = 1;
        self.children.entry((node.parent, node.name.clone())).or_insert(node.ino);
        self.nodes.insert(node.ino, Box::new(node));
    }

    /// The bucket directories the kernel holds a reference to (and the root).
    pub fn held_dirs(&self) -> Vec<Ino> {
        self.nodes
            .values()
            .filter(|n| n.lookups > 0 || n.ino == ROOT_INO)
            .filter(|n| matches!(n.location, Location::Dir { .. }))
            .map(|n| n.ino)
            .collect()
    }

    /// The kernel dropped `count` references to `ino`; true if that was the last one and
    /// the inode left the table. An entry still fresh stays until the sweep: the kernel
    /// forgets under memory pressure, not because the entry changed, and a kept listing of
    /// its directory still names it (served from the table, it would be missing).
    pub fn forget(&mut self, ino: Ino, count: u64) -> bool {
        let Some(node) = self.nodes.get_mut(&ino) else { return false };
        node.lookups = node.lookups.saturating_sub(count);
        if node.lookups > 0 || ino == ROOT_INO || node.fresh_at(Instant::now()) {
            return false;
        }
        self.unlink(ino);
        true
    }

    /// Removes the inodes nobody references whose attributes expired before `now` (the
    /// roots, the sources and files being written never expire); returns them.
    pub fn sweep(&mut self, now: Instant) -> Vec<Ino> {
        let stale: Vec<Ino> = self
            .nodes
            .values()
            .filter(|n| n.lookups == 0 && !n.fresh_at(now) && n.ino != ROOT_INO)
            .map(|n| n.ino)
            .collect();
        for ino in &stale {
            self.unlink(*ino);
        }
        // A map keeps the capacity of its largest size: after a walk of a huge tree, that
        // would be most of the memory the walk took.
        shrink_if_mostly_empty(&mut self.nodes);
        shrink_if_mostly_empty(&mut self.children);
        stale
    }

    fn unlink(&mut self, ino: Ino) {
        if let Some(node) = self.nodes.remove(&ino) {
            let key = (node.parent, node.name);
            if self.children.get(&key) == Some(&ino) {
                self.children.remove(&key);
            }
        }
    }

    /// Forgets (parent, name); returns the inode it had.
    pub fn remove(&mut self, parent: Ino, name: &str) -> Option<Ino> {
        let ino = *self.children.get(&ChildName(parent, name))?;
        self.unlink(ino);
        Some(ino)
    }

    /// Files at the keys objects were copied to, still showing the version copied, show
    /// the copy's ETag (same bytes). Returns them with the copy each follows.
    pub fn follow_copies<'a>(&mut self, copied: &'a [Copied]) -> Vec<(Ino, &'a Copied)> {
        let by_key: HashMap<&str, &Copied> = copied.iter().map(|copy| (copy.to.as_str(), copy)).collect();
        let mut followed = Vec::new();
        for node in self.nodes.values_mut() {
            let Location::File { key, .. } = &node.location else { continue };
            if let Some(copy) = by_key.get(key.as_str()).filter(|copy| copy.from_etag == node.etag) {
                node.etag = copy.etag.clone();
                followed.push((node.ino, *copy));
            }
        }
        followed
    }

    /// (parent, name) is now (new_parent, new_name), its key (for a directory: prefix)
    /// `new_key` instead of `old_key`; what was at the new name is gone. The inode keeps
    /// its number, and everything below a renamed directory moves with it. Returns the
    /// inode moved and the one replaced.
    pub fn rename(
        &mut self,
        (parent, name): (Ino, &str),
        (new_parent, new_name): (Ino, &str),
        old_key: &str,
        new_key: &str,
    ) -> Option<(Ino, Option<Ino>)> {
        let ino = self.children.remove(&ChildName(parent, name))?;
        let replaced = self.children.insert((new_parent, Box::from(new_name)), ino);
        if let Some(replaced) = replaced {
            self.nodes.remove(&replaced);
        }
        let renamed_dir = old_key.ends_with('/');
        for node in self.nodes.values_mut() {
            if node.ino != ino && !renamed_dir {
                continue;
            }
            let key = match &mut node.location {
                Location::File { key, .. } => key,
                Location::Dir { prefix, .. } => prefix,
                // The view of a moved directory shows the history of its new keys; a
                // version stays the old key's (it is still there, and may be open).
                Location::History(History::Names { prefix: key, .. } | History::Versions { key, .. }) => key,
                Location::SourceList | Location::History(History::Version { .. }) => continue,
            };
            if let Some(rest) = key.strip_prefix(old_key) {
                *key = format!("{new_key}{rest}");
            }
        }
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.parent = new_parent;
            node.name = new_name.into();
        }
        Some((ino, replaced))
    }
}

#[cfg(test)]
mod tests {
    /// A boxed node fits a 192-byte allocation (see `InodeTable::nodes`).
    #[test]
    fn a_node_is_at_most_184_bytes() {
        assert!(std::mem::size_of::<super::Node>() <= 184, "{}", std::mem::size_of::<super::Node>());
    }
}
