//! The filesystem: what each operation means, independent of how FUSE delivers it.
//!
//! [`Fs`] owns the namespace and the open handles, turns namespace nodes into file
//! attributes, and decides what an operation may do. Modes, owners and times come from
//! object metadata ([`attrs`], s3fs's format) where it sets them, else from the mount
//! options and Last-Modified. Special files (FIFOs, sockets, devices) are empty objects
//! whose stored mode says what they are, as s3fs stores them: the kernel does their I/O. Files open for reading get a [`ReadHandle`], files open for
//! writing an [`Upload`] committed at `flush`/`fsync`. With `--read-only` every change is
//! refused with EROFS (and the kernel, seeing a read-only mount, refuses most before
//! they reach us).

pub mod attrs;
mod change;
mod content_type;
mod copy;
mod deletes;
mod dir_markers;
mod dirs;
pub mod error;
mod handles;
#[cfg(test)]
mod model_test;
mod rename;
mod small_ahead;
mod write_back;
mod writers;
mod xattrs;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{FileAttr, FileType, INodeNo};

use crate::datacache::{DataCache, ObjectId};
use crate::memory::MemoryLimiter;
use crate::namespace::{History, Ino, Location, Namespace, Node};
use crate::read::{CacheLink, ReadConfig, ReadHandle};
use crate::write::journal::Journal;
use crate::write::staging::{Base, Staged, StagingConfig};
use crate::write::write_back::Amendment;
use crate::write::write_back::WriteBackLog;
use crate::write::{HeldBytes, Move, Output, Upload, Written};
use attrs::StoredAttrs;
use bucketfs_client::store::{Metadata, WriteCondition};
use deletes::PendingDeletes;
use dir_markers::PendingMarkers;
pub use dirs::DirEntry;
use error::FsError;
use handles::{process_of, Handles, Reader};
pub use handles::{Backing, Opened};
use small_ahead::SmallFilesAhead;
pub use write_back::WRITE_BACK;
use writers::{Writer, Writers};
pub use xattrs::INDEX_REFRESH;

const S_IFMT: u32 = libc::S_IFMT;
const S_IFREG: u32 = libc::S_IFREG;
const S_IFDIR: u32 = libc::S_IFDIR;
const S_IFLNK: u32 = libc::S_IFLNK;
const S_IFIFO: u32 = libc::S_IFIFO;
const S_IFSOCK: u32 = libc::S_IFSOCK;
const S_IFCHR: u32 = libc::S_IFCHR;
const S_IFBLK: u32 = libc::S_IFBLK;
/// Content type of directory markers, as s3fs writes them.
const DIRECTORY_CONTENT_TYPE: &str = "application/x-directory";
/// Objects copied (then deleted) at once when renaming a directory.
const RENAME_CONCURRENCY: usize = 16;
/// Moves of a file between outputs for one write (see `Fs::write`).
const MOST_MOVES: usize = 4;
/// `st_blksize` of files and of directories (see `Fs::attr`).
const FILE_BLKSIZE: u32 = 1024 * 1024;
const DIR_BLKSIZE: u32 = 32 * 1024;

/// Ownership and permission bits shown for entries whose metadata does not set them.
#[derive(Clone, Debug)]
pub struct Presentation {
    pub uid: u32,
    pub gid: u32,
    pub file_mode: u16,
    pub dir_mode: u16,
    /// Show listed entries with the defaults rather than HEAD each one for its stored
    /// attributes (`--attributes-from-listing`).
    pub attributes_from_listing: bool,
}

/// Who asks: the calling thread (as FUSE names it; see `handles::process_of`) and its
/// credentials.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub thread: u32,
    pub uid: u32,
    pub gid: u32,
}

/// What may be changed, and how uploads are cut.
#[derive(Clone, Debug)]
pub struct WriteConfig {
    pub read_only: bool,
    pub part_size: u64,
    pub staging: StagingConfig,
    /// Where uploads in progress are recorded (see `write::journal`).
    pub journal: Option<Arc<Journal>>,
    /// Where `--write-back` records the files it closes, and where files the store
    /// refused are kept, also those a replay took over (see `write::write_back`).
    pub write_back_log: Option<Arc<WriteBackLog>>,
    /// `--write-back`: `close()` returns before the upload (see [`Fs::flush`]).
    pub write_back: bool,
    /// Store new files with the Content-Type their name calls for (`content_type.rs`).
    pub content_type_from_name: bool,
}

/// Who hears the outcome of a commit (see [`Fs::commit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heard {
    ByCaller,
    ByNobody,
}

/// What a `setattr` asks to change.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttrChange {
    /// Permission bits (`& 0o7777`).
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub mtime: Option<SystemTime>,
    pub atime: Option<SystemTime>,
    /// The descriptor it came through (`ftruncate`, `fchmod`), if any.
    pub handle: Option<u64>,
    /// The file loses its set-ID bits with this change (a `chown`, or a `truncate` by a
    /// caller without CAP_FSETID, where the kernel leaves that to the daemon): see
    /// [`without_set_id_bits`].
    pub drop_set_id: bool,
}

/// Permission bits `perm` without what a write, `truncate` or `chown` takes away: the
/// set-user-ID bit, and the set-group-ID bit if the file is group-executable (without
/// group execute that bit marks mandatory locking, not a privilege), as a local file
/// system does.
pub fn without_set_id_bits(perm: u16) -> u16 {
    let mut kept = u32::from(perm) & !libc::S_ISUID;
    if kept & libc::S_IXGRP != 0 {
        kept &= !libc::S_ISGID;
    }
    kept as u16
}

pub struct Fs {
    namespace: Namespace,
    config: Config,
    /// The one budget for buffered data (reads ahead, parts in flight).
    memory: Arc<MemoryLimiter>,
    /// Handles of files open for reading and of directories.
    handles: Handles,
    /// Files open for writing: the only place they are kept (see `writers.rs`).
    writers: Writers,
    /// With `--write-back`: directory markers to write again with new attributes.
    markers: PendingMarkers,
    /// With `--write-back`: deletes sent after `unlink` and `rmdir` returned.
    deletes: PendingDeletes,
    /// With `--cache`: blocks of objects read, and small files read ahead.
    cache: Option<Caches>,
}

/// How the mount shows, reads and writes files: fixed at mount.
struct Config {
    presentation: Presentation,
    read: ReadConfig,
    write: WriteConfig,
}

/// With `--cache`: the data cache, and the small files of a walked directory read from it
/// ahead of their open.
struct Caches {
    data: Arc<DataCache>,
    small_files_ahead: Arc<SmallFilesAhead>,
}

impl Fs {
    pub fn new(
        namespace: Namespace,
        presentation: Presentation,
        read_config: ReadConfig,
        write_config: WriteConfig,
        memory: Arc<MemoryLimiter>,
    ) -> Self {
        let writers = Writers::new(write_config.write_back);
        Self {
            namespace,
            config: Config { presentation, read: read_config, write: write_config },
            memory,
            handles: Handles::new(),
            writers,
            markers: PendingMarkers::default(),
            deletes: PendingDeletes::default(),
            cache: None,
        }
    }

    /// At exit: waits up to `limit` for the blocks fetched for the data cache to be
    /// written; whether they were (true without a cache).
    pub async fn finish_cache_writes(&self, limit: std::time::Duration) -> bool {
        match self.data_cache() {
            Some(cache) => cache.stored_all(limit).await,
            None => true,
        }
    }

    /// Reads of objects go through `cache` (`--cache`).
    pub fn with_data_cache(mut self, cache: Arc<DataCache>) -> Self {
        let small_files_ahead = SmallFilesAhead::new(cache.clone(), self.namespace.ttl());
        self.cache = Some(Caches { data: cache, small_files_ahead });
        self
    }

    pub fn read_only(&self) -> bool {
        self.config.write.read_only
    }

    /// The kernel was handed an entry for `ino` (see `Namespace::add_lookup`).
    pub fn add_lookup(&self, ino: Ino) {
        self.namespace.add_lookup(ino);
    }

    /// The kernel forgot `count` references to `ino`; once it holds none, so do we.
    pub fn forget(&self, ino: Ino, count: u64) {
        // (Not `namespace.node`, which copies the node: a cold `find` forgets every entry.)
        if self.namespace.forget(ino, count) {
            self.handles.opened_etags.lock().remove(&ino);
        }
    }

    /// Drops state that expired and that nobody references (run periodically).
    pub fn sweep(&self) {
        self.namespace.sweep();
        self.handles.opened_etags.lock().retain(|ino, _| self.namespace.node(*ino).is_ok());
    }

    /// How long the kernel may trust entries and attributes we return.
    pub fn ttl(&self) -> Duration {
        self.namespace.ttl()
    }

    /// The entry `name` of `parent`, counted as a reference the kernel holds (the reply
    /// must follow: if it cannot be delivered, the kernel forgets it itself).
    pub async fn lookup(&self, parent: Ino, name: &str) -> Result<FileAttr, FsError> {
        let node = self.complete(self.namespace.lookup(parent, name).await?).await?;
        self.namespace.add_lookup_of(&node);
        Ok(self.attr(&node))
    }

    /// A READDIRPLUS entry was handed to the kernel: one more reference to its node.
    pub fn add_lookup_of(&self, entry: &DirEntry<'_>) {
        self.namespace.add_lookup_of(entry.node);
    }

    pub async fn getattr(&self, ino: Ino) -> Result<FileAttr, FsError> {
        // `fstat` of a descriptor of a file unlinked since it was opened: the namespace no
        // longer has it (and would warn about a lost inode).
        if let Some(attr) = self.handles.unlinked.lock().get(&ino).copied() {
            return Ok(attr);
        }
        let node = self.namespace.getattr(ino).await?;
        Ok(self.attr(&self.complete(node).await?))
    }

    /// Whether a handle (for reading or writing) of `ino` is open.
    fn is_open(&self, ino: Ino) -> bool {
        self.writers.is_open(ino) || self.handles.is_reading(ino)
    }

    /// `node` with the stored attributes it shows (unless the mount shows listings as
    /// they are).
    async fn complete(&self, node: Node) -> Result<Node, FsError> {
        if self.config.presentation.attributes_from_listing {
            Ok(node)
        } else {
            Ok(self.namespace.with_metadata(node).await?)
        }
    }

    pub async fn open(&self, ino: Ino, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            // A write builds on the stored object: after an upload close() left running.
            self.settle(ino).await;
            return self.open_for_writing(ino, flags, caller).await;
        }
        // A file being written here is read from what was written (read-your-writes),
        // also one closed with --write-back and not stored yet: its upload is not
        // hurried (rsync opens its temporary file to `fchmod` it, then renames it; the
        // upload takes both). Once stored, its reads go to the object.
        let writer = self.writers.current(ino);
        if let Some(writer) = writer {
            writer.touched.notify_one();
            let handle = self.handles.next();
            self.handles.files.lock().insert(handle, (ino, Reader::Writer(writer)));
            return Ok(Opened { handle, keep_cache: false, backing: None });
        }
        let walking = self.namespace.note_read(ino);
        let (reader, etag) = self.object_reader(ino).await?;
        let backing = match &etag {
            Some(etag) => reader.cached_whole_file().map(|file| Backing { file, etag: etag.clone() }),
            None => None,
        };
        if walking {
            self.read_small_files_ahead(ino);
        }
        let small = etag.as_deref().and_then(|etag| {
            let ahead = self.cache.as_ref().and_then(|cache| cache.small_files_ahead.take(ino, etag));
            ahead.or_else(|| self.namespace.take_small_object(ino, etag))
        });
        let reader = match small.or_else(|| reader.cached_small_content()) {
            Some(content) => Reader::Loaded(content),
            None => Reader::Object(reader),
        };
        let keep_cache = match etag {
            Some(etag) => self.handles.opened_etags.lock().insert(ino, etag.clone()).as_deref() == Some(&etag),
            None => false,
        };
        let handle = self.handles.next();
        self.handles.files.lock().insert(handle, (ino, reader));
        Ok(Opened { handle, keep_cache, backing })
    }

    /// `ino` now has ETag `new` with the same content as at `old` (rewritten onto itself):
    /// pages the kernel cached at `old` may be kept at the next open.
    fn same_content(&self, ino: Ino, old: Option<&str>, new: Option<&str>) {
        let mut opened = self.handles.opened_etags.lock();
        if let (Some(new), true) = (new, opened.get(&ino).map(String::as_str) == old) {
            opened.insert(ino, new.to_owned());
        }
    }

    /// Reads the cache files of the small files listed after `ino` (see `small_ahead`).
    fn read_small_files_ahead(&self, ino: Ino) {
        let Some(ahead) = self.cache.as_ref().map(|cache| &cache.small_files_ahead) else { return };
        let next = self.namespace.files_listed_after(ino, small_ahead::AHEAD).into_iter().filter_map(|node| {
            let (Location::File { source, key }, Some(etag)) = (node.location, node.etag) else { return None };
            let location = self.namespace.store(source).location();
            Some((node.ino, ObjectId { location, key, etag, size: node.size }))
        });
        ahead.read_ahead(next);
    }

    /// A reader of the object behind `ino`, pinned to its current ETag (also returned).
    async fn object_reader(&self, ino: Ino) -> Result<(Arc<ReadHandle>, Option<String>), FsError> {
        let node = self.namespace.getattr(ino).await?;
        let (source, key, version) = match &node.location {
            Location::File { source, key } => (source, key, None),
            Location::History(History::Version { source, key, id }) => (source, key, Some(id)),
            _ => return Err(FsError::IsDir),
        };
        let store = self.namespace.store(*source).clone();
        let config = self.config.read.clone();
        let mut reader =
            ReadHandle::new(store.clone(), key, node.etag.as_deref(), node.size, config, self.memory.clone());
        if let Some(id) = version {
            reader = reader.of_version(id);
        }
        // Blocks are named by the object's version: without an ETag there is no name.
        if let (Some(cache), Some(etag)) = (self.data_cache(), &node.etag) {
            let id = ObjectId { location: store.location(), key: key.clone(), etag: etag.clone(), size: node.size };
            reader = reader.with_cache(CacheLink::new(cache.clone(), id));
        }
        Ok((Arc::new(reader), node.etag))
    }

    pub async fn read(&self, handle: u64, offset: u64, size: u32) -> Result<Bytes, FsError> {
        let len = u64::from(size);
        let reader = match self.handles.files.lock().get(&handle) {
            Some((_, reader)) => reader.clone(),
            None => Reader::Writer(self.current_writer_of(handle)?),
        };
        let writer = match reader {
            Reader::Object(reader) => return Ok(reader.read(offset, len).await?),
            Reader::Loaded(content) => {
                let start = offset.min(content.len() as u64) as usize;
                let end = offset.saturating_add(len).min(content.len() as u64) as usize;
                return Ok(content.slice(start..end));
            }
            Reader::Writer(writer) => writer,
        };
        // A writer superseded by a version stored past it holds none of the file: the
        // object is read (below).
        if !writer.is_superseded() {
            let upload = match &writer.output {
                Output::Staged(staged) => return Ok(staged.read(offset, len).await?),
                Output::Streamed(upload) => upload,
            };
            match upload.read(offset, len).await? {
                HeldBytes::Here(bytes) => return Ok(bytes),
                HeldBytes::Stored => {}
                // Bytes already sent as parts, which S3 cannot give back before the upload
                // completes: store what was written and go on in a staging file, which reads
                // back whole (as a write back over sent bytes does).
                HeldBytes::Sent => {
                    if let Some(writing) = self.writers.handle_of(&writer) {
                        self.store_then_staged(writing, &writer).await?;
                    }
                }
            }
        }
        // Stored since this handle was opened: read what the file's writer holds now (a
        // staging file that went on from the stored object), else the object.
        let staged = self.writers.current(writer.ino).filter(|w| w.output.is_staged());
        if let Some(staged) = staged {
            if let Some(reading) = self.handles.files.lock().get_mut(&handle) {
                *reading = (writer.ino, Reader::Writer(staged.clone()));
            }
            if let Output::Staged(file) = &staged.output {
                return Ok(file.read(offset, len).await?);
            }
        }
        let (reader, _) = self.object_reader(writer.ino).await?;
        self.handles.files.lock().insert(handle, (writer.ino, Reader::Object(reader.clone())));
        Ok(reader.read(offset, len).await?)
    }

    /// Creates `name` in `parent` with permission bits `mode` and opens it for writing:
    /// streamed, or staged if also opened for reading (`O_RDWR`).
    pub async fn create(
        &self,
        parent: Ino,
        name: &str,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(FileAttr, Opened), FsError> {
        self.check_writable()?;
        let (source, key) = self.new_entry_key(parent, name).await?;
        // No times yet: the commit stamps the time of the last write.
        let mut metadata = self.new_entry_metadata(S_IFREG | (mode & 0o7777), caller, None);
        metadata.content_type = self.content_type_for(name);
        let output = if flags & libc::O_ACCMODE == libc::O_RDWR {
            Output::Staged(self.new_staged(source, key.clone(), None, metadata.clone())?)
        } else {
            Output::Streamed(self.new_upload(source, key.clone(), true, metadata.clone()))
        };
        let node = self.namespace.enter_pending_file(parent, name, source, key, Arc::new(metadata));
        self.namespace.touch_dir(parent);
        let opened = self.add_writer(Arc::new(Writer::new(true, node.ino, output, false)), process_of(caller.thread));
        Ok((self.attr(&node), opened))
    }

    /// The Content-Type to store a new file named `name` with.
    fn content_type_for(&self, name: &str) -> Option<String> {
        self.config.write.content_type_from_name.then(|| content_type::for_name(name)).flatten()
    }

    /// The metadata of an entry created by `caller` with `mode` at `time` (if the entry's
    /// content is complete at once): only what differs from the mount's defaults is
    /// stored, and the time, so that it has nanoseconds rather than Last-Modified's
    /// whole seconds.
    fn new_entry_metadata(&self, mode: u32, caller: Caller, time: Option<SystemTime>) -> Metadata {
        let p = &self.config.presentation;
        let default_mode = match mode & S_IFMT {
            S_IFDIR => Some(S_IFDIR | u32::from(p.dir_mode)),
            S_IFREG => Some(S_IFREG | u32::from(p.file_mode)),
            _ => None, // a symlink or special file must say so
        };
        let attrs = StoredAttrs {
            mode: (Some(mode) != default_mode).then_some(mode),
            uid: (caller.uid != p.uid).then_some(caller.uid),
            gid: (caller.gid != p.gid).then_some(caller.gid),
            mtime: time,
            ..StoredAttrs::default()
        };
        let mut metadata = Metadata::default();
        attrs.apply_to(&mut metadata);
        metadata
    }

    /// Opening an existing file for writing. If it is being written here already, the
    /// new handle shares that writer ([`Fs::writer_to_share`]; `O_TRUNC` cuts it). Else,
    /// with `O_TRUNC` and write-only, what is written replaces the object, streamed;
    /// anything else (append, writes in place, `O_RDWR`) goes through a staging file that
    /// starts as the object.
    async fn open_for_writing(&self, ino: Ino, flags: i32, caller: Caller) -> Result<Opened, FsError> {
        self.check_writable()?;
        let node = self.namespace.getattr(ino).await?;
        Self::check_changeable(&node)?;
        let Location::File { .. } = &node.location else {
            return Err(FsError::IsDir);
        };
        let truncate = flags & libc::O_TRUNC != 0;
        if let Some(shared) = self.writer_to_share(ino).await? {
            if truncate {
                self.truncate_writer(&shared, 0).await?;
            }
            return Ok(self.add_writer(shared, process_of(caller.thread)));
        }
        let writer = self.writer_over_object(&node, flags).await?;
        Ok(self.add_writer(writer, process_of(caller.thread)))
    }

    /// A new writer of the existing file `node`, opened with `flags`: with `O_TRUNC` and
    /// write-only, streamed; else a staging file that starts as the object.
    async fn writer_over_object(&self, node: &Node, flags: i32) -> Result<Arc<Writer>, FsError> {
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        let (ino, truncate) = (node.ino, flags & libc::O_TRUNC != 0);
        // The file keeps its mode and owner. Its times become those of the new content:
        // at once with O_TRUNC, else at the first write (see `Fs::write`).
        let mut metadata = self.stored_metadata(node.clone()).await?;
        if truncate {
            StoredAttrs::forget_content_times(&mut metadata);
        }
        let output = if truncate && flags & libc::O_ACCMODE == libc::O_WRONLY {
            Output::Streamed(
                self.new_upload(*source, key.clone(), false, metadata.clone()).replacing(node.etag.clone()),
            )
        } else {
            let base = (!truncate).then(|| Base { etag: node.etag.clone(), size: node.size });
            let staged = self.new_staged(*source, key.clone(), base, metadata.clone())?;
            staged.allow_replace().await;
            Output::Staged(staged)
        };
        let (parent, name) = node.parent_and_name();
        self.namespace.enter_pending_file(parent, &name, *source, key.clone(), Arc::new(metadata));
        self.namespace.set_pending_size(ino, if truncate { 0 } else { node.size });
        Ok(Arc::new(Writer::new(false, ino, output, !truncate)))
    }

    /// The writer of `ino` that a new descriptor open for writing shares, if the file is
    /// being written here: one still open for writing (not one whose upload
    /// `--write-back` left running after its close, which the open waited for). A stream
    /// has one writer: it stores what was written so far and goes on in a staging file
    /// ([`Fs::store_then_staged`]). One streamed and stored already (by its opener's
    /// close, or `fsync`) is left alone, and the new descriptor starts from the stored
    /// object; a descriptor of the old writer still open joins the new one when it is
    /// used again ([`Fs::current_writer_of`]).
    async fn writer_to_share(&self, ino: Ino) -> Result<Option<Arc<Writer>>, FsError> {
        let mut stream = None;
        for (handle, writer) in self.writers.open_of(ino) {
            match &writer.output {
                Output::Staged(_) => return Ok(Some(writer)),
                Output::Streamed(upload) if upload.stored().await.is_none() => stream = Some((handle, writer)),
                Output::Streamed(_) => {}
            }
        }
        match stream {
            Some((handle, writer)) => Ok(Some(self.store_then_staged(handle, &writer).await?)),
            None => Ok(None),
        }
    }

    /// The writer that `handle` changes the file through (`write`, `ftruncate`). Usually
    /// its own. One closed by its opener while this descriptor stays open (a shell's
    /// `dup2`) and handed off under `--write-back`, its upload not started, is taken back
    /// ([`Writer::take_back`]). One whose upload has started or ended (a truncation by
    /// name may have stored past it since), or that a newer writer superseded, is left:
    /// the descriptor goes on in the file's current writer, or in a new one that starts
    /// from the object as it is now, so that its descriptors keep writing one file.
    async fn writer_to_change(&self, handle: u64) -> Result<Arc<Writer>, FsError> {
        let writer = self.current_writer_of(handle)?;
        if !writer.is_handed_off() && !writer.is_superseded() {
            return Ok(writer);
        }
        if writer.take_back() || self.handles.unlinked.lock().contains_key(&writer.ino) {
            return Ok(writer); // an unlinked file's writes go nowhere new (see `Fs::unlink`)
        }
        Writers::hurry_and_wait(vec![writer.clone()]).await;
        let node = self.namespace.getattr(writer.ino).await?;
        let next = self.writer_over_object(&node, libc::O_RDWR).await?;
        self.writers.join(handle, &next)?;
        Ok(next)
    }

    /// The writer `handle` stands for: its own, or, where a newer writer of the file
    /// superseded it, the file's current one, which the handle joins (the descriptors of
    /// a file write one file). A superseded writer is left where no current one is (the
    /// newer one was stored and released).
    fn current_writer_of(&self, handle: u64) -> Result<Arc<Writer>, FsError> {
        let writer = self.writers.get(handle).ok_or(FsError::BadHandle)?;
        if !writer.is_superseded() {
            return Ok(writer);
        }
        match self.writers.current(writer.ino) {
            Some(current) => {
                self.writers.join(handle, &current)?;
                Ok(current)
            }
            None => Ok(writer),
        }
    }

    fn new_staged(
        &self,
        source: usize,
        key: String,
        base: Option<Base>,
        metadata: Metadata,
    ) -> Result<Staged, FsError> {
        let store = self.namespace.store(source).clone();
        let config = &self.config.write;
        Ok(Staged::new(store, key, base, metadata, config.part_size, &config.staging, self.memory.clone())?)
    }

    /// `write()`. `drop_set_id`: the caller may not keep the file's set-ID bits (see
    /// [`Fs::drop_set_id_bits`]).
    pub async fn write(&self, handle: u64, offset: u64, data: &[u8], drop_set_id: bool) -> Result<u32, FsError> {
        let mut writer = self.writer_to_change(handle).await?;
        // A write the file's output refuses moves the file to another output, and is made
        // there. Each move goes forward; the longest way is streamed, staged past one
        // part, streamed past the write-back limit, staged over bytes already sent: three
        // moves, and one more where another write moved the file first.
        let mut moves = 0;
        let size = loop {
            let change = match writer.output.write(offset, data).await? {
                Written::Size(size) => break size,
                Written::Refused(change) => change,
            };
            if moves == MOST_MOVES {
                let key = writer.output.key();
                return Err(FsError::Local(format!(
                    "{key}: a write was refused after {moves} moves, the last {change:?}"
                )));
            }
            writer = self.make_move(handle, &writer, change).await?;
            moves += 1;
        };
        self.content_changed(&writer).await;
        self.namespace.set_pending_size(writer.ino, size);
        if let Some(unlinked) = self.handles.unlinked.lock().get_mut(&writer.ino) {
            // What `fstat` shows of a file no name reaches any more.
            unlinked.size = size;
            unlinked.blocks = size.div_ceil(512);
            unlinked.mtime = SystemTime::now();
        }
        if drop_set_id {
            self.drop_set_id_bits(writer.ino).await?;
        }
        Ok(data.len() as u32)
    }

    /// Moves the file `handle` writes through `writer` to the output `change` calls for;
    /// the writer it goes on with.
    async fn make_move(&self, handle: u64, writer: &Arc<Writer>, change: Move) -> Result<Arc<Writer>, FsError> {
        match change {
            Move::StagedFromStored => self.staged_from_stored(handle, writer).await,
            Move::StoreThenStaged => self.store_then_staged(handle, writer).await,
            Move::StagedPastOnePart => self.staged_past_one_part(handle, writer).await,
            Move::StreamedPastLimit => self.streamed_past_limit(handle, writer).await,
        }
    }

    /// The content of `writer`'s file changed (a write, `ftruncate`): if its metadata may
    /// still hold an mtime or ctime from before, they go, so that the commit stamps the
    /// time of this change. Costs one atomic swap on all but the first write.
    async fn content_changed(&self, writer: &Writer) {
        if writer.times_kept.swap(false, Ordering::AcqRel) {
            if let Some(metadata) = writer.output.update_metadata(StoredAttrs::forget_content_times).await {
                self.namespace.set_metadata(writer.ino, Arc::new(metadata), None);
            }
        }
    }

    /// A streamed file changed where a multipart upload cannot change it any more (a
    /// write over bytes already sent, as a program that writes its header last does;
    /// `ftruncate`): what was written so far is stored, as `fsync` would store it, and the
    /// file goes on in a staging file from there ([`Fs::staged_from_stored`]). The program
    /// sees a file that takes any write, as on a local disk; the store sees the object a
    /// little earlier than at close.
    async fn store_then_staged(&self, handle: u64, writer: &Arc<Writer>) -> Result<Arc<Writer>, FsError> {
        tracing::debug!(key = writer.output.key(), "change behind the streamed bytes: stored so far, staged from now");
        self.commit(writer, Heard::ByCaller).await?;
        self.staged_from_stored(handle, writer).await
    }

    /// A streamed file written again after it stored its object (a write after `fsync`,
    /// or through a descriptor still open after the opener's close): it goes on, under
    /// the same handle, as a staging file that starts as the stored object. So the file
    /// keeps its bytes, as on a local disk, and is never cut to what was written since.
    async fn staged_from_stored(&self, handle: u64, writer: &Arc<Writer>) -> Result<Arc<Writer>, FsError> {
        let Output::Streamed(upload) = &writer.output else { return Err(FsError::Committed) };
        let (etag, size) = upload.stored().await.ok_or(FsError::Committed)?;
        let node = self.namespace.node(writer.ino)?;
        let Location::File { source, .. } = node.location else { return Err(FsError::IsDir) };
        let key = upload.key();
        let mut metadata = upload.metadata().await;
        StoredAttrs::forget_content_times(&mut metadata); // a write follows
        let staged = self.new_staged(source, key.clone(), Some(Base { etag, size }), metadata.clone())?;
        staged.allow_replace().await;
        let next = Arc::new(Writer::new(false, writer.ino, Output::Staged(staged), false));
        // Every handle sharing the writer goes on with the staging file, unless another
        // write of this handle got here first.
        let moved = self.writers.move_on_from(handle, writer, &next)?;
        if !Arc::ptr_eq(&moved, &next) {
            return Ok(moved);
        }
        let (parent, name) = node.parent_and_name();
        self.namespace.enter_pending_file(parent, &name, source, key, Arc::new(metadata));
        self.namespace.set_pending_size(writer.ino, size);
        Ok(next)
    }

    /// `close()`: commits when the process that opened the file closes it (from any of
    /// its threads: `closer` is the calling thread). A forked child
    /// closes its inherited copy of the descriptor too (at exit, or at exec for
    /// close-on-exec descriptors); committing then would end the file while the parent is
    /// still writing. Other closes leave the commit to the opener's close or to release.
    ///
    /// With `--write-back` the opener's close starts the commit and returns at once; the
    /// next operation on the file waits for it ([`Fs::settle`]), and a failure is only
    /// logged (and the entry removed), since nobody is left to hear of it.
    pub async fn flush(self: &Arc<Self>, handle: u64, closer: u32) -> Result<(), FsError> {
        if self.writers.opener(handle) != Some(process_of(closer)) {
            return Ok(()); // a read handle, or not the opener's close
        }
        let writer = self.current_writer_of(handle)?;
        // Closed before by a duplicate of a descriptor and not changed since (a change
        // takes it back, or goes on in another writer): logged or stored already.
        if writer.is_handed_off() || writer.is_superseded() {
            return Ok(());
        }
        match self.writers.upload_slots() {
            Some(uploads) => {
                // A staging file another descriptor still has open goes on changing under
                // that one (and new opens share it): stored now, as without the option.
                if writer.output.is_staged() && self.writers.shared_beyond(handle, &writer) {
                    return self.commit(&writer, Heard::ByCaller).await;
                }
                let uploads = uploads.clone();
                self.hand_off(writer, uploads).await
            }
            None => self.commit(&writer, Heard::ByCaller).await,
        }
    }

    /// `fsync()`: the object is in the bucket when this returns `Ok`.
    pub async fn fsync(&self, handle: u64) -> Result<(), FsError> {
        let Ok(writer) = self.current_writer_of(handle) else {
            return Ok(()); // a read handle: nothing to do
        };
        self.settle(writer.ino).await;
        // Closed before by a duplicate of a descriptor and stored in the background
        // (`--write-back`), or superseded since by a version stored past it: nothing of it
        // to commit again (that would give the file the ETag of an older object back),
        // only its own upload's outcome to tell.
        if writer.is_handed_off() || writer.is_superseded() {
            return match writer.upload_failure() {
                Some(error) => Err(FsError::Local(format!("{} was not stored: {error}", writer.output.key()))),
                None => Ok(()),
            };
        }
        self.commit(&writer, Heard::ByCaller).await
    }

    /// Settles `ino`: hurries the uploads that `close()` left running for it
    /// (`--write-back`) and waits until they ended, so that what follows sees their
    /// outcome (and cannot be overtaken by them: a later upload of the same key, a
    /// rename, a delete).
    async fn settle(&self, ino: Ino) {
        Writers::hurry_and_wait(self.writers.handed_off_of(ino)).await;
    }

    /// [`Fs::settle`] for every file, directory marker and delete: before moving a
    /// directory key by key, and at unmount.
    async fn settle_all(&self) {
        Writers::hurry_and_wait(self.writers.all_where(|w| w.is_handed_off())).await;
        self.markers.settle_all().await;
        self.deletes.settle_all().await;
    }

    /// At unmount: stores what is still open or running (release commits a file only when
    /// its last descriptor is closed; with `--write-back` the uploads run after close).
    pub async fn finish_uploads(&self) {
        self.settle_all().await;
        for writer in self.writers.all_where(|_| true) {
            let _kept_for_unstored = self.commit(&writer, Heard::ByNobody).await;
        }
        if let Some(log) = &self.config.write.write_back_log {
            log.remove_done_segments();
        }
    }

    /// Makes the deleted file `name` in `parent` current again from its latest version, on
    /// a versioned bucket (`bucketfs undelete`).
    pub async fn undelete(&self, parent: Ino, name: &str) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let (source, key) = self.new_entry_key(parent, name).await?;
        let info = self.namespace.store(source).restore_latest_version(&key).await?;
        let node = self.namespace.enter_restored(parent, name, source, info);
        Ok(self.attr(&self.complete(node).await?))
    }

    pub fn files_open_for_writing(&self) -> usize {
        self.writers.count()
    }

    /// Files closed whose upload is still running (`--write-back`), and their bytes.
    pub fn uploads_after_close(&self) -> (usize, u64) {
        let running = self.writers.uploads_pending();
        let bytes = running.iter().filter_map(|&ino| self.namespace.node(ino).ok()).map(|node| node.size).sum();
        (running.len(), bytes)
    }

    /// The mount's data cache, if it has one.
    pub fn data_cache(&self) -> Option<&Arc<DataCache>> {
        self.cache.as_ref().map(|cache| &cache.data)
    }

    /// Files whose upload failed where no caller could hear of it, and why (key, error),
    /// and how many more failed past the ones kept: what the daemon reports as it exits.
    pub fn unstored(&self) -> (Vec<(String, String)>, usize) {
        self.writers.unstored()
    }

    /// Commits `writer`. Heard by a caller (`close`, `fsync`): a failure is the caller's
    /// answer. Heard by nobody (release, an upload after close, unmount): a failure is
    /// kept for [`Fs::unstored`] (and logged), unless a caller heard of one already; the
    /// outcome is returned for a caller that keeps more (the write-back log).
    async fn commit(&self, writer: &Writer, heard: Heard) -> Result<(), FsError> {
        let result = self.store_writer(writer).await;
        if let Err(error) = &result {
            match heard {
                Heard::ByCaller => writer.failure_reported.store(true, Ordering::Release),
                Heard::ByNobody if writer.failure_reported.load(Ordering::Acquire) => {}
                Heard::ByNobody => self.writers.note_unstored(writer.output.key(), error.to_string()),
            }
        }
        result
    }

    /// The opener's `close()` (without `--write-back`), `fsync()` and release: the object
    /// is in the bucket when this returns `Ok`. A new file whose upload failed disappears
    /// from the directory (no phantom entries).
    async fn store_writer(&self, writer: &Writer) -> Result<(), FsError> {
        // Unlinked while open: nothing is stored (its output was discarded), so nothing
        // can fail; `fsync` and `close` succeed as on a local disk, and its bytes stay
        // readable through its descriptors until the last one closes.
        if self.handles.unlinked.lock().contains_key(&writer.ino) {
            return Ok(());
        }
        // The time the file showed since its last write (with nanoseconds) goes with the
        // upload, at no cost, so that it does not jump to Last-Modified's whole seconds.
        if let Ok(node) = self.namespace.node(writer.ino) {
            let time = node.mtime;
            writer.output.update_metadata_if_free(|m| StoredAttrs::stamp_content_times(m, time)).await;
        }
        let committed = writer.output.commit().await;
        if writer.output.moved().await {
            return Ok(()); // the output it moved to stores the file (see `Fs::staged_past_one_part`)
        }
        match committed {
            Ok(stored) => {
                self.writers.no_longer_unstored(&writer.output.key());
                // What is written through a mount with `--cache` enters the cache once
                // stored, so reading it back costs no GET: files of one PUT (a larger
                // file's parts were freed as they were sent).
                if let (Some(Some(etag)), Some(bytes)) = (&stored, writer.output.take_stored_bytes().await) {
                    self.cache_written(writer.ino, writer.output.key(), bytes, etag.clone());
                }
                // Nothing stored: an unchanged staging file; the object is as it was.
                let etag = match stored {
                    Some(etag) => etag,
                    None => self.namespace.node(writer.ino)?.etag,
                };
                self.namespace.upload_done(writer.ino, etag, Arc::new(writer.output.metadata().await));
                Ok(())
            }
            Err(error) => {
                tracing::warn!(key = writer.output.key(), "upload failed: {error}");
                if writer.created {
                    // Where the file is now: it may have been renamed since it was opened.
                    if let Ok(node) = self.namespace.node(writer.ino) {
                        let (parent, name) = node.parent_and_name();
                        self.namespace.remove_entry(parent, &name);
                        self.namespace.touch_dir(parent);
                    }
                } else {
                    // The old object is still there: forget what we showed, ask S3 again.
                    self.namespace.upload_abandoned(writer.ino);
                }
                Err(error.into())
            }
        }
    }

    /// Puts `bytes`, just stored at `key` as `etag`, into the data cache, in the background.
    fn cache_written(&self, ino: Ino, key: String, bytes: Bytes, etag: String) {
        let (Some(cache), Ok(node)) = (self.data_cache().cloned(), self.namespace.node(ino)) else { return };
        let Location::File { source, .. } = node.location else { return };
        let location = self.namespace.store(source).location();
        let id = ObjectId { location, key, etag, size: bytes.len() as u64 };
        tokio::task::spawn_blocking(move || cache.store_whole(&id, &bytes));
    }

    pub async fn release(self: &Arc<Self>, handle: u64) {
        let reader = self.handles.files.lock().remove(&handle).map(|(ino, _)| ino);
        let writer = self.writers.get(handle);
        if let Some(ino) = reader.or(writer.as_ref().map(|w| w.ino)) {
            if self.handles.unlinked.lock().contains_key(&ino) {
                // Without this handle (a writer's is removed below) is anything still open?
                let others = self.handles.is_reading(ino) || self.writers.open_beyond(ino, handle);
                if !others {
                    self.handles.unlinked.lock().remove(&ino);
                }
            }
        }
        let Some(writer) = writer else { return };
        // Another handle still shares the writer: this one goes, and the last one's
        // release commits.
        if self.writers.release_shared(handle, &writer) {
            return;
        }
        if writer.is_handed_off() {
            // Its upload runs on (`--write-back`): the kernel's RELEASE is answered now
            // rather than held for it (an unmount with uploads left would abort every
            // RELEASE held), and the handle stays known until the upload ends, for `settle`.
            let fs = self.clone();
            // Writes through a duplicate of the descriptor after the close took it back or
            // went on in another writer (`Fs::writer_to_change`): nothing is left to commit.
            tokio::spawn(async move {
                writer.upload_ended().await;
                fs.writers.remove(handle);
                // Unlinked meanwhile: this was its last handle, unless one opened since.
                if !fs.is_open(writer.ino) {
                    fs.handles.unlinked.lock().remove(&writer.ino);
                }
            });
            return;
        }
        // Usually committed at the last flush already; if not, nobody is left to hear of
        // an error, so it is logged and kept. A writer superseded holds nothing newer
        // than what is stored (committing it again would give the file its older ETag).
        if !writer.is_superseded() {
            let _kept_for_unstored = self.commit(&writer, Heard::ByNobody).await;
        }
        self.writers.remove(handle);
    }

    pub async fn mkdir(&self, parent: Ino, name: &str, mode: u32, caller: Caller) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let (source, key) = self.new_entry_key(parent, name).await?;
        let prefix = format!("{key}/");
        if prefix.len() > crate::namespace::names::MAX_KEY {
            return Err(FsError::NameTooLong); // the marker's key is one byte longer
        }
        let mut metadata = self.new_entry_metadata(S_IFDIR | (mode & 0o7777), caller, Some(SystemTime::now()));
        metadata.content_type = Some(DIRECTORY_CONTENT_TYPE.into());
        // A new marker is create-only, so that another client's directory is not taken
        // over. Not where this mount removed the name just now: a store whose deletes
        // lag (SeaweedFS keeps an emptied folder for about 2 minutes) would answer 412
        // for the folder it still holds, and `mkdir` after `mv d e` or `rm -r d` fail.
        let create_only = !self.namespace.removed_here(parent, name);
        let node = self
            .write_marker(source, &prefix, metadata, create_only, |metadata| {
                let node = self.namespace.enter_dir(parent, name, source, prefix.clone(), metadata);
                (node.ino, node)
            })
            .await?;
        Ok(self.attr(&node))
    }

    pub async fn unlink(&self, parent: Ino, name: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let node = self.namespace.lookup(parent, name).await?;
        Self::check_changeable(&node)?;
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        // A file closed with --write-back whose upload has not started goes with it:
        // nothing is sent, and the log notes it (a replay does not store it). A new file
        // then holds nothing at its key, and nothing is deleted either: builds and
        // `configure` scripts write temporary files and remove them at once.
        let writers = self.writers.of(node.ino);
        let mut unstored = None;
        if let [writer] = writers.as_slice() {
            if writer.is_handed_off() {
                unstored = writer.output.discard_unstored().await;
                if let (Some(_), Some(record)) = (unstored, writer.record()) {
                    record.amend(Amendment { discarded: true, ..Amendment::default() });
                }
            }
        }
        let mut etag = node.etag.clone();
        if unstored.is_none() {
            self.settle(node.ino).await;
            for writer in &self.writers.of(node.ino) {
                writer.output.discard().await;
            }
            // What the key holds now: an upload that ended meanwhile stored a new version.
            etag = self.namespace.node(node.ino).map_or(etag, |now| now.etag);
        }
        // What `fstat` of a descriptor still open shows: taken before the entry goes.
        let still_open = self.attr_once_unlinked(&node);
        if unstored == Some(false) {
            self.namespace.remove_entry(parent, name);
        } else {
            self.delete_entry((parent, name), *source, key, etag).await?;
        }
        if let Some(attr) = still_open {
            self.handles.unlinked.lock().insert(node.ino, attr);
        }
        self.namespace.touch_dir(parent);
        Ok(())
    }

    /// What `fstat` of a descriptor of `node` still open shows once its name is gone
    /// (`unlink`, or a rename over it): a link count of 0 and the size written so far, as
    /// on a local disk; `None` if no descriptor is open.
    fn attr_once_unlinked(&self, node: &Node) -> Option<FileAttr> {
        let current = self.namespace.node(node.ino).unwrap_or_else(|_| node.clone());
        self.is_open(node.ino).then(|| FileAttr { nlink: 0, ..self.attr(&current) })
    }

    pub async fn rmdir(&self, parent: Ino, name: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let node = self.namespace.lookup(parent, name).await?;
        Self::check_changeable(&node)?;
        let Location::Dir { source, prefix } = &node.location else {
            return Err(FsError::NotDir);
        };
        self.check_empty_dir(&node).await?;
        self.markers.settle(node.ino).await; // its new attributes must not bring it back
        self.delete_entry((parent, name), *source, prefix, None).await?;
        self.namespace.touch_dir(parent);
        Ok(())
    }

    /// `symlink()`: an object holding the target path, with mode `S_IFLNK | 0777` in its
    /// metadata (as s3fs stores symlinks).
    pub async fn symlink(&self, parent: Ino, name: &str, target: &str, caller: Caller) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let (source, key) = self.new_entry_key(parent, name).await?;
        let metadata = self.new_entry_metadata(S_IFLNK | 0o777, caller, Some(SystemTime::now()));
        self.put_entry(parent, name, (source, key), Bytes::from(target.to_owned()), metadata).await
    }

    /// `mknod()`: a FIFO, socket, character or block device (or an empty regular file) is
    /// an empty object whose stored mode holds the file type, with the device number in
    /// `x-amz-meta-rdev` for devices, as s3fs stores them. Nothing else is needed: the
    /// kernel never sends reads or writes of such files to a file system (a FIFO or
    /// socket lives in the kernel; a device is its driver's, and FUSE mounts are `nodev`).
    pub async fn mknod(
        &self,
        parent: Ino,
        name: &str,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let kind = mode & S_IFMT;
        if ![S_IFREG, S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK].contains(&kind) {
            return Err(FsError::Invalid("mknod of a directory or symlink"));
        }
        let (source, key) = self.new_entry_key(parent, name).await?;
        let mut metadata = self.new_entry_metadata(mode & (S_IFMT | 0o7777), caller, Some(SystemTime::now()));
        if kind == S_IFCHR || kind == S_IFBLK {
            StoredAttrs { rdev: Some(rdev), ..StoredAttrs::default() }.apply_to(&mut metadata);
        }
        if kind == S_IFREG {
            metadata.content_type = self.content_type_for(name);
        }
        self.put_entry(parent, name, (source, key), Bytes::new(), metadata).await
    }

    /// Stores a new entry whose content is known at once (create-only) and enters it.
    async fn put_entry(
        &self,
        parent: Ino,
        name: &str,
        (source, key): (usize, String),
        content: Bytes,
        metadata: Metadata,
    ) -> Result<FileAttr, FsError> {
        let size = content.len() as u64;
        let etag = self.namespace.store(source).put(&key, content, &metadata, &WriteCondition::Absent).await?;
        let metadata = Arc::new(metadata);
        let node = self.namespace.enter_pending_file(parent, name, source, key, metadata.clone());
        self.namespace.touch_dir(parent);
        self.namespace.set_pending_size(node.ino, size);
        self.namespace.upload_done(node.ino, etag, metadata);
        Ok(self.attr(&self.namespace.node(node.ino)?))
    }

    /// `readlink()`: the content of a symlink's object.
    pub async fn readlink(&self, ino: Ino) -> Result<Bytes, FsError> {
        let node = self.complete(self.namespace.getattr(ino).await?).await?;
        let Location::File { source, key } = &node.location else { return Err(FsError::Invalid("not a symlink")) };
        if self.attr(&node).kind != FileType::Symlink {
            return Err(FsError::Invalid("not a symlink"));
        }
        Ok(self.namespace.store(*source).get_range(key, 0..node.size, node.etag.as_deref()).await?)
    }

    /// Where multipart uploads are recorded (see `write::journal`).
    fn journal(&self) -> Option<&Journal> {
        self.config.write.journal.as_deref()
    }

    fn check_writable(&self) -> Result<(), FsError> {
        if self.config.write.read_only {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// `node` may be changed: it is not in the view of versions, which only shows what
    /// the store keeps.
    fn check_changeable(node: &Node) -> Result<(), FsError> {
        match node.location {
            Location::History(_) => Err(FsError::ReadOnly),
            _ => Ok(()),
        }
    }

    fn new_upload(&self, source: usize, key: String, create_only: bool, metadata: Metadata) -> Upload {
        let store = self.namespace.store(source).clone();
        let config = &self.config.write;
        let part_size = config.part_size.max(crate::write::MIN_PART);
        Upload::new(store, key, create_only, config.part_size, self.memory.clone(), config.staging.clone(), metadata)
            .keeping_stored_bytes(self.cache.is_some())
            // Staged past one part under `--write-back` (see `Fs::staged_past_one_part`), where
            // more than a part may be staged.
            .one_part_only(self.config.write.write_back && self.staged_at_most().is_some_and(|most| most > part_size))
    }

    /// A new handle of `writer`, opened by process `opener`.
    fn add_writer(&self, writer: Arc<Writer>, opener: u32) -> Opened {
        let handle = self.handles.next();
        self.writers.add(handle, writer, opener);
        Opened { handle, keep_cache: false, backing: None }
    }

    /// The directories whose listings the kernel may keep (from the index) and holds: a
    /// refresh may change any of them, so the kernel is told to drop them after each.
    pub fn held_indexed_dirs(&self) -> Vec<Ino> {
        self.namespace.held_indexed_dirs()
    }

    /// The attributes of a negative entry (inode 0): "no such name", cacheable.
    pub fn missing_attr(&self) -> FileAttr {
        let attr = self.attr_of(0, 0, SystemTime::UNIX_EPOCH, None, false, StoredAttrs::default());
        FileAttr { ino: INodeNo(0), size: 0, blocks: 0, nlink: 0, ..attr }
    }

    fn attr(&self, node: &Node) -> FileAttr {
        let stored = node.metadata.as_deref().map(StoredAttrs::from_metadata).unwrap_or_default();
        let attr = self.attr_of(node.ino, node.size, node.mtime, node.touched, node.location.is_dir(), stored);
        match node.location {
            // The view of versions cannot be changed: shown without write permission.
            Location::History(_) => FileAttr { perm: attr.perm & !0o222, ..attr },
            _ => attr,
        }
    }

    /// `mtime` is the node's own (Last-Modified, or the time of the last write);
    /// `touched` when an entry of a directory last changed through this mount, newer
    /// than anything in its marker (see `Node::touched`).
    fn attr_of(
        &self,
        ino: Ino,
        size: u64,
        mtime: SystemTime,
        touched: Option<SystemTime>,
        is_dir: bool,
        stored: StoredAttrs,
    ) -> FileAttr {
        let p = &self.config.presentation;
        let kind = match stored.mode.map(|mode| mode & S_IFMT) {
            _ if is_dir => FileType::Directory,
            Some(S_IFLNK) => FileType::Symlink,
            Some(S_IFIFO) => FileType::NamedPipe,
            Some(S_IFSOCK) => FileType::Socket,
            Some(S_IFCHR) => FileType::CharDevice,
            Some(S_IFBLK) => FileType::BlockDevice,
            _ => FileType::RegularFile,
        };
        let default_perm = match kind {
            FileType::Directory => p.dir_mode,
            FileType::Symlink => 0o777,
            _ => p.file_mode,
        };
        let perm = stored.mode.map_or(default_perm, |mode| (mode & 0o7777) as u16);
        let mtime = touched.or(stored.mtime).unwrap_or(mtime);
        // Without a stored ctime (objects written by others) the last change is the mtime.
        let ctime = touched.or(stored.ctime).unwrap_or(mtime);
        let atime = stored.atime.unwrap_or(mtime);
        // nlink 1 tells find(1) not to count subdirectories from the link count.
        let nlink = 1;
        let (uid, gid) = (stored.uid.unwrap_or(p.uid), stored.gid.unwrap_or(p.gid));
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime,
            mtime,
            ctime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: if matches!(kind, FileType::CharDevice | FileType::BlockDevice) {
                stored.rdev.unwrap_or(0)
            } else {
                0
            },
            blksize: match kind {
                // glibc sizes a directory stream's buffer by `st_blksize`, and the kernel
                // sizes each READDIR by that buffer, allocating and mapping it anew per call:
                // 1 MiB made a cold `find` over an indexed linux-5.12.13 tree 1.45 s, 32 KiB
                // (glibc's own default) 1.19 s; `ls -f` of 100,000 entries is no slower.
                FileType::Directory => DIR_BLKSIZE,
                // Programs that size their reads by it (`cp`, stdio) read in 1 MiB.
                _ => FILE_BLKSIZE,
            },
            flags: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::without_set_id_bits;

    #[test]
    fn set_group_id_goes_only_from_group_executable_files() {
        assert_eq!(without_set_id_bits(0o6755), 0o755);
        assert_eq!(without_set_id_bits(0o4644), 0o644);
        assert_eq!(without_set_id_bits(0o2755), 0o755);
        assert_eq!(without_set_id_bits(0o2745), 0o2745, "no group execute: a locking mark, kept");
        assert_eq!(without_set_id_bits(0o1777), 0o1777, "the sticky bit stays");
    }
}
