//! One store reached through several endpoints (`--endpoint-url A,B`, the gateways or nodes
//! of a cluster without a load balancer): requests are spread over the endpoints, and one
//! that dies in the middle of a read or a write is left out while the program sees nothing
//! but a short pause.
//!
//! The two gateways are two relays in front of the one MinIO: two endpoints of one data
//! set, each of which can be made to die (reset every connection, open or new) or hang at
//! an exact moment. `scripts/test-stores` runs the same tests against the store under test:
//! on SeaweedFS through two of its own S3 gateways (`weed s3` processes of one filer, from
//! `BUCKETFS_TEST_STORE_GATEWAYS`), killed with SIGKILL or hung with SIGSTOP; elsewhere
//! through relays.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use sha2::{Digest, Sha256};

/// The size of the reads: 1 GiB, but 256 MiB on moto, which keeps objects in the memory
/// of one Python process and serves them at a few MB/s.
fn big_read_size() -> usize {
    if store_kind() == "moto" {
        256 * MIB
    } else {
        1024 * MIB
    }
}

/// One endpoint of the store under test that a test can make fail.
enum Gateway {
    Relay(Relay),
    /// A gateway process of the store (SeaweedFS's `weed s3`).
    Process {
        endpoint: String,
        pid: i32,
    },
}

impl Gateway {
    fn endpoint(&self) -> &str {
        match self {
            Gateway::Relay(relay) => &relay.endpoint,
            Gateway::Process { endpoint, .. } => endpoint,
        }
    }

    /// Dies: every connection reset, new ones refused.
    fn kill(&self) {
        match self {
            Gateway::Relay(relay) => relay.faults.down.store(true, Ordering::Relaxed),
            Gateway::Process { pid, .. } => signal(*pid, libc::SIGKILL),
        }
    }

    /// Stops answering without closing anything.
    fn hang(&self) {
        match self {
            Gateway::Relay(relay) => relay.faults.frozen.store(true, Ordering::Relaxed),
            Gateway::Process { pid, .. } => signal(*pid, libc::SIGSTOP),
        }
    }

    /// Answers again after [`Gateway::hang`] (or, for a relay, after [`Gateway::kill`]).
    fn recover(&self) {
        match self {
            Gateway::Relay(relay) => {
                relay.faults.frozen.store(false, Ordering::Relaxed);
                relay.faults.down.store(false, Ordering::Relaxed);
            }
            Gateway::Process { pid, .. } => signal(*pid, libc::SIGCONT),
        }
    }

    /// Whether [`Gateway::recover`] brings it back after [`Gateway::kill`].
    fn comes_back_after_kill(&self) -> bool {
        matches!(self, Gateway::Relay(_))
    }
}

impl Drop for Gateway {
    /// A stopped gateway process would hang the store's stop.
    fn drop(&mut self) {
        if let Gateway::Process { pid, .. } = self {
            signal(*pid, libc::SIGCONT);
        }
    }
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) with a pid the store's script started for the tests.
    let result = unsafe { libc::kill(pid, signal) };
    assert!(result == 0 || signal == libc::SIGCONT, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
}

/// The store's own gateways (`URL=PID,...`), when scripts/test-stores started some.
fn store_gateways() -> Option<Vec<(String, i32)>> {
    let list = std::env::var("BUCKETFS_TEST_STORE_GATEWAYS").ok().filter(|list| !list.is_empty())?;
    let parse = |entry: &str| {
        let (url, pid) = entry.rsplit_once('=')?;
        Some((url.to_owned(), pid.parse().ok()?))
    };
    Some(list.split(',').map(|entry| parse(entry).unwrap_or_else(|| panic!("gateway {entry:?}"))).collect())
}

/// Reads `path` whole in 1 MiB calls in a thread of its own, noting each call in
/// `progress`; the bytes' digest.
fn spawn_reader(path: std::path::PathBuf, progress: Arc<Progress>) -> std::thread::JoinHandle<std::io::Result<String>> {
    std::thread::spawn(move || {
        let mut file = std::fs::File::open(path)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; MIB];
        let mut total = 0u64;
        loop {
            let started = Instant::now();
            let n = file.read(&mut buffer)?;
            if n == 0 {
                return Ok(hex::encode(hasher.finalize()));
            }
            total += n as u64;
            progress.call_took(started.elapsed(), total);
            hasher.update(&buffer[..n]);
        }
    })
}

/// Two endpoints of the store under test: two gateways of its own not used by another test
/// yet (each test fails one), or two relays in front of it.
fn two_gateways() -> (Gateway, Gateway) {
    static TAKEN: AtomicUsize = AtomicUsize::new(0);
    match store_gateways() {
        Some(gateways) => {
            let first = TAKEN.fetch_add(2, Ordering::Relaxed);
            assert!(first + 1 < gateways.len(), "{} gateways: one pair per test", gateways.len());
            let take = |(endpoint, pid): &(String, i32)| Gateway::Process { endpoint: endpoint.clone(), pid: *pid };
            (take(&gateways[first]), take(&gateways[first + 1]))
        }
        None => (Gateway::Relay(Relay::start(minio().port)), Gateway::Relay(Relay::start(minio().port))),
    }
}

/// What a program reading or writing in 1 MiB calls saw: its longest wait for one call, and
/// how far it was then.
#[derive(Default)]
struct Progress {
    bytes: AtomicU64,
    longest_call_us: AtomicU64,
    longest_call_at: AtomicU64,
    /// Time spent in calls over half a second (stalls), in microseconds.
    stalled_us: AtomicU64,
}

impl Progress {
    fn call_took(&self, took: Duration, at: u64) {
        let micros = took.as_micros() as u64;
        if took > Duration::from_millis(500) {
            self.stalled_us.fetch_add(micros, Ordering::Relaxed);
        }
        if micros > self.longest_call_us.fetch_max(micros, Ordering::Relaxed) {
            self.longest_call_at.store(at, Ordering::Relaxed);
        }
        self.bytes.store(at, Ordering::Relaxed);
    }

    fn wait_for(&self, bytes: u64, timeout: Duration) {
        let started = Instant::now();
        while self.bytes.load(Ordering::Relaxed) < bytes {
            assert!(started.elapsed() < timeout, "no progress to {bytes} bytes in {timeout:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Only calls from now on count (the endpoint is about to fail; a slow store's first
    /// calls are not what the test is about).
    fn restart_longest(&self) {
        self.longest_call_us.store(0, Ordering::Relaxed);
        self.stalled_us.store(0, Ordering::Relaxed);
    }

    fn stalled(&self) -> Duration {
        Duration::from_micros(self.stalled_us.load(Ordering::Relaxed))
    }

    /// Waits until `until` bytes went through, and gives the longest call from `from` on:
    /// what a call takes on this store once it is going (moto serves a part in a second).
    fn steady_longest(&self, from: u64, until: u64) -> Duration {
        self.wait_for(from, Duration::from_secs(120));
        self.restart_longest();
        self.wait_for(until, Duration::from_secs(120));
        self.longest().0
    }

    fn longest(&self) -> (Duration, u64) {
        (
            Duration::from_micros(self.longest_call_us.load(Ordering::Relaxed)),
            self.longest_call_at.load(Ordering::Relaxed) / MIB as u64,
        )
    }
}

/// The longest a single read or write call may take at the failover, beyond twice the
/// longest call before it: the attempts to the dead endpoint fail at once (reset), their
/// retries go to the other after one backoff (tens of ms on MinIO; seconds if requests
/// kept going to the dead endpoint, checked).
const STALL_BOUND: Duration = Duration::from_millis(1500);

/// Requests tried again in a whole test: those in flight to the endpoint when it died (a
/// few parts), not one in two of all the requests sent after (30 to 90 here, checked).
const RETRIED_BOUND: u64 = 12;

fn assert_endpoint_left_out_once(m: &Mount, dead: &Gateway) {
    let log = m.stderr();
    let said = log.matches(&format!("the store's endpoint {} stopped answering", dead.endpoint())).count();
    assert_eq!(said, 1, "the log says once that {} stopped answering:\n{log}", dead.endpoint());
    assert!(!log.contains(" ERROR ") && !log.contains("failed after"), "no operation failed:\n{log}");
}

/// A 1 GiB read through two endpoints, one of which dies a quarter of the way in: every
/// byte right, no error, the longest read call within [`STALL_BOUND`], and `bucketfs
/// status` shows the dead endpoint left out.
#[test]
fn an_endpoint_dying_in_the_middle_of_a_read_is_not_seen_by_the_reader() {
    let b = create_bucket("endpoints-read");
    let data = gen_data(71, big_read_size());
    let expected = sha256_hex(&data);
    put(&b, "big", data);
    let (first, second) = two_gateways();
    let m = MountBuilder::new().bucket(&b).endpoint(format!("{},{}", first.endpoint(), second.endpoint())).mount();

    let progress = Arc::new(Progress::default());
    let reader = spawn_reader(m.join("big"), progress.clone());
    let steady = progress.steady_longest(big_read_size() as u64 / 16, big_read_size() as u64 / 4);
    progress.restart_longest();
    first.kill();
    let died_at = progress.bytes.load(Ordering::Relaxed) / MIB as u64;
    let read = run_with_timeout("the reader", Duration::from_secs(300), move || reader.join().expect("reader"));
    let digest = read.unwrap_or_else(|error| panic!("read failed: {error}\n{}", m.diagnostics()));
    assert_eq!(digest, expected, "the bytes read are the object's");
    let (longest, at) = progress.longest();
    eprintln!("endpoint died at {died_at} MiB; longest read call {longest:?} at {at} MiB");
    let bound = STALL_BOUND + steady * 2;
    eprintln!("longest read call before: {steady:?}");
    assert!(longest < bound, "a read call took {longest:?} (at {at} MiB; the endpoint died at {died_at} MiB)");
    assert_endpoint_left_out_once(&m, &first);
    let retried = retried(&m);
    eprintln!("{retried} requests retried");
    assert!(retried <= RETRIED_BOUND, "{retried} requests retried: the dead endpoint was not left out");
    let line = endpoints_line(&m);
    assert!(line.contains(&format!("{} left out", first.endpoint())), "{line}");
    assert!(line.contains(&format!("{} in use", second.endpoint())), "{line}");
}

/// A 256 MiB write through two endpoints, one of which dies a quarter of the way in: the
/// writes and the close succeed, the object is stored whole, no upload is left behind; the
/// dead endpoint, once back, is used again.
#[test]
fn an_endpoint_dying_in_the_middle_of_a_write_is_not_seen_by_the_writer() {
    let b = create_bucket("endpoints-write");
    let data = Arc::new(gen_data(72, 256 * MIB));
    let (first, second) = two_gateways();
    let m = MountBuilder::new().bucket(&b).endpoint(format!("{},{}", first.endpoint(), second.endpoint())).mount();

    let progress = Arc::new(Progress::default());
    let writer = {
        let (path, progress, data) = (m.join("big"), progress.clone(), data.clone());
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut file = std::fs::File::create(path)?;
            let mut total = 0u64;
            for chunk in data.chunks(MIB) {
                let started = Instant::now();
                file.write_all(chunk)?;
                total += chunk.len() as u64;
                progress.call_took(started.elapsed(), total);
            }
            let started = Instant::now();
            let closed = close(file);
            eprintln!("close took {:?}", started.elapsed());
            closed
        })
    };
    let steady = progress.steady_longest(16 * MIB as u64, 64 * MIB as u64);
    progress.restart_longest();
    second.kill();
    let died_at = progress.bytes.load(Ordering::Relaxed) / MIB as u64;
    let written = run_with_timeout("the writer", Duration::from_secs(300), move || writer.join().expect("writer"));
    written.unwrap_or_else(|error| panic!("write failed: {error}\n{}", m.diagnostics()));
    let (longest, at) = progress.longest();
    eprintln!("endpoint died at {died_at} MiB; longest write call {longest:?} at {at} MiB");
    let bound = STALL_BOUND + steady * 2;
    eprintln!("longest write call before: {steady:?}");
    assert!(longest < bound, "a write call took {longest:?} (at {at} MiB; the endpoint died at {died_at} MiB)");
    assert_eq!(sha256_hex(&get(&b, "big")), sha256_hex(&data), "the object is stored whole");
    assert_eq!(open_uploads(&b), 0, "no multipart upload left behind");
    assert_endpoint_left_out_once(&m, &second);
    let retried = retried(&m);
    eprintln!("{retried} requests retried");
    assert!(retried <= RETRIED_BOUND, "{retried} requests retried: the dead endpoint was not left out");

    // Back up: a probe finds it again, and status shows it in use (a killed gateway
    // process stays dead: the hang test sees one come back).
    if !second.comes_back_after_kill() {
        return;
    }
    second.recover();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    loop {
        std::fs::write(m.join(format!("small-{i}")), b"x").expect("small write");
        i += 1;
        let line = endpoints_line(&m);
        if line.contains(&format!("{} in use", second.endpoint())) {
            break;
        }
        assert!(Instant::now() < deadline, "{} never used again: {line}", second.endpoint());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The `endpoints:` line of `bucketfs status`.
fn endpoints_line(m: &Mount) -> String {
    status_line(m, "endpoints: ")
}

fn status_line(m: &Mount, name: &str) -> String {
    let status = run_bucketfs(&["status", m.path().to_str().expect("utf-8")], Duration::from_secs(10)).1;
    status
        .lines()
        .find_map(|line| line.trim().strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} line in the status:\n{status}"))
        .to_owned()
}

/// How many requests were tried again (`S3 requests: ... N retried`).
fn retried(m: &Mount) -> u64 {
    let line = status_line(m, "S3 requests: ");
    line.trim_end_matches(" retried")
        .rsplit(' ')
        .next()
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no retry count in: {line}"))
}

/// An endpoint that stops answering without closing anything (a node that hangs) in the
/// middle of a 1 GiB read: the requests in flight to it time out once (`--read-timeout 2`),
/// then none goes to it; probes bring it back once it answers again.
#[test]
fn an_endpoint_that_hangs_in_the_middle_of_a_read_costs_one_timeout() {
    let b = create_bucket("endpoints-hang");
    let data = gen_data(73, big_read_size());
    let expected = sha256_hex(&data);
    put(&b, "big", data);
    let (first, second) = two_gateways();
    let m = MountBuilder::new()
        .bucket(&b)
        .endpoint(format!("{},{}", first.endpoint(), second.endpoint()))
        .args(["--read-timeout", "2"])
        .mount();

    let progress = Arc::new(Progress::default());
    let reader = spawn_reader(m.join("big"), progress.clone());
    progress.wait_for(big_read_size() as u64 / 4, Duration::from_secs(120));
    progress.restart_longest();
    first.hang();
    let hung_at = progress.bytes.load(Ordering::Relaxed) / MIB as u64;
    let read = run_with_timeout("the reader", Duration::from_secs(300), move || reader.join().expect("reader"));
    let digest = read.unwrap_or_else(|error| panic!("read failed: {error}\n{}", m.diagnostics()));
    assert_eq!(digest, expected, "the bytes read are the object's");
    let (longest, at) = progress.longest();
    let stalled = progress.stalled();
    eprintln!(
        "endpoint hung at {hung_at} MiB; longest read call {longest:?} at {at} MiB; {stalled:?} in calls over 0.5 s"
    );
    // One timeout of 2 s (an attempt may take twice that), not one per request sent to it.
    assert!(stalled < Duration::from_secs(6), "reads stalled {stalled:?} in all: the hung endpoint was not left out");
    assert_endpoint_left_out_once(&m, &first);

    first.recover();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let line = endpoints_line(&m);
        if line.contains(&format!("{} in use", first.endpoint())) {
            break;
        }
        assert!(Instant::now() < deadline, "{} never probed back: {line}", first.endpoint());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An endpoint that is not a URL is refused before anything is mounted, with the value named.
#[test]
fn an_endpoint_without_a_scheme_is_refused_with_its_value() {
    let b = create_bucket("endpoints-bad");
    let failure = MountBuilder::new()
        .bucket(&b)
        .endpoint(format!("{},127.0.0.1:{}", minio().endpoint, minio().port))
        .expect_failure();
    failure.assert_failed_cleanly();
    let said = format!("invalid value '127.0.0.1:{}' for '--endpoint-url", minio().port);
    assert!(failure.stderr.starts_with(&format!("error: {said}")), "{}", failure.stderr);
    assert!(failure.stderr.contains("is not an endpoint URL such as http://"), "{}", failure.stderr);
}
