//! What a running mount is doing, for `bucketfs status` and the gauges of
//! `--metrics-addr`: sampled once a second by the daemon ([`MountState::tick`]),
//! answered as the attribute `bucketfs.status` of the mount's root ([`MountState::report`]),
//! and read by `bucketfs status [MOUNTPOINT]` from every bucketfs mount.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytesize::ByteSize;
use parking_lot::Mutex;

use bucketfs_client::store::ObjectStore;
use bucketfs_core::fs::Fs;
use bucketfs_core::memory::MemoryLimiter;

use crate::mounts::attributes::read_status;
use crate::mounts::bucketfs_mounts;

/// How far back the request rate looks.
const RATE_WINDOW: usize = 10;

pub struct MountState {
    fs: Arc<Fs>,
    memory: Arc<MemoryLimiter>,
    sources: String,
    /// Each source's store, for its request window.
    stores: Vec<Arc<dyn ObjectStore>>,
    started: Instant,
    /// S3 requests sent so far, at each of the last ticks.
    requests: Mutex<VecDeque<(Instant, u64)>>,
    /// The data cache's bytes at the last tick: a file read, kept off the FUSE thread
    /// that answers `bucketfs status`.
    cache_bytes: AtomicU64,
}

impl MountState {
    pub fn new(
        fs: Arc<Fs>,
        memory: Arc<MemoryLimiter>,
        sources: String,
        stores: Vec<Arc<dyn ObjectStore>>,
    ) -> Arc<Self> {
        let started = Instant::now();
        let requests = Mutex::new(VecDeque::from([(started, bucketfs_client::metrics::s3_requests_so_far())]));
        Arc::new(Self { fs, memory, sources, stores, started, requests, cache_bytes: AtomicU64::new(0) })
    }

    /// Samples the state once a second, for the rate and the metrics' gauges.
    pub async fn tick_every_second(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        loop {
            every.tick().await;
            let state = self.clone();
            // The cache's size is a file read: off the runtime's workers.
            let _ = tokio::task::spawn_blocking(move || state.tick()).await;
        }
    }

    fn tick(&self) {
        {
            let mut requests = self.requests.lock();
            requests.push_back((Instant::now(), bucketfs_client::metrics::s3_requests_so_far()));
            while requests.len() > RATE_WINDOW + 1 {
                requests.pop_front();
            }
        }
        let cache = self.fs.data_cache();
        if let Some(cache) = cache {
            self.cache_bytes.store(cache.bytes(), Ordering::Relaxed);
        }
        bucketfs_client::metrics::sample(bucketfs_client::metrics::Sample {
            memory_used: self.memory.used(),
            memory_limit: self.memory.limit(),
            files_open_for_writing: self.fs.files_open_for_writing(),
            uploads_in_background: self.fs.uploads_after_close().0,
            cache_bytes: cache.map(|_| self.cache_bytes.load(Ordering::Relaxed)),
            cache_cap: cache.map(|cache| cache.cap()),
            requests_allowed: self
                .stores
                .iter()
                .filter_map(|store| Some((store.location(), store.request_window()?.allowed)))
                .collect(),
        });
    }

    /// S3 requests per second over the last ticks.
    fn request_rate(&self) -> f64 {
        let requests = self.requests.lock();
        match (requests.front(), requests.back()) {
            (Some((from, first)), Some((to, last))) if to > from => {
                (last - first) as f64 / to.duration_since(*from).as_secs_f64()
            }
            _ => 0.0,
        }
    }

    /// `key: value` lines.
    pub fn report(&self) -> String {
        let writing = self.fs.files_open_for_writing();
        let (uploads, upload_bytes) = self.fs.uploads_after_close();
        let cache = match self.fs.data_cache() {
            Some(cache) => format!("{} of {}", size(self.cache_bytes.load(Ordering::Relaxed)), size(cache.cap())),
            None => "off".to_owned(),
        };
        let uptime = Duration::from_secs(self.started.elapsed().as_secs());
        let write_back = match self.fs.write_back_usage() {
            // Without --write-back the log only ever holds files a replay could not store.
            Some((0, _)) if !self.fs.write_back_on() => "write-back: off".to_owned(),
            Some((held, limit)) => {
                let refused = self.fs.write_back_failed();
                let refused_bytes: u64 = refused.iter().map(|failed| failed.bytes).sum();
                format!(
                    "write-back log: {} of {}, {} refused files ({}; `bucketfs write-back list`)",
                    size(held),
                    size(limit),
                    refused.len(),
                    size(refused_bytes)
                )
            }
            None => "write-back: off".to_owned(),
        };
        [
            format!("pid: {}", std::process::id()),
            format!("sources: {}", self.sources),
            format!("up: {}", humantime::format_duration(uptime)),
            format!("files open for writing: {writing}"),
            format!("uploads after close: {uploads} files, {} ({upload_bytes} bytes)", size(upload_bytes)),
            write_back,
            format!("memory: {} of {}", size(self.memory.used()), size(self.memory.limit())),
            format!("data cache: {cache}"),
            format!(
                "S3 requests: {:.1}/s over the last {RATE_WINDOW} s, {} in all, {} retried",
                self.request_rate(),
                bucketfs_client::metrics::s3_requests_so_far(),
                bucketfs_client::metrics::s3_retries_so_far()
            ),
        ]
        .into_iter()
        .chain(self.stores.iter().filter_map(|store| throttling_line(store.as_ref())))
        .chain(self.stores.iter().filter_map(|store| endpoints_line(store.as_ref())))
        .collect::<Vec<_>>()
        .join("\n")
            + "\n"
    }
}

/// `throttling: ...` for one store: its request window and throttled answers.
fn throttling_line(store: &dyn ObjectStore) -> Option<String> {
    let window = store.request_window()?;
    let now = match window.throttling_since {
        Some(since) => format!("throttling now (for {} s)", since.elapsed().as_secs()),
        None => "not throttling now".to_owned(),
    };
    Some(format!(
        "throttling: {} answers so far, {now}; requests in flight allowed: {} of {} ({})",
        window.throttled_answers,
        window.allowed,
        window.cap,
        store.location()
    ))
}

/// `endpoints: ...` for a store with several URLs: which answer, which are left out.
fn endpoints_line(store: &dyn ObjectStore) -> Option<String> {
    let endpoints = store.endpoints();
    if endpoints.is_empty() {
        return None;
    }
    let states: Vec<String> = endpoints
        .iter()
        .map(|endpoint| match endpoint.left_out_for {
            Some(since) => format!(
                "{} left out for {} s ({} failed attempts and probes)",
                endpoint.url,
                since.as_secs(),
                endpoint.failures_in_row
            ),
            None => format!("{} in use", endpoint.url),
        })
        .collect();
    Some(format!("endpoints: {}", states.join(", ")))
}

fn size(bytes: u64) -> String {
    ByteSize::b(bytes).display().iec().to_string()
}

/// `bucketfs status [MOUNTPOINT]`: the report of one mount, or of every bucketfs mount.
pub fn run(mountpoint: Option<&Path>) -> Result<()> {
    use std::io::Write as _;
    let mounts = match mountpoint {
        Some(path) => vec![path.to_owned()],
        None => bucketfs_mounts()?,
    };
    let mut out = std::io::stdout().lock();
    if mounts.is_empty() {
        let _ = writeln!(out, "no bucketfs mounts");
    }
    for mount in mounts {
        let report = match read_status(&mount) {
            Ok(report) => report,
            Err(error) if mountpoint.is_some() => return Err(error),
            Err(error) => format!("not answering: {error:#}\n"),
        };
        let indented: String = report.lines().map(|line| format!("  {line}\n")).collect();
        // A closed pipe (`| head`) is no error of ours.
        let _ = write!(out, "{}\n{indented}", mount.display());
    }
    Ok(())
}
