//! When the store goes away, programs see nothing of a short outage (a restart of a few
//! seconds) and a clear error after a bounded time for a long one; nothing hangs. The
//! outages are made by a loopback TCP relay in front of the real MinIO that can freeze
//! (hold connections silently), go down (reset every connection, refuse new ones, as a
//! restarting server does), or answer a number of requests with `503 SlowDown` (the
//! harness's [`crate::common::Relay`]).

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn unresponsive_store_fails_operations_in_bounded_time() {
    let b = create_bucket("outage");
    put(&b, "dir/file", gen_data(3, 3 * MIB));
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new()
        .bucket(&b)
        .endpoint(relay.endpoint.clone())
        .args(["--read-timeout", "1", "--metadata-ttl", "0"])
        .mount();

    relay.faults.frozen.store(true, Ordering::Relaxed);
    let path = m.join("dir/file");
    let (result, elapsed) = run_with_timeout("stat while the store hangs", Duration::from_secs(60), move || {
        let started = Instant::now();
        (std::fs::metadata(path), started.elapsed())
    });
    let error = result.expect_err("stat while the store hangs must fail");
    assert!(
        matches!(error.raw_os_error(), Some(libc::ETIMEDOUT) | Some(libc::EIO)),
        "stat failed with {error}, expected ETIMEDOUT or EIO"
    );
    assert!(elapsed < Duration::from_secs(20), "stat took {elapsed:?} with a 1 s read timeout and a 10 s retry window");

    relay.faults.frozen.store(false, Ordering::Relaxed);
    let data = std::fs::read(m.join("dir/file")).expect("read after the store is back");
    assert_eq!(sha256_hex(&data), sha256_hex(&gen_data(3, 3 * MIB)));
    m.assert_alive();
}

/// A store that restarts for 3 s (connections reset, new ones refused) in the middle of
/// a large read and a large write: both programs finish with the right bytes and never
/// see an error.
#[test]
fn store_restart_of_a_few_seconds_is_invisible() {
    let b = create_bucket("outage-restart");
    let data = gen_data(5, 48 * MIB);
    put(&b, "big", data.clone());
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new()
        .bucket(&b)
        .endpoint(relay.endpoint.clone())
        .args(["--metadata-ttl", "0", "--part-size", "5MiB"])
        .mount();

    let reader_path = m.join("big");
    let reader = std::thread::spawn(move || {
        // A slow reader, so that the outage comes while it reads.
        let mut file = std::fs::File::open(reader_path)?;
        let mut out = Vec::new();
        let mut chunk = vec![0; MIB];
        loop {
            let n = file.read(&mut chunk)?;
            if n == 0 {
                return Ok::<_, std::io::Error>(out);
            }
            out.extend_from_slice(&chunk[..n]);
            std::thread::sleep(Duration::from_millis(80));
        }
    });
    let written = gen_data(6, 20 * MIB);
    let writer_path = m.join("written");
    let to_write = written.clone();
    let writer = std::thread::spawn(move || {
        let mut file = std::fs::File::create(writer_path)?;
        for chunk in to_write.chunks(MIB) {
            file.write_all(chunk)?;
            std::thread::sleep(Duration::from_millis(150));
        }
        file.sync_all()
    });
    std::thread::sleep(Duration::from_millis(700));
    relay.faults.down.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(3));
    relay.faults.down.store(false, Ordering::Relaxed);

    let read = run_with_timeout("the reader", Duration::from_secs(120), move || reader.join().expect("reader thread"));
    let read = read.expect("the reader saw no error");
    assert_eq!(read.len(), data.len());
    assert!(read == data, "the reader read the right bytes");
    run_with_timeout("the writer", Duration::from_secs(120), move || writer.join().expect("writer thread"))
        .expect("the writer saw no error");
    assert_eq!(sha256_hex(&get(&b, "written")), sha256_hex(&written));
    assert_eq!(open_uploads(&b), 0);
    m.assert_alive();
}

/// The answer to a CreateMultipartUpload is lost (the store started the upload, the
/// connection broke before its id came back): the write goes on with a second upload,
/// and the first one is aborted, not left behind.
#[test]
fn an_upload_started_by_an_attempt_whose_answer_was_lost_is_not_left_behind() {
    let b = create_bucket("outage-lost-start");
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new().bucket(&b).endpoint(relay.endpoint.clone()).args(["--part-size", "5MiB"]).mount();
    relay.faults.lose_answers("?uploads", 1);
    let data = gen_data(9, 12 * MIB);
    std::fs::write(m.join("big"), &data).expect("the write succeeds");
    assert_eq!(relay.faults.answers_lost.load(Ordering::Relaxed), 1, "one start's answer was lost");
    assert!(get(&b, "big") == data, "stored whole");
    assert_eq!(open_uploads_of(&b, "big"), 0, "no upload left behind:\n{}", m.diagnostics());
    m.assert_alive();
}

/// The answer to the request that stores a new file is lost (the store made the object,
/// the connection broke before it said so): the retry, conditional on the key being
/// absent, is refused because of our own object. That is not "someone else made it":
/// the write succeeds and the file is what was written, for a multipart complete and for
/// a single PUT alike.
#[test]
fn a_lost_answer_to_the_store_of_a_new_file_is_not_an_error() {
    let b = create_bucket("outage-lost-finish");
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new().bucket(&b).endpoint(relay.endpoint.clone()).args(["--part-size", "5MiB"]).mount();
    let write_and_close = |name: &str, data: &[u8]| {
        let mut file = std::fs::File::create(m.join(name)).expect("create");
        file.write_all(data).expect("write");
        close(file).unwrap_or_else(|e| panic!("close of {name} failed: {e}\n{}", m.diagnostics()));
    };
    relay.faults.lose_answers("?uploadId=", 1);
    let big = gen_data(10, 12 * MIB);
    write_and_close("big", &big);
    assert_eq!(relay.faults.answers_lost.load(Ordering::Relaxed), 1, "the complete's answer was lost");
    assert!(get(&b, "big") == big, "stored whole");
    assert_eq!(open_uploads_of(&b, "big"), 0);
    relay.faults.lose_answers(&format!("PUT /{b}/small"), 1);
    write_and_close("small", b"small file");
    assert_eq!(relay.faults.answers_lost.load(Ordering::Relaxed), 2, "the PUT's answer was lost");
    assert_eq!(get(&b, "small"), b"small file");
    m.assert_alive();
}

/// A store that is gone for good: an operation fails once the retry window is over
/// (10 s), not at once and not never; with the store back, the mount works again.
#[test]
fn dead_endpoint_fails_within_the_retry_window() {
    let b = create_bucket("outage-dead");
    put(&b, "dir/file", b"x".to_vec());
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new().bucket(&b).endpoint(relay.endpoint.clone()).args(["--metadata-ttl", "0"]).mount();
    relay.faults.down.store(true, Ordering::Relaxed);
    let dir = m.join("dir");
    let (result, elapsed) = run_with_timeout("ls of a dead endpoint", Duration::from_secs(60), move || {
        let started = Instant::now();
        (std::fs::read_dir(dir).and_then(|entries| entries.collect::<Result<Vec<_>, _>>()), started.elapsed())
    });
    let error = result.expect_err("ls with the store gone must fail");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    eprintln!("ls of a dead endpoint failed after {elapsed:?}");
    assert!(elapsed >= Duration::from_secs(10), "gave up after {elapsed:?}, before the end of the 10 s retry window");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?} to fail");
    relay.faults.down.store(false, Ordering::Relaxed);
    assert_eq!(std::fs::read(m.join("dir/file")).expect("read once the store is back"), b"x");
    m.assert_alive();
}

/// Bursts of `503 SlowDown` are waited out with backoff: the program gets its bytes.
#[test]
fn slow_down_answers_are_retried() {
    let b = create_bucket("outage-slowdown");
    let data = gen_data(8, 3 * MIB);
    put(&b, "f", data.clone());
    let relay = Relay::start(minio().port);
    let m = MountBuilder::new().bucket(&b).endpoint(relay.endpoint.clone()).args(["--metadata-ttl", "0"]).mount();
    relay.faults.slow_down.store(6, Ordering::Relaxed);
    let read = std::fs::read(m.join("f")).expect("read through a burst of SlowDown");
    assert!(read == data);
    assert_eq!(relay.faults.slow_down.load(Ordering::Relaxed), 0, "the relay answered all six with 503");
    std::fs::write(m.join("g"), b"written").expect("write after the burst");
    relay.faults.slow_down.store(4, Ordering::Relaxed);
    std::fs::write(m.join("h"), b"written during a burst").expect("write through a burst of SlowDown");
    assert_eq!(get(&b, "h"), b"written during a burst");
}
