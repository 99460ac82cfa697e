//! The kernel's byte layouts (`include/uapi/linux/fuse.h`, protocol 7.45) of requests and
//! answers, for both transports (fuser has its own, but private). A request is decoded
//! from the layout `read(2)` of `/dev/fuse` gives (the ring's queue lays its requests out
//! that way); an answer's out-arguments are encoded without the out-header, which each
//! transport writes itself.
//!
//! Never panics on what the kernel sends: a request too short for its opcode is an error.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, TimeOrNow};

pub const IN_HEADER_SIZE: usize = 40;
pub const OUT_HEADER_SIZE: usize = 16;

/// `struct fuse_entry_out`, `struct fuse_attr_out`, `struct fuse_open_out`.
const ENTRY_OUT_SIZE: usize = 40 + ATTR_SIZE;
const ATTR_OUT_SIZE: usize = 16 + ATTR_SIZE;
const OPEN_OUT_SIZE: usize = 16;
/// `struct fuse_attr`.
const ATTR_SIZE: usize = 88;
/// `struct fuse_dirent` without its name.
const DIRENT_SIZE: usize = 24;

mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const COPY_FILE_RANGE: u32 = 47;
}

/// `FATTR_*`: which fields of a SETATTR are set.
mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `FUSE_OPEN_KILL_SUIDGID` in an OPEN's `open_flags`: an `open(O_TRUNC)` by a caller
/// without CAP_FSETID, whose set-ID bits are to go.
const OPEN_KILL_SUIDGID: u32 = 1;

/// `FUSE_WRITE_KILL_SUIDGID` in a WRITE's `write_flags`: a write by a caller without
/// CAP_FSETID, whose set-ID bits are to go.
const WRITE_KILL_SUIDGID: u32 = 1 << 2;

const GETATTR_FH: u32 = 1;
const READ_LOCKOWNER: u32 = 2;
const WRITE_LOCKOWNER: u32 = 2;
const FSYNC_FDATASYNC: u32 = 1;

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// Why a request could not be decoded.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("a request shorter than its header or its opcode's arguments")]
    Short,
    #[error("a name without its terminating NUL")]
    NoNul,
}

/// A request as the kernel sent it, borrowed from its buffer.
#[derive(Debug, PartialEq)]
pub enum Request<'a> {
    Lookup {
        name: &'a OsStr,
    },
    GetAttr {
        fh: Option<u64>,
    },
    SetAttr(SetAttr),
    ReadLink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    MkNod {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    },
    MkDir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    RmDir {
        name: &'a OsStr,
    },
    /// FUSE_RENAME (flags 0) and FUSE_RENAME2.
    Rename {
        newdir: u64,
        name: &'a OsStr,
        newname: &'a OsStr,
        flags: u32,
    },
    Open {
        flags: i32,
        kill_suidgid: bool,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
        /// The set-ID bits are to go (`FUSE_WRITE_KILL_SUIDGID`).
        kill_suidgid: bool,
        flags: i32,
        lock_owner: Option<u64>,
    },
    StatFs,
    Release {
        fh: u64,
        flags: i32,
        release_flags: u32,
        lock_owner: u64,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    SetXattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
    },
    GetXattr {
        name: &'a OsStr,
        size: u32,
    },
    ListXattr {
        size: u32,
    },
    RemoveXattr {
        name: &'a OsStr,
    },
    Flush {
        fh: u64,
        lock_owner: u64,
    },
    OpenDir {
        flags: i32,
    },
    ReadDir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    ReadDirPlus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    ReleaseDir {
        fh: u64,
        flags: i32,
    },
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    },
    CopyFileRange {
        fh_in: u64,
        offset_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
        flags: u64,
    },
    Forget {
        nlookup: u64,
    },
    /// (nodeid, nlookup) pairs.
    BatchForget(Vec<(u64, u64)>),
    Interrupt {
        unique: u64,
    },
    Destroy,
    /// Any other opcode (ACCESS, LINK, GETLK, FALLOCATE, LSEEK, STATX, ...).
    Other {
        opcode: u32,
    },
}

/// `struct fuse_setattr_in`: each field is there only if its `FATTR_*` bit is set.
#[derive(Debug, Clone, PartialEq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
    pub fh: Option<u64>,
    pub lock_owner: Option<u64>,
    pub kill_suidgid: bool,
}

/// Reads a request's arguments in order.
struct Args<'a> {
    bytes: &'a [u8],
}

impl<'a> Args<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < len {
            return Err(WireError::Short);
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let bytes = self.take(4)?;
        Ok(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn i32(&mut self) -> Result<i32, WireError> {
        Ok(self.u32()? as i32)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let bytes = self.take(8)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_ne_bytes(array))
    }

    /// A NUL-terminated name, without its NUL.
    fn name(&mut self) -> Result<&'a OsStr, WireError> {
        let end = self.bytes.iter().position(|byte| *byte == 0).ok_or(WireError::NoNul)?;
        let name = OsStr::from_bytes(&self.bytes[..end]);
        self.bytes = &self.bytes[end + 1..];
        Ok(name)
    }

    fn skip(&mut self, len: usize) -> Result<(), WireError> {
        self.take(len).map(|_| ())
    }
}

/// `struct fuse_in_header`, at the start of `bytes`.
pub fn parse_header(bytes: &[u8]) -> Result<InHeader, WireError> {
    let mut args = Args { bytes };
    let header = InHeader {
        len: args.u32()?,
        opcode: args.u32()?,
        unique: args.u64()?,
        nodeid: args.u64()?,
        uid: args.u32()?,
        gid: args.u32()?,
        pid: args.u32()?,
    };
    args.skip(4)?; // total_extlen, padding
    Ok(header)
}

/// Decodes one request laid out as `read(2)` of `/dev/fuse` returns it: the in-header, then
/// the op's arguments; the header's length is where the request ends.
pub fn parse(bytes: &[u8]) -> Result<(InHeader, Request<'_>), WireError> {
    let header = parse_header(bytes)?;
    let end = header.len as usize;
    if end < IN_HEADER_SIZE || bytes.len() < end {
        return Err(WireError::Short);
    }
    let mut args = Args { bytes: &bytes[IN_HEADER_SIZE..end] };
    let request = match header.opcode {
        opcode::LOOKUP => Request::Lookup { name: args.name()? },
        opcode::FORGET => Request::Forget { nlookup: args.u64()? },
        opcode::GETATTR => {
            let flags = args.u32()?;
            args.skip(4)?;
            let fh = args.u64()?;
            Request::GetAttr { fh: (flags & GETATTR_FH != 0).then_some(fh) }
        }
        opcode::SETATTR => Request::SetAttr(setattr(&mut args)?),
        opcode::READLINK => Request::ReadLink,
        opcode::SYMLINK => Request::Symlink { name: args.name()?, target: args.name()? },
        opcode::MKNOD => {
            let (mode, rdev, umask) = (args.u32()?, args.u32()?, args.u32()?);
            args.skip(4)?;
            Request::MkNod { name: args.name()?, mode, umask, rdev }
        }
        opcode::MKDIR => {
            let (mode, umask) = (args.u32()?, args.u32()?);
            Request::MkDir { name: args.name()?, mode, umask }
        }
        opcode::UNLINK => Request::Unlink { name: args.name()? },
        opcode::RMDIR => Request::RmDir { name: args.name()? },
        opcode::RENAME => {
            let newdir = args.u64()?;
            Request::Rename { newdir, name: args.name()?, newname: args.name()?, flags: 0 }
        }
        opcode::RENAME2 => {
            let (newdir, flags) = (args.u64()?, args.u32()?);
            args.skip(4)?;
            Request::Rename { newdir, name: args.name()?, newname: args.name()?, flags }
        }
        opcode::OPEN => {
            let (flags, open_flags) = (args.i32()?, args.u32()?);
            Request::Open { flags, kill_suidgid: open_flags & OPEN_KILL_SUIDGID != 0 }
        }
        opcode::OPENDIR => Request::OpenDir { flags: args.i32()? },
        opcode::READ | opcode::READDIR | opcode::READDIRPLUS => {
            let (fh, offset, size, read_flags) = (args.u64()?, args.u64()?, args.u32()?, args.u32()?);
            let (lock_owner, flags) = (args.u64()?, args.i32()?);
            match header.opcode {
                opcode::READ => Request::Read {
                    fh,
                    offset,
                    size,
                    flags,
                    lock_owner: (read_flags & READ_LOCKOWNER != 0).then_some(lock_owner),
                },
                opcode::READDIR => Request::ReadDir { fh, offset, size },
                _ => Request::ReadDirPlus { fh, offset, size },
            }
        }
        opcode::WRITE => {
            let (fh, offset, size, write_flags) = (args.u64()?, args.u64()?, args.u32()?, args.u32()?);
            let (lock_owner, flags) = (args.u64()?, args.i32()?);
            args.skip(4)?;
            let data = args.take(size as usize)?;
            let lock_owner = (write_flags & WRITE_LOCKOWNER != 0).then_some(lock_owner);
            let kill_suidgid = write_flags & WRITE_KILL_SUIDGID != 0;
            Request::Write { fh, offset, data, kill_suidgid, flags, lock_owner }
        }
        opcode::STATFS => Request::StatFs,
        opcode::RELEASE | opcode::RELEASEDIR => {
            let (fh, flags, release_flags, lock_owner) = (args.u64()?, args.i32()?, args.u32()?, args.u64()?);
            match header.opcode {
                opcode::RELEASE => Request::Release { fh, flags, release_flags, lock_owner },
                _ => Request::ReleaseDir { fh, flags },
            }
        }
        opcode::FSYNC => {
            let (fh, fsync_flags) = (args.u64()?, args.u32()?);
            Request::Fsync { fh, datasync: fsync_flags & FSYNC_FDATASYNC != 0 }
        }
        opcode::SETXATTR => {
            // The 8-byte form: the session never takes FUSE_SETXATTR_EXT.
            let (size, flags) = (args.u32()?, args.i32()?);
            let name = args.name()?;
            Request::SetXattr { name, value: args.take(size as usize)?, flags }
        }
        opcode::GETXATTR => {
            let size = args.u32()?;
            args.skip(4)?;
            Request::GetXattr { name: args.name()?, size }
        }
        opcode::LISTXATTR => Request::ListXattr { size: args.u32()? },
        opcode::REMOVEXATTR => Request::RemoveXattr { name: args.name()? },
        opcode::FLUSH => {
            let fh = args.u64()?;
            args.skip(8)?;
            Request::Flush { fh, lock_owner: args.u64()? }
        }
        opcode::CREATE => {
            let (flags, mode, umask) = (args.i32()?, args.u32()?, args.u32()?);
            args.skip(4)?; // open_flags
            Request::Create { name: args.name()?, mode, umask, flags }
        }
        opcode::INTERRUPT => Request::Interrupt { unique: args.u64()? },
        opcode::DESTROY => Request::Destroy,
        opcode::BATCH_FORGET => {
            let count = args.u32()?;
            args.skip(4)?;
            // Bounded by the request's length, not by what `count` claims.
            let mut forgets = Vec::with_capacity((count as usize).min(args.bytes.len() / 16));
            for _ in 0..count {
                forgets.push((args.u64()?, args.u64()?));
            }
            Request::BatchForget(forgets)
        }
        // Not COPY_FILE_RANGE_64 (53), whose answer differs: ENOSYS (as fuser answers it on
        // /dev/fuse) and the kernel asks with this one from then on.
        opcode::COPY_FILE_RANGE => Request::CopyFileRange {
            fh_in: args.u64()?,
            offset_in: args.u64()?,
            nodeid_out: args.u64()?,
            fh_out: args.u64()?,
            offset_out: args.u64()?,
            len: args.u64()?,
            flags: args.u64()?,
        },
        other => Request::Other { opcode: other },
    };
    Ok((header, request))
}

/// `struct fuse_setattr_in` (88 bytes).
fn setattr(args: &mut Args<'_>) -> Result<SetAttr, WireError> {
    let valid = args.u32()?;
    args.skip(4)?;
    let (fh, size, lock_owner) = (args.u64()?, args.u64()?, args.u64()?);
    let (atime, mtime, ctime) = (args.u64()?, args.u64()?, args.u64()?);
    let (atime_nsec, mtime_nsec, ctime_nsec) = (args.u32()?, args.u32()?, args.u32()?);
    let mode = args.u32()?;
    args.skip(4)?;
    let (uid, gid) = (args.u32()?, args.u32()?);
    args.skip(4)?;
    let set = |bit: u32| valid & bit != 0;
    let time = |set_bit: u32, now_bit: u32, secs: u64, nsec: u32| match (set(set_bit), set(now_bit)) {
        (_, true) => Some(TimeOrNow::Now),
        (true, false) => Some(TimeOrNow::SpecificTime(system_time(secs as i64, nsec))),
        (false, false) => None,
    };
    Ok(SetAttr {
        mode: set(fattr::MODE).then_some(mode),
        uid: set(fattr::UID).then_some(uid),
        gid: set(fattr::GID).then_some(gid),
        size: set(fattr::SIZE).then_some(size),
        atime: time(fattr::ATIME, fattr::ATIME_NOW, atime, atime_nsec),
        mtime: time(fattr::MTIME, fattr::MTIME_NOW, mtime, mtime_nsec),
        ctime: set(fattr::CTIME).then(|| system_time(ctime as i64, ctime_nsec)),
        fh: set(fattr::FH).then_some(fh),
        lock_owner: set(fattr::LOCKOWNER).then_some(lock_owner),
        kill_suidgid: set(fattr::KILL_SUIDGID),
    })
}

fn system_time(secs: i64, nsec: u32) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

/// Seconds (negative before 1970) and a non-negative nanosecond part, as the kernel keeps
/// times: -1.5 s is -2 s and 500,000,000 ns.
fn epoch_time(time: SystemTime) -> (i64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (after.as_secs() as i64, after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            match before.subsec_nanos() {
                0 => (-(before.as_secs() as i64), 0),
                nanos => (-(before.as_secs() as i64) - 1, 1_000_000_000 - nanos),
            }
        }
    }
}

/// Writes values one after another into a fixed array.
struct Out<'a> {
    bytes: &'a mut [u8],
    at: usize,
}

impl Out<'_> {
    fn u32(&mut self, value: u32) -> &mut Self {
        self.bytes[self.at..self.at + 4].copy_from_slice(&value.to_ne_bytes());
        self.at += 4;
        self
    }

    fn u64(&mut self, value: u64) -> &mut Self {
        self.bytes[self.at..self.at + 8].copy_from_slice(&value.to_ne_bytes());
        self.at += 8;
        self
    }
}

fn mode_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// `struct fuse_attr`.
fn write_attr(out: &mut Out<'_>, attr: &FileAttr) {
    let (atime, atime_nsec) = epoch_time(attr.atime);
    let (mtime, mtime_nsec) = epoch_time(attr.mtime);
    let (ctime, ctime_nsec) = epoch_time(attr.ctime);
    out.u64(attr.ino.0).u64(attr.size).u64(attr.blocks);
    out.u64(atime as u64).u64(mtime as u64).u64(ctime as u64);
    out.u32(atime_nsec).u32(mtime_nsec).u32(ctime_nsec);
    out.u32(mode_bits(attr.kind) | u32::from(attr.perm)).u32(attr.nlink).u32(attr.uid).u32(attr.gid);
    out.u32(attr.rdev).u32(attr.blksize).u32(0);
}

/// `struct fuse_entry_out`; generation 0.
pub fn entry_out(attr: &FileAttr, entry_ttl: Duration, attr_ttl: Duration) -> [u8; ENTRY_OUT_SIZE] {
    let mut bytes = [0u8; ENTRY_OUT_SIZE];
    let mut out = Out { bytes: &mut bytes, at: 0 };
    out.u64(attr.ino.0).u64(0).u64(entry_ttl.as_secs()).u64(attr_ttl.as_secs());
    out.u32(entry_ttl.subsec_nanos()).u32(attr_ttl.subsec_nanos());
    write_attr(&mut out, attr);
    bytes
}

/// `struct fuse_attr_out`.
pub fn attr_out(attr: &FileAttr, ttl: Duration) -> [u8; ATTR_OUT_SIZE] {
    let mut bytes = [0u8; ATTR_OUT_SIZE];
    let mut out = Out { bytes: &mut bytes, at: 0 };
    out.u64(ttl.as_secs()).u32(ttl.subsec_nanos()).u32(0);
    write_attr(&mut out, attr);
    bytes
}

/// `struct fuse_open_out`.
pub fn open_out(fh: u64, open_flags: u32, backing_id: i32) -> [u8; OPEN_OUT_SIZE] {
    let mut bytes = [0u8; OPEN_OUT_SIZE];
    Out { bytes: &mut bytes, at: 0 }.u64(fh).u32(open_flags).u32(backing_id as u32);
    bytes
}

/// CREATE's answer: `struct fuse_entry_out` then `struct fuse_open_out`.
pub fn create_out(attr: &FileAttr, ttl: Duration, fh: u64, open_flags: u32) -> [u8; ENTRY_OUT_SIZE + OPEN_OUT_SIZE] {
    let mut bytes = [0u8; ENTRY_OUT_SIZE + OPEN_OUT_SIZE];
    bytes[..ENTRY_OUT_SIZE].copy_from_slice(&entry_out(attr, ttl, ttl));
    bytes[ENTRY_OUT_SIZE..].copy_from_slice(&open_out(fh, open_flags, 0));
    bytes
}

/// `struct fuse_write_out`.
pub fn write_out(size: u32) -> [u8; 8] {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&size.to_ne_bytes());
    bytes
}

/// `struct fuse_getxattr_out`: the size of a value, to a probe.
pub fn xattr_size_out(size: u32) -> [u8; 8] {
    write_out(size)
}

/// `struct fuse_statfs_out` (`struct fuse_kstatfs`).
#[allow(clippy::too_many_arguments)]
pub fn statfs_out(
    blocks: u64,
    bfree: u64,
    bavail: u64,
    files: u64,
    ffree: u64,
    bsize: u32,
    namelen: u32,
    frsize: u32,
) -> [u8; 80] {
    let mut bytes = [0u8; 80];
    let mut out = Out { bytes: &mut bytes, at: 0 };
    out.u64(blocks).u64(bfree).u64(bavail).u64(files).u64(ffree).u32(bsize).u32(namelen).u32(frsize);
    bytes
}

/// `struct fuse_out_header`: `error` is 0 or a negative errno.
pub fn out_header(len: u32, error: i32, unique: u64) -> [u8; OUT_HEADER_SIZE] {
    let mut bytes = [0u8; OUT_HEADER_SIZE];
    Out { bytes: &mut bytes, at: 0 }.u32(len).u32(error as u32).u64(unique);
    bytes
}

/// A READDIR or READDIRPLUS answer being filled, at most `max` bytes (the request's size).
pub struct DirBuffer {
    bytes: Vec<u8>,
    max: usize,
}

impl DirBuffer {
    pub fn new(max: usize) -> Self {
        Self { bytes: Vec::new(), max }
    }

    /// Adds a `struct fuse_dirent`; true if it did not fit (nothing was added), as fuser's
    /// `ReplyDirectory::add` says.
    pub fn add(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr) -> bool {
        let record = dirent_size(name);
        if self.bytes.len() + record > self.max {
            return true;
        }
        self.push_dirent(ino, offset, kind, name, record);
        false
    }

    /// Adds a `struct fuse_direntplus` (the entry, then the dirent); the same answer as
    /// [`DirBuffer::add`].
    pub fn add_plus(&mut self, offset: u64, name: &OsStr, ttl: Duration, attr: &FileAttr) -> bool {
        self.push_plus(&entry_out(attr, ttl, ttl), offset, name, attr)
    }

    /// Adds a `struct fuse_direntplus` whose entry is all zeros (node id 0: the kernel
    /// makes no inode of it and hands `getdents` the dirent alone); the same answer as
    /// [`DirBuffer::add`].
    pub fn add_plus_name_only(&mut self, offset: u64, name: &OsStr, attr: &FileAttr) -> bool {
        self.push_plus(&[0; ENTRY_OUT_SIZE], offset, name, attr)
    }

    fn push_plus(&mut self, entry: &[u8; ENTRY_OUT_SIZE], offset: u64, name: &OsStr, attr: &FileAttr) -> bool {
        let record = dirent_size(name);
        if self.bytes.len() + ENTRY_OUT_SIZE + record > self.max {
            return true;
        }
        self.bytes.extend_from_slice(entry);
        self.push_dirent(attr.ino.0, offset, attr.kind, name, record);
        false
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn push_dirent(&mut self, ino: u64, offset: u64, kind: FileType, name: &OsStr, record: usize) {
        let start = self.bytes.len();
        let name = name.as_bytes();
        self.bytes.extend_from_slice(&ino.to_ne_bytes());
        self.bytes.extend_from_slice(&offset.to_ne_bytes());
        self.bytes.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        self.bytes.extend_from_slice(&(mode_bits(kind) >> 12).to_ne_bytes());
        self.bytes.extend_from_slice(name);
        self.bytes.resize(start + record, 0);
    }
}

/// A dirent's record: its fixed part and name, padded to 8 bytes (`FUSE_DIRENT_ALIGN`).
fn dirent_size(name: &OsStr) -> usize {
    (DIRENT_SIZE + name.len()).next_multiple_of(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fuser::INodeNo;
    use proptest::prelude::*;

    /// A request as the kernel lays it out: the in-header, then `args`.
    fn request(opcode: u32, args: &[&[u8]]) -> Vec<u8> {
        let len = IN_HEADER_SIZE + args.iter().map(|arg| arg.len()).sum::<usize>();
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&(len as u32).to_ne_bytes());
        bytes.extend_from_slice(&opcode.to_ne_bytes());
        bytes.extend_from_slice(&77u64.to_ne_bytes()); // unique
        bytes.extend_from_slice(&5u64.to_ne_bytes()); // nodeid
        for value in [1000u32, 100, 4242, 0] {
            bytes.extend_from_slice(&value.to_ne_bytes());
        }
        for arg in args {
            bytes.extend_from_slice(arg);
        }
        bytes
    }

    fn words(values: &[u64], sizes: &[usize]) -> Vec<u8> {
        values
            .iter()
            .zip(sizes)
            .flat_map(|(value, size)| match size {
                4 => (*value as u32).to_ne_bytes().to_vec(),
                _ => value.to_ne_bytes().to_vec(),
            })
            .collect()
    }

    fn parsed(bytes: &[u8]) -> Request<'_> {
        let (header, request) = parse(bytes).expect("parses");
        assert_eq!((header.unique, header.nodeid, header.uid, header.gid, header.pid), (77, 5, 1000, 100, 4242));
        request
    }

    fn os(name: &str) -> &OsStr {
        OsStr::new(name)
    }

    #[test]
    fn names_and_their_headers() {
        assert_eq!(parsed(&request(opcode::LOOKUP, &[b"file.txt\0"])), Request::Lookup { name: os("file.txt") });
        assert_eq!(
            parsed(&request(opcode::SYMLINK, &[b"link\0", b"../target\0"])),
            Request::Symlink { name: os("link"), target: os("../target") }
        );
        let mknod = words(&[0o10644, 0x0103, 0o22, 0], &[4, 4, 4, 4]);
        assert_eq!(
            parsed(&request(opcode::MKNOD, &[&mknod, b"fifo\0"])),
            Request::MkNod { name: os("fifo"), mode: 0o10644, umask: 0o22, rdev: 0x0103 }
        );
        let create = words(&[libc::O_WRONLY as u64, 0o100600, 0o22, 0], &[4, 4, 4, 4]);
        assert_eq!(
            parsed(&request(opcode::CREATE, &[&create, b"new\0"])),
            Request::Create { name: os("new"), mode: 0o100600, umask: 0o22, flags: libc::O_WRONLY }
        );
        let rename = 9u64.to_ne_bytes();
        assert_eq!(
            parsed(&request(opcode::RENAME, &[&rename, b"a\0b\0"])),
            Request::Rename { newdir: 9, name: os("a"), newname: os("b"), flags: 0 }
        );
        let rename2 = words(&[9, 1, 0], &[8, 4, 4]);
        assert_eq!(
            parsed(&request(opcode::RENAME2, &[&rename2, b"a\0b\0"])),
            Request::Rename { newdir: 9, name: os("a"), newname: os("b"), flags: 1 }
        );
        let setxattr = words(&[4, 1], &[4, 4]);
        assert_eq!(
            parsed(&request(opcode::SETXATTR, &[&setxattr, b"user.x\0", b"blue"])),
            Request::SetXattr { name: os("user.x"), value: b"blue", flags: 1 }
        );
        assert_eq!(parse(&request(opcode::LOOKUP, &[b"no-nul"])).map(|(_, r)| r), Err(WireError::NoNul));
    }

    #[test]
    fn reads_writes_and_handles() {
        let read =
            words(&[3, 4096, 65536, READ_LOCKOWNER as u64, 99, libc::O_RDONLY as u64, 0], &[8, 8, 4, 4, 8, 4, 4]);
        assert_eq!(
            parsed(&request(opcode::READ, &[&read])),
            Request::Read { fh: 3, offset: 4096, size: 65536, flags: 0, lock_owner: Some(99) }
        );
        assert_eq!(
            parsed(&request(opcode::READDIRPLUS, &[&read])),
            Request::ReadDirPlus { fh: 3, offset: 4096, size: 65536 }
        );
        // FUSE_WRITE_KILL_SUIDGID (4), then FUSE_WRITE_LOCKOWNER (2) with its owner.
        for (write_flags, lock_owner, kill_suidgid) in [(4, None, true), (2, Some(9), false)] {
            let owner = lock_owner.unwrap_or(0);
            let write = words(&[3, 10, 5, write_flags, owner, libc::O_WRONLY as u64, 0], &[8, 8, 4, 4, 8, 4, 4]);
            assert_eq!(
                parsed(&request(opcode::WRITE, &[&write, b"hello"])),
                Request::Write { fh: 3, offset: 10, data: b"hello", kill_suidgid, flags: libc::O_WRONLY, lock_owner }
            );
        }
        let release = words(&[3, libc::O_RDWR as u64, 1, 7], &[8, 4, 4, 8]);
        assert_eq!(
            parsed(&request(opcode::RELEASE, &[&release])),
            Request::Release { fh: 3, flags: libc::O_RDWR, release_flags: 1, lock_owner: 7 }
        );
        let flush = words(&[3, 0, 0, 7], &[8, 4, 4, 8]);
        assert_eq!(parsed(&request(opcode::FLUSH, &[&flush])), Request::Flush { fh: 3, lock_owner: 7 });
        let getattr = words(&[GETATTR_FH as u64, 0, 3], &[4, 4, 8]);
        assert_eq!(parsed(&request(opcode::GETATTR, &[&getattr])), Request::GetAttr { fh: Some(3) });
        let forgets = words(&[2, 0, 11, 1, 12, 3], &[4, 4, 8, 8, 8, 8]);
        assert_eq!(parsed(&request(opcode::BATCH_FORGET, &[&forgets])), Request::BatchForget(vec![(11, 1), (12, 3)]));
        assert_eq!(parsed(&request(34, &[&[0u8; 8]])), Request::Other { opcode: 34 });
    }

    #[test]
    fn setattr_fields_follow_their_bits() {
        let setattr = |valid: u32| {
            let mut bytes =
                words(&[valid as u64, 0, 3, 1000, 0, 1_500_000_000, 1_600_000_000, 0], &[4, 4, 8, 8, 8, 8, 8, 8]);
            bytes.extend(words(&[5, 6, 0, 0o644, 0, 1001, 1002, 0], &[4, 4, 4, 4, 4, 4, 4, 4]));
            assert_eq!(bytes.len(), 88);
            let Request::SetAttr(set) = parse(&request(opcode::SETATTR, &[&bytes])).expect("parses").1 else {
                panic!("not a setattr")
            };
            set
        };
        let set = setattr(fattr::MODE | fattr::SIZE | fattr::FH);
        assert_eq!((set.mode, set.size, set.fh, set.uid, set.atime), (Some(0o644), Some(1000), Some(3), None, None));
        let set = setattr(fattr::UID | fattr::GID | fattr::KILL_SUIDGID);
        assert_eq!((set.uid, set.gid, set.kill_suidgid, set.mode), (Some(1001), Some(1002), true, None));
        let set = setattr(fattr::ATIME | fattr::ATIME_NOW | fattr::MTIME);
        assert_eq!(set.atime, Some(TimeOrNow::Now));
        assert_eq!(set.mtime, Some(TimeOrNow::SpecificTime(UNIX_EPOCH + Duration::new(1_600_000_000, 6))));
    }

    #[test]
    fn an_open_says_whether_set_id_bits_go() {
        for (open_flags, kill_suidgid) in [(1, true), (0, false)] {
            let bytes = request(opcode::OPEN, &[&words(&[512, open_flags], &[4, 4])]);
            assert_eq!(parse(&bytes).expect("parses").1, Request::Open { flags: 512, kill_suidgid });
        }
    }

    #[test]
    fn every_prefix_of_a_request_is_refused() {
        let write = words(&[3, 10, 5, 0, 0, 1, 0], &[8, 8, 4, 4, 8, 4, 4]);
        for full in
            [request(opcode::WRITE, &[&write, b"hello"]), request(opcode::RENAME, &[&9u64.to_ne_bytes(), b"a\0b\0"])]
        {
            for cut in 0..full.len() {
                assert!(parse(&full[..cut]).is_err(), "{cut} of {} bytes", full.len());
                // The header says more than the arguments hold.
                let mut short = full[..cut.max(IN_HEADER_SIZE)].to_vec();
                if cut >= IN_HEADER_SIZE && cut < full.len() {
                    short[..4].copy_from_slice(&(cut as u32).to_ne_bytes());
                    assert!(parse(&short).is_err(), "arguments cut at {cut}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn nothing_the_kernel_could_send_panics(opcode in 0u32..60, args in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&request(opcode, &[&args]));
        }
    }

    fn attr() -> FileAttr {
        FileAttr {
            ino: INodeNo(42),
            size: 1234,
            blocks: 3,
            atime: UNIX_EPOCH - Duration::from_millis(1500),
            mtime: UNIX_EPOCH + Duration::new(1_700_000_000, 123),
            ctime: UNIX_EPOCH + Duration::new(1_700_000_001, 0),
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o640,
            nlink: 1,
            uid: 1000,
            gid: 100,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }

    fn u32_at(bytes: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
    }

    fn u64_at(bytes: &[u8], at: usize) -> u64 {
        u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    }

    #[test]
    fn answers_are_laid_out_as_the_kernel_reads_them() {
        let entry = entry_out(&attr(), Duration::new(5, 7), Duration::new(6, 8));
        assert_eq!((u64_at(&entry, 0), u64_at(&entry, 8), u64_at(&entry, 16), u64_at(&entry, 24)), (42, 0, 5, 6));
        assert_eq!((u32_at(&entry, 32), u32_at(&entry, 36)), (7, 8));
        let attr_at = 40;
        assert_eq!((u64_at(&entry, attr_at), u64_at(&entry, attr_at + 8)), (42, 1234));
        // Before 1970: -1.5 s is -2 s and half a second.
        assert_eq!((u64_at(&entry, attr_at + 24) as i64, u32_at(&entry, attr_at + 48)), (-2, 500_000_000));
        assert_eq!((u64_at(&entry, attr_at + 32), u32_at(&entry, attr_at + 52)), (1_700_000_000, 123));
        assert_eq!(u32_at(&entry, attr_at + 60), libc::S_IFREG | 0o640);
        assert_eq!((u32_at(&entry, attr_at + 68), u32_at(&entry, attr_at + 80)), (1000, 1 << 20));
        let attr_out = attr_out(&attr(), Duration::new(5, 7));
        assert_eq!((u64_at(&attr_out, 0), u32_at(&attr_out, 8)), (5, 7));
        assert_eq!(attr_out[16..], entry[40..]);
        let create = create_out(&attr(), Duration::new(5, 7), 9, 1);
        assert_eq!(create[..128], entry_out(&attr(), Duration::new(5, 7), Duration::new(5, 7)));
        assert_eq!((u64_at(&create, 128), u32_at(&create, 136)), (9, 1));
        let header = out_header(16, -libc::ENOENT, 77);
        assert_eq!(header.to_vec(), words(&[16, (-libc::ENOENT) as u32 as u64, 77], &[4, 4, 8]));
    }

    #[test]
    fn listings_pad_each_entry_and_stop_where_the_next_does_not_fit() {
        let mut listing = DirBuffer::new(64);
        assert!(!listing.add(7, 1, FileType::Directory, os("abc")));
        assert_eq!(listing.bytes().len(), 32, "24 + 3 rounded up to 8");
        assert_eq!((u64_at(listing.bytes(), 0), u64_at(listing.bytes(), 8)), (7, 1));
        assert_eq!((u32_at(listing.bytes(), 16), u32_at(listing.bytes(), 20)), (3, libc::DT_DIR as u32));
        assert_eq!(&listing.bytes()[24..32], b"abc\0\0\0\0\0");
        assert!(!listing.add(8, 2, FileType::RegularFile, os("12345678")));
        assert_eq!(listing.bytes().len(), 64);
        assert!(listing.add(9, 3, FileType::RegularFile, os("x")), "full");
        assert_eq!(listing.bytes().len(), 64, "nothing added");
        let mut plus = DirBuffer::new(4096);
        assert!(!plus.add_plus(1, os("f"), Duration::from_secs(1), &attr()));
        assert_eq!(plus.bytes().len(), 128 + 32);
        assert_eq!(u64_at(plus.bytes(), 128), 42, "the dirent's inode follows the entry");
        assert!(!plus.add_plus_name_only(2, os("g"), &attr()));
        let name_only = &plus.bytes()[160..];
        assert_eq!(name_only.len(), 128 + 32);
        assert!(name_only[..128].iter().all(|&b| b == 0), "node id 0, no attributes");
        assert_eq!((u64_at(name_only, 128), u64_at(name_only, 136)), (42, 2), "the dirent as a whole one's");
        assert_eq!(u32_at(name_only, 148), libc::DT_REG as u32);
        let mut full = DirBuffer::new(160 + 100);
        assert!(!full.add_plus(1, os("f"), Duration::from_secs(1), &attr()));
        assert!(full.add_plus_name_only(2, os("g"), &attr()), "does not fit");
        assert_eq!(full.bytes().len(), 160, "nothing added");
    }
}
