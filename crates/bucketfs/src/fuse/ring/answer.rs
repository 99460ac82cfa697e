//! Answers to requests carried over the ring: each holds its entry until it is sent (an
//! answer dropped unsent sends EIO, so the entry goes back to the kernel whatever happens).

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use fuser::{Errno, FileAttr, FileType, FopenFlags};

use super::queue::QueueShared;
use super::wire;
use crate::fuse::answer::{
    Answer, AttrAnswer, CreateAnswer, DataAnswer, DirAnswer, DirPlusAnswer, EmptyAnswer, EntryAnswer, OpenAnswer,
    StatfsAnswer, WriteAnswer, XattrAnswer,
};
use crate::fuse::io_modes::KernelBacking;

pub(super) struct RingAnswer {
    queue: Arc<QueueShared>,
    entry: u16,
    unique: u64,
    sent: bool,
}

impl RingAnswer {
    pub(super) fn new(queue: Arc<QueueShared>, entry: u16, unique: u64) -> Self {
        Self { queue, entry, unique, sent: false }
    }

    fn send(mut self, error: i32, parts: &[&[u8]]) {
        self.sent = true;
        self.queue.answer(self.entry, self.unique, error, parts);
    }

    /// A listing of at most `size` bytes to fill.
    pub(super) fn listing(self, size: u32) -> RingListing {
        let max = (size as usize).min(self.queue.payload_capacity());
        RingListing { answer: self, entries: wire::DirBuffer::new(max) }
    }
}

impl Drop for RingAnswer {
    fn drop(&mut self) {
        if !self.sent {
            self.queue.answer(self.entry, self.unique, -libc::EIO, &[]);
        }
    }
}

impl Answer for RingAnswer {
    fn error(self, errno: Errno) {
        self.send(-errno.code(), &[])
    }
}

impl EntryAnswer for RingAnswer {
    fn entry(self, ttl: &Duration, attr: &FileAttr) {
        self.send(0, &[&wire::entry_out(attr, *ttl, *ttl)])
    }
}

impl AttrAnswer for RingAnswer {
    fn attr(self, ttl: &Duration, attr: &FileAttr) {
        self.send(0, &[&wire::attr_out(attr, *ttl)])
    }
}

impl EmptyAnswer for RingAnswer {
    fn ok(self) {
        self.send(0, &[])
    }
}

impl DataAnswer for RingAnswer {
    fn data(self, data: &[u8]) {
        self.send(0, &[data])
    }
}

impl WriteAnswer for RingAnswer {
    fn written(self, size: u32) {
        self.send(0, &[&wire::write_out(size)])
    }
}

impl OpenAnswer for RingAnswer {
    fn opened(self, fh: u64, flags: FopenFlags) {
        self.send(0, &[&wire::open_out(fh, flags.bits(), 0)])
    }

    fn opened_passthrough(self, fh: u64, flags: FopenFlags, backing: &KernelBacking) {
        let flags = flags | FopenFlags::FOPEN_PASSTHROUGH;
        self.send(0, &[&wire::open_out(fh, flags.bits(), backing.id() as i32)])
    }
}

impl CreateAnswer for RingAnswer {
    fn created(self, ttl: &Duration, attr: &FileAttr, fh: u64, flags: FopenFlags) {
        self.send(0, &[&wire::create_out(attr, *ttl, fh, flags.bits())])
    }
}

impl XattrAnswer for RingAnswer {
    fn size(self, size: u32) {
        self.send(0, &[&wire::xattr_size_out(size)])
    }

    fn data(self, data: &[u8]) {
        self.send(0, &[data])
    }
}

impl StatfsAnswer for RingAnswer {
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
        self.send(0, &[&wire::statfs_out(blocks, bfree, bavail, files, ffree, bsize, namelen, frsize)])
    }
}

/// A READDIR or READDIRPLUS answer being filled.
pub(super) struct RingListing {
    answer: RingAnswer,
    entries: wire::DirBuffer,
}

impl Answer for RingListing {
    fn error(self, errno: Errno) {
        self.answer.error(errno)
    }
}

impl DirAnswer for RingListing {
    fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool {
        self.entries.add(ino, offset, kind, name)
    }

    fn ok(self) {
        self.answer.send(0, &[self.entries.bytes()])
    }
}

impl DirPlusAnswer for RingListing {
    fn add(&mut self, offset: u64, name: &OsStr, ttl: &Duration, attr: &FileAttr) -> bool {
        self.entries.add_plus(offset, name, *ttl, attr)
    }

    fn add_name_only(&mut self, offset: u64, name: &OsStr, attr: &FileAttr) -> Option<bool> {
        Some(self.entries.add_plus_name_only(offset, name, attr))
    }

    fn ok(self) {
        self.answer.send(0, &[self.entries.bytes()])
    }
}
