//! FUSE over io_uring (Linux 6.14 and later, with the `fuse` module's `enable_uring` on):
//! the kernel carries requests and answers through one io_uring queue per possible CPU
//! instead of `read`/`write` on `/dev/fuse`, and each request is served on the CPU that
//! made it. INIT, FORGET and INTERRUPT still come on `/dev/fuse` (see `dev_fuse`), as do
//! notifications we send.
//!
//! `queue.rs` owns each queue's ring, entries and thread; requests are decoded and
//! answered as `/dev/fuse`'s are (`fuse::dispatch`), each answer into its entry
//! ([`EntrySink`]).

mod queue;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::dispatch::dispatch;
use super::operations::FuseAdapter;
use super::wire_answer::Sink;
use queue::QueueShared;

/// The `fuse` module's switch: servers may use io_uring only while it is `Y`.
pub const KERNEL_SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Requests one queue holds at once; more wait in the kernel. Each entry holds a payload
/// buffer as large as the largest write (1 MiB), touched only as far as requests fill it.
const DEPTH: usize = 8;

/// Whether the kernel lets FUSE servers use io_uring.
pub fn kernel_allows() -> bool {
    std::fs::read_to_string(KERNEL_SWITCH).is_ok_and(|value| value.trim() == "Y")
}

/// Turns the kernel's switch on (root only; it is the whole machine's).
pub fn allow_in_kernel() -> io::Result<()> {
    std::fs::write(KERNEL_SWITCH, "Y")
}

/// Registers one queue per possible CPU on the session's `/dev/fuse` (after the INIT
/// answer, which asked for io_uring; `max_write` as agreed), each served by a thread
/// pinned to its CPU. On an error the kernel goes on with `/dev/fuse` (a refused
/// registration turns the ring off for the connection; [`give_up`] makes sure of one), and
/// the queues that did register idle until unmount.
pub fn serve(adapter: Arc<FuseAdapter>, device: Arc<OwnedFd>, max_write: u32) -> io::Result<usize> {
    let result = start_queues(adapter, &device, max_write);
    if result.is_err() {
        give_up(&device);
    }
    result
}

/// Returns how many queues started; their threads end with the connection.
fn start_queues(adapter: Arc<FuseAdapter>, device: &Arc<OwnedFd>, max_write: u32) -> io::Result<usize> {
    if std::env::var_os("BUCKETFS_TEST_RING_REFUSED").is_some() {
        return Err(io::Error::other("refused for a test (BUCKETFS_TEST_RING_REFUSED)"));
    }
    // The kernel refuses a payload buffer smaller than this (`fuse_uring_create_ring_ent`).
    let payload_capacity = (max_write as usize).max(8192).max(super::MAX_REQUEST as usize);
    let queues = possible_cpus()?;
    let mut outcomes = Vec::new();
    for qid in 0..queues {
        let queue = Arc::new(QueueShared::new(qid as u16, DEPTH, payload_capacity)?);
        let (ready, outcome) = std::sync::mpsc::channel();
        let (adapter, device) = (adapter.clone(), device.clone());
        std::thread::Builder::new().name(format!("fuse-ring-{qid}")).spawn(move || {
            queue::run(device, queue, qid, ready, |queue, delivered| {
                bucketfs_client::metrics::fuse_ring_request();
                let sink = EntrySink { queue: queue.clone(), entry: delivered.entry };
                dispatch(&adapter, delivered.bytes, sink, delivered.commit_id)
            })
        })?;
        outcomes.push(outcome);
    }
    for outcome in outcomes {
        match outcome.recv() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(io::Error::other("a FUSE ring queue ended while registering")),
        }
    }
    Ok(queues)
}

/// Answers go into the request's own entry, which goes back to the kernel with them.
struct EntrySink {
    queue: Arc<QueueShared>,
    entry: u16,
}

impl Sink for EntrySink {
    fn send(&self, unique: u64, error: i32, payload: &[u8]) {
        self.queue.answer(self.entry, unique, error, payload);
    }

    fn capacity(&self) -> usize {
        self.queue.payload_capacity()
    }

    /// The kernel never sends these over the ring; an entry must be given back all the same.
    fn unanswered(&self, unique: u64) {
        self.queue.answer(self.entry, unique, -libc::ENOSYS, &[]);
    }
}

/// Whether this process can make the kind of io_uring a queue needs (a container may
/// forbid io_uring: `kernel.io_uring_disabled`, seccomp).
pub fn usable() -> io::Result<()> {
    queue::probe()
}

/// Tells the kernel the ring will not be registered, so that it stops holding requests
/// for it and goes on through /dev/fuse: a registration it refuses turns the ring off for
/// the connection.
pub fn give_up(device: &OwnedFd) {
    if let Err(error) = queue::refused_registration(device) {
        tracing::error!("FUSE over io_uring: cannot tell the kernel to go on without it ({error}); requests wait");
    }
}

/// The CPUs the kernel makes a queue for (`num_possible_cpus`), which the ring must all
/// have before the kernel uses it: `/sys/devices/system/cpu/possible`, e.g. `0-3`.
fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(&text).ok_or_else(|| io::Error::other(format!("cannot read the possible CPUs from {text:?}")))
}

/// The number of CPUs a list like `0-3,5` names, counted up to its highest (queue ids
/// run from 0 to the highest CPU).
fn parse_cpu_list(text: &str) -> Option<usize> {
    let mut highest = None;
    for range in text.trim().split(',') {
        let last = range.rsplit('-').next()?;
        let last: usize = last.trim().parse().ok()?;
        highest = highest.max(Some(last));
    }
    highest.map(|highest| highest + 1)
}

#[cfg(test)]
mod tests {
    use super::parse_cpu_list;

    #[test]
    fn possible_cpus_count_up_to_the_highest() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,5"), Some(6));
        assert_eq!(parse_cpu_list("garbage"), None);
    }
}
