//! A store that asks its clients to slow down is a slower store, not a broken one: its
//! throttling answers (MinIO's `429 TooManyRequests` past `MINIO_API_REQUESTS_MAX`, S3's
//! `503 SlowDown`) are waited out with fewer requests in flight, and only a store that
//! keeps throttling for the whole retry window fails an operation.

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;

/// A MinIO that serves at most 2 requests at once and answers any more at once with
/// `429 TooManyRequests` (and `Retry-After: 60`; this version ignores the deadline).
fn throttling_minio() -> OwnMinio {
    OwnMinio::start_with(&[("MINIO_API_REQUESTS_MAX", "2"), ("MINIO_API_REQUESTS_DEADLINE", "100ms")])
}

/// One PUT at a time, tried again if MinIO throttled it anyway (the SDK's own retries
/// do not take MinIO's 429 for throttling).
fn put_retrying(client: &aws_sdk_s3::Client, bucket: &str, key: &str, data: &[u8]) {
    for attempt in 0.. {
        let body = aws_sdk_s3::primitives::ByteStream::from(data.to_vec());
        match block_on(client.put_object().bucket(bucket).key(key).body(body).send()) {
            Ok(_) => return,
            Err(error) if attempt < 20 => {
                eprintln!("set-up PUT {key}: {error:?}; again");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(error) => panic!("set-up PUT {key}: {error:?}"),
        }
    }
}

/// 16 readers and 4 writers at once through one mount of a throttling MinIO: every
/// byte read is right, every file written is stored whole, no upload is left, and the
/// mount says it met throttling (log and `bucketfs status`).
#[test]
fn a_throttling_store_is_waited_out_by_many_readers_and_writers() {
    let own = throttling_minio();
    let b = "throttled";
    let client = own.client();
    block_on(client.create_bucket().bucket(b).send()).expect("create bucket");
    let objects: Vec<(String, Vec<u8>)> = (0..16).map(|i| (format!("r/{i}"), gen_data(100 + i, 4 * MIB))).collect();
    for (key, data) in &objects {
        put_retrying(&client, b, key, data);
    }
    let m = MountBuilder::new()
        .bucket(b)
        .endpoint(&own.server.endpoint)
        .args(["--metadata-ttl", "0", "--part-size", "5MiB"])
        .mount();

    let readers: Vec<_> = objects
        .iter()
        .map(|(key, data)| {
            let (path, expected) = (m.join(key), sha256_hex(data));
            std::thread::spawn(move || {
                let mut read = Vec::new();
                std::fs::File::open(&path)?.read_to_end(&mut read)?;
                Ok::<bool, std::io::Error>(sha256_hex(&read) == expected)
            })
        })
        .collect();
    let written: Vec<(String, Vec<u8>)> = (0..4).map(|i| (format!("w/{i}"), gen_data(200 + i, 12 * MIB))).collect();
    std::fs::create_dir(m.join("w")).expect("mkdir w");
    let writers: Vec<_> = written
        .iter()
        .map(|(key, data)| {
            let (path, data) = (m.join(key), data.clone());
            std::thread::spawn(move || {
                let mut file = std::fs::File::create(path)?;
                for chunk in data.chunks(MIB) {
                    file.write_all(chunk)?;
                }
                file.sync_all()
            })
        })
        .collect();

    let mut failures = Vec::new();
    for (reader, (key, _)) in readers.into_iter().zip(&objects) {
        match run_with_timeout("a reader", Duration::from_secs(120), move || reader.join().expect("reader thread")) {
            Ok(true) => {}
            Ok(false) => failures.push(format!("{key}: wrong bytes")),
            Err(error) => failures.push(format!("read {key}: {error}")),
        }
    }
    for (writer, (key, _)) in writers.into_iter().zip(&written) {
        if let Err(error) =
            run_with_timeout("a writer", Duration::from_secs(120), move || writer.join().expect("writer thread"))
        {
            failures.push(format!("write {key}: {error}"));
        }
    }
    assert!(failures.is_empty(), "through a throttling store:\n{}\n{}", failures.join("\n"), m.diagnostics());
    for (key, data) in &written {
        let stored = block_on(client.get_object().bucket(b).key(key).send()).expect("written object");
        let stored = block_on(stored.body.collect()).expect("its body").into_bytes();
        assert_eq!(sha256_hex(&stored), sha256_hex(data), "{key} stored whole");
    }
    let uploads = block_on(client.list_multipart_uploads().bucket(b).send()).expect("list uploads");
    assert!(uploads.uploads().is_empty(), "uploads left: {:?}", uploads.uploads());

    // The store did throttle (or this test proves nothing), and the mount said so.
    let status = run_bucketfs(&["status", m.path().to_str().expect("utf-8")], Duration::from_secs(10)).1;
    let answers: u64 = status
        .lines()
        .find_map(|line| line.trim().strip_prefix("throttling: "))
        .and_then(|line| line.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no throttling line in the status:\n{status}"));
    assert!(answers > 0, "MinIO never throttled: the test needs a lower request limit\n{status}");
    let log = m.stderr();
    let episodes = log.matches("the store is throttling requests").count();
    assert!(episodes >= 1, "the log does not say the store throttled:\n{log}");
    assert!(episodes <= 2, "the log says it {episodes} times: once per episode\n{log}");
    eprintln!("{answers} throttling answers, {episodes} log lines");
}

/// A store that throttles every request for longer than the retry window: the operation
/// fails with EIO once the window is over (not at once), and the log names the answer.
#[test]
fn throttling_past_the_retry_window_fails_with_eio() {
    let b = create_bucket("throttled-forever");
    put(&b, "f", b"x".to_vec());
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new()
        .bucket(&b)
        .endpoint(relay.endpoint.clone())
        .args(["--metadata-ttl", "0", "--retry-window", "2"])
        .mount();
    relay.faults.slow_down.store(usize::MAX / 2, Ordering::Relaxed);
    let path = m.join("f");
    let (result, elapsed) = run_with_timeout("stat of a throttling store", Duration::from_secs(60), move || {
        let started = std::time::Instant::now();
        (std::fs::metadata(path), started.elapsed())
    });
    let error = result.expect_err("stat must fail while every answer is SlowDown");
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert!(elapsed >= Duration::from_secs(2), "gave up after {elapsed:?}, before the end of a 2 s retry window");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
    relay.faults.slow_down.store(0, Ordering::Relaxed);
    let log = m.stderr();
    let named = log.lines().filter(|line| line.contains("the store is throttling requests: SlowDown")).count();
    assert_eq!(named, 1, "one log line names the store's answer:\n{log}");
    assert_eq!(std::fs::read(m.join("f")).expect("read once the store stops throttling"), b"x");
    m.assert_alive();
}
