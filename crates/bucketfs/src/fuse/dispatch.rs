//! Hands a decoded request to the shared operations, whichever transport carried it
//! (`dev_fuse` or `ring`): decoded by `wire`, answered through a [`WireAnswer`] on the
//! transport's [`Sink`].

use fuser::Errno;

use super::answer::{Answer as _, Requester};
use super::operations::FuseAdapter;
use super::wire::{self, Request};
use super::wire_answer::{Sink, WireAnswer};

const FUSE_LINK: u32 = 13;

/// Serves the request in `bytes` (laid out as `read(2)` of `/dev/fuse` gives it). One
/// that does not decode is answered EIO (as request `fallback_unique` if even its header
/// does not). Who may send requests is the kernel's business: without `allow_other` it
/// refuses every caller but the mount's owner before a request is made.
pub(super) fn dispatch<S: Sink>(adapter: &FuseAdapter, bytes: &[u8], sink: S, fallback_unique: u64) {
    let (header, request) = match wire::parse(bytes) {
        Ok(parsed) => parsed,
        Err(error) => {
            tracing::warn!("FUSE: a request that does not parse: {error}");
            let unique = wire::parse_header(bytes).map_or(fallback_unique, |h| h.unique);
            return WireAnswer::new(sink, unique).error(Errno::EIO);
        }
    };
    let reply = WireAnswer::new(sink, header.unique);
    let req = Requester { uid: header.uid, gid: header.gid, pid: header.pid };
    let ino = header.nodeid;
    match request {
        Request::Lookup { name } => adapter.lookup(&req, ino, name, reply),
        Request::GetAttr { .. } => adapter.getattr(&req, ino, reply),
        Request::SetAttr(set) => adapter.setattr(&req, ino, set, reply),
        Request::ReadLink => adapter.readlink(&req, ino, reply),
        Request::Symlink { name, target } => adapter.symlink(&req, ino, name, target, reply),
        Request::MkNod { name, mode, rdev, .. } => adapter.mknod(&req, ino, name, mode, rdev, reply),
        Request::MkDir { name, mode, .. } => adapter.mkdir(&req, ino, name, mode, reply),
        Request::Unlink { name } => adapter.unlink(&req, ino, name, reply),
        Request::RmDir { name } => adapter.rmdir(&req, ino, name, reply),
        Request::Rename { newdir, name, newname, flags } => {
            adapter.rename(&req, ino, name, newdir, newname, flags, reply)
        }
        Request::Open { flags, kill_suidgid } => adapter.open(&req, ino, flags, kill_suidgid, reply),
        Request::Read { fh, offset, size, .. } => adapter.read(&req, ino, fh, offset, size, reply),
        Request::Write { fh, offset, data, kill_suidgid, .. } => {
            adapter.write(&req, ino, fh, offset, data, kill_suidgid, reply)
        }
        Request::StatFs => adapter.statfs(reply),
        Request::Release { fh, .. } => adapter.release(&req, ino, fh, reply),
        Request::Fsync { fh, .. } => adapter.fsync(&req, ino, fh, reply),
        Request::SetXattr { name, value, flags } => adapter.setxattr(&req, ino, name, value, flags, reply),
        Request::GetXattr { name, size } => adapter.getxattr(&req, ino, name, size, reply),
        Request::ListXattr { size } => adapter.listxattr(&req, ino, size, reply),
        Request::RemoveXattr { name } => adapter.removexattr(&req, ino, name, reply),
        Request::Flush { fh, .. } => adapter.flush(&req, ino, fh, reply),
        Request::OpenDir { .. } => adapter.opendir(ino, reply),
        Request::ReadDir { fh, offset, size } => adapter.readdir(&req, ino, fh, offset, reply.listing(size)),
        Request::ReadDirPlus { fh, offset, size } => adapter.readdirplus(&req, ino, fh, offset, reply.listing(size)),
        Request::ReleaseDir { fh, .. } => adapter.releasedir(fh, reply),
        Request::Create { name, mode, flags, .. } => adapter.create(&req, ino, name, mode, flags, reply),
        Request::CopyFileRange { fh_in, offset_in, fh_out, offset_out, len, .. } => {
            adapter.copy_file_range(&req, ino, fh_in, offset_in, fh_out, offset_out, len, reply)
        }
        // The kernel sends these on /dev/fuse, never over the ring, and wants no answer.
        Request::Forget { nlookup } => {
            adapter.forget(ino, nlookup);
            reply.none()
        }
        Request::BatchForget(forgets) => {
            for (ino, nlookup) in forgets {
                adapter.forget(ino, nlookup);
            }
            reply.none()
        }
        // As fuser's session answers it: hard links cannot be made (two keys cannot share
        // one object).
        Request::Other { opcode: FUSE_LINK } => reply.error(Errno::EPERM),
        Request::Interrupt { .. } | Request::Destroy | Request::Other { .. } => reply.error(Errno::ENOSYS),
    }
}
