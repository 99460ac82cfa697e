//! What the daemon counts, for `--metrics-addr HOST:PORT` (Prometheus text format).
//!
//! The `metrics` facade with the Prometheus exporter: a scrape endpoint needs no
//! collector next to the mount (OTLP would), and the facade costs nothing when no
//! exporter is installed (without the flag every call here is a no-op). Each layer calls
//! the function for what it sees (the store its requests, `read` its read-ahead, `fuse`
//! its operations); gauges of state (memory, uploads, cache size) are sampled once a
//! second by the mount. The names are documented in docs/CONFIGURATION.md, "Metrics".

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::PrometheusBuilder;

/// Seconds: the buckets of the request latency histogram (a 1 ms HEAD on a local store
/// to a 30 s GET of a large range).
const LATENCY_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// Serves the metrics on `address` (`GET /metrics`, or any path), from a thread of the
/// exporter's own.
pub fn serve(address: SocketAddr) -> Result<(), String> {
    PrometheusBuilder::new()
        .with_http_listener(address)
        .set_buckets(LATENCY_BUCKETS)
        .map_err(|error| error.to_string())?
        .install()
        .map_err(|error| format!("cannot serve metrics on {address}: {error}"))
}

/// S3 request attempts so far, counted whether or not metrics are served (`bucketfs
/// status` shows the rate).
static S3_REQUESTS: AtomicU64 = AtomicU64::new(0);

pub fn s3_requests_so_far() -> u64 {
    S3_REQUESTS.load(Ordering::Relaxed)
}

/// One attempt of an S3 request (`op`: `GET`, `PUT`, ...) ended with `outcome` (`ok` or
/// the kind of error) after `elapsed` (for a GET, until its body ended).
pub fn s3_request(op: &'static str, outcome: &'static str, elapsed: Duration) {
    S3_REQUESTS.fetch_add(1, Ordering::Relaxed);
    counter!("bucketfs_s3_requests_total", "op" => op, "outcome" => outcome).increment(1);
    histogram!("bucketfs_s3_request_seconds", "op" => op).record(elapsed.as_secs_f64());
}

/// S3 attempts tried again so far, counted whether or not metrics are served (`bucketfs
/// status` shows them).
static S3_RETRIES: AtomicU64 = AtomicU64::new(0);

pub fn s3_retries_so_far() -> u64 {
    S3_RETRIES.load(Ordering::Relaxed)
}

/// A failed attempt of `op` is about to be tried again.
pub fn s3_retry(op: &'static str) {
    S3_RETRIES.fetch_add(1, Ordering::Relaxed);
    counter!("bucketfs_s3_retries_total", "op" => op).increment(1);
}

/// Bytes received from the store (object content).
pub fn s3_bytes_received(bytes: u64) {
    counter!("bucketfs_s3_bytes_received_total").increment(bytes);
}

/// Bytes sent to the store (object content: PUT bodies and parts).
pub fn s3_bytes_sent(bytes: u64) {
    counter!("bucketfs_s3_bytes_sent_total").increment(bytes);
}

/// A FUSE request `op` arrived.
pub fn fuse_request(op: &'static str) {
    counter!("bucketfs_fuse_requests_total", "op" => op).increment(1);
}

/// A FUSE request arrived over io_uring (counted in [`fuse_request`] too, by op).
pub fn fuse_ring_request() {
    counter!("bucketfs_fuse_ring_requests_total").increment(1);
}

/// Entries of READDIRPLUS answers sent as names only, without an inode for the kernel
/// (see `fuse::names_only`).
pub fn names_only_entries(count: u64) {
    counter!("bucketfs_fuse_names_only_entries_total").increment(count);
}

/// A FUSE request `op` was answered with error `errno`.
pub fn fuse_error(op: &'static str, errno: i32) {
    // `ENOENT` rather than 2: what operators grep for.
    let name = format!("{:?}", nix::errno::Errno::from_raw(errno));
    counter!("bucketfs_fuse_errors_total", "op" => op, "errno" => name).increment(1);
}

/// A read of an open file: its bytes were already fetched or being fetched (by an
/// earlier read or read-ahead), or it started a GET of its own.
pub fn read(prefetched: bool) {
    counter!("bucketfs_reads_total", "prefetched" => if prefetched { "yes" } else { "no" }).increment(1);
}

/// Read-ahead started fetching `bytes` nobody asked for yet.
pub fn read_ahead(bytes: u64) {
    counter!("bucketfs_read_ahead_bytes_total").increment(bytes);
}

/// The data cache had (`hit`) or lacked what a read needed: a block, or a small object.
pub fn data_cache(kind: &'static str, hit: bool) {
    let name = if hit { "bucketfs_cache_hits_total" } else { "bucketfs_cache_misses_total" };
    counter!(name, "kind" => kind).increment(1);
}

/// A request to the shared cache (`--shared-cache`): `hit`, `miss`, `corrupt` (a block
/// that failed its check), `error`, `put` (a block written), `put_dropped` (too many
/// waiting to be written).
pub fn shared_cache(result: &'static str) {
    counter!("bucketfs_shared_cache_blocks_total", "result" => result).increment(1);
}

/// The state sampled once a second by the mount (`cli::status`).
pub struct Sample {
    pub memory_used: u64,
    pub memory_limit: u64,
    pub files_open_for_writing: usize,
    pub uploads_in_background: usize,
    pub cache_bytes: Option<u64>,
    pub cache_cap: Option<u64>,
    /// Per store (its location): requests allowed in flight now (the request window,
    /// smaller than `--max-concurrent-requests` while the store throttles).
    pub requests_allowed: Vec<(String, usize)>,
}

pub fn sample(sample: Sample) {
    gauge!("bucketfs_memory_used_bytes").set(sample.memory_used as f64);
    gauge!("bucketfs_memory_limit_bytes").set(sample.memory_limit as f64);
    gauge!("bucketfs_files_open_for_writing").set(sample.files_open_for_writing as f64);
    gauge!("bucketfs_uploads_in_background").set(sample.uploads_in_background as f64);
    for (store, allowed) in sample.requests_allowed {
        gauge!("bucketfs_s3_requests_allowed", "store" => store).set(allowed as f64);
    }
    if let (Some(bytes), Some(cap)) = (sample.cache_bytes, sample.cache_cap) {
        gauge!("bucketfs_cache_bytes").set(bytes as f64);
        gauge!("bucketfs_cache_cap_bytes").set(cap as f64);
    }
}
