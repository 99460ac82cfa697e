//! Versioned buckets: `bucketfs undelete PATH` makes the latest version of a deleted file
//! current again (MinIO with versioning on).

mod common;

use std::time::Duration;

use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
use common::*;

#[test]
fn undelete_restores_the_latest_version_of_a_deleted_file() {
    let bucket = create_bucket("versions");
    let versioning = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
    block_on(s3().put_bucket_versioning().bucket(&bucket).versioning_configuration(versioning).send())
        .expect("versioning on");
    put(&bucket, "docs/report.txt", b"first draft".to_vec());
    put(&bucket, "docs/report.txt", b"final text".to_vec());
    let mount = MountBuilder::new().bucket(&bucket).args(["--metadata-ttl", "60"]).mount();
    let report = mount.join("docs/report.txt");
    std::fs::remove_file(&report).expect("rm");
    assert!(list_keys(&bucket, "docs/").is_empty(), "deleted (a delete marker on top)");
    // A look-up after the delete leaves the kernel a negative entry (for the TTL, 60 s here):
    // the undelete must clear it, or the file stays hidden.
    assert!(std::fs::metadata(&report).is_err(), "gone from the mount");

    let undelete =
        |path: &std::path::Path| run_bucketfs(&["undelete", path.to_str().expect("UTF-8")], Duration::from_secs(20));
    let (status, stdout, stderr) = undelete(&report);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("restored"), "{stdout}");
    assert_eq!(std::fs::read(&report).expect("read through the mount"), b"final text");
    assert_eq!(get(&bucket, "docs/report.txt"), b"final text", "the latest version, not the first");
    assert_eq!(ls(&mount.join("docs")), ["report.txt"]);

    let (status, _, stderr) = undelete(&report);
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("is not deleted"), "{stderr}");
    let (status, _, stderr) = undelete(&mount.join("docs/never-written.txt"));
    assert_eq!(status.code(), Some(1));
    assert!(stderr.contains("no earlier version"), "{stderr}");
}
