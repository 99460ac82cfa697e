//! Mounts that must fail: non-zero exit within 15 s, a one-line message on stderr that names
//! the problem, and nothing left mounted.

use crate::common::*;

#[test]
fn bucket_does_not_exist() {
    let missing = unique_bucket_name("missing");
    let r = MountBuilder::new().bucket(&missing).expect_failure();
    r.assert_error("does not exist");
}

#[test]
fn bucket_does_not_exist_in_background_mode() {
    let missing = unique_bucket_name("missing-bg");
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().canonicalize().unwrap();
    let r = MountBuilder::new().bucket(&missing).mountpoint(&mp).background().expect_failure();
    r.assert_error("does not exist");
    assert!(!is_mounted(&mp));
    assert!(
        wait_until(std::time::Duration::from_secs(3), || { pids_with_arg_containing(mp.to_str().unwrap()).is_empty() }),
        "a bucketfs process is left behind for {}",
        mp.display()
    );
}

#[test]
fn wrong_secret_key() {
    let b = create_bucket("wrong-secret");
    let r = MountBuilder::new().bucket(&b).secret_key("not-the-secret").expect_failure();
    r.assert_error("credentials rejected");
}

/// No credentials anywhere (environment, config files, instance metadata): the mount
/// says so, and what to do, rather than calling the endpoint unreachable.
#[test]
fn no_credentials_at_all() {
    let b = create_bucket("no-credentials");
    let r =
        MountBuilder::new().bucket(&b).env("AWS_ACCESS_KEY_ID", "").env("AWS_SECRET_ACCESS_KEY", "").expect_failure();
    r.assert_error("no credentials to sign requests");
    r.assert_error("AWS_ACCESS_KEY_ID");
}

#[test]
fn endpoint_unreachable() {
    let r = MountBuilder::new().bucket("any-bucket").endpoint(UNREACHABLE_ENDPOINT).expect_failure();
    r.assert_error("cannot reach");
}

#[test]
fn mountpoint_does_not_exist() {
    let b = create_bucket("mp-missing");
    let dir = tempfile::tempdir().unwrap();
    let r = MountBuilder::new().bucket(&b).mountpoint(dir.path().join("no-such-dir")).expect_failure();
    r.assert_error("does not exist");
}

#[test]
fn mountpoint_is_a_regular_file() {
    let b = create_bucket("mp-file");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("regular");
    std::fs::write(&file, b"x").unwrap();
    let r = MountBuilder::new().bucket(&b).mountpoint(&file).expect_failure();
    r.assert_error("not a directory");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn mountpoint_not_empty() {
    let b = create_bucket("mp-nonempty");
    put(&b, "k", b"v".to_vec());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("existing"), b"x").unwrap();
    let r = MountBuilder::new().bucket(&b).mountpoint(dir.path()).expect_failure();
    r.assert_error("not empty");
    assert_eq!(ls(dir.path()), ["existing"]);
}

#[test]
fn mountpoint_already_mounted() {
    let b = create_bucket("mp-mounted");
    put(&b, "k", b"v".to_vec());
    let mut m = MountBuilder::new().bucket(&b).mount();
    let r = MountBuilder::new().bucket(&b).mountpoint(m.path()).expect_failure();
    r.assert_error("already mounted");
    // the first mount is unaffected
    m.assert_alive();
    assert_eq!(mount_count(m.path()), 1);
    assert_eq!(std::fs::read(m.join("k")).unwrap(), b"v");
}

#[test]
fn mixed_multiplexed_and_plain_sources_are_rejected() {
    let b1 = create_bucket("mixed-1");
    let b2 = create_bucket("mixed-2");
    MountBuilder::new()
        .source(format!("s3://{b1}=one"))
        .source(format!("s3://{b2}"))
        .expect_failure()
        .assert_failed_cleanly();
    // two sources without =SUBDIR cannot both be the root
    MountBuilder::new()
        .source(format!("s3://{b1}"))
        .source(format!("s3://{b2}"))
        .expect_failure()
        .assert_failed_cleanly();
}

#[test]
fn malformed_sources_are_rejected() {
    for src in ["just-a-name", "http://bucket/x", "s3://"] {
        MountBuilder::new().source(src).expect_failure().assert_failed_cleanly();
    }
}

#[test]
fn invalid_option_values_are_rejected() {
    let b = create_bucket("bad-options");
    for args in [
        ["--part-size", "banana"],
        ["--file-mode", "0999"],
        ["--dir-mode", "rwx"],
        ["--uid", "someone"],
        ["--metadata-ttl", "soon"],
        ["--memory-limit", "-5"],
    ] {
        MountBuilder::new().bucket(&b).args(args).expect_failure().assert_failed_cleanly();
    }
}

/// A data cache directory that cannot be made fails the mount, with the directory named,
/// before the daemon starts (the message reaches the terminal).
#[test]
fn unusable_data_cache_directory() {
    let b = create_bucket("bad-cache");
    let r = MountBuilder::new().bucket(&b).background().args(["--cache", "/proc/no-such-cache"]).expect_failure();
    r.assert_error("data cache directory /proc/no-such-cache is not usable");
}
