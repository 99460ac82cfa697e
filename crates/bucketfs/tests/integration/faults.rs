//! Reads and writes through a mount whose store connection misbehaves: toxiproxy between
//! the mount and MinIO adds latency, limits bandwidth, resets connections, holds them
//! silently, slices bodies or cuts them short, and the harness's relay answers bursts of
//! `503 SlowDown`. The contract (SEMANTICS, "Limits and timeouts"): a program gets the
//! right bytes or a clear error (`EIO`, `ETIMEDOUT`), never wrong bytes and never a hang
//! past the retry window plus the attempt timeout; a write leaves the whole object or
//! none, and no multipart upload open. Objects are checked against MinIO directly, not
//! through the proxy.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;

/// No single step of these tests should come near this; past it, something hangs.
const HANG: Duration = Duration::from_secs(120);
/// Uploads are multipart from this size on, so every write test has several parts.
const PART_SIZE: &str = "5MiB";

fn mount_through(proxy_endpoint: &str, bucket: &str, extra: &[&str]) -> Mount {
    MountBuilder::new()
        .bucket(bucket)
        .endpoint(proxy_endpoint)
        .args(["--part-size", PART_SIZE, "--metadata-ttl", "0"])
        .args(extra.iter().copied())
        .mount()
}

/// Reads `path` from the start in 1 MiB `read(2)` calls, checking every chunk against
/// `expected` as it arrives, with `pause` between calls. Ok(bytes read) at the end of the
/// file, or the first error; panics on a wrong byte or on more bytes than expected.
fn read_checked(path: PathBuf, expected: &[u8], pause: Duration) -> io::Result<usize> {
    let mut file = File::open(&path)?;
    let mut buffer = vec![0; MIB];
    let mut offset = 0;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok(offset);
        }
        assert!(offset + n <= expected.len(), "{}: read past the end ({} bytes at {offset})", path.display(), n);
        assert_same_bytes(
            &buffer[..n],
            &expected[offset..offset + n],
            &format!("{} at offset {offset}", path.display()),
        );
        offset += n;
        std::thread::sleep(pause);
    }
}

/// Reads the whole file (on its own thread, failing the test if it hangs) and asserts the
/// program got every byte, right, without an error. Returns how long it took.
#[track_caller]
fn assert_reads_right(m: &Mount, name: &str, expected: &[u8], pause: Duration) -> Duration {
    let path = m.join(name);
    let expected = expected.to_vec();
    let (result, elapsed) = run_with_timeout("the reader", HANG, move || {
        let started = Instant::now();
        (read_checked(path, &expected, pause).map(|n| (n, expected.len())), started.elapsed())
    });
    match result {
        Ok((read, len)) => assert_eq!(read, len, "{name}: the reader stopped short"),
        Err(e) => panic!("{name}: the reader saw an error: {e}\n{}", m.diagnostics()),
    }
    elapsed
}

/// Writes `data` into a new file in 1 MiB `write(2)` calls with `pause` between them,
/// then closes it (the commit); the first error of any of these calls.
fn write_file(path: PathBuf, data: &[u8], pause: Duration) -> io::Result<()> {
    let mut file = File::create(path)?;
    for chunk in data.chunks(MIB) {
        file.write_all(chunk)?;
        std::thread::sleep(pause);
    }
    close(file)
}

/// Writes the file through the mount and asserts that nothing failed, that MinIO holds
/// exactly these bytes and that no multipart upload is left open. Returns the time taken.
#[track_caller]
fn assert_writes_right(m: &Mount, bucket: &str, name: &str, data: &[u8], pause: Duration) -> Duration {
    let path = m.join(name);
    let to_write = data.to_vec();
    let (result, elapsed) = run_with_timeout("the writer", HANG, move || {
        let started = Instant::now();
        (write_file(path, &to_write, pause), started.elapsed())
    });
    if let Err(e) = result {
        panic!("{name}: the writer saw an error: {e}\n{}", m.diagnostics());
    }
    assert_same_bytes(&get(bucket, name), data, &format!("s3://{bucket}/{name} in MinIO"));
    assert_eq!(open_uploads(bucket), 0, "multipart uploads left open in {bucket}");
    elapsed
}

/// An error a program may see when the store fails: `EIO` or `ETIMEDOUT`.
#[track_caller]
fn assert_clear_error(error: &io::Error, what: &str) {
    assert!(
        matches!(error.raw_os_error(), Some(libc::EIO) | Some(libc::ETIMEDOUT)),
        "{what} failed with {error:?}, expected EIO or ETIMEDOUT"
    );
}

/// Every toxic slows each chunk by 200 ± 50 ms in both directions: slow, but right.
#[test]
fn latency_gives_the_right_bytes() {
    let b = create_bucket("faults-latency");
    let data = gen_data(1, 8 * MIB);
    put(&b, "read", data.clone());
    let proxy = ToxiProxy::to_minio();
    let m = mount_through(&proxy.endpoint, &b, &[]);
    for direction in [Direction::Upstream, Direction::Downstream] {
        let name = format!("latency-{direction:?}");
        proxy.add(&name, direction, Toxic::Latency { latency_ms: 200, jitter_ms: 50 });
    }
    let read = assert_reads_right(&m, "read", &data, Duration::ZERO);
    let written = assert_writes_right(&m, &b, "written", &gen_data(2, 12 * MIB), Duration::ZERO);
    eprintln!("with 200 ms latency: 8 MiB read in {read:?}, 12 MiB written in {written:?}");
    // Each request waits at least the latency of its request and of its answer.
    assert!(read >= Duration::from_millis(300), "the read took {read:?}: did it go through the proxy?");
}

/// 8 MiB at about 4 MB/s per connection each way, at most two requests in flight: the
/// bytes are right and take about as long as the limit says (the lower bound shows that
/// the limit applied, the upper one that nothing stalled).
#[test]
fn bandwidth_limit_gives_the_right_bytes_in_time() {
    let b = create_bucket("faults-bandwidth");
    let data = gen_data(3, 8 * MIB);
    put(&b, "read", data.clone());
    let proxy = ToxiProxy::to_minio();
    let m = mount_through(&proxy.endpoint, &b, &["--max-concurrent-requests", "2"]);
    for direction in [Direction::Upstream, Direction::Downstream] {
        let name = format!("bandwidth-{direction:?}");
        proxy.add(&name, direction, Toxic::Bandwidth { kb_per_s: 4096 });
    }
    let read = assert_reads_right(&m, "read", &data, Duration::ZERO);
    let written = assert_writes_right(&m, &b, "written", &gen_data(4, 8 * MIB), Duration::ZERO);
    eprintln!("at 4 MB/s per connection: 8 MiB read in {read:?}, 8 MiB written in {written:?}");
    // 8 MiB over two connections of 4.096 MB/s take 1.02 s at best.
    for (what, took) in [("read", read), ("write", written)] {
        assert!(took >= Duration::from_millis(800), "the {what} of 8 MiB took only {took:?}: no limit?");
        assert!(took < Duration::from_secs(30), "the {what} of 8 MiB took {took:?}");
    }
}

/// On a slow link (64 KB/s per connection), a read that falls inside a read-ahead GET
/// still running returns as soon as its own bytes have arrived: the GET's body is
/// handed over as it comes, not when the whole range is in.
///
/// A first O_DIRECT read of 64 KiB at offset 0 starts read-ahead of the next bytes in
/// 1 MiB GETs, each on its own connection; a 4 KiB read at 64 KiB, once the first read
/// returned (about 1 s), finds its bytes in the first read-ahead GET, which needs about
/// 15 s more to finish. It must return well before that.
#[test]
fn a_read_inside_a_slow_read_ahead_waits_only_for_its_own_bytes() {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const KIB: u64 = 1024;
    let b = create_bucket("faults-streamed");
    let data = gen_data(8, 4 * MIB);
    put(&b, "big", data.clone());
    let proxy = ToxiProxy::to_minio();
    let m = MountBuilder::new().bucket(&b).endpoint(&proxy.endpoint).request_log().mount();
    std::fs::metadata(m.join("big")).expect("stat");
    proxy.add("slow", Direction::Downstream, Toxic::Bandwidth { kb_per_s: 64 });
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(m.join("big")).expect("open");
    let mut first = AlignedBuffer::new(64 * KIB as usize);
    assert_eq!(file.read_at(first.bytes(), 0).expect("first read"), 64 * KIB as usize);
    assert_same_bytes(first.bytes(), &data[..64 * KIB as usize], "first read");
    let mut second = AlignedBuffer::new(4 * KIB as usize);
    let started = Instant::now();
    assert_eq!(file.read_at(second.bytes(), 64 * KIB).expect("second read"), 4 * KIB as usize);
    let took = started.elapsed();
    assert_same_bytes(second.bytes(), &data[64 * KIB as usize..68 * KIB as usize], "second read");
    let gets: Vec<_> = m.s3_requests().into_iter().filter_map(|r| r.range).collect();
    let covering = gets.iter().find(|(start, len)| *start <= 64 * KIB && 68 * KIB <= start + len);
    // A read-ahead GET runs to the end of its part (here the object's), paced to the
    // window: its first 1 MiB alone takes 15 s at 64 KB/s.
    let rest = 4 * MIB as u64 - 64 * KIB;
    assert_eq!(covering, Some(&(64 * KIB, rest)), "the second read's bytes came with read-ahead: {gets:?}");
    assert!(took < Duration::from_millis(1500), "a 4 KiB read waited {took:?}, as for its GET's first window");
    eprintln!("4 KiB read inside a paced read-ahead GET at 64 KB/s: {took:?}");
}

/// Two bursts of 1.5 s during which every connection is reset as soon as a byte goes
/// through it, in the middle of a slow read and a slow multipart write: shorter than the
/// retry window, so the programs see no error and get the right bytes.
#[test]
fn reset_bursts_shorter_than_the_retry_window_are_invisible() {
    read_and_write_survive("faults-reset", 5, Duration::from_millis(150), |proxy| {
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(700));
            proxy.add("reset-up", Direction::Upstream, Toxic::ResetPeer { after_ms: 0 });
            proxy.add("reset-down", Direction::Downstream, Toxic::ResetPeer { after_ms: 0 });
            std::thread::sleep(Duration::from_millis(1500));
            proxy.remove("reset-up");
            proxy.remove("reset-down");
        }
    });
}

/// A slow read of a 16 MiB object and a slow 12 MiB multipart write run through `proxy`
/// while `fault` does its worst (on this thread): both finish without an error, with the
/// right bytes (the written object checked in MinIO), and no multipart upload is left.
fn read_and_write_survive(bucket: &str, seed: u64, pause: Duration, fault: impl FnOnce(&ToxiProxy)) {
    let b = create_bucket(bucket);
    let data = gen_data(seed, 16 * MIB);
    put(&b, "read", data.clone());
    let written = gen_data(seed + 1, 12 * MIB);
    let proxy = ToxiProxy::to_minio();
    let m = mount_through(&proxy.endpoint, &b, &[]);

    let reader_path = m.join("read");
    let expected = data.clone();
    let reader = std::thread::spawn(move || read_checked(reader_path, &expected, pause));
    let writer_path = m.join("written");
    let to_write = written.clone();
    let writer = std::thread::spawn(move || write_file(writer_path, &to_write, pause));
    fault(&proxy);

    let read = run_with_timeout("the reader", HANG, move || reader.join().expect("reader thread"));
    assert_eq!(read.unwrap_or_else(|e| panic!("the reader saw an error: {e}\n{}", m.diagnostics())), data.len());
    run_with_timeout("the writer", HANG, move || writer.join().expect("writer thread"))
        .unwrap_or_else(|e| panic!("the writer saw an error: {e}\n{}", m.diagnostics()));
    assert_same_bytes(&get(&b, "written"), &written, "the written object in MinIO");
    assert_eq!(open_uploads(&b), 0, "multipart uploads left open");
}

/// Read timeout and retry window of the mounts of the timeout tests, kept small so that
/// they are quick. One request to a silent store fails within one window plus one attempt
/// (two read timeouts); a `read(2)` can take two requests in turn (the kernel follows a
/// failed read-ahead with a synchronous read of the page), hence the slack of
/// `SILENT_STORE_BOUND` (measured: 6.4 s).
const READ_TIMEOUT_S: u64 = 1;
const RETRY_WINDOW_S: u64 = 3;
const SILENT_STORE_BOUND: Duration = Duration::from_secs(RETRY_WINDOW_S + 2 * READ_TIMEOUT_S + 5);

/// A store that takes every connection and never answers (toxiproxy's `timeout` toxic,
/// held for longer than retry window + read timeout): a read fails with a clear error in
/// bounded time, not at once and not never.
#[test]
fn silent_store_fails_a_read_in_bounded_time() {
    let b = create_bucket("faults-timeout-read");
    let data = gen_data(7, 8 * MIB);
    put(&b, "read", data.clone());
    let proxy = ToxiProxy::to_minio();
    let (read_timeout, retry_window) = (READ_TIMEOUT_S.to_string(), RETRY_WINDOW_S.to_string());
    let mut m = mount_through(&proxy.endpoint, &b, &["--read-timeout", &read_timeout, "--retry-window", &retry_window]);
    // Opened before the store goes silent: what is timed below is the reads alone.
    let mut file = File::open(m.join("read")).expect("open");
    proxy.add("silent", Direction::Upstream, Toxic::Timeout { after_ms: 0 });
    let expected = data.clone();
    let (result, elapsed) = run_with_timeout("a read from a silent store", HANG, move || {
        let started = Instant::now();
        let mut buffer = vec![0; MIB];
        let result = file.read(&mut buffer).map(|n| buffer[..n] == expected[..n]);
        (result, started.elapsed())
    });
    eprintln!("a read from a silent store returned {result:?} after {elapsed:?}");
    let error = result.expect_err("a read from a silent store must fail");
    assert_clear_error(&error, "a read from a silent store");
    // Not at once: the silence is waited for at least one read timeout. (That the retries
    // cover the window is checked where they succeed: resets, cut bodies, SlowDown.)
    assert!(elapsed >= Duration::from_secs(READ_TIMEOUT_S), "gave up after {elapsed:?}");
    assert!(elapsed < SILENT_STORE_BOUND, "took {elapsed:?} to fail (bound {SILENT_STORE_BOUND:?})");

    proxy.remove("silent");
    assert_reads_right(&m, "read", &data, Duration::ZERO);
    m.assert_alive();
}

/// The same silent store in the middle of a multipart write (the upload has started and
/// sent a part): the program gets a clear error in bounded time, the bucket gets no
/// object, and the upload left open is aborted by the next mount (the daemon that
/// started it could not reach the store to abort it).
#[test]
fn silent_store_fails_a_write_without_leaving_anything() {
    let b = create_bucket("faults-timeout-write");
    let proxy = ToxiProxy::to_minio();
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("utf-8").to_owned();
    let (read_timeout, retry_window) = (READ_TIMEOUT_S.to_string(), RETRY_WINDOW_S.to_string());
    let options = ["--read-timeout", &read_timeout, "--retry-window", &retry_window, "--cache-dir", &cache_dir];
    let m = mount_through(&proxy.endpoint, &b, &options);

    let data = gen_data(8, 16 * MIB);
    let mut file = File::create(m.join("written")).expect("create");
    file.write_all(&data[..6 * MIB]).expect("the first part is written while the store answers");
    assert!(
        wait_until(Duration::from_secs(30), || open_uploads_of(&b, "written") == 1),
        "the multipart upload did not start\n{}",
        m.diagnostics()
    );
    proxy.add("silent", Direction::Upstream, Toxic::Timeout { after_ms: 0 });
    let rest = data[6 * MIB..].to_vec();
    let (result, elapsed) = run_with_timeout("a write to a silent store", HANG, move || {
        let started = Instant::now();
        let result = rest.chunks(MIB).try_for_each(|chunk| file.write_all(chunk)).map(|()| file);
        (result.and_then(close), started.elapsed())
    });
    eprintln!("a write to a silent store returned {result:?} after {elapsed:?}");
    let error = result.expect_err("a write to a silent store must fail");
    assert_clear_error(&error, "a write to a silent store");
    // Up to three calls wait out the silence in turn: a part, the next part, the commit.
    let bound = SILENT_STORE_BOUND * 3;
    assert!(elapsed < bound, "took {elapsed:?} to fail (bound {bound:?})");

    proxy.remove("silent");
    assert!(!list_keys(&b, "").contains(&"written".to_owned()), "a partial object was committed");
    drop(m);
    let again = mount_through(&proxy.endpoint, &b, &options);
    assert!(
        wait_until(Duration::from_secs(30), || open_uploads(&b) == 0),
        "the next mount left the failed upload open\n{}",
        again.diagnostics()
    );
    assert!(list_keys(&b, "").is_empty(), "objects appeared: {:?}", list_keys(&b, ""));
}

/// Bodies come in slices of about 2 KiB with pauses between them, both ways: the same
/// bytes arrive.
#[test]
fn sliced_bodies_give_the_right_bytes() {
    let b = create_bucket("faults-slicer");
    let data = gen_data(9, 8 * MIB);
    put(&b, "read", data.clone());
    let proxy = ToxiProxy::to_minio();
    let m = mount_through(&proxy.endpoint, &b, &[]);
    for direction in [Direction::Upstream, Direction::Downstream] {
        let name = format!("slicer-{direction:?}");
        proxy.add(&name, direction, Toxic::Slicer { average_bytes: 2048, variation_bytes: 1024, delay_us: 10 });
    }
    assert_reads_right(&m, "read", &data, Duration::ZERO);
    assert_writes_right(&m, &b, "written", &gen_data(10, 12 * MIB), Duration::ZERO);
}

/// For 2 s every connection is closed after 256 KiB (bodies cut short, both ways), in
/// the middle of a slow read and a slow multipart write: the cut requests are retried
/// and the programs get the right bytes, without an error.
#[test]
fn bodies_cut_short_for_a_while_are_retried() {
    read_and_write_survive("faults-cut-burst", 11, Duration::from_millis(100), |proxy| {
        std::thread::sleep(Duration::from_millis(500));
        proxy.add("cut-up", Direction::Upstream, Toxic::LimitData { bytes: 256 * KIB as u64 });
        proxy.add("cut-down", Direction::Downstream, Toxic::LimitData { bytes: 256 * KIB as u64 });
        std::thread::sleep(Duration::from_secs(2));
        proxy.remove("cut-up");
        proxy.remove("cut-down");
    });
}

/// Every connection is closed after 1 MiB, for good: requests that fit still work and
/// larger ones keep failing. Whatever the program gets must be right: every byte read
/// before an error matches, and the error is a clear one, in bounded time; a write
/// either commits the whole object or fails, leaving nothing.
#[test]
fn bodies_always_cut_short_never_give_wrong_bytes() {
    let b = create_bucket("faults-cut-always");
    let data = gen_data(13, 8 * MIB);
    put(&b, "read", data.clone());
    let proxy = ToxiProxy::to_minio();
    let (read_timeout, retry_window) = (READ_TIMEOUT_S.to_string(), RETRY_WINDOW_S.to_string());
    let m = mount_through(&proxy.endpoint, &b, &["--read-timeout", &read_timeout, "--retry-window", &retry_window]);
    proxy.add("cut-up", Direction::Upstream, Toxic::LimitData { bytes: MIB as u64 });
    proxy.add("cut-down", Direction::Downstream, Toxic::LimitData { bytes: MIB as u64 });

    let path = m.join("read");
    let expected = data.clone();
    let (read, elapsed) = run_with_timeout("the reader", HANG, move || {
        let started = Instant::now();
        (read_checked(path, &expected, Duration::ZERO), started.elapsed())
    });
    eprintln!("reading with bodies cut at 1 MiB: {read:?} after {elapsed:?}");
    match read {
        Ok(n) => assert_eq!(n, data.len(), "the reader stopped short without an error"),
        Err(e) => assert_clear_error(&e, "the read"),
    }
    assert!(elapsed < SILENT_STORE_BOUND * 3, "the read took {elapsed:?}");

    let written = gen_data(14, 12 * MIB);
    let path = m.join("written");
    let to_write = written.clone();
    let (write, elapsed) = run_with_timeout("the writer", HANG, move || {
        let started = Instant::now();
        (write_file(path, &to_write, Duration::ZERO), started.elapsed())
    });
    eprintln!("writing with bodies cut at 1 MiB: {write:?} after {elapsed:?}");
    proxy.remove("cut-up");
    proxy.remove("cut-down");
    match write {
        Ok(()) => assert_same_bytes(&get(&b, "written"), &written, "the written object in MinIO"),
        Err(e) => {
            assert_clear_error(&e, "the write");
            assert!(!list_keys(&b, "").contains(&"written".to_owned()), "a partial object was committed");
        }
    }
    assert!(elapsed < SILENT_STORE_BOUND * 3, "the write took {elapsed:?}");
    // The failed upload (if any) was aborted by the daemon once it could not continue.
    assert!(
        wait_until(Duration::from_secs(10), || open_uploads(&b) == 0),
        "multipart uploads left open\n{}",
        m.diagnostics()
    );
}

/// Bursts of four `503 SlowDown` answers (the harness's relay), 1.5 s apart, in the middle
/// of a multipart write: every request of the upload (lookup, start, parts, complete) that
/// meets one is retried with backoff, and the object arrives whole. (A single request
/// that met 503s for longer than the retry window would fail, as documented: the gaps
/// between bursts are longer than its backoff after four failures.)
#[test]
fn slow_down_bursts_during_a_multipart_write_are_retried() {
    let b = create_bucket("faults-slowdown");
    let relay = Relay::start(minio().port);
    let m = mount_through(&relay.endpoint, &b, &[]);
    let written = gen_data(15, 16 * MIB);
    let path = m.join("written");
    let to_write = written.clone();
    let writer = std::thread::spawn(move || write_file(path, &to_write, Duration::from_millis(100)));
    for _ in 0..3 {
        if writer.is_finished() {
            break;
        }
        relay.faults.slow_down.store(4, Ordering::Relaxed);
        wait_until(Duration::from_secs(10), || {
            relay.faults.slow_down.load(Ordering::Relaxed) == 0 || writer.is_finished()
        });
        std::thread::sleep(Duration::from_millis(1500));
    }
    relay.faults.slow_down.store(0, Ordering::Relaxed);
    run_with_timeout("the writer", HANG, move || writer.join().expect("writer thread"))
        .unwrap_or_else(|e| panic!("the writer saw an error: {e}\n{}", m.diagnostics()));
    assert_same_bytes(&get(&b, "written"), &written, "the written object in MinIO");
    assert_eq!(open_uploads(&b), 0, "multipart uploads left open");
    let answered = relay.faults.slow_downs_answered.load(Ordering::Relaxed);
    assert!(answered >= 4, "the relay answered only {answered} requests with 503 during the write");
}
