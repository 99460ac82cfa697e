//! `bucketfs status`: every bucketfs mount with what it is doing, read from the daemons.

use std::io::Write;
use std::time::Duration;

use crate::common::*;

#[test]
fn status_reports_every_mount_and_what_it_is_doing() {
    let first = create_bucket("status-a");
    let second = create_bucket("status-b");
    put(&first, "f.txt", b"first".to_vec());
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let cached = MountBuilder::new().bucket(&first).args(["--cache", cache.path().to_str().expect("UTF-8")]).mount();
    let plain = MountBuilder::new().bucket(&second).mount();
    assert_eq!(std::fs::read(cached.join("f.txt")).expect("read"), b"first");
    let mut open = std::fs::File::create(plain.join("open.txt")).expect("create");
    open.write_all(b"still open").expect("write");

    let (status, stdout, stderr) = run_bucketfs(&["status"], Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    for (mount, bucket) in [(&cached, &first), (&plain, &second)] {
        let block = stdout
            .split_once(&format!("{}\n", mount.path().display()))
            .unwrap_or_else(|| panic!("{} not listed:\n{stdout}", mount.path().display()))
            .1;
        assert!(block.starts_with("  pid: "), "{block}");
        assert!(block.contains(&format!("sources: s3://{bucket}/")), "{block}");
    }

    let (_, one, _) = run_bucketfs(&["status", cached.path().to_str().expect("UTF-8")], Duration::from_secs(10));
    assert!(one.contains("data cache: ") && !one.contains("data cache: off"), "{one}");
    let requests: u64 = one
        .lines()
        .find_map(|l| l.split(", ").nth(1)?.strip_suffix(" in all")?.parse().ok())
        .unwrap_or_else(|| panic!("no request count: {one}"));
    assert!(requests >= 1, "the read sent requests: {one}");
    let (_, other, _) = run_bucketfs(&["status", plain.path().to_str().expect("UTF-8")], Duration::from_secs(10));
    assert!(other.contains("files open for writing: 1"), "{other}");
    assert!(other.contains("data cache: off"), "{other}");
    assert!(other.contains("write-back: off"), "no --write-back and nothing logged: {other}");
    drop(open);

    let (status, _, stderr) = run_bucketfs(&["status", "/tmp"], Duration::from_secs(10));
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("is not a bucketfs mount"), "{stderr}");
}
