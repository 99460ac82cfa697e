//! Requests read from `/dev/fuse` by fuser's session: decoded by fuser, handed to
//! [`FuseAdapter`]'s operations with fuser's replies. INIT, FORGET and INTERRUPT always
//! come this way, and everything else too unless the ring carries it (see `ring`).

use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

use fuser::{
    CopyFileRangeFlags, FileHandle, Filesystem, INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::operations::{FuseAdapter, SetAttrRequest};

/// fuser's [`Filesystem`] over the shared operations.
pub struct DevFuse(pub Arc<FuseAdapter>);

impl Filesystem for DevFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.0.init(config);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.0.lookup(&req.into(), parent.0, name, reply)
    }

    // `batch_forget` comes here too (fuser's default), one inode at a time.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.forget(ino.0, nlookup)
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.0.getattr(&req.into(), ino.0, reply)
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.0.open(&req.into(), ino.0, flags.0, reply)
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.0.read(&req.into(), ino.0, fh.0, offset, size, reply)
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.release(&req.into(), ino.0, fh.0, reply)
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.0.opendir(ino.0, reply)
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.0.readdir(&req.into(), ino.0, fh.0, offset, reply)
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        self.0.readdirplus(&req.into(), ino.0, fh.0, offset, reply)
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.0.releasedir(fh.0, reply)
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.0.statfs(reply)
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.0.getxattr(&req.into(), ino.0, name, size, reply)
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.0.listxattr(&req.into(), ino.0, size, reply)
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.0.setxattr(&req.into(), ino.0, name, value, flags, reply)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.removexattr(&req.into(), ino.0, name, reply)
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.0.readlink(&req.into(), ino.0, reply)
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.0.create(&req.into(), parent.0, name, mode, flags, reply)
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let drop_set_id = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        self.0.write(&req.into(), ino.0, fh.0, offset, data, drop_set_id, reply)
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.0.copy_file_range(&req.into(), ino_in.0, fh_in.0, offset_in, fh_out.0, offset_out, len, reply)
    }

    fn flush(&self, req: &Request, ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.0.flush(&req.into(), ino.0, fh.0, reply)
    }

    fn fsync(&self, req: &Request, ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.0.fsync(&req.into(), ino.0, fh.0, reply)
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        self.0.mkdir(&req.into(), parent.0, name, mode, reply)
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.unlink(&req.into(), parent.0, name, reply)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.rmdir(&req.into(), parent.0, name, reply)
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttrRequest { mode, uid, gid, size, atime, mtime, fh: fh.map(|fh| fh.0) };
        self.0.setattr(&req.into(), ino.0, set, reply)
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.0.rename(&req.into(), parent.0, name, newparent.0, newname, flags.bits(), reply)
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.0.mknod(&req.into(), parent.0, name, mode, rdev, reply)
    }

    fn symlink(&self, req: &Request, parent: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        self.0.symlink(&req.into(), parent.0, name, target.as_os_str(), reply)
    }
}
