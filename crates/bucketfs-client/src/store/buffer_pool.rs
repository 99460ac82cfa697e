//! Freed GET buffers kept for the next GET of a similar size.
//!
//! A sequential read fetches its object in pieces of up to 16 MiB, each into a buffer of
//! its own ([`super::RangeBody`]). A fresh buffer that large comes from `mmap`, and every
//! 4 KiB of it costs a page fault and a zeroed page on first touch: perf put ~6% of the
//! daemon's CPU there at 8 MiB pieces, and 16 or 32 MiB pieces (fewer requests, less CPU
//! in the store) cost more than they saved. The pool hands a freed buffer, already
//! faulted in, to the next GET instead.
//!
//! Bounded: it holds at most [`limit`](BufferPool::set_limit) bytes (an eighth of the
//! mount's memory limit, at most 64 MiB) and never more than the memory budget leaves
//! free at the time (so reserved and pooled bytes together stay within the limit: under
//! load the pool stays empty), only buffers of at least 1 MiB, and gives everything back
//! to the system when a sweep finds it unused since the previous sweep
//! ([`BufferPool::release_idle`]), so an idle mount holds none.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;

/// Smaller buffers come from the allocator's heap, already reused.
const POOLED_MIN: usize = 1 << 20;
const DEFAULT_LIMIT: usize = 64 << 20;

pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    limit: AtomicUsize,
    /// A buffer was taken from the pool since the last sweep.
    used: AtomicBool,
    /// Bytes the mount's memory budget leaves free (none set: no bound but `limit`).
    budget_free: OnceLock<FreeBytes>,
}

type FreeBytes = Box<dyn Fn() -> u64 + Send + Sync>;

/// The pool every GET body of this process draws from.
pub static POOL: BufferPool = BufferPool::new();

impl BufferPool {
    const fn new() -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            limit: AtomicUsize::new(DEFAULT_LIMIT),
            used: AtomicBool::new(false),
            budget_free: OnceLock::new(),
        }
    }

    /// Caps the bytes the pool keeps (set once at mount from the memory limit), and
    /// never past what the memory budget leaves free (`budget_free`).
    pub fn set_limit(&self, bytes: usize, budget_free: impl Fn() -> u64 + Send + Sync + 'static) {
        self.limit.store(bytes.min(DEFAULT_LIMIT), Ordering::Relaxed);
        let _ = self.budget_free.set(Box::new(budget_free));
        self.trim_to(self.limit.load(Ordering::Relaxed));
    }

    /// An empty buffer with room for `len` bytes: a freed one of at least `len` and less
    /// than twice it if the pool has one (its old bytes are never read: the body tracks
    /// what it wrote), else a new one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        if len >= POOLED_MIN {
            let mut free = self.free.lock();
            if let Some(at) = free.iter().position(|b| b.capacity() >= len && b.capacity() / 2 < len) {
                self.used.store(true, Ordering::Relaxed);
                return free.swap_remove(at);
            }
        }
        Vec::with_capacity(len)
    }

    /// Keeps `buffer` for a later [`take`](Self::take), or frees it if it is small or the
    /// pool is full.
    pub fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() < POOLED_MIN {
            return;
        }
        buffer.clear();
        let free_in_budget =
            self.budget_free.get().map_or(usize::MAX, |free| usize::try_from(free()).unwrap_or(usize::MAX));
        let limit = self.limit.load(Ordering::Relaxed).min(free_in_budget);
        let mut free = self.free.lock();
        let held: usize = free.iter().map(Vec::capacity).sum();
        if held + buffer.capacity() <= limit {
            free.push(buffer);
        }
    }

    /// Frees every kept buffer if none was taken since the last call (run by the mount's
    /// sweeper every 30 s).
    pub fn release_idle(&self) {
        if !self.used.swap(false, Ordering::Relaxed) {
            self.trim_to(0);
        }
    }

    fn trim_to(&self, bytes: usize) {
        let mut free = self.free.lock();
        while free.iter().map(Vec::capacity).sum::<usize>() > bytes {
            free.pop();
        }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.free.lock().iter().map(Vec::capacity).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn a_freed_buffer_is_reused_within_the_limit_and_released_when_idle() {
        let pool = BufferPool::new();
        let budget_free = std::sync::Arc::new(AtomicUsize::new(usize::MAX));
        let budget = budget_free.clone();
        pool.set_limit(20 * MIB, move || budget.load(Ordering::Relaxed) as u64);
        let first = pool.take(8 * MIB);
        let address = first.as_ptr();
        pool.give_back(first);
        let again = pool.take(6 * MIB);
        assert_eq!(again.as_ptr(), address, "a freed 8 MiB buffer serves a 6 MiB GET");
        assert!(pool.take(3 * MIB).capacity() < 8 * MIB, "not one more than twice the size asked");
        pool.give_back(again);
        pool.give_back(Vec::with_capacity(8 * MIB));
        pool.give_back(Vec::with_capacity(8 * MIB));
        assert_eq!(pool.held(), 16 * MIB, "the third 8 MiB buffer is past the 20 MiB limit");
        pool.give_back(Vec::with_capacity(MIB / 2));
        assert_eq!(pool.held(), 16 * MIB, "small buffers are not kept");
        let _ = pool.take(8 * MIB);
        pool.release_idle();
        assert_eq!(pool.held(), 8 * MIB, "used since the last sweep: kept");
        pool.release_idle();
        assert_eq!(pool.held(), 0, "unused for a sweep: given back");
        budget_free.store(12 * MIB, Ordering::Relaxed);
        pool.give_back(Vec::with_capacity(8 * MIB));
        pool.give_back(Vec::with_capacity(8 * MIB));
        assert_eq!(pool.held(), 8 * MIB, "no more than the memory budget leaves free");
    }
}
