//! Directory streams: a directory listed page by page, so a directory of any size is
//! listed in memory proportional to one page, from the store or from a fresh complete
//! listing kept by the namespace. Entries come back already entered in the inode table.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use super::dir_state::MAX_CACHED_LISTING;
use super::index::DirListing;
use super::inode::{Ino, Node, ROOT_INO};
use super::listing::ListingMerger;
use super::versions::History;
use super::{Namespace, NamespaceError};

/// Entries served per batch from a cached listing (a store page holds 1,000 keys too).
const CACHED_BATCH: usize = 1000;

/// One entry of a directory listing, already entered in the inode table.
#[derive(Clone, Debug)]
pub struct Listed {
    pub name: String,
    pub node: Node,
}

/// A directory being listed.
pub struct DirStream {
    pub dir: Ino,
    pub parent: Ino,
    /// (source, prefix) of a directory in a bucket; `None` for the multiplexed root.
    pub(super) inner: Option<(usize, String)>,
    /// A directory of the view of versions, listed whole at once.
    pub(super) history: Option<History>,
    pub(super) merger: Option<ListingMerger>,
    pub(super) token: Option<String>,
    pub(super) done: bool,
    /// Files being written here when listing started and not yet seen in the listing;
    /// shown after the listed entries.
    pub(super) pending: BTreeSet<String>,
    /// A fresh complete listing to serve from, and the position in it.
    pub(super) cached: Option<(Arc<Vec<String>>, usize)>,
    /// The index's listing of this directory (`--index`), and the position in it: the
    /// stream keeps the one it started with, so a refresh never shows it a mix.
    pub(super) indexed: Option<(Arc<DirListing>, usize)>,
    /// Names listed so far from the store, to cache once complete (`None` past the cap).
    pub(super) collected: Option<Vec<String>>,
    pub(super) started: Instant,
}

impl DirStream {
    /// Starts the stream of an indexed directory after its first `served` entries (a
    /// read resumed without the stream it began with: see fs/dirs.rs); false when the
    /// index does not cover the directory, whose stream then starts at its beginning.
    pub fn resume_indexed_at(&mut self, namespace: &Namespace, served: usize) -> bool {
        let (Some((source, prefix)), None) = (&self.inner, &self.history) else { return false };
        let Some(listing) = namespace.indexes().and_then(|indexes| indexes.dir(*source, prefix)) else {
            return false;
        };
        let start = served.min(listing.len());
        // Files being written come after the listing: those it holds before `start` were
        // served with it, and the first `served - len` of the others after it.
        self.pending.retain(|name| listing.position(name).is_none_or(|at| at >= start));
        for _ in 0..served - start {
            self.pending.pop_first();
        }
        self.indexed = Some((listing, start));
        true
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The next batch of entries; empty once the listing is complete.
    pub async fn next_batch(&mut self, namespace: &Namespace) -> Result<Vec<Listed>, NamespaceError> {
        if self.done {
            return Ok(Vec::new());
        }
        if let Some(history) = &self.history {
            self.done = true;
            return namespace.list_history(self.dir, history).await;
        }
        let Some((source, prefix)) = self.inner.clone() else {
            self.done = true;
            let state = namespace.state.lock();
            let mut sources: Vec<Listed> = state
                .inodes
                .children_of(ROOT_INO)
                .map(|(name, node)| Listed { name: name.to_owned(), node: node.clone() })
                .collect();
            sources.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(sources);
        };
        if self.indexed.is_none() && self.merger.is_none() {
            self.indexed = namespace.indexes().and_then(|indexes| indexes.dir(source, &prefix)).map(|l| (l, 0));
        }
        if let Some((listing, position)) = &mut self.indexed {
            let end = (*position + CACHED_BATCH).min(listing.len());
            let entries: Vec<_> = (*position..end).map(|at| listing.entry(at, &prefix)).collect();
            *position = end;
            self.done = end == listing.len();
            for (name, _) in &entries {
                self.pending.remove(name);
            }
            let mut listed = namespace.enter_indexed(self.dir, source, &prefix, entries);
            if self.done {
                listed.extend(self.take_pending(namespace, source, &prefix).await?);
            }
            return Ok(listed);
        }
        if self.cached.is_none() && self.merger.is_none() {
            // About to list from the store: a flat listing running over this directory
            // may bring it first; else this may be a walk, worth one.
            match namespace.listing_from_subtree_job(self.dir, source, &prefix).await {
                Some(names) => self.cached = Some((names, 0)),
                None => namespace.start_subtree_listings(self.dir, self.parent),
            }
        }
        if let Some((names, position)) = &mut self.cached {
            let end = (*position + CACHED_BATCH).min(names.len());
            let batch: Vec<String> = names[*position..end].to_vec();
            *position = end;
            self.done = end == names.len();
            let mut listed = self.listed_entries(namespace, source, &prefix, batch).await?;
            if self.done {
                listed.extend(self.take_pending(namespace, source, &prefix).await?);
            }
            return Ok(listed);
        }
        loop {
            let merger = self.merger.get_or_insert_with(|| ListingMerger::new(prefix.clone()));
            // Bare: a page of 1,000 keys costs MinIO 20 ms, 50 with metadata, and `ls` or
            // `find` need none; `ls -l` gets the files' from a LIST per 1,000 (`metadata`).
            let page = namespace.store(source).list(&prefix, self.token.take(), None, false).await?;
            self.token = page.next_token.clone();
            self.done = self.token.is_none();
            let entries = merger.push_page(page);
            for entry in &entries {
                self.pending.remove(&entry.name);
            }
            if !entries.is_empty() || self.done {
                // Entered first: what is kept is what was shown (names this mount just
                // removed are left out there).
                let mut listed = namespace.enter_listed(self.dir, source, &prefix, entries);
                if let Some(collected) = &mut self.collected {
                    collected.extend(listed.iter().map(|entry| entry.name.clone()));
                    if collected.len() > MAX_CACHED_LISTING {
                        self.collected = None;
                    }
                }
                if self.done {
                    if let Some(names) = self.collected.take() {
                        namespace.remember_listing(self.dir, self.started, names);
                    }
                    listed.extend(self.take_pending(namespace, source, &prefix).await?);
                }
                return Ok(listed);
            }
        }
    }

    /// The entries of this directory with these names, from a kept listing: from the
    /// inode table, or from the store for those the table no longer holds (the kernel
    /// forgot them, or their attributes expired and were swept, while the listing is
    /// still fresh; they were left out of the walk, and a lookup that listed the
    /// directory answered ENOENT).
    async fn listed_entries(
        &mut self,
        namespace: &Namespace,
        source: usize,
        prefix: &str,
        names: Vec<String>,
    ) -> Result<Vec<Listed>, NamespaceError> {
        let found: Vec<Result<Listed, String>> = {
            let state = namespace.state.lock();
            names
                .into_iter()
                .map(|name| {
                    self.pending.remove(&name);
                    match state.inodes.child(self.dir, &name) {
                        Some(node) => Ok(Listed { node: node.clone(), name }),
                        None => Err(name),
                    }
                })
                .collect()
        };
        let mut listed = Vec::with_capacity(found.len());
        for entry in found {
            match entry {
                Ok(entry) => listed.push(entry),
                Err(name) => match namespace.lookup_uncached(self.dir, &name, source, prefix).await {
                    Ok(node) => listed.push(Listed { node, name }),
                    Err(NamespaceError::NotFound) => {} // deleted since it was listed
                    Err(error) => return Err(error),
                },
            }
        }
        Ok(listed)
    }

    /// The files being written here that the listing did not show (yet).
    async fn take_pending(
        &mut self,
        namespace: &Namespace,
        source: usize,
        prefix: &str,
    ) -> Result<Vec<Listed>, NamespaceError> {
        let pending = std::mem::take(&mut self.pending);
        self.listed_entries(namespace, source, prefix, pending.into_iter().collect()).await
    }
}
