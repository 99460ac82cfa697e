//! What an operation answers the kernel, whichever transport carried the request.
//!
//! Each operation (see `operations.rs`) is written once against these traits; fuser's reply
//! types implement them for requests read from `/dev/fuse` (below), and `ring::RingAnswer`
//! for requests carried over io_uring. An answer is sent once, from any thread.

use std::ffi::OsStr;
use std::time::Duration;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};

use super::io_modes::KernelBacking;

/// Who sent a request (the kernel's view: the calling thread and its credentials).
#[derive(Clone, Copy, Debug)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl From<&fuser::Request> for Requester {
    fn from(req: &fuser::Request) -> Self {
        Self { uid: req.uid(), gid: req.gid(), pid: req.pid() }
    }
}

/// Every answer may be an error instead.
pub trait Answer: Send + 'static {
    fn error(self, errno: Errno);
}

pub trait EntryAnswer: Answer {
    fn entry(self, ttl: &Duration, attr: &FileAttr);
}

pub trait AttrAnswer: Answer {
    fn attr(self, ttl: &Duration, attr: &FileAttr);
}

pub trait EmptyAnswer: Answer {
    fn ok(self);
}

pub trait DataAnswer: Answer {
    fn data(self, data: &[u8]);
}

pub trait WriteAnswer: Answer {
    fn written(self, size: u32);
}

pub trait OpenAnswer: Answer {
    fn opened(self, fh: u64, flags: FopenFlags);
    fn opened_passthrough(self, fh: u64, flags: FopenFlags, backing: &KernelBacking);
}

pub trait CreateAnswer: Answer {
    fn created(self, ttl: &Duration, attr: &FileAttr, fh: u64, flags: FopenFlags);
}

pub trait XattrAnswer: Answer {
    /// The size of the value, to a probe with size 0.
    fn size(self, size: u32);
    fn data(self, data: &[u8]);
}

pub trait StatfsAnswer: Answer {
    #[allow(clippy::too_many_arguments)]
    fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    );
}

/// A directory listing being filled: `add` says true when the entry did not fit.
pub trait DirAnswer: Answer {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool;
    fn ok(self);
}

pub trait DirPlusAnswer: Answer {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool;
    /// Adds the entry as its name, type and inode number only (node id 0: the kernel
    /// keeps no inode for it; see `fuse::names_only`): `Some(true)` if it did not fit,
    /// `None` where the transport cannot say that (fuser's answer sets the node id from
    /// `attr`), and nothing was added.
    fn add_name_only(&mut self, _offset: u64, _name: &OsStr, _attr: &FileAttr) -> Option<bool> {
        None
    }
    fn ok(self);
}

// --- fuser's replies, for requests read from /dev/fuse ---

macro_rules! answer_for {
    ($($reply:ty),*) => {$(
        impl Answer for $reply {
            fn error(self, errno: Errno) {
                <$reply>::error(self, errno)
            }
        }
    )*};
}

answer_for!(
    ReplyEntry,
    ReplyAttr,
    ReplyEmpty,
    ReplyData,
    ReplyWrite,
    ReplyOpen,
    ReplyCreate,
    ReplyXattr,
    ReplyStatfs,
    ReplyDirectory,
    ReplyDirectoryPlus
);

impl EntryAnswer for ReplyEntry {
    fn entry(self, ttl: &Duration, attr: &FileAttr) {
        ReplyEntry::entry(self, ttl, attr, Generation(0))
    }
}

impl AttrAnswer for ReplyAttr {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        ReplyAttr::attr(self, ttl, attr)
    }
}

impl EmptyAnswer for ReplyEmpty {
    fn ok(self) {
        ReplyEmpty::ok(self)
    }
}

impl DataAnswer for ReplyData {
    fn data(self, data: &[u8]) {
        ReplyData::data(self, data)
    }
}

impl WriteAnswer for ReplyWrite {
    fn written(self, size: u32) {
        ReplyWrite::written(self, size)
    }
}

impl OpenAnswer for ReplyOpen {
    fn opened(self, fh: u64, flags: FopenFlags) {
        ReplyOpen::opened(self, FileHandle(fh), flags)
    }

    fn opened_passthrough(self, fh: u64, flags: FopenFlags, backing: &KernelBacking) {
        // SAFETY: the id is open (`backing` closes it only when dropped) and belongs to
        // this session; `into_raw` below gives it back without closing it.
        let lent = unsafe { self.wrap_backing(backing.id()) };
        ReplyOpen::opened_passthrough(self, FileHandle(fh), flags, &lent);
        let _ = lent.into_raw();
    }
}

impl CreateAnswer for ReplyCreate {
    fn created(self, ttl: &Duration, attr: &FileAttr, fh: u64, flags: FopenFlags) {
        ReplyCreate::created(self, ttl, attr, Generation(0), FileHandle(fh), flags)
    }
}

impl XattrAnswer for ReplyXattr {
    fn size(self, size: u32) {
        ReplyXattr::size(self, size)
    }

    fn data(self, data: &[u8]) {
        ReplyXattr::data(self, data)
    }
}

impl StatfsAnswer for ReplyStatfs {
    fn statfs(
        self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
        frsize: u32,
    ) {
        ReplyStatfs::statfs(self, blocks, bfree, bavail, files, ffree, bsize, namelen, frsize)
    }
}

impl DirAnswer for ReplyDirectory {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool {
        ReplyDirectory::add(self, INodeNo(ino), offset, kind, name)
    }

    fn ok(self) {
        ReplyDirectory::ok(self)
    }
}

impl DirPlusAnswer for ReplyDirectoryPlus {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool {
        ReplyDirectoryPlus::add(self, attr.ino, offset, name, ttl, attr, Generation(0))
    }

    fn ok(self) {
        ReplyDirectoryPlus::ok(self)
    }
}
