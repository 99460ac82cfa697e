//! `--metrics-addr`: a real scrape of a real mount, before and after a read and a write,
//! and the counters that must have moved.

mod common;

use std::time::Duration;

use common::*;

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
