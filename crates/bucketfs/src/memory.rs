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
}

/// Bytes reserved from the budget, given back on drop.
#[derive(Debug)]
pub struct Reservation {
    limiter: Arc<MemoryLimiter>,
    bytes: u64,
}

impl MemoryLimiter {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self { limit, used: AtomicU64::new(0) })
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
        self.limiter.used.fetch_sub(freed, Ordering::AcqRel);
        self.bytes -= freed;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.limiter.used.fetch_sub(self.bytes, Ordering::AcqRel);
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
}
