//! Answers in the kernel's byte layout (`wire`), whichever transport carried the request:
//! a [`Sink`] takes each finished answer (a ring entry, or a `writev` on the `/dev/fuse`
//! descriptor that read the request). An answer dropped unsent sends EIO, so no request
//! waits for ever and no ring entry is lost.

use std::ffi::OsStr;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};

use super::answer::{
    Answer, AttrAnswer, CreateAnswer, DataAnswer, DirAnswer, DirPlusAnswer, EmptyAnswer, EntryAnswer, OpenAnswer,
    StatfsAnswer, WriteAnswer, XattrAnswer,
};
use super::io_modes::KernelBacking;
use super::wire;

/// Where a transport's answers go.
pub trait Sink: Send + 'static {
    /// Sends the answer to request `unique`: `error` (0 or a negative errno) and
    /// `payload`, its out-arguments.
    fn send(&self, unique: u64, error: i32, payload: &[u8]);
    /// The largest out-arguments it carries.
    fn capacity(&self) -> usize;
    /// A request the kernel wants no answer to (FORGET) was served.
    fn unanswered(&self, unique: u64);
}

pub struct WireAnswer<S: Sink> {
    sink: S,
    unique: u64,
    sent: bool,
}

impl<S: Sink> WireAnswer<S> {
    pub fn new(sink: S, unique: u64) -> Self {
        Self { sink, unique, sent: false }
    }

    fn send(mut self, error: i32, payload: &[u8]) {
        self.sent = true;
        self.sink.send(self.unique, error, payload);
    }

    /// The request wants no answer (FORGET).
    pub fn none(mut self) {
        self.sent = true;
        self.sink.unanswered(self.unique);
    }

    /// A listing of at most `size` bytes to fill.
    pub fn listing(self, size: u32) -> WireListing<S> {
        let max = (size as usize).min(self.sink.capacity());
        WireListing { answer: self, entries: wire::DirBuffer::new(max) }
    }
}

impl<S: Sink> Drop for WireAnswer<S> {
    fn drop(&mut self) {
        if !self.sent {
            self.sink.send(self.unique, -libc::EIO, &[]);
        }
    }
}

impl<S: Sink> Answer for WireAnswer<S> {
    fn error(self, errno: Errno) {
        self.send(-errno.code(), &[])
    }
}

impl<S: Sink> EntryAnswer for WireAnswer<S> {
    fn entry(self, ttl: &Duration, attr: &FileAttr) {
        self.send(0, &wire::entry_out(attr, *ttl, *ttl))
    }
}

impl<S: Sink> AttrAnswer for WireAnswer<S> {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.send(0, &wire::attr_out(attr, *ttl))
    }
}

impl<S: Sink> EmptyAnswer for WireAnswer<S> {
    fn ok(self) {
        self.send(0, &[])
    }
}

impl<S: Sink> DataAnswer for WireAnswer<S> {
    fn data(self, data: &[u8]) {
        self.send(0, data)
    }
}

impl<S: Sink> WriteAnswer for WireAnswer<S> {
    fn written(self, size: u32) {
        self.send(0, &wire::write_out(size))
    }
}

impl<S: Sink> OpenAnswer for WireAnswer<S> {
    fn opened(self, fh: u64, flags: FopenFlags) {
        self.send(0, &wire::open_out(fh, flags.bits(), 0))
    }

    fn opened_passthrough(self, fh: u64, flags: FopenFlags, backing: &KernelBacking) {
        let flags = flags | FopenFlags::FOPEN_PASSTHROUGH;
        self.send(0, &wire::open_out(fh, flags.bits(), backing.id() as i32))
    }
}

impl<S: Sink> CreateAnswer for WireAnswer<S> {
    fn created(self, ttl: &Duration, attr: &FileAttr, fh: u64, flags: FopenFlags) {
        self.send(0, &wire::create_out(attr, *ttl, fh, flags.bits()))
    }
}

impl<S: Sink> XattrAnswer for WireAnswer<S> {
    fn size(self, size: u32) {
        self.send(0, &wire::xattr_size_out(size))
    }

    fn data(self, data: &[u8]) {
        self.send(0, data)
    }
}

impl<S: Sink> StatfsAnswer for WireAnswer<S> {
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
        self.send(0, &wire::statfs_out(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize))
    }
}

/// A READDIR or READDIRPLUS answer being filled.
pub struct WireListing<S: Sink> {
    answer: WireAnswer<S>,
    entries: wire::DirBuffer,
}

impl<S: Sink> Answer for WireListing<S> {
    fn error(self, errno: Errno) {
        self.answer.error(errno)
    }
}

impl<S: Sink> DirAnswer for WireListing<S> {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool {
        self.entries.add(ino, offset, kind, name)
    }

    fn ok(self) {
        self.answer.send(0, self.entries.bytes())
    }
}

impl<S: Sink> DirPlusAnswer for WireListing<S> {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool {
        self.entries.add_plus(offset, name, *ttl, attr)
    }

    fn add_name_only(&mut self, offset: u64, name: &OsStr, attr: &FileAttr) -> bool {
        self.entries.add_plus_name_only(offset, name, attr)
    }

    fn ok(self) {
        self.answer.send(0, self.entries.bytes())
    }
}
