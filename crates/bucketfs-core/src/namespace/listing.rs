//! Turns pages of a delimited S3 listing into directory entries.
//!
//! Two rules make this more than a concatenation:
//! - **A directory beats a file of the same name.** With keys `a` and `a/b`, `a` is shown
//!   as a directory and the object `a` is hidden (lookups agree, see `Namespace::lookup`).
//!   The object `a` and the prefix `a/` can arrive on different pages, because keys like
//!   `a-x` or `a.txt` sort between them. So a file entry is only final once the listing
//!   has gone past `a/`; until then it is held back and merged with the next page.
//! - **Keys that cannot be file names are hidden** (see [`super::names`]), with a warning.

use std::collections::BTreeMap;

use bucketfs_client::store::{ListPage, ObjectInfo};

use super::names::check_component;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File(ObjectInfo),
    Dir,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
}

/// Merges the pages of one directory listing (`prefix` is the directory's key prefix,
/// empty or ending in `/`).
#[derive(Debug)]
pub struct ListingMerger {
    prefix: String,
    /// File entries that a directory of the same name on a later page could still replace.
    held: BTreeMap<String, Entry>,
}

impl ListingMerger {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self { prefix: prefix.into(), held: BTreeMap::new() }
    }

    /// Takes one page; returns the entries that are now final. After the last page
    /// (`page.next_token == None`) everything held back is returned too.
    pub fn push_page(&mut self, page: ListPage) -> Vec<Entry> {
        let mut merged = std::mem::take(&mut self.held);
        let mut last_key_seen: Option<&str> = None;

        for object in &page.objects {
            last_key_seen = max_str(last_key_seen, &object.key);
            let Some(name) = object.key.strip_prefix(self.prefix.as_str()) else { continue };
            if name.is_empty() {
                continue; // the directory's own marker object (`dir/`)
            }
            if !self.visible(name, &object.key) {
                continue;
            }
            match merged.get(name) {
                Some(Entry { kind: EntryKind::Dir, .. }) => warn_shadowed(&object.key),
                _ => {
                    merged.insert(
                        name.to_owned(),
                        Entry { name: name.to_owned(), kind: EntryKind::File(object.clone()) },
                    );
                }
            }
        }
        for prefix in &page.prefixes {
            last_key_seen = max_str(last_key_seen, prefix);
            let Some(name) = prefix.strip_prefix(self.prefix.as_str()).and_then(|n| n.strip_suffix('/')) else {
                continue;
            };
            if !self.visible(name, prefix) {
                continue;
            }
            if let Some(Entry { kind: EntryKind::File(object), .. }) = merged.get(name) {
                warn_shadowed(&object.key);
            }
            merged.insert(name.to_owned(), Entry { name: name.to_owned(), kind: EntryKind::Dir });
        }

        if page.next_token.is_some() {
            // A file `n` is final only if `prefix + n + "/"` sorts at or before the last key
            // of this page: then a prefix `n/` would already have been seen.
            let last = last_key_seen.unwrap_or("").to_owned();
            let prefix = &self.prefix;
            let (final_entries, held): (Vec<_>, Vec<_>) = merged.into_iter().partition(|(name, entry)| {
                matches!(entry.kind, EntryKind::Dir) || format!("{prefix}{name}/").as_str() <= last.as_str()
            });
            self.held = held.into_iter().collect();
            final_entries.into_iter().map(|(_, e)| e).collect()
        } else {
            merged.into_values().collect()
        }
    }

    fn visible(&self, name: &str, key: &str) -> bool {
        match check_component(name) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(key, "key not shown: {why}");
                false
            }
        }
    }
}

fn max_str<'a>(current: Option<&'a str>, candidate: &'a str) -> Option<&'a str> {
    match current {
        Some(c) if c >= candidate => Some(c),
        _ => Some(candidate),
    }
}

fn warn_shadowed(key: &str) {
    tracing::warn!(key, "object not shown: a directory of the same name exists");
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use bucketfs_client::store::memory::MemoryStore;

    /// The reference model: the entries of directory `prefix` (name → is a directory),
    /// computed from the whole key set at once. (Flat listings are checked against it too.)
    pub(in crate::namespace) fn expected_entries(keys: &BTreeSet<String>, prefix: &str) -> BTreeMap<String, bool> {
        let mut entries = BTreeMap::new(); // name -> is_dir
        for key in keys {
            let Some(rest) = key.strip_prefix(prefix) else { continue };
            match rest.split_once('/') {
                Some((dir, _)) if check_component(dir).is_ok() => {
                    entries.insert(dir.to_owned(), true);
                }
                None if !rest.is_empty() && check_component(rest).is_ok() => {
                    entries.entry(rest.to_owned()).or_insert(false);
                }
                _ => {}
            }
        }
        entries
    }

    fn list_all(store: &MemoryStore, prefix: &str, page_size: usize) -> Vec<Entry> {
        let mut merger = ListingMerger::new(prefix);
        let mut token = None;
        let mut out = Vec::new();
        loop {
            let page = store.list_sync(prefix, token.take(), page_size);
            token = page.next_token.clone();
            out.extend(merger.push_page(page));
            if token.is_none() {
                return out;
            }
        }
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        // Few distinct characters, so that collisions (file vs dir, `a-x` between `a` and
        // `a/`), empty components and dots actually happen.
        let component = prop::sample::select(vec!["a", "b", "a-", "a.", ".", "..", "", "a b"]);
        prop::collection::vec(component, 1..4).prop_map(|parts| parts.join("/"))
    }

    proptest! {
        #[test]
        fn merged_pages_match_the_reference_model(
            keys in prop::collection::btree_set(key_strategy(), 0..40),
            page_size in 1usize..6,
            dir in prop::sample::select(vec!["", "a/", "b/", "a-/"]),
        ) {
            let store = MemoryStore::with_keys(keys.iter().map(|k| (k.clone(), Vec::new())));
            let listed = list_all(&store, dir, page_size);
            let mut seen = BTreeMap::new();
            for entry in &listed {
                let previous = seen.insert(entry.name.clone(), matches!(entry.kind, EntryKind::Dir));
                prop_assert!(previous.is_none(), "duplicate entry {:?}", entry.name);
            }
            prop_assert_eq!(seen, expected_entries(&keys, dir));
        }
    }

    #[test]
    fn file_and_prefix_on_different_pages_show_one_directory() {
        let keys = ["a", "a-1", "a-2", "a.txt", "a/b", "z"];
        let store = MemoryStore::with_keys(keys.iter().map(|k| (k.to_string(), Vec::new())));
        let listed = list_all(&store, "", 1);
        let names: Vec<_> = listed.iter().map(|e| (e.name.as_str(), e.kind == EntryKind::Dir)).collect();
        let mut names = names;
        names.sort();
        assert_eq!(names, vec![("a", true), ("a-1", false), ("a-2", false), ("a.txt", false), ("z", false)]);
    }
}
