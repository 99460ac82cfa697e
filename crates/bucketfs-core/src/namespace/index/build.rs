//! Listing a whole source into a [`SourceIndex`]: the top few levels with delimited
//! LISTs until there are enough subtrees to list in parallel, then each subtree flat
//! (`ListObjectsV2` without delimiter, 1,000 keys a page), [`LISTS_IN_FLIGHT`] at a
//! time. One flat listing of a bucket is a chain of pages, each waiting for the last
//! one's continuation token; subtrees under their own prefixes are chains that run side
//! by side.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::tree::SourceIndex;
use crate::namespace::listing::{EntryKind, ListingMerger};
use crate::namespace::subtree::{FilledDirs, SubtreeFiller};
use bucketfs_client::store::{ObjectInfo, ObjectStore, StoreError};

/// Flat LISTs in flight at once while building an index.
const LISTS_IN_FLIGHT: usize = 8;
/// Directories are listed level by level (delimited) until this many subtrees are
/// found, or [`MAX_SPLIT_LEVELS`] levels were.
const SUBTREES_WANTED: usize = 16;
const MAX_SPLIT_LEVELS: usize = 4;
/// Times a page of a build is asked for before the build fails. Each ask already retries
/// within `--retry-window`, which is sized for a program waiting; a build runs in the
/// background and can wait longer, and a failed page fails the whole listing: with 1 M
/// keys on a MinIO whose disk cache was cold, a page among 8 listings in flight took
/// longer than `--read-timeout`, and the build started over every minute.
const PAGE_ASKS: u32 = 4;
/// The wait before asking again for a failed page, doubled each time (short in unit
/// tests).
const FIRST_PAGE_PAUSE: Duration = if cfg!(test) { Duration::from_millis(10) } else { Duration::from_secs(2) };

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
    whole.index.share_equal_metadata();
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
        let page = patiently(&dir, || store.list(&dir, token.clone(), None, true)).await?;
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
        let page = patiently(&dir, || store.list_recursive(&dir, token.clone(), true)).await?;
        filler.push(&mut part, &page.objects, now);
        token = page.next_token;
        if token.is_none() {
            filler.finish(&mut part);
            return Ok(part);
        }
    }
}

/// A page of the listing of `dir`, asked for again (up to [`PAGE_ASKS`] times) while
/// the store fails for a passing reason.
async fn patiently<T, F, Fut>(dir: &str, ask: F) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut pause = FIRST_PAGE_PAUSE;
    let mut asked = 1;
    loop {
        match ask().await {
            Err(error) if error.is_transient() && asked < PAGE_ASKS => {
                tracing::info!(prefix = dir, "index listing: a page failed ({error}); asking again in {pause:?}");
                tokio::time::sleep(pause).await;
                pause *= 2;
                asked += 1;
            }
            answered => return answered,
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

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;
    use std::sync::atomic::Ordering;

    /// Pages that time out are asked for again: three timeouts in a row, and the build
    /// still ends with every key; a store that never answers fails it (it does not wait
    /// forever).
    #[tokio::test]
    async fn a_build_waits_out_pages_that_time_out() {
        let keys = (0..2500).map(|i| (format!("d{}/f{i:04}", i % 3), b"x".to_vec()));
        let store = Arc::new(MemoryStore::with_keys(keys));
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        store.lists_timing_out.store(3, Ordering::Release);
        let index = list_source(&dyn_store, "").await.expect("built after the timeouts");
        assert_eq!(index.files(), 2500, "every key indexed");
        assert!(index.dir("d2/").is_some());

        store.lists_timing_out.store(usize::MAX, Ordering::Release);
        assert!(list_source(&dyn_store, "").await.is_err(), "a page that never answers fails the build");
    }
}
