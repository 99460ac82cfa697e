//! Listing a whole source into a [`SourceIndex`]: the top few levels with delimited
//! LISTs until there are enough subtrees to list in parallel, then each subtree flat
//! (`ListObjectsV2` without delimiter, 1,000 keys a page), [`LISTS_IN_FLIGHT`] at a
//! time. One flat listing of a bucket is a chain of pages, each waiting for the last
//! one's continuation token; subtrees under their own prefixes are chains that run side
//! by side.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;

use super::tree::SourceIndex;
use crate::namespace::listing::{EntryKind, ListingMerger};
use crate::namespace::subtree::{FilledDirs, SubtreeFiller};
use crate::store::{ObjectInfo, ObjectStore, StoreError};

/// Flat LISTs in flight at once while building an index.
const LISTS_IN_FLIGHT: usize = 8;
/// Directories are listed level by level (delimited) until this many subtrees are
/// found, or [`MAX_SPLIT_LEVELS`] levels were.
const SUBTREES_WANTED: usize = 16;
const MAX_SPLIT_LEVELS: usize = 4;

/// A flat listing fills an index: each directory once the listing has passed it.
struct IntoIndex {
    index: SourceIndex,
    /// Marker objects met, by directory prefix: set on the parent's entry at the end
    /// (the parent may be in another part).
    markers: HashMap<String, ObjectInfo>,
}

impl FilledDirs for IntoIndex {
    type Dir = ();

    fn open(&mut self, _parent: &(), _name: &str, _prefix: &str, _valid_until: Instant) {}

    fn close(
        &mut self,
        _dir: (),
        prefix: &str,
        entries: BTreeMap<String, EntryKind>,
        marker: Option<ObjectInfo>,
        _valid_until: Instant,
    ) {
        if let Some(marker) = marker {
            self.markers.insert(prefix.to_owned(), marker);
        }
        self.index.set_dir(prefix, entries);
    }
}

/// Lists everything below `prefix` (the source's prefix) into an index.
pub async fn list_source(store: &Arc<dyn ObjectStore>, prefix: &str) -> Result<SourceIndex, StoreError> {
    let mut whole = IntoIndex { index: SourceIndex::default(), markers: HashMap::new() };
    let mut frontier = vec![prefix.to_owned()];
    for _ in 0..MAX_SPLIT_LEVELS {
        if frontier.is_empty() || frontier.len() >= SUBTREES_WANTED {
            break;
        }
        let listed = futures::stream::iter(frontier.drain(..).map(|dir| list_delimited(store, dir)))
            .buffer_unordered(LISTS_IN_FLIGHT)
            .collect::<Vec<_>>()
            .await;
        for result in listed {
            let (dir, entries, marker) = result?;
            frontier.extend(
                entries
                    .iter()
                    .filter(|(_, kind)| matches!(kind, EntryKind::Dir))
                    .map(|(name, _)| format!("{dir}{name}/")),
            );
            if let Some(marker) = marker {
                whole.markers.insert(dir.clone(), marker);
            }
            whole.index.set_dir(&dir, entries);
        }
    }
    let parts = futures::stream::iter(frontier.into_iter().map(|dir| list_flat(store, dir)))
        .buffer_unordered(LISTS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    for part in parts {
        let part = part?;
        whole.markers.extend(part.markers);
        whole.index.absorb(part.index);
    }
    Ok(finish(whole))
}

fn finish(mut whole: IntoIndex) -> SourceIndex {
    for (prefix, marker) in &whole.markers {
        whole.index.set_marker(prefix, marker);
    }
    whole.index
}

/// Directory `dir` listed with a delimiter: its entries and its marker object.
async fn list_delimited(
    store: &Arc<dyn ObjectStore>,
    dir: String,
) -> Result<(String, BTreeMap<String, EntryKind>, Option<ObjectInfo>), StoreError> {
    let mut merger = ListingMerger::new(dir.clone());
    let mut entries = BTreeMap::new();
    let mut marker = None;
    let mut token = None;
    loop {
        let page = store.list(&dir, token.take(), None, true).await?;
        token = page.next_token.clone();
        marker = marker.or_else(|| page.objects.iter().find(|o| o.key == dir).cloned());
        entries.extend(merger.push_page(page).into_iter().map(|entry| (entry.name, entry.kind)));
        if token.is_none() {
            return Ok((dir, entries, marker));
        }
    }
}

/// The subtree `dir` listed flat.
async fn list_flat(store: &Arc<dyn ObjectStore>, dir: String) -> Result<IntoIndex, StoreError> {
    let mut part = IntoIndex { index: SourceIndex::default(), markers: HashMap::new() };
    let mut filler = SubtreeFiller::new((), dir.clone());
    let mut token = None;
    let now = Instant::now();
    loop {
        let page = store.list_recursive(&dir, token.take(), true).await?;
        filler.push(&mut part, &page.objects, now);
        token = page.next_token;
        if token.is_none() {
            filler.finish(&mut part);
            return Ok(part);
        }
    }
}

/// The index of these objects (all below `prefix`, in key order), as one flat listing
/// builds it (for tests).
#[cfg(test)]
pub fn index_of(objects: Vec<ObjectInfo>, prefix: &str) -> SourceIndex {
    let mut whole = IntoIndex { index: SourceIndex::default(), markers: HashMap::new() };
    let mut filler = SubtreeFiller::new((), prefix.to_owned());
    filler.push(&mut whole, &objects, Instant::now());
    filler.finish(&mut whole);
    finish(whole)
}
