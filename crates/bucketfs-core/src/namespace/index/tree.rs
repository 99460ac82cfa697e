//! The listing index of one source, as data: every directory below the source's prefix
//! with its complete entries, sorted by name, packed so that a million keys fit in well
//! under 150 MB (one fixed-size record per entry plus its name's bytes; see
//! [`SourceIndex::heap_bytes`]).
//!
//! Directories are kept by key prefix, each behind its own `Arc`: a reader listing a
//! directory holds that one listing (a refresh or a change elsewhere never shows it a
//! mix), and a change copies only the directory it touches, and only while a reader
//! holds it. Changes made through the mount are [`Change`]s, applied here the one way
//! whether they arrive live or are replayed onto a refreshed index.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize};

use crate::namespace::listing::EntryKind;
use bucketfs_client::store::{Metadata, ObjectInfo, SharedMetadata};

/// `Packed::flags`: the entry is a directory.
const DIR: u8 = 1;
/// For a directory: a `dir/` marker object exists (its size, mtime and ETag are the
/// entry's; its metadata, once fetched, too).
const MARKER: u8 = 2;
/// The ETag is `"` + 32 lower-case hex digits (+ `-N` for a multipart upload) + `"`,
/// stored as 16 bytes (and N).
const ETAG_MD5: u8 = 4;
/// The ETag is stored as text after the name (any other form).
const ETAG_TEXT: u8 = 8;

thread_local! {
    /// While [`decoding_shared`] runs: the metadata values decoded so far, each once.
    static DECODED_METADATA: RefCell<Option<SharedMetadata>> = const { RefCell::new(None) };
}

/// Runs `decode` (of a saved index) so that entries with equal metadata share one copy
/// as they are decoded: sharing them afterwards leaves the copies' memory to the heap,
/// between live entries, where it is not given back (1 M keys with one content type:
/// 192 bytes per key held after a load).
pub fn decoding_shared<R>(decode: impl FnOnce() -> R) -> R {
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            DECODED_METADATA.with(|seen| *seen.borrow_mut() = None);
        }
    }
    DECODED_METADATA.with(|seen| *seen.borrow_mut() = Some(SharedMetadata::default()));
    let _done = Done;
    decode()
}

fn shared_metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Arc<Metadata>>, D::Error> {
    let Some(metadata) = Option::<Metadata>::deserialize(deserializer)? else { return Ok(None) };
    Ok(Some(DECODED_METADATA.with(|seen| match seen.borrow_mut().as_mut() {
        Some(seen) => seen.share(Arc::new(metadata)),
        None => Arc::new(metadata),
    })))
}

/// One entry: 56 bytes, plus its name (and an unusual ETag) in the listing's `text`.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Packed {
    text_start: u32,
    name_len: u16,
    flags: u8,
    size: u64,
    /// Nanoseconds since the Unix epoch.
    mtime: i64,
    etag: [u8; 16],
    /// Multipart part count (`ETAG_MD5`; 0: none) or the text ETag's length.
    etag_extra: u32,
    /// The object's stored metadata (for a directory, its marker's), once known: from
    /// the listing where the store gives it there (MinIO), else fetched by HEAD.
    #[serde(deserialize_with = "shared_metadata")]
    metadata: Option<Arc<Metadata>>,
}

/// One directory's entries, sorted by name.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DirListing {
    entries: Vec<Packed>,
    /// Names (and unusual ETags), back to back.
    text: Vec<u8>,
    /// Bytes of `text` no entry uses any more (removed or renamed entries).
    garbage: u32,
}

/// What the index says about one name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Indexed {
    /// An object; `metadata` is `None` until its stored attributes were fetched.
    File(ObjectInfo),
    /// A directory. `metadata`: its marker's (empty without a marker), `None` while a
    /// marker's metadata is not known.
    Dir { metadata: Option<Arc<Metadata>> },
}

impl From<EntryKind> for Indexed {
    /// An entry of a delimited listing: a directory's marker metadata is not known.
    fn from(kind: EntryKind) -> Self {
        match kind {
            EntryKind::File(info) => Indexed::File(info),
            EntryKind::Dir => Indexed::Dir { metadata: None },
        }
    }
}

impl DirListing {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn name(&self, at: usize) -> &str {
        let entry = &self.entries[at];
        let start = entry.text_start as usize;
        // Names enter only as `&str` (see `insert`), so the bytes are UTF-8.
        std::str::from_utf8(&self.text[start..start + entry.name_len as usize]).unwrap_or_default()
    }

    /// Entry `at` as the namespace uses it; `prefix` is this directory's key prefix.
    pub fn entry(&self, at: usize, prefix: &str) -> (String, Indexed) {
        let name = self.name(at).to_owned();
        let indexed = self.decode(at, prefix, &name);
        (name, indexed)
    }

    /// The keys of the files here (`prefix` is this directory's) whose stored metadata
    /// is not known yet.
    pub fn files_without_metadata(&self, prefix: &str) -> Vec<String> {
        (0..self.entries.len())
            .filter(|at| self.entries[*at].flags & DIR == 0 && self.entries[*at].metadata.is_none())
            .map(|at| format!("{prefix}{}", self.name(at)))
            .collect()
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        let mut low = 0;
        let mut high = self.entries.len();
        while low < high {
            let mid = (low + high) / 2;
            match self.name(mid).cmp(name) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(low)
    }

    /// Up to `count` names after `name` (which need not be here), in order.
    pub fn names_after(&self, name: &str, count: usize) -> Vec<String> {
        let start = match self.find(name) {
            Ok(at) => at + 1,
            Err(at) => at,
        };
        (start..self.entries.len()).take(count).map(|at| self.name(at).to_owned()).collect()
    }

    /// Where `name` is in the listing, if it is here.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.find(name).ok()
    }

    pub fn get(&self, name: &str, prefix: &str) -> Option<Indexed> {
        self.find(name).ok().map(|at| self.decode(at, prefix, name))
    }

    fn decode(&self, at: usize, prefix: &str, name: &str) -> Indexed {
        let entry = &self.entries[at];
        if entry.flags & DIR != 0 {
            let metadata = if entry.flags & MARKER == 0 { Some(Arc::default()) } else { entry.metadata.clone() };
            return Indexed::Dir { metadata };
        }
        Indexed::File(ObjectInfo {
            key: [prefix, name].concat(),
            size: entry.size,
            mtime: from_nanos(entry.mtime),
            etag: self.etag(entry),
            metadata: entry.metadata.clone(),
        })
    }

    fn etag(&self, entry: &Packed) -> Option<String> {
        if entry.flags & ETAG_MD5 != 0 {
            // One allocation for the text, no formatting machinery (a `format!` per byte
            // was a sixth of the daemon's time in a cold `find` on an indexed mount).
            let mut digits = [0u8; 32];
            hex::encode_to_slice(entry.etag, &mut digits).ok()?; // 16 bytes: 32 digits
            let mut etag = String::with_capacity(2 + digits.len() + 11);
            etag.push('"');
            etag.push_str(std::str::from_utf8(&digits).ok()?);
            if entry.etag_extra != 0 {
                use std::fmt::Write as _;
                let _ = write!(etag, "-{}", entry.etag_extra); // a String takes any write
            }
            etag.push('"');
            return Some(etag);
        }
        if entry.flags & ETAG_TEXT != 0 {
            let start = entry.text_start as usize + entry.name_len as usize;
            let bytes = &self.text[start..start + entry.etag_extra as usize];
            return Some(String::from_utf8_lossy(bytes).into_owned());
        }
        None
    }

    /// Sets the entry `name` (replacing one of the same name).
    fn insert(&mut self, name: &str, object: Option<&ObjectInfo>, flags: u8, metadata: Option<Arc<Metadata>>) -> bool {
        let mut packed = Packed {
            text_start: self.text.len() as u32,
            name_len: name.len() as u16,
            flags,
            size: 0,
            mtime: 0,
            etag: [0; 16],
            etag_extra: 0,
            metadata,
        };
        self.text.extend_from_slice(name.as_bytes());
        if let Some(object) = object {
            packed.size = object.size;
            packed.mtime = to_nanos(object.mtime);
            match object.etag.as_deref().map(parse_md5_etag) {
                Some(Some((md5, parts))) => {
                    packed.flags |= ETAG_MD5;
                    packed.etag = md5;
                    packed.etag_extra = parts;
                }
                Some(None) => {
                    let text = object.etag.as_deref().unwrap_or_default();
                    packed.flags |= ETAG_TEXT;
                    packed.etag_extra = text.len() as u32;
                    self.text.extend_from_slice(text.as_bytes());
                }
                None => {}
            }
        }
        self.place(name, packed)
    }

    /// Puts `packed` (whose text is in place) at `name`'s position; true if it is new.
    fn place(&mut self, name: &str, packed: Packed) -> bool {
        match self.find(name) {
            Ok(at) => {
                self.garbage += text_len(&self.entries[at]);
                self.entries[at] = packed;
                self.compact_if_mostly_garbage();
                false
            }
            Err(at) => {
                self.entries.insert(at, packed);
                true
            }
        }
    }

    fn remove(&mut self, name: &str) -> Option<Packed> {
        let at = self.find(name).ok()?;
        let removed = self.entries.remove(at);
        self.garbage += text_len(&removed);
        self.compact_if_mostly_garbage();
        Some(removed)
    }

    /// Puts an entry taken from another listing (a rename) under `name`.
    fn put_packed(&mut self, name: &str, mut packed: Packed, from: &DirListing) -> bool {
        let start = packed.text_start as usize + packed.name_len as usize;
        let etag_text = if packed.flags & ETAG_TEXT != 0 {
            from.text[start..start + packed.etag_extra as usize].to_vec()
        } else {
            Vec::new()
        };
        packed.text_start = self.text.len() as u32;
        packed.name_len = name.len() as u16;
        self.text.extend_from_slice(name.as_bytes());
        self.text.extend_from_slice(&etag_text);
        self.place(name, packed)
    }

    fn compact_if_mostly_garbage(&mut self) {
        if (self.garbage as usize) * 2 <= self.text.len() {
            return;
        }
        let mut text = Vec::with_capacity(self.text.len() - self.garbage as usize);
        for entry in &mut self.entries {
            let start = entry.text_start as usize;
            entry.text_start = text.len() as u32;
            text.extend_from_slice(&self.text[start..start + text_len(entry) as usize]);
        }
        self.text = text;
        self.garbage = 0;
    }

    fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Packed>() + self.text.capacity()
    }
}

fn text_len(entry: &Packed) -> u32 {
    entry.name_len as u32 + if entry.flags & ETAG_TEXT != 0 { entry.etag_extra } else { 0 }
}

fn to_nanos(time: SystemTime) -> i64 {
    match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => after.as_nanos().min(i64::MAX as u128) as i64,
        Err(before) => -(before.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

fn from_nanos(nanos: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        SystemTime::UNIX_EPOCH + magnitude
    } else {
        SystemTime::UNIX_EPOCH - magnitude
    }
}

/// `"<32 lower-case hex>"` or `"<32 lower-case hex>-<N>"` as (16 bytes, N); anything else
/// `None` (kept as text: the ETag must come back exactly as the server sent it).
fn parse_md5_etag(etag: &str) -> Option<([u8; 16], u32)> {
    let inner = etag.strip_prefix('"')?.strip_suffix('"')?;
    let (hex, parts) = match inner.split_once('-') {
        Some((hex, text)) => {
            let parts: u32 = text.parse().ok().filter(|n| *n > 0)?;
            (parts.to_string() == text).then_some((hex, parts))? // `-01` would not come back as sent
        }
        None => (inner, 0),
    };
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut md5 = [0u8; 16];
    for (at, byte) in md5.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * at..2 * at + 2], 16).ok()?;
    }
    Some((md5, parts))
}

/// A change made through the mount, applied to the index at once (and again to an index
/// being refreshed meanwhile, so that the refresh does not undo it).
#[derive(Clone, Debug)]
pub enum Change {
    /// The object `key` now is `info` (created, overwritten).
    File(ObjectInfo),
    /// The directory `prefix` (ending in `/`) was created, with a marker of this metadata.
    Dir { prefix: String, metadata: Arc<Metadata> },
    /// `key` (a file, or a directory without its trailing `/`) is gone, with everything
    /// below it.
    Remove { key: String },
    /// `from` moved to `to`: file keys, or directory prefixes (ending in `/`).
    Rename { from: String, to: String },
    /// The stored metadata and/or ETag (each when given) of `key` (a file key, or a
    /// directory's prefix for its marker) became known or changed.
    Attributes { key: String, metadata: Option<Arc<Metadata>>, etag: Option<Option<String>> },
}

/// The whole tree of one source.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct SourceIndex {
    /// Directory key prefix (the source's prefix for its root) → its listing.
    dirs: HashMap<Box<str>, Arc<DirListing>>,
    /// Files (objects shown as files) in all directories.
    files: usize,
}

impl SourceIndex {
    pub fn files(&self) -> usize {
        self.files
    }

    pub fn dirs(&self) -> usize {
        self.dirs.len()
    }

    /// Makes entries with equal metadata share one copy ([`SharedMetadata`]). A listing
    /// page's objects share theirs already (MinIO's listings carry metadata, mostly the
    /// same for all), but the pages of a build have one copy each.
    pub fn share_equal_metadata(&mut self) {
        let mut seen = SharedMetadata::default();
        for listing in self.dirs.values_mut() {
            let listing = Arc::make_mut(listing);
            for metadata in listing.entries.iter_mut().filter_map(|entry| entry.metadata.as_mut()) {
                *metadata = seen.share(metadata.clone());
            }
        }
    }

    /// The listing of directory `prefix`, if the index has it.
    pub fn dir(&self, prefix: &str) -> Option<Arc<DirListing>> {
        self.dirs.get(prefix).cloned()
    }

    /// Whether the index has directory `prefix`: then it knows every name in it.
    pub fn has_dir(&self, prefix: &str) -> bool {
        self.dirs.contains_key(prefix)
    }

    /// What `name` in directory `prefix` is; `None`: nothing of that name.
    pub fn lookup(&self, prefix: &str, name: &str) -> Option<Indexed> {
        self.dirs.get(prefix)?.get(name, prefix)
    }

    /// Memory held by the index's data (names, records, the table of directories).
    pub fn heap_bytes(&self) -> usize {
        let per_dir = std::mem::size_of::<(Box<str>, Arc<DirListing>)>() + std::mem::size_of::<DirListing>() + 16;
        self.dirs.iter().map(|(prefix, listing)| prefix.len() + per_dir + listing.heap_bytes()).sum()
    }

    /// Sets directory `prefix`'s entries, as a listing found them complete.
    pub fn set_dir(&mut self, prefix: &str, entries: BTreeMap<String, EntryKind>) {
        let mut listing = DirListing {
            entries: Vec::with_capacity(entries.len()),
            text: Vec::with_capacity(entries.keys().map(String::len).sum()),
            garbage: 0,
        };
        for (name, kind) in entries {
            match kind {
                EntryKind::File(info) => {
                    self.files += 1;
                    listing.insert(&name, Some(&info), 0, info.metadata.clone());
                }
                EntryKind::Dir => {
                    listing.insert(&name, None, DIR, None);
                }
            }
        }
        listing.text.shrink_to_fit();
        if let Some(old) = self.dirs.insert(prefix.into(), Arc::new(listing)) {
            self.files -= old.entries.iter().filter(|e| e.flags & DIR == 0).count();
        }
    }

    /// Directory `prefix` (ending in `/`) has the marker object `marker`.
    pub fn set_marker(&mut self, prefix: &str, marker: &ObjectInfo) {
        let (parent, name) = split_key(prefix.trim_end_matches('/'));
        let Some(listing) = self.dirs.get_mut(parent) else { return };
        if listing.find(name).is_ok_and(|at| listing.entries[at].flags & DIR != 0) {
            Arc::make_mut(listing).insert(name, Some(marker), DIR | MARKER, marker.metadata.clone());
        }
    }

    /// Takes the directories of `part` (another subtree of the same source).
    pub fn absorb(&mut self, part: SourceIndex) {
        self.files += part.files;
        self.dirs.extend(part.dirs);
    }

    /// Stored metadata this index knows that `older` knew for the same version of an
    /// entry (same size, mtime and ETag) is carried over: a refresh does not forget what
    /// HEADs found.
    pub fn carry_metadata_from(&mut self, older: &SourceIndex) {
        for (prefix, listing) in &mut self.dirs {
            let Some(old) = older.dirs.get(prefix) else { continue };
            if !listing.entries.iter().any(|e| e.metadata.is_none()) {
                continue;
            }
            let listing = Arc::make_mut(listing);
            for at in 0..listing.entries.len() {
                if listing.entries[at].metadata.is_some() {
                    continue;
                }
                let Ok(was) = old.find(listing.name(at)) else { continue };
                let (new, was) = (&listing.entries[at], &old.entries[was]);
                let same = new.flags == was.flags
                    && new.size == was.size
                    && new.mtime == was.mtime
                    && listing.etag(new) == old.etag(was);
                if same {
                    listing.entries[at].metadata = was.metadata.clone();
                }
            }
        }
    }

    /// The prefixes of every directory, sorted.
    pub fn dir_prefixes(&self) -> Vec<Box<str>> {
        let mut prefixes: Vec<Box<str>> = self.dirs.keys().cloned().collect();
        prefixes.sort_unstable();
        prefixes
    }

    /// The directories (their prefixes) whose marker's metadata is not known yet.
    pub fn markers_without_metadata(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (prefix, listing) in &self.dirs {
            for at in 0..listing.entries.len() {
                let entry = &listing.entries[at];
                if entry.flags & MARKER != 0 && entry.metadata.is_none() {
                    found.push(format!("{prefix}{}/", listing.name(at)));
                }
            }
        }
        found
    }

    pub fn apply(&mut self, change: &Change) {
        match change {
            Change::File(info) => {
                let (parent, name) = split_key(&info.key);
                if let Some(listing) = self.dirs.get_mut(parent) {
                    if Arc::make_mut(listing).insert(name, Some(info), 0, info.metadata.clone()) {
                        self.files += 1;
                    }
                }
            }
            Change::Dir { prefix, metadata } => {
                let (parent, name) = split_key(prefix.trim_end_matches('/'));
                if let Some(listing) = self.dirs.get_mut(parent) {
                    let marker = ObjectInfo {
                        key: prefix.clone(),
                        size: 0,
                        mtime: SystemTime::now(),
                        etag: None,
                        metadata: None,
                    };
                    Arc::make_mut(listing).insert(name, Some(&marker), DIR | MARKER, Some(metadata.clone()));
                    self.dirs.entry(prefix.as_str().into()).or_default();
                }
            }
            Change::Remove { key } => {
                let (parent, name) = split_key(key);
                let removed = self.dirs.get_mut(parent).and_then(|listing| Arc::make_mut(listing).remove(name));
                match removed {
                    Some(entry) if entry.flags & DIR != 0 => self.remove_subtree(&format!("{key}/")),
                    Some(_) => self.files -= 1,
                    None => {}
                }
            }
            Change::Rename { from, to } => self.rename(from, to),
            Change::Attributes { key, metadata, etag } => {
                let is_dir = key.ends_with('/');
                let (parent, name) = split_key(key.trim_end_matches('/'));
                let Some(listing) = self.dirs.get_mut(parent) else { return };
                let Ok(at) = listing.find(name) else { return };
                if (listing.entries[at].flags & DIR != 0) != is_dir {
                    return;
                }
                let listing = Arc::make_mut(listing);
                let entry = &mut listing.entries[at];
                match (is_dir, etag) {
                    (true, _) | (false, None) => {
                        if let Some(metadata) = metadata {
                            if is_dir {
                                entry.flags |= MARKER;
                            }
                            entry.metadata = Some(metadata.clone());
                        }
                    }
                    (false, Some(etag)) => {
                        let info = ObjectInfo {
                            key: key.clone(),
                            size: entry.size,
                            mtime: from_nanos(entry.mtime),
                            etag: etag.clone(),
                            metadata: None,
                        };
                        let metadata = metadata.clone().or_else(|| entry.metadata.clone());
                        listing.insert(name, Some(&info), 0, metadata);
                    }
                }
            }
        }
    }

    fn remove_subtree(&mut self, prefix: &str) {
        let below: Vec<Box<str>> = self.dirs.keys().filter(|p| p.starts_with(prefix)).cloned().collect();
        for dir in below {
            if let Some(listing) = self.dirs.remove(&dir) {
                self.files -= listing.entries.iter().filter(|e| e.flags & DIR == 0).count();
            }
        }
    }

    fn rename(&mut self, from: &str, to: &str) {
        let is_dir = from.ends_with('/');
        let (from_parent, from_name) = split_key(from.trim_end_matches('/'));
        let (to_parent, to_name) = split_key(to.trim_end_matches('/'));
        let Some(source) = self.dirs.get(from_parent).cloned() else { return };
        let Ok(at) = source.find(from_name) else { return };
        let packed = source.entries[at].clone();
        if (packed.flags & DIR != 0) != is_dir {
            return;
        }
        if let Some(listing) = self.dirs.get_mut(from_parent) {
            Arc::make_mut(listing).remove(from_name);
        }
        // What was at the new name is replaced.
        let replaced = self.dirs.get(to_parent).and_then(|listing| listing.get(to_name, to_parent));
        match replaced {
            Some(Indexed::Dir { .. }) => self.remove_subtree(&format!("{}/", to.trim_end_matches('/'))),
            Some(Indexed::File(_)) => self.files -= 1,
            None => {}
        }
        match self.dirs.get_mut(to_parent) {
            Some(listing) => {
                Arc::make_mut(listing).put_packed(to_name, packed, &source);
            }
            None if !is_dir => self.files -= 1, // moved out of what the index covers
            None => {}
        }
        if is_dir {
            let moved: Vec<Box<str>> = self.dirs.keys().filter(|p| p.starts_with(from)).cloned().collect();
            let covered = self.dirs.contains_key(to_parent);
            for old in moved {
                if let Some(listing) = self.dirs.remove(&old) {
                    if covered {
                        self.dirs.insert(format!("{to}{}", &old[from.len()..]).into(), listing);
                    } else {
                        self.files -= listing.entries.iter().filter(|e| e.flags & DIR == 0).count();
                    }
                }
            }
        }
    }
}

/// `a/b/c` → (`a/b/`, `c`); `c` → (``, `c`).
fn split_key(key: &str) -> (&str, &str) {
    match key.rfind('/') {
        Some(at) => (&key[..=at], &key[at + 1..]),
        None => ("", key),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::namespace::listing::tests::expected_entries;

    pub(crate) fn info(key: &str, size: u64) -> ObjectInfo {
        ObjectInfo {
            key: key.to_owned(),
            size,
            mtime: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            etag: Some(format!("\"{:032x}\"", size)),
            metadata: None,
        }
    }

    /// The index of `keys` built as a flat listing builds it.
    fn built(keys: &BTreeSet<String>) -> SourceIndex {
        super::super::build::index_of(keys.iter().map(|k| info(k, k.len() as u64)).collect(), "")
    }

    fn shown(index: &SourceIndex, prefix: &str) -> BTreeMap<String, bool> {
        let listing = index.dir(prefix).expect("a listed directory");
        (0..listing.len())
            .map(|at| (listing.name(at).to_owned(), matches!(listing.entry(at, prefix).1, Indexed::Dir { .. })))
            .collect()
    }

    /// Equal metadata, listed in separate pages (or loaded from a saved index), ends
    /// as one shared copy in a built index; different metadata stays apart.
    #[test]
    fn equal_metadata_is_shared() {
        let with = |key: &str, kind: &str| ObjectInfo {
            metadata: Some(Arc::new(Metadata { content_type: Some(kind.to_owned()), ..Metadata::default() })),
            ..info(key, 1)
        };
        let objects = vec![
            with("d/a", "text/plain"),
            with("d/b", "text/plain"),
            with("e/c", "text/plain"),
            with("e/d", "image/png"),
        ];
        // Each object its own copy, as pages of a build or a load give them.
        let index = super::super::build::index_of(objects, "");
        let metadata_of = |prefix: &str, name: &str| match index.lookup(prefix, name) {
            Some(Indexed::File(object)) => object.metadata.expect("metadata"),
            other => panic!("{prefix}{name}: {other:?}"),
        };
        let (a, b, c, d) =
            (metadata_of("d/", "a"), metadata_of("d/", "b"), metadata_of("e/", "c"), metadata_of("e/", "d"));
        assert!(Arc::ptr_eq(&a, &b) && Arc::ptr_eq(&a, &c), "one copy of text/plain");
        assert!(!Arc::ptr_eq(&a, &d));
        assert_eq!(d.content_type.as_deref(), Some("image/png"));
    }

    #[test]
    fn names_after_a_name_here_or_not() {
        let keys: BTreeSet<String> = ["d/a", "d/c", "d/e", "d/sub/x"].iter().map(|k| k.to_string()).collect();
        let listing = built(&keys).dir("d/").expect("d");
        assert_eq!(listing.names_after("a", 10), ["c", "e", "sub"]);
        assert_eq!(listing.names_after("b", 1), ["c"], "b is not there: from where it would be");
        assert!(listing.names_after("sub", 10).is_empty());
    }

    /// Every directory of the index against the model, from the root down; returns
    /// the files seen.
    fn check(index: &SourceIndex, keys: &BTreeSet<String>, prefix: &str) -> Result<usize, TestCaseError> {
        let shown = shown(index, prefix);
        prop_assert_eq!(&shown, &expected_entries(keys, prefix), "directory {:?}", prefix);
        let mut files = 0;
        for (name, is_dir) in shown {
            if is_dir {
                files += check(index, keys, &format!("{prefix}{name}/"))?;
            } else {
                files += 1;
                let Some(Indexed::File(object)) = index.lookup(prefix, &name) else {
                    return Err(TestCaseError::fail(format!("{prefix}{name} is not a file")));
                };
                prop_assert_eq!(object, info(&format!("{prefix}{name}"), (prefix.len() + name.len()) as u64));
            }
        }
        Ok(files)
    }

    fn key_strategy() -> impl Strategy<Value = String> {
        let component = prop::sample::select(vec!["a", "b", "a-", "a.", ".", "", "a b"]);
        prop::collection::vec(component, 1..5).prop_map(|parts| parts.join("/"))
    }

    /// The model after a change: the key set the store would hold, except that a
    /// directory emptied through the mount stays in the index until the next refresh
    /// (as if it had a marker).
    fn apply_to_model(keys: &mut BTreeSet<String>, change: &Change) {
        let gone = match change {
            Change::Remove { key } => Some(key.clone()),
            Change::Rename { from, .. } => Some(from.trim_end_matches('/').to_owned()),
            _ => None,
        };
        apply_to_keys(keys, change);
        let Some(gone) = gone else { return };
        let mut ancestor = gone.as_str();
        while let Some(at) = ancestor.rfind('/') {
            ancestor = &ancestor[..at];
            let prefix = format!("{ancestor}/");
            if !keys.iter().any(|k| k.starts_with(&prefix)) {
                keys.insert(prefix);
            }
        }
    }

    fn apply_to_keys(keys: &mut BTreeSet<String>, change: &Change) {
        match change {
            Change::File(info) => {
                keys.insert(info.key.clone());
            }
            Change::Dir { prefix, .. } => {
                keys.insert(prefix.clone());
            }
            Change::Remove { key } => {
                keys.remove(key);
                keys.retain(|k| !k.starts_with(&format!("{key}/")));
            }
            Change::Rename { from, to } => {
                let moved: Vec<String> = keys.iter().filter(|k| k.starts_with(from.as_str())).cloned().collect();
                if from.ends_with('/') {
                    keys.retain(|k| {
                        !k.starts_with(&format!("{}/", to.trim_end_matches('/'))) && k != to.trim_end_matches('/')
                    });
                    for key in moved {
                        keys.remove(&key);
                        keys.insert(format!("{to}{}", &key[from.len()..]));
                    }
                } else if keys.remove(from) {
                    keys.insert(to.clone());
                }
            }
            Change::Attributes { .. } => {}
        }
    }

    proptest! {
        /// Built from any key set, every directory shows what a delimited listing of it
        /// would, and every file its size, mtime and ETag.
        #[test]
        fn the_index_shows_every_directory_as_a_delimited_listing_would(
            keys in prop::collection::btree_set(key_strategy(), 0..40),
        ) {
            let index = built(&keys);
            let files = check(&index, &keys, "")?;
            prop_assert_eq!(index.files(), files);
        }

        /// Changes made through the mount (the ones the mount can make: in directories
        /// that exist, to names that pass the name rules) keep the index equal to an index
        /// built again from the changed key set.
        #[test]
        fn changes_keep_the_index_equal_to_a_fresh_listing(
            keys in prop::collection::btree_set(prop::sample::select(vec!["a/x", "a/y", "b/x", "b/c/z", "f", "a/", "g"]), 0..7),
            changes in prop::collection::vec((0u8..4, prop::sample::select(vec!["a", "b", "h", "a/x", "b/c", "a/n", "b/c/z", "f"]), prop::sample::select(vec!["a", "k", "a/m", "b/c", "f2"])), 0..6),
        ) {
            let keys: BTreeSet<String> = keys.into_iter().map(String::from).collect();
            let mut model = keys.clone();
            let mut index = built(&keys);
            for (op, target, destination) in changes {
                let existing = index.lookup(split_key(target).0, split_key(target).1);
                if index.dir(split_key(target).0).is_none() {
                    continue; // the mount changes only names in directories that exist
                }
                let change = match (op, existing) {
                    (0, None) => Change::File(info(target, target.len() as u64)),
                    (1, None) => Change::Dir { prefix: format!("{target}/"), metadata: Arc::default() },
                    (2, Some(_)) => Change::Remove { key: target.to_owned() },
                    (3, Some(kind)) => {
                        let (parent, _) = split_key(destination);
                        let target_entry = index.lookup(parent, split_key(destination).1);
                        // rename(2) refuses to move a directory into itself or onto its
                        // ancestor, and onto a directory that is not empty.
                        let into_itself = destination.starts_with(&format!("{target}/")) || destination == target;
                        let onto_ancestor = target.starts_with(&format!("{destination}/"));
                        let onto_full_dir = index.dir(&format!("{destination}/")).is_some_and(|d| !d.is_empty());
                        if index.dir(parent).is_none() || into_itself || onto_ancestor || onto_full_dir {
                            continue;
                        }
                        let is_dir = matches!(kind, Indexed::Dir { .. });
                        // rename(2) refuses a directory onto a file and a file onto a directory.
                        if target_entry.as_ref().is_some_and(|t| matches!(t, Indexed::Dir { .. }) != is_dir) {
                            continue;
                        }
                        if is_dir {
                            Change::Rename { from: format!("{target}/"), to: format!("{destination}/") }
                        } else {
                            Change::Rename { from: target.to_owned(), to: destination.to_owned() }
                        }
                    }
                    _ => continue,
                };
                apply_to_model(&mut model, &change);
                index.apply(&change);
            }
            let fresh = built(&model);
            let mut expected = BTreeMap::new();
            let mut got = BTreeMap::new();
            for (prefix, listing) in &fresh.dirs {
                expected.insert(prefix.to_string(), (0..listing.len()).map(|at| listing.name(at).to_owned()).collect::<Vec<_>>());
            }
            for (prefix, listing) in &index.dirs {
                got.insert(prefix.to_string(), (0..listing.len()).map(|at| listing.name(at).to_owned()).collect::<Vec<_>>());
            }
            prop_assert_eq!(got, expected);
            prop_assert_eq!(index.files(), fresh.files());
        }
    }

    #[test]
    fn etags_come_back_exactly_as_sent() {
        for etag in [
            "\"0123456789abcdef0123456789abcdef\"",
            "\"0123456789abcdef0123456789abcdef-17\"",
            "\"ABC\"",
            "weird",
            "\"0123456789abcdef0123456789abcdef-01\"",
        ] {
            let mut listing = DirListing::default();
            let object = ObjectInfo { etag: Some(etag.to_owned()), ..info("n", 1) };
            listing.insert("n", Some(&object), 0, None);
            assert_eq!(listing.get("n", ""), Some(Indexed::File(object)), "{etag}");
        }
        assert_eq!(parse_md5_etag("\"0123456789abcdef0123456789abcdef-01\""), None, "kept as text");
    }

    /// Memory per key of a realistic shape (depth 4–8, names of 10–40 bytes): the
    /// issue's target is 150 B.
    #[test]
    fn a_key_costs_well_under_150_bytes() {
        let mut keys = BTreeSet::new();
        for i in 0..20_000u32 {
            let depth = 4 + (i % 5);
            let mut key = String::new();
            for level in 0..depth - 1 {
                key.push_str(&format!("directory-{level}-{:03}/", (i / 40 + level) % 50));
            }
            key.push_str(&format!("file-name-{i:08}-{}.dat", "x".repeat((i % 20) as usize)));
            keys.insert(key);
        }
        let index = built(&keys);
        let per_key = index.heap_bytes() / keys.len();
        eprintln!("index: {per_key} bytes per key, {} keys in {} directories", keys.len(), index.dirs());
        assert!(per_key <= 110, "{per_key} bytes per key");
    }
}
