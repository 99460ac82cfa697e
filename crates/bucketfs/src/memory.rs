//! One memory budget (`--memory-limit`) for the data the daemon buffers.
//!
//! Read-ahead only happens when it fits: [`MemoryLimiter::try_reserve`] says no rather
//! than wait, and the prefetcher then simply stops reading ahead. Bytes a program is
//! waiting for right now are always fetched ([`MemoryLimiter::reserve`] may overdraw);
//! those are bounded by the kernel's own limit on requests in flight (max_background ×
//! 1 MiB), so the total stays within the limit plus a small, fixed margin. Many readers
//! at once therefore slow down to demand reads; they do not grow memory without bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct MemoryLimiter {
    limit: u64,
    used: AtomicU64,
    /// Woken whenever bytes are given back (see [`MemoryLimiter::reserve_waiting`]).
    released: tokio::sync::Notify,
}

/// Bytes reserved from the budget, given back on drop.
#[derive(Debug)]
pub struct Reservation {
    limiter: Arc<MemoryLimiter>,
    bytes: u64,
}

impl MemoryLimiter {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self { limit, used: AtomicU64::new(0), released: tokio::sync::Notify::new() })
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
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

    /// Reserves `bytes`, waiting for others to give memory back; past `patience` without
    /// room it overdraws rather than wait longer. Upload buffers take memory this way:
    /// many writers share the budget as their parts complete, and a writer that can only
    /// go on with more memory is never stuck behind others stuck the same way.
    pub async fn reserve_waiting(self: &Arc<Self>, bytes: u64, patience: std::time::Duration) -> Reservation {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(reservation) = self.try_reserve(bytes) {
                return reservation;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                tracing::debug!(bytes, used = self.used(), limit = self.limit, "memory budget spent: overdrawing");
                return self.reserve(bytes);
            }
        }
    }

    fn give_back(&self, bytes: u64) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
            self.released.notify_waiters();
        }
    }

    /// Reserves `bytes` even past the limit, for data a reader is blocked on.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Reservation {
        self.used.fetch_add(bytes, Ordering::AcqRel);
        Reservation { limiter: self.clone(), bytes }
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
        self.limiter.give_back(freed);
        self.bytes -= freed;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.limiter.give_back(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    async fn waiting_reservations_get_memory_given_back_and_overdraw_past_their_patience() {
        let limiter = MemoryLimiter::new(100);
        let held = limiter.try_reserve(100).expect("fits");
        let waiter = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.reserve_waiting(50, std::time::Duration::from_secs(30)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "waits while the budget is spent");
        drop(held);
        let got = waiter.await.expect("waiter");
        assert_eq!((got.bytes(), limiter.used()), (50, 50), "served from what was given back");
        let started = std::time::Instant::now();
        let _rest = limiter.try_reserve(50).expect("fits");
        let overdrawn = limiter.reserve_waiting(10, std::time::Duration::from_millis(50)).await;
        assert!(started.elapsed() >= std::time::Duration::from_millis(50));
        assert_eq!((overdrawn.bytes(), limiter.used()), (10, 110), "overdrawn after its patience");
    }
}
