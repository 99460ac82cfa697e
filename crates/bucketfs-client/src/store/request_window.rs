//! How many requests one store may have in flight right now: an adaptive window under
//! the mount's cap (`--max-concurrent-requests`), as TCP's congestion window.
//!
//! A store that answers "slow down" (HTTP 429 or 503: `SlowDown`, `TooManyRequests`…)
//! is overloaded by the requests it already has, so sending the same number again, only
//! later, keeps it overloaded. The window is cut in half on such an answer and grown
//! back by one request per window of successes (additive increase, multiplicative
//! decrease); a throttled answer to a request sent before the last cut says nothing new
//! and cuts nothing. This file owns the count of permits, the window and the throttling
//! episode (what `bucketfs status`, the metrics and the one log line per episode say).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Semaphore, SemaphorePermit};

/// A throttling episode ends once the store has answered this long without throttling.
const QUIET_ENDS_EPISODE: Duration = Duration::from_secs(10);

pub struct RequestWindow {
    /// Where the store is, for the log.
    location: String,
    cap: usize,
    /// `cap` permits; the ones the window withholds are forgotten (taken out for good)
    /// as requests in flight return them, and added back as the window grows.
    permits: Semaphore,
    state: Mutex<State>,
}

struct State {
    /// Requests allowed in flight, fractional: each success adds `1 / limit`, so a whole
    /// window of successes adds one request.
    limit: f64,
    /// Permits taken out of the semaphore for good.
    withheld: usize,
    /// Permits still to take out: the next ones returned are forgotten instead.
    owed: usize,
    /// Cuts so far; a permit remembers the number when it was taken.
    cuts: u64,
    throttled_answers: u64,
    episode: Option<Episode>,
}

struct Episode {
    began: Instant,
    last_throttled: Instant,
    answers: u64,
    lowest: usize,
}

/// What `bucketfs status` and the metrics show of a store's window.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowReport {
    /// Requests allowed in flight now, and the most ever allowed.
    pub allowed: usize,
    pub cap: usize,
    /// Throttling answers since the mount started.
    pub throttled_answers: u64,
    /// When the current throttling episode began: `None` once the store has gone
    /// `QUIET_ENDS_EPISODE` without a throttled answer (also on an idle mount).
    pub throttling_since: Option<Instant>,
}

/// One request's place in the window. Dropped without [`Permit::succeeded`] or
/// [`Permit::throttled`] (any other failure) it changes nothing but the count in flight.
pub struct Permit<'a> {
    window: &'a RequestWindow,
    permit: Option<SemaphorePermit<'a>>,
    cuts_when_taken: u64,
}

impl RequestWindow {
    pub fn new(location: String, cap: usize) -> Arc<Self> {
        let cap = cap.max(1);
        let state = State { limit: cap as f64, withheld: 0, owed: 0, cuts: 0, throttled_answers: 0, episode: None };
        Arc::new(Self { location, cap, permits: Semaphore::new(cap), state: Mutex::new(state) })
    }

    /// Waits for room in the window (first come, first served).
    pub async fn acquire(&self) -> Permit<'_> {
        // The semaphore is never closed, so `acquire` cannot fail; `ok()` keeps a
        // request going rather than panicking if that ever changed.
        let permit = self.permits.acquire().await.ok();
        let cuts_when_taken = self.state.lock().cuts;
        Permit { window: self, permit, cuts_when_taken }
    }

    pub fn report(&self) -> WindowReport {
        let state = self.state.lock();
        WindowReport {
            allowed: state.allowed(),
            cap: self.cap,
            throttled_answers: state.throttled_answers,
            throttling_since: state
                .episode
                .as_ref()
                .filter(|episode| episode.last_throttled.elapsed() < QUIET_ENDS_EPISODE)
                .map(|episode| episode.began),
        }
    }

    /// Makes the semaphore hold `allowed` permits: owes or gives back the difference.
    fn resize(&self, state: &mut State, allowed: usize) {
        let held_back = self.cap - allowed;
        let current = state.withheld + state.owed;
        if held_back > current {
            state.owed += held_back - current;
            // Permits nobody holds now are taken out at once; the rest as requests end.
            while state.owed > 0 {
                let Ok(idle) = self.permits.try_acquire() else { break };
                idle.forget();
                state.owed -= 1;
                state.withheld += 1;
            }
        } else {
            let mut give_back = current - held_back;
            let cancelled = give_back.min(state.owed);
            state.owed -= cancelled;
            give_back -= cancelled;
            state.withheld -= give_back;
            self.permits.add_permits(give_back);
        }
    }
}

impl State {
    fn allowed(&self) -> usize {
        (self.limit as usize).max(1)
    }
}

impl Permit<'_> {
    /// The request succeeded: the window grows by one request per window of successes,
    /// and an episode whose store has stopped throttling ends (one log line).
    pub fn succeeded(self) {
        let window = self.window;
        let mut state = window.state.lock();
        if state.limit < window.cap as f64 {
            let before = state.allowed();
            state.limit = (state.limit + 1.0 / state.limit).min(window.cap as f64);
            let after = state.allowed();
            if after != before {
                window.resize(&mut state, after);
            }
        }
        if let Some(episode) = &state.episode {
            if episode.last_throttled.elapsed() >= QUIET_ENDS_EPISODE {
                tracing::warn!(
                    store = %window.location,
                    "the store stopped throttling: {} throttled answers in {:.1} s, at most {} requests in flight \
                     at the lowest, {} now (of {})",
                    episode.answers,
                    episode.began.elapsed().as_secs_f64(),
                    episode.lowest,
                    state.allowed(),
                    window.cap
                );
                state.episode = None;
            }
        }
    }

    /// The store answered `answer` (its code, or the HTTP status) to slow us down: the
    /// window is cut in half, unless it already was since this request was sent.
    pub fn throttled(self, answer: &str) {
        let window = self.window;
        let mut state = window.state.lock();
        state.throttled_answers += 1;
        if self.cuts_when_taken == state.cuts {
            state.cuts += 1;
            state.limit = (state.limit / 2.0).max(1.0);
            let allowed = state.allowed();
            window.resize(&mut state, allowed);
            tracing::debug!(store = %window.location, answer, allowed, "throttled: window cut");
        }
        let now = Instant::now();
        let allowed = state.allowed();
        match &mut state.episode {
            Some(episode) => {
                episode.last_throttled = now;
                episode.answers += 1;
                episode.lowest = episode.lowest.min(allowed);
            }
            None => {
                tracing::warn!(
                    store = %window.location,
                    "the store is throttling requests ({answer}): bucketfs keeps at most {allowed} requests in flight \
                     (of {}), growing back as they succeed, and retries within --retry-window",
                    window.cap
                );
                state.episode = Some(Episode { began: now, last_throttled: now, answers: 1, lowest: allowed });
            }
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else { return };
        let mut state = self.window.state.lock();
        if state.owed > 0 {
            state.owed -= 1;
            state.withheld += 1;
            permit.forget();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many permits can be taken at once right now (then all given back).
    async fn free_now(window: &RequestWindow) -> usize {
        let mut taken = Vec::new();
        while let Ok(permit) = tokio::time::timeout(Duration::from_millis(5), window.acquire()).await {
            taken.push(permit);
        }
        taken.len()
    }

    #[tokio::test]
    async fn a_throttled_answer_halves_the_window_once_per_round_of_requests() {
        let window = RequestWindow::new("test".into(), 16);
        let sent_together: Vec<_> = futures::future::join_all((0..16).map(|_| window.acquire())).await;
        // Sixteen answers to requests sent before any cut: one cut, not sixteen.
        for permit in sent_together {
            permit.throttled("SlowDown");
        }
        assert_eq!(window.report().allowed, 8);
        assert_eq!(window.report().throttled_answers, 16);
        assert!(window.report().throttling_since.is_some());
        assert_eq!(free_now(&window).await, 8);
        // A request sent after that cut and throttled again cuts again.
        window.acquire().await.throttled("SlowDown");
        assert_eq!(window.report().allowed, 4);
        assert_eq!(free_now(&window).await, 4);
    }

    #[tokio::test]
    async fn the_window_never_closes() {
        let window = RequestWindow::new("test".into(), 4);
        for _ in 0..10 {
            window.acquire().await.throttled("TooManyRequests");
        }
        assert_eq!(window.report().allowed, 1);
        assert_eq!(free_now(&window).await, 1);
    }

    #[tokio::test]
    async fn successes_grow_the_window_back_by_one_request_per_window() {
        let window = RequestWindow::new("test".into(), 16);
        window.acquire().await.throttled("SlowDown");
        window.acquire().await.throttled("SlowDown");
        assert_eq!(window.report().allowed, 4);
        // About one window of successes (each adds 1 / limit) adds one request.
        for _ in 0..3 {
            window.acquire().await.succeeded();
        }
        assert_eq!(window.report().allowed, 4);
        for _ in 0..2 {
            window.acquire().await.succeeded();
        }
        assert_eq!(window.report().allowed, 5);
        for _ in 0..6 {
            window.acquire().await.succeeded();
        }
        assert_eq!(window.report().allowed, 6);
        assert_eq!(free_now(&window).await, 6);
        for _ in 0..1000 {
            window.acquire().await.succeeded();
        }
        assert_eq!(window.report().allowed, 16, "never above the cap");
        assert_eq!(free_now(&window).await, 16);
    }

    #[tokio::test]
    async fn requests_in_flight_past_a_cut_finish_and_their_permits_are_withheld() {
        let window = RequestWindow::new("test".into(), 8);
        let in_flight: Vec<_> = futures::future::join_all((0..8).map(|_| window.acquire())).await;
        let mut in_flight = in_flight.into_iter();
        if let Some(permit) = in_flight.next() {
            permit.throttled("SlowDown");
        }
        assert_eq!(window.report().allowed, 4);
        // Seven still in flight; as they end, three are withheld, four come back.
        drop(in_flight);
        assert_eq!(free_now(&window).await, 4);
    }

    #[tokio::test]
    async fn a_cut_takes_idle_permits_out_at_once() {
        let window = RequestWindow::new("test".into(), 16);
        window.acquire().await.throttled("SlowDown");
        assert_eq!(free_now(&window).await, 8);
    }

    #[tokio::test]
    async fn other_failures_leave_the_window_alone() {
        let window = RequestWindow::new("test".into(), 4);
        drop(window.acquire().await);
        assert_eq!(window.report().allowed, 4);
        assert_eq!(window.report().throttled_answers, 0);
        assert!(window.report().throttling_since.is_none());
    }
}
