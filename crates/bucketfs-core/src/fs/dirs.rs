//! Directories being read: where each read of a directory is, with or without a handle.
//!
//! Normally each open directory has a [`DirCursor`] under its handle, from OPENDIR to
//! RELEASEDIR. A mount whose every directory is served from the listing index answers
//! OPENDIR with ENOSYS instead (see `fuse::FuseAdapter::opendir`): the kernel then opens
//! directories without asking us and keeps their listings, as it does for indexed
//! directories anyway, and a walk costs two requests per directory instead of four (a
//! cold `find` over the linux-5.12.13 shape 17% faster, a warm one 45%). Such READDIRs
//! come without a handle: the cursor a read began with is found again from the offset the
//! kernel hands back, which carries a tag of that read in its high bits. So a read goes on
//! in the listing it started with even when a refresh swaps the index meanwhile. The
//! cursors of the [`UNOPENED_READS`] most recent reads are kept, each until its end; a read
//! whose cursor was dropped (more reads than that in progress at once) goes on from the
//! same position in the directory's listing as it is then.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use fuser::FileAttr;
use lru::LruCache;
use parking_lot::Mutex;

use super::error::FsError;
use super::Fs;
use crate::namespace::{DirStream, Ino, Listed, Node};

/// Handle-less reads whose cursors are kept (a walk has one in progress at a time, `ls`
/// of several directories a few).
const UNOPENED_READS: usize = 64;
/// The handle of a directory the kernel opened without OPENDIR.
pub const NO_HANDLE: u64 = 0;
/// Low bits of an offset: the position in the directory; high bits: the read's tag.
const POSITION_BITS: u32 = 32;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
/// Tags stay below 2^31 so that offsets stay positive (`loff_t`, `telldir`).
const TAG_MASK: u32 = (1 << 31) - 1;

/// An entry handed out by `readdir`, with the offset that resumes after it; lent, not
/// copied: a READDIRPLUS answer holds a few hundred of a batch of up to a thousand.
pub struct DirEntry<'a> {
    pub offset: u64,
    pub name: &'a str,
    pub attr: FileAttr,
    /// `attr` is final; if not (stored attributes not fetched yet), it must not be cached.
    pub attr_complete: bool,
    /// What `attr` was made from (see [`Fs::add_lookup_of`]).
    pub(super) node: &'a Node,
}

/// Where one read of a directory is: a window of entries from the listing stream.
/// Entry `i` of the directory (0 = `.`, 1 = `..`) has position `i + 1`.
struct DirCursor {
    stream: DirStream,
    /// Index of `window[0]` in the directory.
    window_start: u64,
    window: Vec<Listed>,
}

type SharedCursor = Arc<tokio::sync::Mutex<DirCursor>>;

pub(super) struct OpenDirs {
    by_handle: Mutex<HashMap<u64, SharedCursor>>,
    unopened: Mutex<LruCache<u32, SharedCursor>>,
    next_tag: AtomicU32,
}

impl OpenDirs {
    pub fn new() -> Self {
        let kept = NonZeroUsize::new(UNOPENED_READS).unwrap_or(NonZeroUsize::MIN);
        Self {
            by_handle: Mutex::new(HashMap::new()),
            unopened: Mutex::new(LruCache::new(kept)),
            next_tag: AtomicU32::new(1),
        }
    }

    fn new_tag(&self) -> u32 {
        loop {
            let tag = self.next_tag.fetch_add(1, Ordering::Relaxed) & TAG_MASK;
            if tag != 0 {
                return tag;
            }
        }
    }
}

impl Fs {
    /// A handle to read directory `ino`, and whether the kernel may keep its listing
    /// across opens (served from the index: see [`Self::held_indexed_dirs`]).
    pub fn opendir(&self, ino: Ino) -> Result<(u64, bool), FsError> {
        let stream = self.namespace.list(ino)?;
        let handle = self.handles.next();
        let cursor = DirCursor { stream, window_start: 2, window: Vec::new() };
        self.handles.dirs.by_handle.lock().insert(handle, Arc::new(tokio::sync::Mutex::new(cursor)));
        Ok((handle, self.namespace.is_indexed_dir(ino)))
    }

    /// Whether every directory is served from the listing index, so that the kernel may
    /// open directories without OPENDIR and keep every listing (see the module's doc).
    pub fn lists_every_dir_from_the_index(&self) -> bool {
        self.namespace.lists_every_dir_from_the_index()
    }

    pub fn releasedir(&self, handle: u64) {
        self.handles.dirs.by_handle.lock().remove(&handle);
    }

    /// Hands the entries of directory `dir` from `offset` on (read through `handle`, or
    /// [`NO_HANDLE`]) to `add`, in order, until it says the answer is full (true) or the
    /// batch ends; none handed out means the end of the directory.
    pub async fn readdir(
        &self,
        dir: Ino,
        handle: u64,
        offset: u64,
        add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<(), FsError> {
        if handle != NO_HANDLE {
            let cursor = self.handles.dirs.by_handle.lock().get(&handle).cloned().ok_or(FsError::BadHandle)?;
            let mut cursor = cursor.lock().await;
            return self.entries_from(&mut cursor, offset, 0, add).await.map(drop);
        }
        let tag = (offset >> POSITION_BITS) as u32;
        let position = offset & POSITION_MASK;
        // Offset 0 starts a read (opendir, rewinddir); a later one goes on with its cursor.
        let kept = if position == 0 { None } else { self.handles.dirs.unopened.lock().get(&tag).cloned() };
        let (tag, cursor) = match kept {
            Some(cursor) => (tag, cursor),
            None => {
                let cursor = Arc::new(tokio::sync::Mutex::new(self.cursor_at(dir, position)?));
                let tag = self.handles.dirs.new_tag();
                self.handles.dirs.unopened.lock().put(tag, cursor.clone());
                (tag, cursor)
            }
        };
        let handed =
            self.entries_from(&mut *cursor.lock().await, position, u64::from(tag) << POSITION_BITS, add).await?;
        if handed == 0 {
            self.handles.dirs.unopened.lock().pop(&tag);
        }
        Ok(())
    }

    /// A cursor for a read of `dir` at `position`: there in an indexed directory, else at
    /// the start (the read then lists up to `position`).
    fn cursor_at(&self, dir: Ino, position: u64) -> Result<DirCursor, FsError> {
        let mut stream = self.namespace.list(dir)?;
        let window_start = if position > 2 && stream.resume_indexed_at(&self.namespace, (position - 2) as usize) {
            position
        } else {
            2
        };
        Ok(DirCursor { stream, window_start, window: Vec::new() })
    }

    /// Hands `add` the entries from position `offset` on, their offsets marked with
    /// `tag_bits`, until it says the answer is full; returns how many it was handed.
    async fn entries_from(
        &self,
        cursor: &mut DirCursor,
        offset: u64,
        tag_bits: u64,
        mut add: impl FnMut(DirEntry<'_>) -> bool,
    ) -> Result<usize, FsError> {
        let mut handed = 0;
        for (index, name, ino) in [(0, ".", cursor.stream.dir), (1, "..", cursor.stream.parent)] {
            if offset <= index {
                let node = self.namespace.node(ino)?;
                handed += 1;
                if add(self.dir_entry(tag_bits | (index + 1), name, &node)) {
                    return Ok(handed);
                }
            }
        }
        let wanted = offset.max(2);
        if wanted < cursor.window_start {
            // rewinddir() or a seek back: list again from the start.
            let dir = cursor.stream.dir;
            *cursor = DirCursor { stream: self.namespace.list(dir)?, window_start: 2, window: Vec::new() };
        }
        while wanted >= cursor.window_start + cursor.window.len() as u64 {
            let DirCursor { stream, .. } = &mut *cursor;
            let batch = stream.next_batch(&self.namespace).await?;
            if batch.is_empty() {
                return Ok(handed);
            }
            cursor.window_start += cursor.window.len() as u64;
            cursor.window = batch;
        }
        let skip = (wanted - cursor.window_start) as usize;
        for (i, listed) in cursor.window.iter().enumerate().skip(skip) {
            let position = cursor.window_start + i as u64 + 1;
            handed += 1;
            if add(self.dir_entry(tag_bits | position, &listed.name, &listed.node)) {
                break;
            }
        }
        Ok(handed)
    }

    fn dir_entry<'a>(&self, offset: u64, name: &'a str, node: &'a Node) -> DirEntry<'a> {
        let attr_complete = node.metadata.is_some() || self.config.presentation.attributes_from_listing;
        DirEntry { offset, name, attr: self.attr(node), attr_complete, node }
    }
}
