//! One ring queue: its io_uring, the entries it registered with the kernel (each a header
//! buffer and a payload buffer the kernel writes requests into and reads answers from),
//! the answers waiting to be committed, and the thread that owns the ring.
//!
//! The kernel sends each request to the queue of the CPU its caller runs on, so the queue's
//! thread is pinned to that CPU: the request is served where it was made, without waking
//! another CPU (most of the gain on a small VM; see bench/uring-spike/REPORT.md).
//!
//! Only the queue's thread submits to its ring (`IORING_SETUP_SINGLE_ISSUER`, and the
//! kernel copies the next request into an entry as task work of the thread that commits
//! it). An answer from another thread is written into its entry and queued in
//! [`QueueShared::answered`]; the eventfd wakes the queue's thread to commit it.
//!
//! Who may touch an entry's buffers: the kernel, from REGISTER or a commit until the
//! entry's completion; then the queue's thread, which copies the request out of the header
//! buffer and reads its payload while it dispatches; then the answer, which writes the
//! header buffer and the payload (past what the request still uses, see
//! [`Entry::payload_in_use`]) until it is queued for commit.

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use parking_lot::Mutex;

use crate::fuse::wire;

/// `struct fuse_uring_req_header`: the in/out header (128), the op's first argument (128),
/// and `struct fuse_uring_ent_in_out` (32).
const HEADER_SIZE: usize = 288;
const IN_OUT: usize = 0;
const OP_IN: usize = 128;
const OP_IN_SIZE: usize = 128;
const ENT_COMMIT_ID: usize = 256 + 8;
const ENT_PAYLOAD_SIZE: usize = 256 + 16;

/// Room before each payload buffer for the in-header and the first argument, copied there
/// so that a request reads as one slice, as `/dev/fuse` gives it, without moving its payload.
const HEADROOM: usize = wire::IN_HEADER_SIZE + OP_IN_SIZE;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `user_data` of the eventfd read (entries use their index).
const WAKE: u64 = u64::MAX;

/// An entry's buffers, allocated once and lent to the kernel for the queue's life.
pub(super) struct Entry {
    header: *mut u8,
    /// HEADROOM bytes, then the payload buffer the kernel knows.
    buffer: *mut u8,
    payload_capacity: usize,
    /// Set while the queue's thread dispatches a request that has a payload (a name, the
    /// bytes of a write): an answer given meanwhile must not write the payload buffer, and
    /// is copied there after the dispatch (see [`QueueShared::answer`]).
    payload_in_use: AtomicBool,
    iov: [libc::iovec; 2],
}

// SAFETY: the buffers are plain bytes whose use is handed from party to party as the
// module's doc says; the pointers themselves never change.
unsafe impl Send for Entry {}
unsafe impl Sync for Entry {}

impl Entry {
    fn new(payload_capacity: usize) -> Self {
        let header = Box::into_raw(vec![0u8; HEADER_SIZE].into_boxed_slice()) as *mut u8;
        let buffer = Box::into_raw(vec![0u8; HEADROOM + payload_capacity].into_boxed_slice()) as *mut u8;
        let iov = [
            libc::iovec { iov_base: header.cast(), iov_len: HEADER_SIZE },
            // SAFETY: within the allocation.
            libc::iovec { iov_base: unsafe { buffer.add(HEADROOM) }.cast(), iov_len: payload_capacity },
        ];
        Self { header, buffer, payload_capacity, payload_in_use: AtomicBool::new(false), iov }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with these lengths; the kernel let go of the entry
        // (the queue's thread saw its last completion) before the queue is dropped.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.header, HEADER_SIZE)));
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.buffer, HEADROOM + self.payload_capacity)));
        }
    }
}

/// An answer for an entry, ready to commit.
pub(super) struct Answered {
    entry: u16,
    /// Its payload, when it could not be written into the entry yet.
    later: Option<Vec<u8>>,
    error: i32,
    unique: u64,
}

/// What the queue's thread shares with the answers.
pub(super) struct QueueShared {
    pub(super) qid: u16,
    entries: Box<[Entry]>,
    answered: Mutex<Vec<Answered>>,
    wake: OwnedFd,
    /// Set on the queue's thread.
    thread: std::sync::OnceLock<std::thread::ThreadId>,
}

impl QueueShared {
    pub(super) fn new(qid: u16, depth: usize, payload_capacity: usize) -> io::Result<Self> {
        // SAFETY: plain syscall; the fd is owned below.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned by nothing else.
        let wake = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(wake) };
        let entries = (0..depth).map(|_| Entry::new(payload_capacity)).collect();
        Ok(Self { qid, entries, answered: Mutex::new(Vec::new()), wake, thread: std::sync::OnceLock::new() })
    }

    /// How many payload bytes an answer may have.
    pub(super) fn payload_capacity(&self) -> usize {
        self.entries.first().map_or(0, |entry| entry.payload_capacity)
    }

    /// Answers the request in `entry`: `error` (0 or a negative errno) and `payload`, its
    /// out-arguments. Commits it now if this is the queue's thread (after its dispatch),
    /// or wakes that thread.
    pub(super) fn answer(&self, entry: u16, unique: u64, error: i32, payload: &[u8]) {
        let Some(slot) = self.entries.get(usize::from(entry)) else { return };
        let (error, payload) =
            if payload.len() > slot.payload_capacity { (-libc::EIO, &[][..]) } else { (error, payload) };
        let later = if !payload.is_empty() && slot.payload_in_use.load(Ordering::Acquire) {
            Some(payload.to_vec())
        } else {
            // SAFETY: the entry is this answer's (see the module doc); the request being
            // dispatched, if any, uses no payload bytes.
            unsafe { write_answer(slot, unique, error, payload) };
            None
        };
        self.answered.lock().push(Answered { entry, later, error, unique });
        if self.thread.get() != Some(&std::thread::current().id()) {
            // SAFETY: writes 8 bytes from a live u64.
            let one = 1u64;
            unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

/// Writes the out-header and `payload` into `slot`.
///
/// SAFETY: the caller holds the entry (see the module doc), and nothing reads its payload
/// buffer's first `payload.len()` bytes meanwhile.
unsafe fn write_answer(slot: &Entry, unique: u64, error: i32, payload: &[u8]) {
    let len = payload.len();
    let header = std::slice::from_raw_parts_mut(slot.header, HEADER_SIZE);
    let out = wire::out_header((wire::OUT_HEADER_SIZE + len) as u32, error, unique);
    header[IN_OUT..IN_OUT + out.len()].copy_from_slice(&out);
    header[ENT_PAYLOAD_SIZE..ENT_PAYLOAD_SIZE + 4].copy_from_slice(&(len as u32).to_ne_bytes());
    std::ptr::copy_nonoverlapping(payload.as_ptr(), slot.buffer.add(HEADROOM), len);
}

/// A request as the queue's thread hands it to the dispatcher.
pub(super) struct Delivered<'a> {
    pub(super) entry: u16,
    pub(super) commit_id: u64,
    /// The request laid out as `/dev/fuse` gives it.
    pub(super) bytes: &'a [u8],
}

/// Registers `queue`'s entries on `device` and serves them until the kernel tears them
/// down (unmount), on a thread pinned to `cpu`. `ready` gets the outcome of the registration.
pub(super) fn run(
    device: Arc<OwnedFd>,
    queue: Arc<QueueShared>,
    cpu: usize,
    ready: std::sync::mpsc::Sender<io::Result<()>>,
    mut dispatch: impl FnMut(&Arc<QueueShared>, Delivered<'_>),
) {
    let _ = queue.thread.set(std::thread::current().id());
    pin_to(cpu);
    let depth = queue.entries.len();
    let mut ring = match new_ring((2 * depth + 2).next_power_of_two() as u32) {
        Ok(ring) => ring,
        Err(error) => return drop(ready.send(Err(error))),
    };
    let fd = device.as_raw_fd();
    for (index, entry) in queue.entries.iter().enumerate() {
        let register = uring_cmd(fd, CMD_REGISTER, queue.qid, 0, Some(&entry.iov), index as u64);
        // SAFETY: the iovecs and the buffers they point to live as long as `queue`.
        if unsafe { ring.submission().push(&register) }.is_err() {
            return drop(ready.send(Err(io::Error::other("ring full while registering"))));
        }
    }
    let mut wake_count = 0u64;
    if let Err(error) = arm_wake(&mut ring, &queue, &mut wake_count).and_then(|_| ring.submit().map(|_| ())) {
        return drop(ready.send(Err(error)));
    }
    // A registration stays pending until a request fills its entry; a refusal completes
    // at once.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut completions: Vec<cqueue::Entry> = ring.completion().collect();
    if let Some(refused) = completions.iter().find(|c| c.user_data() != WAKE && c.result() < 0) {
        return drop(ready.send(Err(io::Error::from_raw_os_error(-refused.result()))));
    }
    let _ = ready.send(Ok(()));

    let mut alive = depth;
    loop {
        for completion in completions.drain(..) {
            if completion.user_data() == WAKE {
                if let Err(error) = arm_wake(&mut ring, &queue, &mut wake_count) {
                    tracing::error!(qid = queue.qid, "FUSE ring: cannot wait for answers: {error}");
                }
                continue;
            }
            let index = completion.user_data() as usize;
            if completion.result() < 0 {
                // ENOTCONN: the connection ended (unmount); the entry is the kernel's no more.
                if completion.result() != -libc::ENOTCONN {
                    tracing::warn!(qid = queue.qid, entry = index, "FUSE ring entry ended: {}", completion.result());
                }
                alive -= 1;
                continue;
            }
            deliver(&queue, index, &mut dispatch);
        }
        if alive == 0 {
            break;
        }
        commit_answered(&mut ring, &queue, fd);
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(error) if matches!(error.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
            Err(error) => {
                tracing::error!(qid = queue.qid, "FUSE ring: {error}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        completions.extend(ring.completion());
    }
    tracing::debug!(qid = queue.qid, "FUSE ring queue ended");
}

/// Hands the request in entry `index` to `dispatch`, as one slice.
fn deliver(queue: &Arc<QueueShared>, index: usize, dispatch: &mut impl FnMut(&Arc<QueueShared>, Delivered<'_>)) {
    let entry = &queue.entries[index];
    // SAFETY: the kernel filled this entry and let go of it (its completion arrived); the
    // header buffer is read before anything answers.
    let header = unsafe { std::slice::from_raw_parts(entry.header, HEADER_SIZE) };
    let in_header = &header[IN_OUT..IN_OUT + wire::IN_HEADER_SIZE];
    let read_u32 = |at: usize| u32::from_ne_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    let mut commit_id = [0u8; 8];
    commit_id.copy_from_slice(&header[ENT_COMMIT_ID..ENT_COMMIT_ID + 8]);
    let commit_id = u64::from_ne_bytes(commit_id);
    let total = read_u32(IN_OUT) as usize;
    let payload = read_u32(ENT_PAYLOAD_SIZE) as usize;
    // The first argument's size is what the header's length leaves for it.
    let first_arg = total.checked_sub(wire::IN_HEADER_SIZE + payload).filter(|size| *size <= OP_IN_SIZE);
    let (Some(first_arg), true) = (first_arg, payload <= entry.payload_capacity) else {
        tracing::warn!(qid = queue.qid, total, payload, "FUSE ring: a request of impossible size");
        let unique = wire::parse_header(in_header).map_or(0, |h| h.unique);
        queue.answer(index as u16, unique, -libc::EIO, &[]);
        return;
    };
    let start = HEADROOM - first_arg - wire::IN_HEADER_SIZE;
    // SAFETY: the headroom is the queue thread's alone while it dispatches; the copies do
    // not overlap (different buffers).
    let bytes = unsafe {
        std::ptr::copy_nonoverlapping(in_header.as_ptr(), entry.buffer.add(start), wire::IN_HEADER_SIZE);
        std::ptr::copy_nonoverlapping(
            header[OP_IN..].as_ptr(),
            entry.buffer.add(start + wire::IN_HEADER_SIZE),
            first_arg,
        );
        std::slice::from_raw_parts(entry.buffer.add(start), total)
    };
    entry.payload_in_use.store(payload > 0, Ordering::Release);
    dispatch(queue, Delivered { entry: index as u16, commit_id, bytes });
    entry.payload_in_use.store(false, Ordering::Release);
}

/// Writes the answers kept for later and submits a commit for every answer queued.
fn commit_answered(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>, queue: &QueueShared, fd: i32) {
    let answered = std::mem::take(&mut *queue.answered.lock());
    for answer in answered {
        let Some(slot) = queue.entries.get(usize::from(answer.entry)) else { continue };
        if let Some(payload) = &answer.later {
            // SAFETY: the dispatch that held the payload is over; the entry is the answer's.
            unsafe { write_answer(slot, answer.unique, answer.error, payload) };
        }
        let commit = uring_cmd(fd, CMD_COMMIT_AND_FETCH, queue.qid, answer.unique, None, u64::from(answer.entry));
        // SAFETY: a command without buffers.
        while unsafe { ring.submission().push(&commit) }.is_err() {
            if let Err(error) = ring.submit() {
                tracing::error!(qid = queue.qid, "FUSE ring: cannot submit commits: {error}");
            }
        }
    }
}

/// A ring as a queue makes it, made and dropped: whether io_uring is allowed here.
pub(super) fn probe() -> io::Result<()> {
    new_ring(4).map(drop)
}

fn new_ring(entries: u32) -> io::Result<IoUring<squeue::Entry128, cqueue::Entry>> {
    IoUring::<squeue::Entry128, cqueue::Entry>::builder().setup_single_issuer().setup_coop_taskrun().build(entries)
}

/// A registration the kernel refuses (a queue id past every CPU's), waited for.
pub(super) fn refused_registration(device: &OwnedFd) -> io::Result<()> {
    let mut ring = new_ring(4)?;
    let mut header = [0u8; HEADER_SIZE];
    let mut payload = vec![0u8; 8192];
    let iov = [
        libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_SIZE },
        libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
    ];
    let register = uring_cmd(device.as_raw_fd(), CMD_REGISTER, u16::MAX, 0, Some(&iov), 0);
    // SAFETY: the buffers outlive the wait below, which returns with the refusal.
    unsafe { ring.submission().push(&register) }.map_err(|_| io::Error::other("ring full"))?;
    ring.submit_and_wait(1)?;
    let result = ring.completion().next().map(|completion| completion.result());
    match result {
        Some(result) if result < 0 => Ok(()),
        other => Err(io::Error::other(format!("the kernel took a registration meant to be refused ({other:?})"))),
    }
}

/// Reads the eventfd that says answers are queued, through the ring.
fn arm_wake(
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    queue: &QueueShared,
    count: &mut u64,
) -> io::Result<()> {
    let read =
        opcode::Read::new(types::Fd(queue.wake.as_raw_fd()), (count as *mut u64).cast(), 8).build().user_data(WAKE);
    // SAFETY: `count` lives on the queue thread's stack for the thread's whole loop.
    unsafe { ring.submission().push(&read.into()) }.map_err(|_| io::Error::other("ring full"))
}

/// A FUSE ring command: `struct fuse_uring_cmd_req` {flags, commit_id, qid} in the
/// command area, and for REGISTER the entry's two buffers.
fn uring_cmd(
    fd: i32,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
    user_data: u64,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut command = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd);
    if let Some(iov) = iov {
        command = command.addr(Some(iov.as_ptr() as u64));
    }
    let entry = command.build().user_data(user_data);
    if iov.is_none() {
        return entry;
    }
    // REGISTER wants `sqe->len` = 2 (the iovecs), which io-uring 0.7's UringCmd80 cannot
    // set: write it at its offset in `struct io_uring_sqe` (24), in the entry's bytes.
    // SAFETY: Entry128 is `repr(C)`, 128 bytes: the kernel's SQE and its second half.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(entry) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above; every byte pattern is a valid SQE to the type.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn pin_to(cpu: usize) {
    if let Err(error) = crate::fuse::pin_this_thread(cpu) {
        // Still correct: requests of this CPU are served from wherever the thread runs.
        tracing::debug!(cpu, "FUSE ring queue not pinned: {error}");
    }
}
