//! The filesystem: what each operation means, independent of how FUSE delivers it.
//!
//! [`Fs`] owns the namespace and the open handles, turns namespace nodes into file
//! attributes (modes and owners come from the mount options), and decides what an
//! operation may do. Files open for reading get a [`ReadHandle`], files open for writing
//! an [`Upload`] committed at `flush`/`fsync`. With `--read-only` every change is refused
//! with EROFS (and the kernel, seeing a read-only mount, refuses most before they reach us).

pub mod error;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{FileAttr, FileType, INodeNo};
use parking_lot::Mutex;

use crate::memory::MemoryLimiter;
use crate::namespace::{DirStream, Ino, Listed, Location, Namespace, Node};
use crate::read::{ReadConfig, ReadHandle};
use crate::write::Upload;
use error::FsError;

/// Ownership and permission bits shown for every entry (S3 has none of its own).
#[derive(Clone, Debug)]
pub struct Presentation {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
}

/// What may be changed, and how uploads are cut.
#[derive(Clone, Debug)]
pub struct WriteConfig {
    pub read_only: bool,
    pub part_size: u64,
}

/// What a `setattr` asks to change.
#[derive(Clone, Copy, Debug)]
pub struct AttrChange {
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub explicit_time: bool,
}

/// A file open for writing.
struct Writer {
    /// The thread that opened the file; see [`Fs::flush`].
    opener: u32,
    /// A new file (rather than an existing one being replaced).
    created: bool,
    ino: Ino,
    parent: Ino,
    name: String,
    upload: Upload,
}

pub struct Fs {
    namespace: Namespace,
    presentation: Presentation,
    read_config: ReadConfig,
    write_config: WriteConfig,
    writers: Mutex<HashMap<u64, Arc<Writer>>>,
    memory: Arc<MemoryLimiter>,
    files: Mutex<HashMap<u64, Arc<ReadHandle>>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirCursor>>>>,
    /// ETag each file had when last opened: if it is unchanged, the kernel may keep the
    /// pages it cached from an earlier open.
    opened_etags: Mutex<HashMap<Ino, String>>,
    next_handle: AtomicU64,
}

/// An open file.
pub struct Opened {
    pub handle: u64,
    /// The kernel's cached pages of this file are still valid.
    pub keep_cache: bool,
}

/// An entry returned by `readdir`, with the offset that resumes after it.
pub struct DirEntry {
    pub offset: u64,
    pub name: String,
    pub attr: FileAttr,
}

/// The state of one open directory: a window of entries from the listing stream.
/// Entry `i` of the directory (0 = `.`, 1 = `..`) has offset `i + 1`.
struct DirCursor {
    stream: DirStream,
    /// Index of `window[0]` in the directory.
    window_start: u64,
    window: Vec<Listed>,
}

impl Fs {
    pub fn new(
        namespace: Namespace,
        presentation: Presentation,
        read_config: ReadConfig,
        write_config: WriteConfig,
        memory: Arc<MemoryLimiter>,
    ) -> Self {
        Self {
            namespace,
            presentation,
            read_config,
            write_config,
            writers: Mutex::new(HashMap::new()),
            memory,
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            opened_etags: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        }
    }

    pub fn read_only(&self) -> bool {
        self.write_config.read_only
    }

    /// How long the kernel may trust entries and attributes we return.
    pub fn ttl(&self) -> Duration {
        self.namespace.ttl()
    }

    pub async fn lookup(&self, parent: Ino, name: &str) -> Result<FileAttr, FsError> {
        let node = self.namespace.lookup(parent, name).await?;
        Ok(self.attr(&node))
    }

    pub async fn getattr(&self, ino: Ino) -> Result<FileAttr, FsError> {
        let node = self.namespace.getattr(ino).await?;
        Ok(self.attr(&node))
    }

    pub async fn open(&self, ino: Ino, flags: i32, opener: u32) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return self.open_for_writing(ino, flags, opener).await;
        }
        let node = self.namespace.getattr(ino).await?;
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        let reader = ReadHandle::new(
            self.namespace.store(*source).clone(),
            key,
            node.etag.as_deref(),
            node.size,
            self.read_config.clone(),
            self.memory.clone(),
        );
        let keep_cache = match &node.etag {
            Some(etag) => self.opened_etags.lock().insert(ino, etag.clone()).as_deref() == Some(etag),
            None => false,
        };
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.files.lock().insert(handle, Arc::new(reader));
        Ok(Opened { handle, keep_cache })
    }

    pub async fn read(&self, handle: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        let reader = self.files.lock().get(&handle).cloned().ok_or(FsError::BadHandle)?;
        reader.read(offset, u64::from(size)).await
    }

    /// Creates `name` in `parent` and opens it for writing.
    pub async fn create(&self, parent: Ino, name: &str, opener: u32) -> Result<(FileAttr, Opened), FsError> {
        self.check_writable()?;
        let (source, key) = self.namespace.new_entry_key(parent, name).await?;
        let node = self.namespace.enter_pending_file(parent, name, source, key.clone());
        let upload = self.new_upload(source, key, true);
        let opened = self.add_writer(Writer { opener, created: true, ino: node.ino, parent, name: name.to_owned(), upload });
        Ok((self.attr(&node), opened))
    }

    /// Opening an existing file for writing: with O_TRUNC the object is replaced by what
    /// is written; changing an object in place needs a staging file (not yet).
    async fn open_for_writing(&self, ino: Ino, flags: i32, opener: u32) -> Result<Opened, FsError> {
        self.check_writable()?;
        let node = self.namespace.getattr(ino).await?;
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        if flags & libc::O_TRUNC == 0 && node.size > 0 {
            return Err(FsError::Unsupported("changing an existing object in place (open without O_TRUNC)"));
        }
        let (parent, name) = node.parent_and_name();
        self.namespace.enter_pending_file(parent, &name, *source, key.clone());
        let upload = self.new_upload(*source, key.clone(), false);
        Ok(self.add_writer(Writer { opener, created: false, ino, parent, name, upload }))
    }

    pub async fn write(&self, handle: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let writer = self.writers.lock().get(&handle).cloned().ok_or(FsError::BadHandle)?;
        let size = writer.upload.write(offset, data).await?;
        self.namespace.set_pending_size(writer.ino, size);
        Ok(data.len() as u32)
    }

    /// `close()`: commits when the thread that opened the file closes it. A forked child
    /// closes its inherited copy of the descriptor too (at exit, or at exec for
    /// close-on-exec descriptors); committing then would end the file while the parent is
    /// still writing. Other closes leave the commit to the opener's close or to release.
    pub async fn flush(&self, handle: u64, closer: u32) -> Result<(), FsError> {
        let opener = self.writers.lock().get(&handle).map(|w| w.opener);
        match opener {
            Some(opener) if opener == closer => self.commit(handle).await,
            _ => Ok(()),
        }
    }

    /// `fsync()` and the opener's `close()`: the object is in the bucket when this returns
    /// `Ok`. A new file whose upload failed disappears from the directory (no phantom
    /// entries).
    pub async fn commit(&self, handle: u64) -> Result<(), FsError> {
        let Some(writer) = self.writers.lock().get(&handle).cloned() else {
            return Ok(()); // a read handle: nothing to do
        };
        match writer.upload.commit().await {
            Ok(etag) => {
                self.namespace.upload_done(writer.ino, etag);
                Ok(())
            }
            Err(error) => {
                tracing::warn!(key = writer.upload.key(), "upload failed: {error}");
                if writer.created {
                    self.namespace.remove_entry(writer.parent, &writer.name);
                } else {
                    // The old object is still there: forget what we showed, ask S3 again.
                    self.namespace.upload_abandoned(writer.ino);
                }
                Err(error)
            }
        }
    }

    pub async fn release(&self, handle: u64) {
        self.files.lock().remove(&handle);
        if self.writers.lock().contains_key(&handle) {
            // Usually committed at the last flush already; if not, nobody is left to hear
            // of an error, so it is logged.
            let _ = self.commit(handle).await;
            self.writers.lock().remove(&handle);
        }
    }

    pub async fn mkdir(&self, parent: Ino, name: &str) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let (source, key) = self.namespace.new_entry_key(parent, name).await?;
        let prefix = format!("{key}/");
        self.namespace.store(source).put(&prefix, Bytes::new(), true).await?;
        Ok(self.attr(&self.namespace.enter_dir(parent, name, source, prefix)))
    }

    pub async fn unlink(&self, parent: Ino, name: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let node = self.namespace.lookup(parent, name).await?;
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        let open_writers: Vec<_> = self.writers.lock().values().filter(|w| w.ino == node.ino).cloned().collect();
        for writer in &open_writers {
            writer.upload.discard().await;
        }
        self.namespace.store(*source).delete(key).await?;
        self.namespace.remove_entry(parent, name);
        Ok(())
    }

    pub async fn rmdir(&self, parent: Ino, name: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let node = self.namespace.lookup(parent, name).await?;
        let Location::Dir { source, prefix } = &node.location else {
            return Err(FsError::NotDir);
        };
        let store = self.namespace.store(*source);
        // Two keys are enough to tell: the marker `dir/` itself, and anything else.
        let page = store.list(prefix, None, Some(2)).await?;
        let only_marker = page.prefixes.is_empty() && page.objects.iter().all(|o| o.key == *prefix);
        if !only_marker || self.namespace.has_pending_children(node.ino) {
            return Err(FsError::NotEmpty);
        }
        store.delete(prefix).await?;
        self.namespace.remove_entry(parent, name);
        Ok(())
    }

    /// `chmod`, `chown`, `utimens`, `truncate`. Modes, owners and times are not stored in
    /// S3 yet, so only "changes" to what is already shown succeed (tools that set what a
    /// file already has keep working); anything else is refused rather than pretended.
    pub async fn setattr(&self, ino: Ino, change: AttrChange) -> Result<FileAttr, FsError> {
        let current = self.getattr(ino).await?;
        let unchanged = change.mode.is_none_or(|mode| mode == current.perm)
            && change.uid.is_none_or(|uid| uid == current.uid)
            && change.gid.is_none_or(|gid| gid == current.gid)
            && !change.explicit_time;
        if !unchanged {
            self.check_writable()?;
            return Err(FsError::NotPermitted);
        }
        match change.size {
            Some(size) => self.truncate(ino, size).await,
            None => Ok(current),
        }
    }

    /// `truncate()` without an open handle: only to 0 (a new empty object) or the current size.
    async fn truncate(&self, ino: Ino, size: u64) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let node = self.namespace.getattr(ino).await?;
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        if size == node.size {
            return Ok(self.attr(&node));
        }
        if size != 0 {
            return Err(FsError::Unsupported("truncating to a size other than 0"));
        }
        if self.writers.lock().values().any(|w| w.ino == ino) {
            return Err(FsError::Unsupported("truncating a file while it is being written"));
        }
        let etag = self.namespace.store(*source).put(key, Bytes::new(), false).await?;
        self.namespace.set_pending_size(ino, 0);
        self.namespace.upload_done(ino, etag);
        Ok(self.attr(&self.namespace.node(ino)?))
    }

    fn check_writable(&self) -> Result<(), FsError> {
        if self.write_config.read_only {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    fn new_upload(&self, source: usize, key: String, create_only: bool) -> Upload {
        let store = self.namespace.store(source).clone();
        Upload::new(store, key, create_only, self.write_config.part_size, self.memory.clone())
    }

    fn add_writer(&self, writer: Writer) -> Opened {
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        self.writers.lock().insert(handle, Arc::new(writer));
        Opened { handle, keep_cache: false }
    }

    pub fn opendir(&self, ino: Ino) -> Result<u64, FsError> {
        let stream = self.namespace.list(ino)?;
        let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
        let cursor = DirCursor { stream, window_start: 2, window: Vec::new() };
        self.dirs.lock().insert(handle, Arc::new(tokio::sync::Mutex::new(cursor)));
        Ok(handle)
    }

    /// Entries from index `offset` on; an empty result means the end of the directory.
    pub async fn readdir(&self, handle: u64, offset: u64) -> Result<Vec<DirEntry>, FsError> {
        let cursor = self.dirs.lock().get(&handle).cloned().ok_or(FsError::BadHandle)?;
        let mut cursor = cursor.lock().await;
        let mut out = Vec::new();
        for (index, name, ino) in [(0, ".", cursor.stream.dir), (1, "..", cursor.stream.parent)] {
            if offset <= index {
                let node = self.namespace.node(ino)?;
                out.push(DirEntry { offset: index + 1, name: name.to_owned(), attr: self.attr(&node) });
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
                return Ok(out);
            }
            cursor.window_start += cursor.window.len() as u64;
            cursor.window = batch;
        }
        let skip = (wanted - cursor.window_start) as usize;
        for (i, listed) in cursor.window.iter().enumerate().skip(skip) {
            out.push(DirEntry {
                offset: cursor.window_start + i as u64 + 1,
                name: listed.name.clone(),
                attr: self.attr(&listed.node),
            });
        }
        Ok(out)
    }

    pub fn releasedir(&self, handle: u64) {
        self.dirs.lock().remove(&handle);
    }

    /// The attributes of a negative entry (inode 0): "no such name", cacheable.
    pub fn missing_attr(&self) -> FileAttr {
        FileAttr { ino: INodeNo(0), size: 0, blocks: 0, nlink: 0, ..self.attr_of(0, 0, SystemTime::UNIX_EPOCH, false) }
    }

    fn attr(&self, node: &Node) -> FileAttr {
        self.attr_of(node.ino, node.size, node.mtime, node.location.is_dir())
    }

    fn attr_of(&self, ino: Ino, size: u64, mtime: SystemTime, is_dir: bool) -> FileAttr {
        let p = &self.presentation;
        let (kind, perm, nlink) = if is_dir {
            // nlink 1 tells find(1) not to count subdirectories from the link count.
            (FileType::Directory, p.dir_mode, 1)
        } else {
            (FileType::RegularFile, p.file_mode, 1)
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: p.uid,
            gid: p.gid,
            rdev: 0,
            blksize: 1024 * 1024,
            flags: 0,
        }
    }
}
