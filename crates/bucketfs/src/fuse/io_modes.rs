//! The I/O mode the kernel has each open file in: through its page cache (`Cached`), or
//! straight from a local backing file without the daemon (`Passthrough`, the data
//! cache's whole copy of the object).
//!
//! This is kernel-facing state the adapter must keep, because the kernel fails an open
//! with EIO if it mixes modes on one inode: once an inode is open in passthrough, every
//! other open of it must be passed through to the same backing file, and it can enter
//! passthrough only while no page-cache handle is open. So:
//! - a read-only open whose object is whole in the cache takes passthrough if no other
//!   handle of the inode is open in the page-cache mode; later read-only opens of the
//!   same version share its backing file;
//! - an open for writing reserves the page-cache mode *before* the file is opened (so
//!   nothing is truncated or started for an open that is then refused), and is refused
//!   with [`FsError::PassedThrough`] (ETXTBSY) while the inode is passed through (after a
//!   short wait for releases of handles already closed), as is a read-only open of a
//!   newer version then.
//!
//! One lock, held only to decide.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::os::fd::{AsRawFd as _, OwnedFd};

use parking_lot::Mutex;

use bucketfs_core::fs::error::FsError;
use bucketfs_core::fs::Backing;

/// How long an open for writing waits for the RELEASE of passed-through handles closed
/// just before (the kernel sends it a moment after `close` returned) before ETXTBSY.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

pub enum Mode {
    Cached,
    Passthrough(Arc<KernelBacking>),
}

pub struct IoModes {
    /// Passthrough was granted by the kernel at init, and registering a backing file has
    /// not failed (it needs CAP_SYS_ADMIN).
    passthrough: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    inodes: HashMap<u64, InodeIo>,
    /// Open handles: their inode, and whether they hold a passthrough share.
    handles: HashMap<u64, (u64, bool)>,
}

#[derive(Default)]
struct InodeIo {
    /// Page-cache handles open, and opens for writing on their way.
    cached: usize,
    passthrough: Option<Shared>,
}

/// The backing file an inode is passed through to, the version it holds, and how many
/// handles use it.
struct Shared {
    etag: String,
    backing: Arc<KernelBacking>,
    handles: usize,
}

impl IoModes {
    /// Passthrough stays off until [`IoModes::allow_passthrough`] (the kernel grants it at init).
    pub fn new() -> Self {
        Self { passthrough: AtomicBool::new(false), state: Mutex::new(State::default()) }
    }

    pub fn allow_passthrough(&self) {
        self.passthrough.store(true, Ordering::Relaxed);
    }

    /// Before an open for writing of `ino`: refused while it is passed through;
    /// otherwise the page-cache mode is held for it until [`IoModes::opened`] or
    /// [`IoModes::cancel`].
    pub fn reserve(&self, ino: u64) -> Result<(), FsError> {
        let mut state = self.state.lock();
        let inode = state.inodes.entry(ino).or_default();
        if inode.passthrough.is_some() {
            return Err(FsError::PassedThrough);
        }
        inode.cached += 1;
        Ok(())
    }

    /// [`IoModes::reserve`], waiting up to [`RELEASE_WAIT`] for the passed-through
    /// handles to be released: `close` of a read handle returns before the kernel sends
    /// its RELEASE (it has no FLUSH), so a program that reads a file, closes it and opens
    /// it for writing would otherwise meet ETXTBSY from a handle already closed.
    pub async fn reserve_after_releases(&self, ino: u64) -> Result<(), FsError> {
        let deadline = tokio::time::Instant::now() + RELEASE_WAIT;
        loop {
            match self.reserve(ino) {
                Err(FsError::PassedThrough) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
                result => return result,
            }
        }
    }

    /// The reserved open of `ino` failed.
    pub fn cancel(&self, ino: u64) {
        let mut state = self.state.lock();
        if let Some(inode) = state.inodes.get_mut(&ino) {
            inode.cached = inode.cached.saturating_sub(1);
        }
        state.forget_if_closed(ino);
    }

    /// The reserved open of `ino` (or a file just created) is handle `handle`, in the
    /// page-cache mode.
    pub fn opened(&self, ino: u64, handle: u64, reserved: bool) {
        let mut state = self.state.lock();
        if !reserved {
            state.inodes.entry(ino).or_default().cached += 1;
        }
        state.handles.insert(handle, (ino, false));
    }

    /// The mode of read-only handle `handle` of `ino`. `backing` is the whole cached copy
    /// the open found, if any; `register` makes it a backing file of the kernel.
    pub fn open_for_reading(
        &self,
        ino: u64,
        handle: u64,
        backing: Option<Backing>,
        register: impl FnOnce(&std::fs::File) -> std::io::Result<KernelBacking>,
    ) -> Result<Mode, FsError> {
        let mut state = self.state.lock();
        let inode = state.inodes.entry(ino).or_default();
        let (passed, mode) = match (&mut inode.passthrough, backing) {
            (Some(shared), Some(backing)) if shared.etag == backing.etag => {
                shared.handles += 1;
                (true, Mode::Passthrough(shared.backing.clone()))
            }
            (Some(_), _) => return Err(FsError::PassedThrough),
            (None, Some(backing)) if inode.cached == 0 && self.passthrough.load(Ordering::Relaxed) => {
                match register(&backing.file) {
                    Ok(id) => {
                        let id = Arc::new(id);
                        inode.passthrough = Some(Shared { etag: backing.etag, backing: id.clone(), handles: 1 });
                        (true, Mode::Passthrough(id))
                    }
                    Err(error) => {
                        self.passthrough.store(false, Ordering::Relaxed);
                        tracing::warn!("FUSE passthrough refused ({error}); cached files are read through the daemon");
                        inode.cached += 1;
                        (false, Mode::Cached)
                    }
                }
            }
            (None, _) => {
                inode.cached += 1;
                (false, Mode::Cached)
            }
        };
        state.handles.insert(handle, (ino, passed));
        Ok(mode)
    }

    /// `handle` was released: its share of its inode's mode ends (the backing file is
    /// closed with the last handle passed through to it).
    pub fn release(&self, handle: u64) {
        let mut state = self.state.lock();
        let Some((ino, passed)) = state.handles.remove(&handle) else {
            return;
        };
        if let Some(inode) = state.inodes.get_mut(&ino) {
            if !passed {
                inode.cached = inode.cached.saturating_sub(1);
            } else if let Some(shared) = &mut inode.passthrough {
                shared.handles -= 1;
                if shared.handles == 0 {
                    inode.passthrough = None;
                }
            }
        }
        state.forget_if_closed(ino);
    }
}

impl State {
    fn forget_if_closed(&mut self, ino: u64) {
        if self.inodes.get(&ino).is_some_and(|inode| inode.cached == 0 && inode.passthrough.is_none()) {
            self.inodes.remove(&ino);
        }
    }
}

/// A file the kernel reads a passed-through inode from, registered on the session's
/// `/dev/fuse` (`FUSE_DEV_IOC_BACKING_OPEN`) and closed there when dropped. Ours rather
/// than fuser's `BackingId`, which only a `/dev/fuse` reply can make: requests carried
/// over io_uring open files too.
#[derive(Debug)]
pub struct KernelBacking {
    id: u32,
    device: Arc<OwnedFd>,
}

nix::ioctl_write_ptr!(fuse_backing_close, 229, 2, u32);

impl KernelBacking {
    pub fn register(device: &Arc<OwnedFd>, file: &std::fs::File) -> std::io::Result<Self> {
        let id = fuser::BackingId::create_raw(device.as_ref(), file)?;
        Ok(Self { id, device: device.clone() })
    }

    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for KernelBacking {
    fn drop(&mut self) {
        // SAFETY: the ioctl reads one u32 that lives for the call.
        if let Err(error) = unsafe { fuse_backing_close(self.device.as_raw_fd(), &self.id) } {
            tracing::warn!(id = self.id, "closing a passthrough backing file: {error}");
        }
    }
}
