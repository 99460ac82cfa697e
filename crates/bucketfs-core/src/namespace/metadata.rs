//! Stored attributes of listed entries. LIST carries no object metadata, so an entry
//! known only from a listing takes a HEAD (for a directory: a HEAD of its marker) when
//! it is used. A directory that keeps needing them (`ls -l`, `stat *`, `grep -r`) gets
//! them in batches of its next entries; a small file in a directory whose files are
//! being read comes with its content (a ranged GET for the HEAD), kept in
//! [`crate::cache::SmallObjects`] for the open that follows.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;

use super::dir_state::Counted;
use super::index::Change;
use super::inode::{Ino, Location, Node};
use super::{Namespace, NamespaceError};
use bucketfs_client::store::{Metadata, ObjectInfo, ObjectStore, StoreError};

/// After this many metadata HEADs in one directory within the TTL, each one also
/// fetches the next entries of the directory's listing, `METADATA_BATCH` of them,
/// `METADATA_CONCURRENCY` at a time.
const METADATA_FETCHES_BEFORE_BATCHING: u32 = 2;
pub(super) const METADATA_BATCH: usize = 64;
const METADATA_CONCURRENCY: usize = 16;
/// Files up to this size are read whole when their metadata is fetched (see `cache`).
const SMALL_OBJECT: u64 = 64 * 1024;

impl Namespace {
    /// `node` with its metadata known: fetched with a HEAD if a listing is all we have.
    /// Entries of a directory that keeps needing this are fetched in batches (see
    /// [`METADATA_BATCH`]).
    ///
    /// The answer is `node` with what was fetched, not the table's entry re-read: the
    /// caller may not hold a reference yet (a lookup counts its reply after this), so
    /// while a slow HEAD runs, a sweep may drop the entry once its TTL passes; re-reading
    /// it then answered ENOENT for a directory that exists (`find` over 1 M keys, under
    /// load). The caller's count of the reference puts the entry back.
    pub async fn with_metadata(&self, mut node: Node) -> Result<Node, NamespaceError> {
        if node.metadata.is_some() {
            return Ok(node);
        }
        if !node.location.is_dir() {
            self.state.lock().subtree_jobs.note_file_attributes_wanted(Instant::now());
        }
        let batch = self.metadata_batch(&node);
        if batch.len() > 1 && !node.location.is_dir() {
            if let Some(listed) = self.metadata_from_listing(&node).await? {
                return Ok(listed);
            }
        }
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
            Some(Ok(fetched)) => {
                fetched.apply_to(&mut node);
                Ok(node)
            }
            Some(Err(error)) => Err(error),
            None => Ok(node), // not reached: the batch starts with the node itself
        }
    }

    /// `node` with its whole stored metadata, for a rewrite of it: what a listing
    /// carried may leave headers out (see `Metadata::listed`), so then it is asked again.
    pub async fn with_whole_metadata(&self, mut node: Node) -> Result<Node, NamespaceError> {
        if node.metadata.as_ref().is_some_and(|metadata| !metadata.listed) {
            return Ok(node);
        }
        self.fetch_metadata(node.ino, &node.location.clone()).await?.apply_to(&mut node);
        Ok(node)
    }

    /// A batch of files' metadata from one listing, where the store lists metadata
    /// (MinIO): the page of `node`'s directory that starts at `node`, up to 1,000 files,
    /// enters the table for one LIST instead of a HEAD each (`ls -l` of 5,000 files: 5
    /// LISTs instead of 5,000 HEADs). `None` if the store cannot, if files of the
    /// directory are being read, or if the page does not hold `node` (deleted since it
    /// was listed: the HEAD that follows says so).
    async fn metadata_from_listing(&self, node: &Node) -> Result<Option<Node>, NamespaceError> {
        let Location::File { source, key } = &node.location else { return Ok(None) };
        let Some(prefix) = key.strip_suffix(&*node.name) else { return Ok(None) };
        let start_after = {
            let now = Instant::now();
            let state = self.state.lock();
            if self.small_contents_with_metadata && state.files_read_in(node.parent, now, self.ttl) {
                // Files here are being read (`grep -r`): the batch of GETs that bring small
                // files' content with their metadata serves them better (940 ms against 450
                // for `grep -r` over 1,000 small files, whose reads then each waited a GET).
                return Ok(None);
            }
            state.fresh_names(node.parent, now).and_then(|names| {
                let at = names.partition_point(|name| name.as_str() < &*node.name);
                at.checked_sub(1).map(|before| format!("{prefix}{}", names[before]))
            })
        };
        let Some(page) = self.store(*source).list_metadata_after(prefix, start_after.as_deref()).await? else {
            return Ok(None);
        };
        let mut wanted = None;
        let mut entered = Vec::new();
        {
            let mut state = self.state.lock();
            for info in page.objects {
                let Some(name) = info.key.strip_prefix(prefix).filter(|name| !name.is_empty()) else { continue };
                let Some(child) = state.inodes.child(node.parent, name) else { continue };
                // Only entries known from a listing alone: one being written has its own.
                if info.metadata.is_none() || child.metadata.is_some() || child.location.is_dir() {
                    continue;
                }
                let ino = child.ino;
                let fetched = Fetched::File(info);
                if let Some(child) = state.inodes.get_mut(ino) {
                    fetched.apply_to(child);
                }
                if ino == node.ino {
                    let mut answer = node.clone();
                    fetched.apply_to(&mut answer);
                    wanted = Some(answer);
                }
                if let Fetched::File(info) = fetched {
                    entered.push(info);
                }
            }
        }
        for info in entered {
            self.record(*source, || Change::File(info));
        }
        Ok(wanted)
    }

    /// The entries whose metadata to fetch along with `node`'s: `node` first, then, once
    /// its directory has needed many, the entries after it in the directory's listing.
    fn metadata_batch(&self, node: &Node) -> Vec<(Ino, Location)> {
        let mut batch = vec![(node.ino, node.location.clone())];
        let now = Instant::now();
        if self.count(Counted::MetadataFetches, node.parent, now) < METADATA_FETCHES_BEFORE_BATCHING {
            return batch;
        }
        let state = self.state.lock();
        let Some(names) = state.fresh_names(node.parent, now) else {
            return batch;
        };
        let start = names.partition_point(|n| n.as_str() <= &*node.name);
        // Neighbours of the same kind only: a walk (`find`) looks up every directory and
        // no file, and fetching the files' metadata along with the directories' cost it
        // 30 HEADs per directory; `ls -l` looks up both kinds, each batching its own.
        let is_dir = node.location.is_dir();
        let unknown = names[start..].iter().filter_map(|name| {
            let child = state.inodes.child(node.parent, name)?;
            (child.metadata.is_none() && child.location.is_dir() == is_dir).then(|| (child.ino, child.location.clone()))
        });
        batch.extend(unknown.take(METADATA_BATCH - 1));
        batch
    }

    /// Fetches the metadata of `ino` (at `location`) and enters it in the table, if the
    /// entry is still there; returns it.
    async fn fetch_metadata(&self, ino: Ino, location: &Location) -> Result<Fetched, NamespaceError> {
        let fetched = match location {
            // The view of versions shows no stored attributes (entered with empty ones).
            Location::SourceList | Location::History(_) => Fetched::Marker(Arc::default()),
            Location::Dir { source, prefix } => {
                Fetched::Marker(self.marker_metadata(self.store(*source), prefix).await?)
            }
            Location::File { source, key } => match self.fetch_file_metadata(ino, self.store(*source), key).await {
                Ok(info) => Fetched::File(info),
                Err(StoreError::NotFound) => {
                    // Deleted since it was listed.
                    if let Ok((parent, name)) = self.node(ino).map(|node| node.parent_and_name()) {
                        self.remove_entry(parent, &name);
                    }
                    return Err(NamespaceError::NotFound);
                }
                Err(error) => return Err(error.into()),
            },
        };
        if let Some(node) = self.state.lock().inodes.get_mut(ino) {
            fetched.apply_to(node);
        }
        // The index keeps what was fetched: asked once, not at every expiry or remount.
        match (&fetched, location) {
            (Fetched::File(info), Location::File { source, .. }) => self.record(*source, || Change::File(info.clone())),
            (Fetched::Marker(metadata), Location::Dir { source, prefix }) if !prefix.is_empty() => {
                self.record(*source, || Change::Attributes {
                    key: prefix.clone(),
                    metadata: Some(metadata.clone()),
                    etag: None,
                })
            }
            _ => {}
        }
        Ok(fetched)
    }

    /// HEAD of the file `key` (`ino`). A small file in a directory whose files are being
    /// read (`grep -r`, `cat *`) is read whole instead, for about the same cost, and its
    /// content kept for the open that follows. Elsewhere (`ls -l`) that GET cost 14%
    /// more than a HEAD for 64-byte files, so it is not sent.
    async fn fetch_file_metadata(
        &self,
        ino: Ino,
        store: &Arc<dyn ObjectStore>,
        key: &str,
    ) -> Result<ObjectInfo, StoreError> {
        let (listed_size, read_here) = {
            let state = self.state.lock();
            match state.inodes.get(ino) {
                Some(node) => (node.size, state.files_read_in(node.parent, Instant::now(), self.ttl)),
                None => (0, false),
            }
        };
        if !(1..=SMALL_OBJECT).contains(&listed_size) || !read_here || !self.small_contents_with_metadata {
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
    /// Whether files of its directory were already read within the TTL (a walk).
    pub fn note_read(&self, ino: Ino) -> bool {
        let mut state = self.state.lock();
        let Some(parent) = state.inodes.get(ino).map(|node| node.parent) else { return false };
        let now = Instant::now();
        let walking = state.files_read_in(parent, now, self.ttl);
        state.note_read(parent, now);
        walking
    }

    /// Up to `count` files listed after `ino` in its directory that the table knows now
    /// (a walk's next files; no request): from the directory's fresh listing, or its
    /// index. Entries the kernel was never given have no inode yet and are left out.
    pub fn files_listed_after(&self, ino: Ino, count: usize) -> Vec<Node> {
        let Ok(node) = self.node(ino) else { return Vec::new() };
        let indexed_names = || {
            let Ok(Location::Dir { source, prefix }) = self.node(node.parent).map(|dir| dir.location) else {
                return Vec::new();
            };
            let listing = self.indexes().and_then(|indexes| indexes.dir(source, &prefix));
            listing.map(|listing| listing.names_after(&node.name, count)).unwrap_or_default()
        };
        let listed_names = self.state.lock().fresh_names(node.parent, Instant::now()).map(|names| {
            let start = names.partition_point(|n| n.as_str() <= &*node.name);
            names[start..].iter().take(count).cloned().collect::<Vec<_>>()
        });
        let names = listed_names.unwrap_or_else(indexed_names);
        let state = self.state.lock();
        names
            .iter()
            .filter_map(|name| state.inodes.child(node.parent, name))
            .filter(|child| !child.location.is_dir())
            .cloned()
            .collect()
    }

    /// The content of `ino` at version `etag` if it was read along with its metadata and
    /// not opened since.
    pub fn take_small_object(&self, ino: Ino, etag: &str) -> Option<Bytes> {
        self.small_objects.take(ino, etag)
    }

    /// The metadata of the marker `prefix` (a key ending in `/`); empty if there is none.
    pub(super) async fn marker_metadata(
        &self,
        store: &Arc<dyn ObjectStore>,
        prefix: &str,
    ) -> Result<Arc<Metadata>, StoreError> {
        if prefix.is_empty() {
            return Ok(Arc::default()); // the bucket itself
        }
        match store.head(prefix).await {
            Ok(info) => Ok(info.metadata.unwrap_or_default()),
            Err(StoreError::NotFound) => Ok(Arc::default()),
            Err(error) => Err(error),
        }
    }
}

/// Metadata fetched for one entry.
enum Fetched {
    /// A directory's: its marker's metadata (empty without a marker).
    Marker(Arc<Metadata>),
    /// A file's: what its HEAD said.
    File(ObjectInfo),
}

impl Fetched {
    fn apply_to(&self, node: &mut Node) {
        match self {
            Fetched::Marker(metadata) => node.metadata = Some(metadata.clone()),
            Fetched::File(info) => {
                node.size = info.size;
                node.mtime = info.mtime;
                node.etag = info.etag.clone();
                node.metadata = info.metadata.clone();
            }
        }
    }
}
