//! Each FUSE operation, written once for both transports (`/dev/fuse` through fuser, and
//! io_uring): decoded arguments in, an [`answer`](super::answer) out.
//!
//! Each request is run on the thread that received it until it first has to wait; what is
//! left is handed to the tokio runtime and answered from there. So a request answered from
//! memory costs no thread switch, and a transport's thread never waits on the network. The
//! only state kept here is the kernel's: which I/O mode each open file is in (page cache,
//! passthrough to the data cache's copy, direct; see [`io_modes`](super::io_modes)).

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Context;
use std::time::{Duration, SystemTime};

use fuser::{Errno, FopenFlags, INodeNo, InitFlags, KernelConfig, TimeOrNow};
use tokio::runtime::Handle;
use tracing::Instrument as _;

use super::answer::{
    AttrAnswer, CreateAnswer, DataAnswer, DirAnswer, DirPlusAnswer, EmptyAnswer, EntryAnswer, OpenAnswer, Requester,
    StatfsAnswer, WriteAnswer, XattrAnswer,
};
use super::io_modes::{IoModes, KernelBacking, Mode};
use super::kept_listings::KeptListings;
use super::names_only::NamesOnly;
use super::wire::SetAttr;
use super::{SetLogLevel, Status, LOG_LEVEL, MAX_REQUEST, STATUS, UNDELETE};
use bucketfs_client::store::StoreError;
use bucketfs_core::fs::error::FsError;
use bucketfs_core::fs::{AttrChange, Caller, DirEntry, Fs, INDEX_REFRESH, WRITE_BACK};

/// The root directory's inode.
const ROOT: u64 = INodeNo::ROOT.0;

pub struct FuseAdapter {
    fs: Arc<Fs>,
    runtime: Handle,
    /// Ask the kernel for FUSE passthrough (the mount has a data cache).
    passthrough_wanted: bool,
    /// Ask the kernel to carry requests over io_uring (see `ring`).
    ring_wanted: bool,
    /// Set at init if the kernel was asked to carry requests over io_uring: the largest
    /// write it may send (what a ring entry must hold).
    ring_asked: OnceLock<u32>,
    io_modes: Arc<IoModes>,
    set_log_level: Option<SetLogLevel>,
    status: Option<Status>,
    /// Sends the kernel invalidations; set once the session exists (see [`Self::notifier`]).
    notifier: Arc<OnceLock<fuser::Notifier>>,
    /// The session's `/dev/fuse`, once it exists: passthrough files are registered there.
    device: OnceLock<Arc<OwnedFd>>,
    /// Decided at the first OPENDIR, for the whole session: whether directories are
    /// opened without OPENDIR (every one is served from the index; see fs/dirs.rs).
    without_opendir: OnceLock<bool>,
    /// The kernel took FUSE_HANDLE_KILLPRIV_V2 at init: dropping set-ID bits on `chown`,
    /// `truncate` and `open(O_TRUNC)` is the daemon's (see [`FuseAdapter::init`]).
    set_id_bits_are_ours: AtomicBool,
    /// With `--index`: the kernel's kept listings, dropped after each refresh.
    kept_listings: Option<Arc<KeptListings>>,
    /// Which callers' READDIRPLUS answers carry their files as names only.
    names_only: Arc<NamesOnly>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<Fs>, runtime: Handle, passthrough_wanted: bool, ring_wanted: bool) -> Self {
        let notifier: Arc<OnceLock<fuser::Notifier>> = Arc::default();
        if let Some(names_back) = fs.names_back() {
            runtime.spawn(forget_missing(names_back, notifier.clone()));
        }
        Self {
            fs,
            runtime,
            passthrough_wanted,
            ring_wanted,
            ring_asked: OnceLock::new(),
            io_modes: Arc::new(IoModes::new()),
            set_log_level: None,
            status: None,
            notifier,
            device: OnceLock::new(),
            without_opendir: OnceLock::new(),
            set_id_bits_are_ours: AtomicBool::new(false),
            kept_listings: None,
            names_only: Arc::new(NamesOnly::never()),
        }
    }

    /// The mount has an index refreshed as `refreshes` says: the listings the kernel keeps
    /// of indexed directories are dropped after each refresh.
    pub fn with_index_refreshes(mut self, refreshes: tokio::sync::watch::Receiver<u64>) -> Self {
        let kept = KeptListings::drop_after_refreshes(self.fs.clone(), self.notifier.clone(), refreshes, &self.runtime);
        self.kept_listings = Some(Arc::new(kept));
        self
    }

    /// Whether walks that only want names may get their files as names only (see
    /// [`names_only`](super::names_only); off until this says so): on unless
    /// `--whole-listings`.
    pub fn with_names_only(mut self, on: bool) -> Self {
        self.names_only = Arc::new(if on { NamesOnly::default() } else { NamesOnly::never() });
        self
    }

    /// Lets root or the daemon's own user change the log level through [`LOG_LEVEL`].
    pub fn with_log_level(mut self, set: SetLogLevel) -> Self {
        self.set_log_level = Some(set);
        self
    }

    /// Answers [`STATUS`] with `status`.
    pub fn with_status(mut self, status: Status) -> Self {
        self.status = Some(status);
        self
    }

    /// Once the session exists: its notifier, and its `/dev/fuse` (for passthrough files).
    pub fn session_started(&self, notifier: fuser::Notifier, device: Arc<OwnedFd>) {
        let _ = self.notifier.set(notifier);
        let _ = self.device.set(device);
    }

    /// The kernel was asked at init to carry requests over io_uring (and holds them until
    /// the ring is registered, or given up): the largest write an entry must hold.
    pub fn ring_asked(&self) -> Option<u32> {
        self.ring_asked.get().copied()
    }

    /// The session's `/dev/fuse` (set by [`FuseAdapter::session_started`]).
    pub fn device(&self) -> Option<Arc<OwnedFd>> {
        self.device.get().cloned()
    }

    fn set_log_level(&self, req: &Requester, value: &[u8]) -> Result<(), Errno> {
        let Some(set) = &self.set_log_level else { return Err(Errno::ENOTSUP) };
        if req.uid != 0 && req.uid != nix::unistd::getuid().as_raw() {
            return Err(Errno::EPERM);
        }
        let level = std::str::from_utf8(value).map_err(|_| Errno::EINVAL)?;
        set(level.trim()).map_err(|error| {
            tracing::warn!("log level {level:?} refused: {error}");
            Errno::EINVAL
        })
    }

    /// Runs `work` with its own handle on the filesystem: polled once here (inside the
    /// runtime's context, so it may start I/O and spawn), and if it has to wait, moved to
    /// the runtime as it is, which polls it again with a real waker. Polling never waits
    /// for the network; it may wait for the local disk (see `disk_wait`).
    fn spawn<F, Fut>(&self, span: tracing::Span, work: F)
    where
        F: FnOnce(Arc<Fs>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let _context = self.runtime.enter();
        let mut task = Box::pin(work(self.fs.clone()).instrument(span));
        let waker = futures::task::noop_waker();
        if bucketfs_core::disk_wait::on_request_thread(|| task.as_mut().poll(&mut Context::from_waker(&waker)))
            .is_pending()
        {
            self.runtime.spawn(task);
        }
    }
}

/// How a file opened with `flags` (for writing) is written. A write-only descriptor
/// sends its writes straight to the daemon (`FOPEN_DIRECT_IO`) rather than through the
/// page cache, where the kernel splits a write that starts inside a page at that page's
/// end, copies every byte once more, and (unless it took FUSE_HANDLE_KILLPRIV_V2) asks
/// for the `security.capability` attribute before each write. It leaves dropping set-ID
/// bits to the daemon on direct writes (see `Fs::write`). `tar x` of 7,100 files sends
/// 22% fewer requests. Nothing is lost by it: a write-only descriptor cannot read or map
/// the file, and the kernel drops pages other descriptors cached of the range written.
fn written_straight(flags: i32) -> FopenFlags {
    if flags & libc::O_ACCMODE == libc::O_WRONLY {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

/// A name to look up: every S3 key is UTF-8, so a name that is not cannot exist.
fn existing_name(name: &OsStr) -> Result<&str, FsError> {
    name.to_str().ok_or(FsError::NotFound)
}

/// A name to create: it must be UTF-8 to become part of a key.
fn new_name(name: &OsStr) -> Result<&str, FsError> {
    name.to_str().ok_or(FsError::Invalid("file names must be UTF-8"))
}

/// Answers a size probe (`size` 0) or the value itself, or ERANGE if it does not fit.
fn reply_xattr(reply: impl XattrAnswer, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32)
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(value)
    }
}

fn time_or_now(time: TimeOrNow) -> SystemTime {
    match time {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// A request's span (at debug level: free unless debug logs are on): what every log line
/// of its work carries, operation, inode and caller (`pid`: FUSE's, the calling thread).
fn request_span(op: &'static str, ino: u64, req: &Requester) -> tracing::Span {
    bucketfs_client::metrics::fuse_request(op);
    tracing::debug_span!("fuse", op, ino, pid = req.pid)
}

fn reply_result(reply: impl EmptyAnswer, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

fn caller(req: &Requester) -> Caller {
    Caller { thread: req.pid, uid: req.uid, gid: req.gid }
}

fn log_error(op: &'static str, error: &FsError) -> Errno {
    match error {
        // A name the store cannot hold is the program's business, like ENOENT.
        FsError::Store(StoreError::KeyTooLong) => tracing::debug!("{op}: {error}"),
        FsError::Store(store) => tracing::warn!("{op}: {store}"),
        other => tracing::debug!("{op}: {other}"),
    }
    let errno = error.errno();
    bucketfs_client::metrics::fuse_error(op, errno.code());
    errno
}

impl FuseAdapter {
    /// INIT (always on `/dev/fuse`): what the session asks of the kernel.
    pub fn init(&self, config: &mut KernelConfig) {
        // Each setting is a request the kernel may lower; take what it grants.
        let _ = config.set_max_readahead(MAX_REQUEST).or_else(|max| config.set_max_readahead(max));
        let max_write = config.set_max_write(MAX_REQUEST).map(|_| MAX_REQUEST).unwrap_or_else(|max| {
            let _ = config.set_max_write(max);
            max
        });
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        for wanted in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_ASYNC_READ,
            // open(O_TRUNC) arrives as one open with O_TRUNC, not a truncate then an open.
            InitFlags::FUSE_ATOMIC_O_TRUNC,
        ] {
            if config.add_capabilities(wanted).is_err() {
                tracing::debug!("kernel does not offer {wanted:?}");
            }
        }
        // The daemon drops set-ID bits itself (writes, chown, truncate, open(O_TRUNC) by
        // callers without CAP_FSETID). Otherwise the kernel asks for `security.capability`
        // before writes and re-reads the attributes (GETATTR) before every `chown`, to
        // work out a mode to send: two requests per file of `tar x`.
        let killpriv = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2).is_ok();
        self.set_id_bits_are_ours.store(killpriv, Ordering::Relaxed);
        if self.passthrough_wanted {
            // Reads of files whole in the data cache go from the kernel to the cache file.
            let granted =
                config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() && config.set_max_stack_depth(1).is_ok();
            if granted {
                self.io_modes.allow_passthrough();
                tracing::info!("FUSE passthrough on: files whole in the data cache are read without the daemon");
            } else {
                tracing::info!("FUSE passthrough not offered by the kernel: cached files are read through the daemon");
            }
        }
        // Offered only while the kernel's switch is on. Asked for, the kernel holds every
        // request from now until all the ring's queues are registered (`ring::serve`, or
        // `ring::give_up` if they cannot be), and the connection keeps the ring if the
        // switch is turned off meanwhile. Wanted only where this process can make an
        // io_uring (the mount checks): otherwise requests would wait forever.
        if self.ring_wanted {
            let offered = config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING);
            if offered && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok() {
                let _ = self.ring_asked.set(max_write);
            }
            if !offered {
                tracing::info!("FUSE over io_uring not offered by the kernel: requests go through /dev/fuse");
            }
        }
    }

    pub fn lookup(&self, req: &Requester, parent: u64, name: &OsStr, reply: impl EntryAnswer) {
        let span = request_span("lookup", parent, req);
        let name = name.to_owned();
        let (names_only, notifier) = (self.names_only.clone(), self.notifier.clone());
        // Only an indexed mount's listings are kept by the kernel (FOPEN_CACHE_DIR).
        let kernel_keeps_listings = self.kept_listings.is_some();
        self.spawn(span, move |fs| async move {
            let result = async { fs.lookup(parent, existing_name(&name)?).await }.await;
            match result {
                // Fs::lookup counted the reference the reply hands over.
                Ok(attr) => {
                    if attr.kind != fuser::FileType::Directory {
                        // Before the answer, so that the program looking up goes on to
                        // directories the kernel no longer keeps as names only. This
                        // takes no directory lock (the kernel holds the parent's while
                        // it waits for the answer), only the listings' pages: one write
                        // to /dev/fuse per directory, for each directory once.
                        let given = names_only.looked_up_file_in(parent);
                        if let (true, Some(notifier)) = (kernel_keeps_listings, notifier.get()) {
                            for dir in given {
                                // ENOENT: the kernel forgot it meanwhile; nothing to drop.
                                let _ = notifier.inval_inode(INodeNo(dir), 0, 0);
                            }
                        }
                    }
                    reply.entry(&fs.ttl(), &attr)
                }
                // Inode 0 is a negative entry the kernel caches for the TTL, so programs
                // probing for files that are not there (shells, importers) cost one request.
                Err(FsError::NotFound) => reply.entry(&fs.ttl(), &fs.missing_attr()),
                Err(e) => reply.error(log_error("lookup", &e)),
            }
        });
    }

    pub fn forget(&self, ino: u64, nlookup: u64) {
        bucketfs_client::metrics::fuse_request("forget");
        self.fs.forget(ino, nlookup);
    }

    pub fn getattr(&self, req: &Requester, ino: u64, reply: impl AttrAnswer) {
        let span = request_span("getattr", ino, req);
        self.spawn(span, move |fs| async move {
            match fs.getattr(ino).await {
                Ok(attr) => reply.attr(&fs.ttl(), &attr),
                Err(e) => reply.error(log_error("getattr", &e)),
            }
        });
    }

    /// `kill_suidgid`: the kernel asks for the set-ID bits to go (an `open(O_TRUNC)` by a
    /// caller without CAP_FSETID).
    pub fn open(&self, req: &Requester, ino: u64, flags: i32, kill_suidgid: bool, reply: impl OpenAnswer) {
        let span = request_span("open", ino, req);
        let caller = caller(req);
        let writing = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let drop_set_id = self.set_id_bits_are_ours.load(Ordering::Relaxed) && kill_suidgid;
        let io_modes = self.io_modes.clone();
        let device = self.device.get().cloned();
        self.spawn(span, move |fs| async move {
            if writing {
                if let Err(e) = io_modes.reserve_after_releases(ino).await {
                    return reply.error(log_error("open", &e));
                }
            }
            let opened = match fs.open(ino, flags, caller).await {
                Ok(opened) => opened,
                Err(e) => {
                    if writing {
                        io_modes.cancel(ino);
                    }
                    return reply.error(log_error("open", &e));
                }
            };
            let fopen = if opened.keep_cache { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
            if writing {
                if drop_set_id {
                    if let Err(e) = fs.drop_set_id_bits(ino).await {
                        tracing::warn!(ino, "open(O_TRUNC): could not drop the set-ID bits: {e}");
                    }
                }
                io_modes.opened(ino, opened.handle, true);
                return reply.opened(opened.handle, fopen | written_straight(flags));
            }
            // A read handle's close has nothing to commit (see `Fs::flush`) and no lock
            // to drop (the kernel keeps POSIX locks): no FLUSH round trip for it, one
            // fewer per file of `grep -r`.
            let fopen = fopen | FopenFlags::FOPEN_NOFLUSH;
            let register = |file: &std::fs::File| match &device {
                Some(device) => KernelBacking::register(device, file),
                None => Err(std::io::Error::other("the session has no /dev/fuse yet")),
            };
            match io_modes.open_for_reading(ino, opened.handle, opened.backing, register) {
                Ok(Mode::Cached) => reply.opened(opened.handle, fopen),
                Ok(Mode::Passthrough(backing)) => {
                    tracing::debug!(ino, "open: passthrough to the data cache");
                    // The kernel refuses (EIO) passthrough with any flag but a few; there
                    // is no page cache of ours to keep anyway.
                    reply.opened_passthrough(opened.handle, FopenFlags::FOPEN_NOFLUSH, &backing)
                }
                Err(e) => {
                    fs.release(opened.handle).await;
                    reply.error(log_error("open", &e))
                }
            }
        });
    }

    pub fn read(&self, req: &Requester, ino: u64, fh: u64, offset: u64, size: u32, reply: impl DataAnswer) {
        let span = request_span("read", ino, req);
        self.spawn(span, move |fs| async move {
            match fs.read(fh, offset, size).await {
                Ok(bytes) => reply.data(&bytes),
                Err(e) => reply.error(log_error("read", &e)),
            }
        });
    }

    pub fn release(&self, req: &Requester, ino: u64, fh: u64, reply: impl EmptyAnswer) {
        let span = request_span("release", ino, req);
        self.io_modes.release(fh);
        self.spawn(span, move |fs| async move {
            fs.release(fh).await;
            reply.ok();
        });
    }

    pub fn opendir(&self, ino: u64, reply: impl OpenAnswer) {
        bucketfs_client::metrics::fuse_request("opendir");
        // The kernel takes ENOSYS as "no OPENDIR/RELEASEDIR from now on" and opens every
        // directory itself, keeping its listing (FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE): what
        // an indexed directory gets below anyway. A mount still building its first index
        // lists from the store meanwhile, and keeps OPENDIR for its whole life.
        if *self.without_opendir.get_or_init(|| self.fs.lists_every_dir_from_the_index()) {
            tracing::debug!("every directory is served from the index: directories are opened without OPENDIR");
            return reply.error(Errno::ENOSYS);
        }
        match self.fs.opendir(ino) {
            // A listing from the index changes only through this mount (the kernel then
            // drops its copy itself: the directory's iversion changed) or at a refresh
            // (see [`kept_listings`](super::kept_listings)): the kernel keeps it across
            // opens, and a walk done again costs OPENDIR and RELEASEDIR only.
            Ok((handle, true)) => reply.opened(handle, FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE),
            Ok((handle, false)) => reply.opened(handle, FopenFlags::empty()),
            Err(e) => reply.error(log_error("opendir", &e)),
        }
    }

    pub fn readdir(&self, req: &Requester, ino: u64, fh: u64, offset: u64, mut reply: impl DirAnswer) {
        let span = request_span("readdir", ino, req);
        self.spawn(span, move |fs| async move {
            let add = |entry: DirEntry<'_>| {
                reply.add(entry.attr.ino.0, entry.offset, entry.attr.kind, OsStr::new(entry.name))
            };
            match fs.readdir(ino, fh, offset, add).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("readdir", &e)),
            }
        });
    }

    pub fn readdirplus(&self, req: &Requester, ino: u64, fh: u64, offset: u64, mut reply: impl DirPlusAnswer) {
        let span = request_span("readdirplus", ino, req);
        let (caller, names_only) = (req.pid, self.names_only.clone());
        self.spawn(span, move |fs| async move {
            let mut allowance = names_only.allowance(caller, offset == 0);
            let mut given = 0;
            let ttl = fs.ttl();
            let add = |entry: DirEntry<'_>| {
                let name = OsStr::new(entry.name);
                let dot = entry.name == "." || entry.name == "..";
                if allowance > 0 && !dot && entry.attr.kind != fuser::FileType::Directory {
                    // No reference handed over: nothing to count.
                    let full = reply.add_name_only(entry.offset, name, &entry.attr);
                    if !full {
                        (allowance, given) = (allowance - 1, given + 1);
                    }
                    return full;
                }
                // An entry whose stored attributes are not known yet is not cached: the
                // kernel looks it up (and we fetch them) when it is used.
                let ttl = if entry.attr_complete { ttl } else { Duration::ZERO };
                if reply.add(entry.offset, name, &ttl, &entry.attr) {
                    return true;
                }
                // Each entry but `.` and `..` is a reference the kernel keeps.
                if !dot {
                    fs.add_lookup_of(&entry);
                }
                false
            };
            match fs.readdir(ino, fh, offset, add).await {
                Ok(()) => {
                    names_only.gave(caller, ino, given);
                    bucketfs_client::metrics::names_only_entries(given);
                    reply.ok()
                }
                Err(e) => reply.error(log_error("readdirplus", &e)),
            }
        });
    }

    pub fn releasedir(&self, fh: u64, reply: impl EmptyAnswer) {
        bucketfs_client::metrics::fuse_request("releasedir");
        self.fs.releasedir(fh);
        reply.ok();
    }

    pub fn statfs(&self, reply: impl StatfsAnswer) {
        bucketfs_client::metrics::fuse_request("statfs");
        // S3 has no capacity; report a large, constant one so that tools checking free
        // space (cp, rsync, installers) proceed.
        const BLOCK: u32 = 4096;
        const BLOCKS: u64 = 1 << 40;
        const FILES: u64 = 1 << 32;
        reply.statfs(BLOCKS, BLOCKS, BLOCKS, FILES, FILES, BLOCK, 255, BLOCK);
    }

    pub fn getxattr(&self, req: &Requester, ino: u64, name: &OsStr, size: u32, reply: impl XattrAnswer) {
        let span = request_span("getxattr", ino, req);
        if let (true, Some(status)) = (ino == ROOT && name == STATUS, &self.status) {
            return reply_xattr(reply, size, status().as_bytes());
        }
        if ino == ROOT && name == WRITE_BACK {
            return reply_xattr(reply, size, self.fs.write_back_report().as_bytes());
        }
        let Some(name) = name.to_str().map(str::to_owned) else {
            return reply.error(Errno::ENODATA);
        };
        // `bucketfs refresh` returns once a walk sees the new tree: after the kernel has
        // dropped the listings it kept.
        let wait_for_kept_listings = match &self.kept_listings {
            Some(kept) if ino == ROOT && name == INDEX_REFRESH => Some(kept.clone()),
            _ => None,
        };
        self.spawn(span, move |fs| async move {
            let value = fs.getxattr(ino, &name).await;
            if let (Ok(_), Some(kept)) = (&value, wait_for_kept_listings) {
                kept.caught_up().await;
            }
            match value {
                Ok(value) => reply_xattr(reply, size, &value),
                Err(e) => reply.error(log_error("getxattr", &e)),
            }
        });
    }

    pub fn listxattr(&self, req: &Requester, ino: u64, size: u32, reply: impl XattrAnswer) {
        let span = request_span("listxattr", ino, req);
        self.spawn(span, move |fs| async move {
            match fs.listxattr(ino).await {
                Ok(names) => reply_xattr(reply, size, &names),
                Err(e) => reply.error(log_error("listxattr", &e)),
            }
        });
    }

    pub fn setxattr(&self, req: &Requester, ino: u64, name: &OsStr, value: &[u8], flags: i32, reply: impl EmptyAnswer) {
        let span = request_span("setxattr", ino, req);
        if ino == ROOT && name == LOG_LEVEL {
            return reply_result(reply, self.set_log_level(req, value));
        }
        if ino == ROOT && name == WRITE_BACK {
            // Discarding drops files: the daemon's own user or root only.
            if req.uid != 0 && req.uid != nix::unistd::getuid().as_raw() {
                return reply.error(Errno::EPERM);
            }
            let command = String::from_utf8_lossy(value).into_owned();
            return self.spawn(span, move |fs| async move {
                match fs.write_back_command(&command).await {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(log_error("write-back", &e)),
                }
            });
        }
        if name == UNDELETE {
            let span = request_span("undelete", ino, req);
            let deleted = value.to_vec();
            let notifier = self.notifier.clone();
            return self.spawn(span, move |fs| async move {
                let result = async {
                    let name = std::str::from_utf8(&deleted).map_err(|_| FsError::NotFound)?;
                    fs.undelete(ino, name).await
                };
                match result.await {
                    Ok(_) => {
                        reply.ok();
                        // A negative entry the kernel keeps since the file was deleted would
                        // hide it until the TTL. Sent after the reply: the kernel holds the
                        // directory's lock during setxattr, which the invalidation takes.
                        if let Some(notifier) = notifier.get().cloned() {
                            let name = OsString::from_vec(deleted);
                            tokio::task::spawn_blocking(move || notifier.inval_entry(INodeNo(ino), &name));
                        }
                    }
                    Err(e) => reply.error(log_error("undelete", &e)),
                }
            });
        }
        let (name, value) = (name.to_owned(), value.to_vec());
        self.spawn(span, move |fs| async move {
            let result = async { fs.setxattr(ino, existing_name(&name)?, Some(&value), flags).await }.await;
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("setxattr", &e)),
            }
        });
    }

    pub fn removexattr(&self, req: &Requester, ino: u64, name: &OsStr, reply: impl EmptyAnswer) {
        let span = request_span("removexattr", ino, req);
        let name = name.to_owned();
        self.spawn(span, move |fs| async move {
            let result = async { fs.setxattr(ino, existing_name(&name)?, None, 0).await }.await;
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("removexattr", &e)),
            }
        });
    }

    pub fn readlink(&self, req: &Requester, ino: u64, reply: impl DataAnswer) {
        let span = request_span("readlink", ino, req);
        self.spawn(span, move |fs| async move {
            match fs.readlink(ino).await {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(log_error("readlink", &e)),
            }
        });
    }

    pub fn create(&self, req: &Requester, parent: u64, name: &OsStr, mode: u32, flags: i32, reply: impl CreateAnswer) {
        let span = request_span("create", parent, req);
        let name = name.to_owned();
        let caller = caller(req);
        let io_modes = self.io_modes.clone();
        self.spawn(span, move |fs| async move {
            let result = async { fs.create(parent, new_name(&name)?, mode, flags, caller).await }.await;
            match result {
                Ok((attr, opened)) => {
                    fs.add_lookup(attr.ino.0);
                    io_modes.opened(attr.ino.0, opened.handle, false);
                    reply.created(&fs.ttl(), &attr, opened.handle, written_straight(flags))
                }
                Err(e) => reply.error(log_error("create", &e)),
            }
        });
    }

    /// `drop_set_id`: set on writes sent straight through by a caller without
    /// CAP_FSETID (FUSE_WRITE_KILL_SUIDGID): the kernel leaves dropping the set-user-ID
    /// and set-group-ID bits to us.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        req: &Requester,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        drop_set_id: bool,
        reply: impl WriteAnswer,
    ) {
        let span = request_span("write", ino, req);
        // The kernel's buffer is only lent for this call: copy before going async.
        let data = data.to_vec();
        self.spawn(span, move |fs| async move {
            match fs.write(fh, offset, &data, drop_set_id).await {
                Ok(written) => reply.written(written),
                Err(e) => reply.error(log_error("write", &e)),
            }
        });
    }

    /// Copies the store can make are made there (fs/copy.rs); any other copy the kernel
    /// makes itself on `EOPNOTSUPP`, for that call only (`ENOSYS` would stop it asking for
    /// the whole session). That answer is not an error of the copy: neither logged nor
    /// counted as one.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        req: &Requester,
        ino_in: u64,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
        reply: impl WriteAnswer,
    ) {
        let span = request_span("copy_file_range", ino_in, req);
        self.spawn(span, move |fs| async move {
            match fs.copy_file_range(fh_in, offset_in, fh_out, offset_out, len).await {
                // At most 4 GiB - 4 KiB (fs/copy.rs): the program asks again for the rest.
                Ok(copied) => reply.written(u32::try_from(copied).unwrap_or(u32::MAX)),
                Err(FsError::CopiedByTheKernel) => reply.error(Errno::EOPNOTSUPP),
                Err(e) => reply.error(log_error("copy_file_range", &e)),
            }
        });
    }

    pub fn flush(&self, req: &Requester, ino: u64, fh: u64, reply: impl EmptyAnswer) {
        let span = request_span("flush", ino, req);
        let closer = req.pid;
        self.spawn(span, move |fs| async move {
            match fs.flush(fh, closer).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("close", &e)),
            }
        });
    }

    pub fn fsync(&self, req: &Requester, ino: u64, fh: u64, reply: impl EmptyAnswer) {
        let span = request_span("fsync", ino, req);
        self.spawn(span, move |fs| async move {
            match fs.fsync(fh).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("fsync", &e)),
            }
        });
    }

    pub fn mkdir(&self, req: &Requester, parent: u64, name: &OsStr, mode: u32, reply: impl EntryAnswer) {
        let span = request_span("mkdir", parent, req);
        let name = name.to_owned();
        let caller = caller(req);
        self.spawn(span, move |fs| async move {
            let result = async { fs.mkdir(parent, new_name(&name)?, mode, caller).await }.await;
            match result {
                Ok(attr) => {
                    fs.add_lookup(attr.ino.0);
                    reply.entry(&fs.ttl(), &attr)
                }
                Err(e) => reply.error(log_error("mkdir", &e)),
            }
        });
    }

    pub fn unlink(&self, req: &Requester, parent: u64, name: &OsStr, reply: impl EmptyAnswer) {
        let span = request_span("unlink", parent, req);
        let name = name.to_owned();
        self.spawn(span, move |fs| async move {
            let result = async { fs.unlink(parent, existing_name(&name)?).await }.await;
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("unlink", &e)),
            }
        });
    }

    pub fn rmdir(&self, req: &Requester, parent: u64, name: &OsStr, reply: impl EmptyAnswer) {
        let span = request_span("rmdir", parent, req);
        let name = name.to_owned();
        self.spawn(span, move |fs| async move {
            let result = async { fs.rmdir(parent, existing_name(&name)?).await }.await;
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("rmdir", &e)),
            }
        });
    }

    pub fn setattr(&self, req: &Requester, ino: u64, set: SetAttr, reply: impl AttrAnswer) {
        let span = request_span("setattr", ino, req);
        // The kernel asks for set-ID bits to go (FATTR_KILL_SUIDGID) on a chown of a
        // non-directory and on a truncate by a caller without CAP_FSETID, which only it
        // can tell; the daemon still keeps a directory's (the kernel does not flag them).
        let drop_set_id = self.set_id_bits_are_ours.load(Ordering::Relaxed) && set.kill_suidgid;
        let change = AttrChange {
            mode: set.mode.map(|m| (m & 0o7777) as u16),
            uid: set.uid,
            gid: set.gid,
            size: set.size,
            mtime: set.mtime.map(time_or_now),
            atime: set.atime.map(time_or_now),
            handle: set.fh,
            drop_set_id,
        };
        self.spawn(span, move |fs| async move {
            match fs.setattr(ino, change).await {
                Ok(attr) => reply.attr(&fs.ttl(), &attr),
                Err(e) => reply.error(log_error("setattr", &e)),
            }
        });
    }

    /// `flags`: the RENAME_* flags of `renameat2`.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        req: &Requester,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: impl EmptyAnswer,
    ) {
        let span = request_span("rename", parent, req);
        let (name, newname) = (name.to_owned(), newname.to_owned());
        self.spawn(span, move |fs| async move {
            let result = async {
                if flags & !libc::RENAME_NOREPLACE != 0 {
                    return Err(FsError::Invalid("rename flags other than RENAME_NOREPLACE"));
                }
                let no_replace = flags & libc::RENAME_NOREPLACE != 0;
                fs.rename((parent, existing_name(&name)?), (newparent, new_name(&newname)?), no_replace).await
            }
            .await;
            match result {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(log_error("rename", &e)),
            }
        });
    }

    pub fn mknod(&self, req: &Requester, parent: u64, name: &OsStr, mode: u32, rdev: u32, reply: impl EntryAnswer) {
        let span = request_span("mknod", parent, req);
        let name = name.to_owned();
        let caller = caller(req);
        self.spawn(span, move |fs| async move {
            let result = async { fs.mknod(parent, new_name(&name)?, mode, rdev, caller).await }.await;
            match result {
                Ok(attr) => {
                    fs.add_lookup(attr.ino.0);
                    reply.entry(&fs.ttl(), &attr)
                }
                Err(e) => reply.error(log_error("mknod", &e)),
            }
        });
    }

    pub fn symlink(&self, req: &Requester, parent: u64, name: &OsStr, target: &OsStr, reply: impl EntryAnswer) {
        let span = request_span("symlink", parent, req);
        let (name, target) = (name.to_owned(), target.to_owned());
        let caller = caller(req);
        self.spawn(span, move |fs| async move {
            let result = async {
                let target = target.to_str().ok_or(FsError::Invalid("symlink target is not UTF-8"))?;
                fs.symlink(parent, new_name(&name)?, target, caller).await
            }
            .await;
            match result {
                Ok(attr) => {
                    fs.add_lookup(attr.ino.0);
                    reply.entry(&fs.ttl(), &attr)
                }
                Err(e) => reply.error(log_error("symlink", &e)),
            }
        });
    }
}

/// Drops the kernel's entry of each name whose delete the store refused after `unlink`
/// or `rmdir` returned: a negative entry it kept since would hide the file the store
/// still holds until the entry's TTL.
async fn forget_missing(
    mut names_back: tokio::sync::mpsc::UnboundedReceiver<(u64, String)>,
    notifier: Arc<OnceLock<fuser::Notifier>>,
) {
    while let Some((parent, name)) = names_back.recv().await {
        if let Some(notifier) = notifier.get().cloned() {
            // A write to /dev/fuse: off the runtime's threads. ENOENT: nothing kept.
            let _ = tokio::task::spawn_blocking(move || notifier.inval_entry(INodeNo(parent), OsStr::new(&name))).await;
        }
    }
}
