//! The daemon's logs: `--log-format json` writes one JSON object per event, and
//! `bucketfs log-level` changes the level of a running mount.

use std::path::Path;
use std::time::Duration;

use crate::common::*;

fn logged_mount(bucket: &str, log: &Path, args: &[&str]) -> Mount {
    MountBuilder::new()
        .bucket(bucket)
        .no_log_passthrough()
        .args(["--log-file", log.to_str().expect("UTF-8")])
        .args(args.iter().copied())
        .mount()
}

#[test]
fn json_logs_are_one_object_per_line() {
    let bucket = create_bucket("log-json");
    put(&bucket, "f", b"x".to_vec());
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("bucketfs.log");
    let mount = logged_mount(&bucket, &log, &["--log-format", "json", "--log-level", "bucketfs=debug"]);
    assert_eq!(std::fs::read(mount.join("f")).expect("read"), b"x");
    drop(mount);
    let text = std::fs::read_to_string(&log).expect("log");
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    assert!(events.len() > 3, "{text}");
    for event in &events {
        assert!(event["timestamp"].is_string() && event["level"].is_string(), "{event}");
        assert!(event["fields"]["message"].is_string(), "{event}");
    }
    let get = events.iter().find(|e| e["fields"]["message"].as_str().is_some_and(|m| m.starts_with("s3 GET")));
    let get = get.unwrap_or_else(|| panic!("no GET logged: {text}"));
    assert_eq!(get["fields"]["key"], "f", "fields are JSON fields: {get}");
    // The work of a FUSE request logs inside its span: operation, inode, calling process.
    let looked_up = events.iter().find(|e| e["fields"]["message"] == "s3 HEAD" && e["span"]["op"] == "lookup");
    let looked_up = looked_up.unwrap_or_else(|| panic!("no HEAD inside a lookup's span: {text}"));
    // FUSE's pid is the calling thread's id.
    // SAFETY: gettid has no preconditions.
    assert_eq!(looked_up["span"]["pid"], unsafe { libc::gettid() }, "{looked_up}");
    assert!(looked_up["span"]["ino"].is_u64(), "{looked_up}");
}

#[test]
fn the_log_level_changes_while_mounted() {
    let bucket = create_bucket("log-level");
    put(&bucket, "before", b"1".to_vec());
    put(&bucket, "after", b"2".to_vec());
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("bucketfs.log");
    let mount = logged_mount(&bucket, &log, &["--log-level", "warn", "--attributes-from-listing"]);
    let mnt = mount.path().to_str().expect("UTF-8").to_owned();
    assert_eq!(std::fs::read(mount.join("before")).expect("read"), b"1");
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!logged().contains("s3 GET"), "debug lines at warn: {}", logged());

    let (status, stdout, stderr) = run_bucketfs(&["log-level", &mnt, "bucketfs=debug"], Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("bucketfs=debug"), "{stdout}");
    assert_eq!(std::fs::read(mount.join("after")).expect("read"), b"2");
    assert!(logged().contains("s3 GET"), "no debug lines after the change: {}", logged());

    let (status, _, stderr) = run_bucketfs(&["log-level", &mnt, "loud==="], Duration::from_secs(10));
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("is not a log level"), "{stderr}");
    let (status, _, stderr) = run_bucketfs(&["log-level", "/tmp", "debug"], Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "{stderr}");
}
