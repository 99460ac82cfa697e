//! One memory budget (`--memory-limit`) for the data the daemon buffers.
//!
//! Read-ahead only happens when it fits: [`MemoryLimiter::try_reserve`] says no rather
//! than wait, and the prefetcher then simply stops reading ahead. Bytes a program is
//! waiting for right now are always fetched ([`MemoryLimiter::reserve`] may overdraw);
//! those are bounded by the kernel's own limit on requests in flight (max_background ×
//! 1 MiB), so the total stays within the limit plus a small, fixed margin. Many readers
//! at once therefore slow down to demand reads; they do not grow memory without bound.
//!
//! Writers wait ([`MemoryLimiter::reserve_writing`]) while the budget is spent and memory
//! is **on its way back**: upload parts being sent ([`InFlight`]) return theirs when their
//! request ends, whatever the programs do. When nothing is in flight, all the budget is
//! held by buffers that only the programs' own writes or closes can free (one program
//! filling many files in turn), so waiting could last forever: the writer spills its
//! buffer to disk instead (`write::part_buffer`), or overdraws where it cannot.
//!
//! Read-ahead windows share a pool ([`READ_AHEAD_POOL`], at most a quarter of the budget)
//! among the files being read sequentially at the time ([`MemoryLimiter::read_ahead_share`]):
//! one reader may read far ahead, 256 readers each a little. More read-ahead than that
//! buys no speed (the readers together already keep the store and the CPUs busy) and
//! only holds memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// The read-ahead all sequential readers share (see the module doc).
pub const READ_AHEAD_POOL: u64 = 256 << 20;

#[derive(Debug)]
pub struct MemoryLimiter {
    limit: u64,
    used: AtomicU64,
    /// Of `used`, bytes held by [`InFlight`] reservations.
    in_flight: AtomicU64,
    /// Woken whenever memory is given back.
    released: Notify,
    /// Files being read sequentially now ([`SequentialReader`]s alive).
    sequential_readers: AtomicU64,
}

/// One file read sequentially, counted in [`MemoryLimiter::read_ahead_share`] while alive.
#[derive(Debug)]
pub struct SequentialReader {
    limiter: Arc<MemoryLimiter>,
}

impl Drop for SequentialReader {
    fn drop(&mut self) {
        self.limiter.sequential_readers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes reserved from the budget, given back on drop.
#[derive(Debug)]
pub struct Reservation {
    limiter: Arc<MemoryLimiter>,
    bytes: u64,
}

impl MemoryLimiter {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            released: Notify::new(),
            sequential_readers: AtomicU64::new(0),
        })
    }

    /// Counts a file read sequentially until the returned guard is dropped.
    pub fn reading_sequentially(self: &Arc<Self>) -> SequentialReader {
        self.sequential_readers.fetch_add(1, Ordering::AcqRel);
        SequentialReader { limiter: self.clone() }
    }

    /// How far each file read sequentially may read ahead now: its share of the pool.
    pub fn read_ahead_share(&self) -> u64 {
        let pool = READ_AHEAD_POOL.min(self.limit / 4);
        pool / self.sequential_readers.load(Ordering::Acquire).max(1)
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The budget is used up (or overdrawn).
    pub fn is_spent(&self) -> bool {
        self.used() >= self.limit
    }

    /// Reserves `bytes` if they fit in what is left, else `None`.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= self.limit).then_some(used + bytes)
            })
            .ok()
            .map(|_| Reservation { limiter: self.clone(), bytes })
    }

    /// Reserves `bytes` even past the limit, for data a reader is blocked on.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Reservation {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        Reservation { limiter: self.clone(), bytes }
    }

    /// Reserves `bytes` for a write buffer: at once if they fit, else once memory in
    /// flight has come back. `None` when the budget is spent and nothing is in flight
    /// (see the module doc).
    pub async fn reserve_writing(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        loop {
            // Registered before the check, so a release between the check and the wait
            // is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(reservation) = self.try_reserve(bytes) {
                return Some(reservation);
            }
            if self.in_flight.load(Ordering::Acquire) == 0 {
                return None;
            }
            released.await;
        }
    }

    fn release(&self, bytes: u64) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            self.released.notify_waiters();
        }
    }
}

impl Reservation {
    /// Adds `bytes` to this reservation if they fit in what is left of the budget.
    pub fn try_grow(&mut self, bytes: u64) -> bool {
        let Some(mut more) = self.limiter.try_reserve(bytes) else { return false };
        more.bytes = 0; // now counted in `self`
        self.bytes += bytes;
        true
    }

    /// Takes over what `other` holds.
    pub fn absorb(&mut self, mut other: Reservation) {
        self.bytes += std::mem::take(&mut other.bytes);
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back all but `bytes`.
    pub fn shrink_to(&mut self, bytes: u64) {
        let freed = self.bytes.saturating_sub(bytes);
        self.bytes -= freed;
        self.limiter.release(freed);
    }

    /// This memory is being sent and comes back when the request ends (an upload part).
    pub fn in_flight(self) -> InFlight {
        self.limiter.in_flight.fetch_add(self.bytes, Ordering::AcqRel);
        InFlight { reservation: Some(self) }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.limiter.release(self.bytes);
    }
}

/// A reservation whose memory comes back without the program's help (an upload part
/// being sent): writers short of memory wait for it rather than overdraw.
#[derive(Debug)]
pub struct InFlight {
    reservation: Option<Reservation>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            // No longer in flight before it is given back (which wakes the writers): a
            // writer woken by it that finds the room taken must see that nothing is
            // coming any more, or it would wait for a release that never comes.
            reservation.limiter.in_flight.fetch_sub(reservation.bytes, Ordering::AcqRel);
            drop(reservation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_readers_share_the_read_ahead_pool() {
        let limiter = MemoryLimiter::new(4 << 30);
        assert_eq!(limiter.read_ahead_share(), READ_AHEAD_POOL);
        let readers: Vec<_> = (0..64).map(|_| limiter.reading_sequentially()).collect();
        assert_eq!(limiter.read_ahead_share(), READ_AHEAD_POOL / 64);
        drop(readers);
        assert_eq!(limiter.read_ahead_share(), READ_AHEAD_POOL, "a closed reader's share comes back");
        assert_eq!(MemoryLimiter::new(64 << 20).read_ahead_share(), 16 << 20, "a quarter of a small budget");
    }

    #[test]
    fn try_reserve_refuses_past_the_limit_and_drop_gives_back() {
        let limiter = MemoryLimiter::new(100);
        let a = limiter.try_reserve(60).expect("fits");
        assert!(limiter.try_reserve(41).is_none());
        let b = limiter.try_reserve(40).expect("fits exactly");
        assert_eq!(limiter.used(), 100);
        drop(a);
        assert_eq!(limiter.used(), 40);
        let forced = limiter.reserve(200);
        assert_eq!(limiter.used(), 240);
        drop((b, forced));
        assert_eq!(limiter.used(), 0);
    }

    #[tokio::test]
    async fn writers_wait_for_memory_in_flight_and_hear_when_none_is() {
        let limiter = MemoryLimiter::new(100);
        let sending = limiter.try_reserve(100).expect("fits").in_flight();
        let waiting = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.reserve_writing(60).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "must wait while a part is in flight");
        drop(sending);
        let got = waiting.await.expect("task").expect("memory came back");
        assert_eq!(limiter.used(), 60, "got the memory that came back, not an overdraft");

        // The rest of the budget is held by buffers, nothing in flight: no waiting.
        let _held = limiter.try_reserve(40).expect("fits");
        assert!(limiter.reserve_writing(30).await.is_none());
        assert_eq!(limiter.used(), 100);
        drop(got);
    }
}
