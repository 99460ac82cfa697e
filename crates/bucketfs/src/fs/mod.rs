//! The filesystem: what each operation means, independent of how FUSE delivers it.
//!
//! [`Fs`] owns the namespace and the open handles, turns namespace nodes into file
//! attributes (modes and owners come from the mount options), and decides what an
//! operation may do. It is read-only for now: every write is refused with EROFS here,
//! and the mount is also made read-only, so the kernel refuses most writes before
//! they reach us.

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
use error::FsError;

/// Ownership and permission bits shown for every entry (S3 has none of its own).
#[derive(Clone, Debug)]
pub struct Presentation {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
}

pub struct Fs {
    namespace: Namespace,
    presentation: Presentation,
    read_config: ReadConfig,
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
    pub fn new(namespace: Namespace, presentation: Presentation, read_config: ReadConfig, memory: Arc<MemoryLimiter>) -> Self {
        Self {
            namespace,
            presentation,
            read_config,
            memory,
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            opened_etags: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        }
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

    pub async fn open(&self, ino: Ino, flags: i32) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(FsError::ReadOnly);
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

    pub fn release(&self, handle: u64) {
        self.files.lock().remove(&handle);
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
