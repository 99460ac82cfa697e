//! What an operation answers the kernel, whichever transport carried the request.
//!
//! Each operation (see `operations.rs`) is written once against these traits;
//! [`WireAnswer`](super::wire_answer::WireAnswer) implements them for both transports. An
//! answer is sent once, from any thread.

use std::ffi::OsStr;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};

use super::io_modes::KernelBacking;

/// Who sent a request (the kernel's view: the calling thread and its credentials).
#[derive(Clone, Copy, Debug)]
pub struct Requester {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
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
    /// keeps no inode for it; see `fuse::names_only`): true if it did not fit (nothing
    /// was added).
    fn add_name_only(&mut self, offset: u64, name: &OsStr, attr: &FileAttr) -> bool;
    fn ok(self);
}
