//! Versioned buckets (MinIO with versioning on): `bucketfs undelete PATH` makes the
//! latest version of a deleted file current again; `--show-versions` shows every stored
//! version read-only under `DIR/.versions/NAME/`.

use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use crate::common::*;
use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};

fn versioned_bucket() -> String {
    let bucket = create_bucket("versions");
    let versioning = VersioningConfiguration::builder().status(BucketVersioningStatus::Enabled).build();
    block_on(s3().put_bucket_versioning().bucket(&bucket).versioning_configuration(versioning).send())
        .expect("versioning on");
    bucket
}

/// Each version under `.versions/NAME/` reads as it was stored (a large one too, in
/// ranged GETs with its version id), also once the file is deleted; names sort by time;
/// nothing in the view can be changed; `.versions` is never listed, and without
/// `--show-versions` there is none.
#[test]
fn every_stored_version_reads_as_it_was() {
    let bucket = versioned_bucket();
    put(&bucket, "docs/report.txt", b"first draft".to_vec());
    put(&bucket, "docs/report.txt", b"final text".to_vec());
    let (old_big, new_big) = (gen_data(1, 20 * MIB), gen_data(2, 20 * MIB));
    put(&bucket, "docs/big.bin", old_big.clone());
    put(&bucket, "docs/big.bin", new_big.clone());
    let mount = MountBuilder::new().bucket(&bucket).args(["--show-versions"]).mount();
    let docs = mount.join("docs");
    let view = docs.join(".versions");

    assert_eq!(ls(&docs), ["big.bin", "report.txt"], "the view is not listed");
    assert_eq!(ls(&view), ["big.bin", "report.txt"]);
    let reports = ls(&view.join("report.txt"));
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(reports[0] < reports[1] && reports[0].ends_with('Z'), "named by time: {reports:?}");
    let older = view.join("report.txt").join(&reports[0]);
    assert_eq!(std::fs::read(&older).expect("older version"), b"first draft");
    assert_eq!(std::fs::read(view.join("report.txt").join(&reports[1])).expect("newer"), b"final text");
    assert!(std::fs::metadata(&older).expect("stat").permissions().readonly(), "shown read-only");
    let bigs = ls(&view.join("big.bin"));
    assert_file_content(&view.join("big.bin").join(&bigs[0]), MIB, &old_big);
    assert_file_content(&docs.join("big.bin"), MIB, &new_big);

    std::fs::remove_file(docs.join("report.txt")).expect("rm");
    assert_eq!(ls(&docs), ["big.bin"]);
    assert_eq!(ls(&view.join("report.txt")), reports, "a deleted file keeps its versions");
    assert_eq!(std::fs::read(&older).expect("after the delete"), b"first draft");

    let write = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_TRUNC).open(&older);
    assert_errno(write, libc::EROFS, "open a version for writing");
    assert_errno(std::fs::remove_file(&older), libc::EROFS, "rm a version");
    assert_errno(std::fs::write(view.join("new.txt"), b"x"), libc::EROFS, "create in the view");
    assert_errno(std::fs::create_dir(view.join("d")), libc::EROFS, "mkdir in the view");
    assert_errno(std::fs::rename(docs.join("big.bin"), view.join("moved.bin")), libc::EROFS, "mv into the view");
    assert_errno(std::fs::remove_dir(&view), libc::EROFS, "rmdir the view");
    assert_eq!(list_keys(&bucket, ""), ["docs/big.bin"], "nothing changed in the bucket");
    drop(mount);

    let plain = MountBuilder::new().bucket(&bucket).mount();
    assert_errno(std::fs::metadata(plain.join("docs/.versions")), libc::ENOENT, "no view without --show-versions");
}

#[test]
fn undelete_restores_the_latest_version_of_a_deleted_file() {
    let bucket = versioned_bucket();
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
