//! The URLs of one store when it has several (`--endpoint-url A,B`: the gateways or nodes of
//! a cluster, reached without a load balancer): which URL each request goes to, and which
//! are left out for a while because they stopped answering.
//!
//! Requests are spread round-robin over the URLs that answer. A URL whose connection failed,
//! timed out or broke mid-answer is left out: no request of a program goes to it until a
//! probe (a `HeadBucket` sent to it alone, after a pause that doubles with each failed probe,
//! 1 s up to 30 s) gets an answer. Probes, not programs' requests, pay for a node that hangs.
//! When every URL is left out, requests go round-robin to all of them anyway (the retry
//! window then decides, as for a store with one URL). What the store *says* (errors,
//! throttling) is the store's, not one node's: only failures of the connection count here.
//!
//! [`S3Store::retrying`](super::s3) picks the URL of each attempt ([`Endpoints::pick`]) and
//! runs the attempt inside [`Endpoints::scope`], so that [`PoolResolver`], the SDK's
//! endpoint resolver, sends it there and the attempt's outcome is put down to that URL.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_s3::config::endpoint::{DefaultResolver, EndpointFuture, Params, ResolveEndpoint};
use parking_lot::Mutex;

/// The pause before the first probe of a URL left out; it doubles with each failed probe.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
const MAX_PAUSE: Duration = Duration::from_secs(30);

tokio::task_local! {
    /// The URL (its index) the attempt being polled in this task goes to.
    static CHOSEN: usize;
}

pub struct Endpoints {
    urls: Vec<String>,
    health: Mutex<Vec<Health>>,
    /// Where the next round-robin pick starts.
    next: AtomicUsize,
}

#[derive(Clone, Copy, Default)]
struct Health {
    /// Failed attempts and probes since it last answered.
    failures_in_row: u32,
    /// Since when no request goes to it (until a probe gets an answer).
    left_out_since: Option<Instant>,
}

/// One URL as `bucketfs status` shows it.
#[derive(Clone, Debug)]
pub struct EndpointReport {
    pub url: String,
    /// How long it has been left out, if it is.
    pub left_out_for: Option<Duration>,
    pub failures_in_row: u32,
}

impl Endpoints {
    /// The URLs of one store, in the order given (at least two).
    pub fn new(urls: Vec<String>) -> Arc<Self> {
        let health = Mutex::new(vec![Health::default(); urls.len()]);
        Arc::new(Self { urls, health, next: AtomicUsize::new(0) })
    }

    pub fn url(&self, index: usize) -> &str {
        &self.urls[index]
    }

    /// The URL for the next attempt: the next one round-robin that is not left out, or the
    /// next one of all if every one is.
    pub fn pick(&self) -> usize {
        let health = self.health.lock();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.urls.len();
        (0..count)
            .map(|offset| (start + offset) % count)
            .find(|&index| health[index].left_out_since.is_none())
            .unwrap_or(start % count)
    }

    /// Runs `attempt` with its requests sent to URL `index`.
    pub async fn scope<F: Future>(&self, index: usize, attempt: F) -> F::Output {
        CHOSEN.scope(index, attempt).await
    }

    /// The URL the attempt being polled in this task goes to, if one was chosen.
    pub fn chosen(&self) -> Option<&str> {
        CHOSEN.try_with(|index| *index).ok().map(|index| self.url(index))
    }

    /// URL `index` failed to connect, answer in time, or finish an answer: it is left out.
    /// True if it was not already: the caller then starts [`Endpoints::probe`] for it.
    pub fn failed(&self, index: usize, why: &dyn std::fmt::Display) -> bool {
        let mut health = self.health.lock();
        let entry = &mut health[index];
        entry.failures_in_row += 1;
        if entry.left_out_since.is_some() {
            return false;
        }
        entry.left_out_since = Some(Instant::now());
        tracing::warn!(
            "the store's endpoint {} stopped answering ({why}): requests go to the other {} until it answers again",
            self.urls[index],
            self.urls.len() - 1
        );
        true
    }

    /// URL `index` answered a request sent at `sent_at`: it is back if it was left out.
    /// An answer to a request sent *before* it was left out says nothing about it since
    /// (that answer was on its way when another request found the URL dead), so it is
    /// ignored: the URL stays left out until a probe or a later request gets an answer.
    pub fn answered(&self, index: usize, sent_at: Instant) {
        let mut health = self.health.lock();
        let entry = &mut health[index];
        if entry.left_out_since.is_some_and(|since| sent_at < since) {
            return;
        }
        if let Some(since) = entry.left_out_since {
            tracing::info!(
                "the store's endpoint {} answers again (left out for {} s)",
                self.urls[index],
                since.elapsed().as_secs()
            );
        }
        *entry = Health::default();
    }

    /// Sends `probe` to URL `index` after a pause, again and again with the pause doubled,
    /// until it answers (`probe` gives true): then requests go to it again.
    pub async fn probe<F, Fut>(&self, index: usize, probe: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = bool>,
    {
        let mut pause = FIRST_PAUSE;
        loop {
            tokio::time::sleep(pause).await;
            let sent_at = Instant::now();
            if self.scope(index, probe()).await {
                self.answered(index, sent_at);
                return;
            }
            self.health.lock()[index].failures_in_row += 1;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    pub fn report(&self) -> Vec<EndpointReport> {
        let health = self.health.lock();
        self.urls
            .iter()
            .zip(health.iter())
            .map(|(url, health)| EndpointReport {
                url: url.clone(),
                left_out_for: health.left_out_since.map(|since| since.elapsed()),
                failures_in_row: health.failures_in_row,
            })
            .collect()
    }
}

/// The SDK's endpoint resolver, with the `endpoint` parameter replaced by the URL chosen for
/// the attempt (S3's own rules then still decide path or virtual-host style, and so on).
#[derive(Debug)]
pub struct PoolResolver {
    pool: Arc<Endpoints>,
    rules: DefaultResolver,
}

impl PoolResolver {
    pub fn new(pool: Arc<Endpoints>) -> Self {
        Self { pool, rules: DefaultResolver::new() }
    }
}

impl std::fmt::Debug for Endpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoints").field("urls", &self.urls).finish()
    }
}

impl ResolveEndpoint for PoolResolver {
    fn resolve_endpoint<'a>(&'a self, params: &'a Params) -> EndpointFuture<'a> {
        // A request outside `scope` (none today) still goes to a URL that answers.
        let url = match CHOSEN.try_with(|index| *index) {
            Ok(index) => self.pool.url(index),
            Err(_) => self.pool.url(self.pool.pick()),
        };
        let params = with_endpoint(params, url);
        EndpointFuture::new(async move {
            let params = params?;
            self.rules.resolve_endpoint(&params).await
        })
    }
}

/// `params` with another `endpoint`.
fn with_endpoint(params: &Params, url: &str) -> Result<Params, aws_smithy_runtime_api::box_error::BoxError> {
    Ok(Params::builder()
        .endpoint(url)
        .set_bucket(params.bucket().map(str::to_owned))
        .set_region(params.region().map(str::to_owned))
        .set_use_fips(params.use_fips())
        .set_use_dual_stack(params.use_dual_stack())
        .set_force_path_style(params.force_path_style())
        .set_accelerate(params.accelerate())
        .set_use_global_endpoint(params.use_global_endpoint())
        .set_use_object_lambda_endpoint(params.use_object_lambda_endpoint())
        .set_key(params.key().map(str::to_owned))
        .set_prefix(params.prefix().map(str::to_owned))
        .set_copy_source(params.copy_source().map(str::to_owned))
        .set_disable_access_points(params.disable_access_points())
        .set_disable_multi_region_access_points(params.disable_multi_region_access_points())
        .set_use_arn_region(params.use_arn_region())
        .set_use_s3_express_control_endpoint(params.use_s3_express_control_endpoint())
        .set_disable_s3_express_session_auth(params.disable_s3_express_session_auth())
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(count: usize) -> Arc<Endpoints> {
        Endpoints::new((0..count).map(|i| format!("http://127.0.0.1:{}", 9000 + i)).collect())
    }

    #[test]
    fn picks_go_round_robin_over_the_urls_that_answer() {
        let pool = pool(3);
        let picks: Vec<usize> = (0..6).map(|_| pool.pick()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert!(pool.failed(1, &"refused"), "left out now");
        assert!(!pool.failed(1, &"refused"), "already left out");
        let picks: Vec<usize> = (0..4).map(|_| pool.pick()).collect();
        assert!(!picks.contains(&1), "{picks:?}");
        pool.answered(1, Instant::now());
        let picks: Vec<usize> = (0..3).map(|_| pool.pick()).collect();
        assert!(picks.contains(&1), "{picks:?}");
    }

    /// The race CI met: a request in flight to a URL when another found it dead came back
    /// answered just after, which brought the URL back, and the next failure left it out
    /// (and said so) a second time.
    #[test]
    fn an_answer_to_a_request_sent_before_the_url_was_left_out_does_not_bring_it_back() {
        let pool = pool(2);
        let sent_before = Instant::now();
        assert!(pool.failed(0, &"reset"), "left out now");
        pool.answered(0, sent_before);
        assert!(pool.report()[0].left_out_for.is_some(), "still left out");
        assert!(!pool.failed(0, &"reset"), "not left out (nor said) a second time");
        pool.answered(0, Instant::now());
        assert!(pool.report()[0].left_out_for.is_none(), "a request sent since was answered: back");
    }

    #[test]
    fn when_all_are_left_out_requests_go_to_all() {
        let pool = pool(2);
        pool.failed(0, &"refused");
        pool.failed(1, &"refused");
        let mut picks: Vec<usize> = (0..4).map(|_| pool.pick()).collect();
        picks.sort();
        assert_eq!(picks, [0, 0, 1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn probes_wait_longer_after_each_failure_until_one_is_answered() {
        let pool = pool(2);
        pool.failed(0, &"refused");
        let sent = std::sync::Mutex::new(Vec::new());
        let started = tokio::time::Instant::now();
        pool.probe(0, || async {
            let mut sent = sent.lock().expect("not poisoned");
            sent.push((started.elapsed().as_secs(), pool.chosen().map(str::to_owned)));
            sent.len() == 7
        })
        .await;
        let sent = sent.into_inner().expect("not poisoned");
        let times: Vec<u64> = sent.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [1, 3, 7, 15, 31, 61, 91], "pauses 1, 2, 4, 8, 16, 30, 30 s");
        assert!(sent.iter().all(|(_, url)| url.as_deref() == Some(pool.url(0))), "each probe goes to the URL left out");
        let report = &pool.report()[0];
        assert!(report.left_out_for.is_none() && report.failures_in_row == 0, "{report:?}");
    }

    #[tokio::test]
    async fn the_resolver_sends_an_attempt_to_its_chosen_url() {
        let pool = pool(2);
        let resolver = PoolResolver::new(pool.clone());
        let params = Params::builder()
            .endpoint("http://127.0.0.1:9000")
            .region("us-east-1")
            .bucket("data")
            .force_path_style(true)
            .build()
            .expect("params");
        let url = pool.scope(1, async { resolver.resolve_endpoint(&params).await }).await.expect("resolved");
        assert_eq!(url.url(), "http://127.0.0.1:9001/data");
        let url = pool.scope(0, async { resolver.resolve_endpoint(&params).await }).await.expect("resolved");
        assert_eq!(url.url(), "http://127.0.0.1:9000/data");
    }
}
