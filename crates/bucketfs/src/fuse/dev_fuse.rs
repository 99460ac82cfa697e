//! Requests read from `/dev/fuse`. fuser mounts and answers INIT (its session's handshake,
//! through [`DevFuse`]); from then on [`serve`] reads every request the ring does not
//! carry: a reader per CPU, each on a descriptor of its own (a clone of the session's),
//! reading a request, handing it to the shared dispatcher and answering on the
//! descriptor that read it (the kernel looks an answer up among the requests read through
//! that descriptor only). Decoding and answering are the ring's (`wire`), so both
//! transports send the same bytes, names-only listings included.

use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::sync::Arc;

use fuser::{Filesystem, KernelConfig, Request};

use super::dispatch::dispatch;
use super::operations::FuseAdapter;
use super::wire;
use super::wire_answer::Sink;
use super::MAX_REQUEST;

/// fuser's [`Filesystem`], for INIT alone: requests after it are read by [`serve`].
pub struct DevFuse(pub Arc<FuseAdapter>);

impl Filesystem for DevFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.0.init(config);
        Ok(())
    }
}

/// What a read must have room for: the largest WRITE (headers and 1 MiB of data).
const READ_BUFFER: usize = MAX_REQUEST as usize + 4096;

/// Readers at most: every one waiting is woken by each request (see [`serve`]).
const MAX_READERS: usize = 4;
/// Readers at least, so that a request waiting on the local disk does not hold up all others.
const MIN_READERS: usize = 2;

nix::ioctl_read!(fuse_dev_ioc_clone, 229, 0, u32);

/// Serves the session's `/dev/fuse` until the connection ends: `Ok` once it is unmounted
/// (ENODEV), or the first other error a read met.
///
/// One reader per CPU this process may use (between [`MIN_READERS`] and [`MAX_READERS`]),
/// each pinned to its CPU when they cover them all, each waiting in `poll` on a
/// non-blocking descriptor of its own. A request wakes every reader waiting; the one on
/// the CPU of the program that made it runs first there, as that program goes to sleep,
/// and takes it; the others find nothing and wait again. So a program's requests are
/// served on its own CPU, as the ring's are. Readers blocked in `read` are woken one at a
/// time, the one waiting longest, which the scheduler places on an idle CPU: on a virtual
/// machine each request then waits for that CPU to wake, and for the program's to wake
/// for the answer (a cold indexed `find` of 71,000 files: 1.27-1.55 s that way, 0.47-0.63 s
/// this way, local `find` 0.58-0.70 s; bench/results/issue52-dev-fuse).
pub fn serve(adapter: Arc<FuseAdapter>, device: &OwnedFd) -> io::Result<()> {
    let cpus = usable_cpus();
    let readers = cpus.len().clamp(MIN_READERS, MAX_READERS);
    let pinned = cpus.len() <= MAX_READERS;
    bucketfs_core::disk_wait::set_request_threads(readers);
    let mut threads = Vec::with_capacity(readers);
    for index in 0..readers {
        // A clone even for the first: O_NONBLOCK would otherwise reach the session's own.
        let descriptor = clone_of(device)?;
        nix::fcntl::fcntl(&descriptor, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
        let descriptor = Arc::new(descriptor);
        let adapter = adapter.clone();
        let cpu = pinned.then(|| cpus[index % cpus.len()]);
        let thread = std::thread::Builder::new().name(format!("fuse-dev-{index}")).spawn(move || {
            if let Some(cpu) = cpu {
                pin_to(cpu);
            }
            read_requests(&adapter, descriptor)
        })?;
        threads.push(thread);
    }
    let mut outcome = Ok(());
    for thread in threads {
        let ended = thread.join().unwrap_or_else(|_| Err(io::Error::other("a /dev/fuse reader panicked")));
        if outcome.is_ok() {
            outcome = ended;
        }
    }
    outcome
}

/// The CPUs this process may run on.
fn usable_cpus() -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return vec![0] };
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false)).collect();
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

fn pin_to(cpu: usize) {
    if let Err(error) = super::pin_this_thread(cpu) {
        // Still correct: requests are served from wherever the thread runs.
        tracing::debug!(cpu, "/dev/fuse reader not pinned: {error}");
    }
}

/// A new descriptor of the same connection, with a request queue of its own, so that
/// readers do not contend for one (`FUSE_DEV_IOC_CLONE`).
fn clone_of(device: &OwnedFd) -> io::Result<OwnedFd> {
    let clone: OwnedFd = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?.into();
    let mut source = device.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 that lives for the call, on a descriptor we own.
    unsafe { fuse_dev_ioc_clone(clone.as_raw_fd(), &mut source) }?;
    Ok(clone)
}

fn read_requests(adapter: &FuseAdapter, descriptor: Arc<OwnedFd>) -> io::Result<()> {
    use nix::errno::Errno;
    let mut buffer = vec![0u8; READ_BUFFER];
    loop {
        match nix::unistd::read(descriptor.as_fd(), &mut buffer) {
            Ok(size) => dispatch(adapter, &buffer[..size], DescriptorSink(descriptor.clone()), 0),
            // Nothing pending (another reader took it), or it was interrupted before we
            // read it (ENOENT). Unmounted, poll says so and the read says ENODEV.
            Err(Errno::EAGAIN | Errno::ENOENT | Errno::EINTR) => wait_for_request(&descriptor)?,
            Err(Errno::ENODEV) => return Ok(()),
            Err(error) => return Err(error.into()),
        }
    }
}

fn wait_for_request(descriptor: &OwnedFd) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut waiting = [PollFd::new(descriptor.as_fd(), PollFlags::POLLIN)];
    match poll(&mut waiting, PollTimeout::NONE) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Answers go back on the descriptor that read the request.
struct DescriptorSink(Arc<OwnedFd>);

impl Sink for DescriptorSink {
    fn send(&self, unique: u64, error: i32, payload: &[u8]) {
        let header = wire::out_header((wire::OUT_HEADER_SIZE + payload.len()) as u32, error, unique);
        let slices = [io::IoSlice::new(&header), io::IoSlice::new(payload)];
        // SAFETY: `IoSlice` is ABI-compatible with `iovec`; both slices outlive the call.
        let written = unsafe { libc::writev(self.0.as_raw_fd(), slices.as_ptr().cast(), slices.len() as i32) };
        if written < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                // The request was interrupted, or the connection ended (unmount): no one waits.
                Some(libc::ENOENT | libc::ENODEV) => {}
                _ => tracing::error!("FUSE: cannot answer request {unique}: {error}"),
            }
        }
    }

    /// No bound of its own: an answer is at most what its request asked for.
    fn capacity(&self) -> usize {
        usize::MAX
    }

    fn unanswered(&self, _unique: u64) {}
}
