//! `--metrics-addr`: a real scrape of a real mount, before and after a read and a write,
//! and the counters that must have moved.

use std::time::Duration;

use crate::common::*;

#[test]
fn counters_move_with_a_read_and_a_write() {
    let bucket = create_bucket("metrics");
    let data = gen_data(7, 3 * MIB);
    put(&bucket, "big.bin", data.clone());
    put(&bucket, "dir/inner.txt", b"keeps dir from being removed".to_vec());
    let address = format!("127.0.0.1:{}", free_port());
    let mount = MountBuilder::new().bucket(&bucket).args(["--metrics-addr", &address]).mount();

    let before = scrape(&address);
    assert_file_content(&mount.join("big.bin"), 256 * KIB, &data);
    std::fs::write(mount.join("new.txt"), b"written through the mount").expect("write");
    assert_eq!(get(&bucket, "new.txt"), b"written through the mount");
    // Gauges are sampled once a second.
    std::thread::sleep(Duration::from_millis(1500));
    let after = scrape(&address);

    let moved = |sample: &str| value(&after, sample) - value(&before, sample);
    assert!(moved(r#"bucketfs_s3_requests_total{op="GET",outcome="ok"}"#) >= 1.0, "GETs: {after:?}");
    assert!(moved(r#"bucketfs_s3_requests_total{op="PUT",outcome="ok"}"#) >= 1.0, "PUTs");
    assert!(moved("bucketfs_s3_bytes_received_total") >= data.len() as f64, "bytes read");
    assert!(moved("bucketfs_s3_bytes_sent_total") >= 25.0, "bytes written");
    assert!(moved(r#"bucketfs_s3_request_seconds_count{op="GET"}"#) >= 1.0, "GET latency histogram");
    assert!(moved(r#"bucketfs_fuse_requests_total{op="read"}"#) >= 3.0, "3 MiB in kernel reads of at most 1 MiB");
    assert!(moved(r#"bucketfs_fuse_requests_total{op="write"}"#) >= 1.0);
    assert!(moved(r#"bucketfs_fuse_requests_total{op="create"}"#) >= 1.0);
    assert!(moved("bucketfs_read_ahead_bytes_total") > 0.0, "a sequential read reads ahead");
    assert!(value(&after, "bucketfs_memory_limit_bytes") > 0.0, "the memory gauge is sampled");

    let refused = std::fs::remove_dir(mount.join("dir")).expect_err("not empty");
    assert_eq!(refused.raw_os_error(), Some(libc::ENOTEMPTY));
    let errors = scrape(&address);
    assert_eq!(value(&errors, r#"bucketfs_fuse_errors_total{op="rmdir",errno="ENOTEMPTY"}"#), 1.0, "{errors:?}");
}

/// What `tar x` sends per file it writes: a write-only descriptor writes straight through
/// (one WRITE per `write(2)`, also one starting inside a page, and no
/// `security.capability` probe before it), and a `chown` costs no GETATTR (the daemon
/// drops set-ID bits itself). Through the page cache, 4 writes of 10 KiB were 7 WRITEs
/// and 4 GETXATTRs, and the chown a GETATTR more.
#[test]
fn a_file_written_like_tar_does_costs_one_request_per_call() {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let bucket = create_bucket("metrics-tar");
    let address = format!("127.0.0.1:{}", free_port());
    let mount = MountBuilder::new().bucket(&bucket).args(["--metrics-addr", &address]).mount();
    let path = mount.join("f");
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).expect("create");
    let before = scrape(&address);
    for _ in 0..4 {
        file.write_all(&[7u8; 10240]).expect("write");
    }
    std::os::unix::fs::fchown(&file, Some(0), Some(0)).expect("fchown");
    let after = scrape(&address);
    close(file).expect("close");
    let moved = |op: &str| {
        let sample = format!(r#"bucketfs_fuse_requests_total{{op="{op}"}}"#);
        value(&after, &sample) - value(&before, &sample)
    };
    let requests: Vec<_> = after
        .iter()
        .filter(|(k, v)| k.starts_with("bucketfs_fuse_requests_total") && before.get(*k) != Some(v))
        .collect();
    assert_eq!(moved("write"), 4.0, "requests (totals) that moved: {requests:?}");
    assert!(moved("getxattr") <= 1.0, "only chown's own probe");
    assert_eq!(moved("getattr"), 0.0, "chown asked for the attributes first");
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), 4 * 10240);
}
