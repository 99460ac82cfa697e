//! What the store refuses (docs/SEMANTICS.md, "Writing"): a change the credentials may not
//! make fails with EACCES and leaves nothing behind, neither in the bucket nor in the
//! mount; and of two mounts creating the same new key, the second to close gets EEXIST
//! (create-only PUT / CompleteMultipartUpload with `If-None-Match: *`) and the first one's
//! object stays.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use aws_sdk_s3::error::ProvideErrorMetadata;

/// Creates `path`, writes `data` in 1 MiB writes and closes it; on failure, which step
/// failed (`open`, `write at OFFSET`, `close`) and its error. The descriptor is closed in
/// every case.
fn write_new_file(path: &Path, data: &[u8]) -> Result<(), (String, io::Error)> {
    let mut file = File::create(path).map_err(|e| ("open(O_CREAT)".to_string(), e))?;
    let mut offset = 0;
    for chunk in data.chunks(MIB) {
        if let Err(e) = file.write_all(chunk) {
            return Err((format!("write at offset {offset}"), e));
        }
        offset += chunk.len();
    }
    close(file).map_err(|e| ("close".to_string(), e))
}

fn contains(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// A mount whose credentials may only read the bucket: creating a file (small: one
/// PutObject at close; large: a multipart upload), mkdir and rm all fail with EACCES and
/// leave no trace; reading and listing keep working.
#[test]
fn refused_writes_give_eacces_and_leave_no_entry() {
    let b = create_bucket("perm-readonly");
    let existing = gen_data(1, 3 * MIB + 17);
    put(&b, "dir/existing.bin", existing.clone());
    put(&b, "victim.txt", b"keep me".to_vec());
    let before = bucket_snapshot(&b);

    let creds = read_only_credentials(&b);
    // The identity really is read-only, else nothing below would be tested.
    let ro = s3_client_with(&creds);
    block_on(ro.list_objects_v2().bucket(&b).send()).expect("the read-only identity can list");
    block_on(ro.get_object().bucket(&b).key("victim.txt").send()).expect("the read-only identity can read");
    let put_denied = block_on(
        ro.put_object().bucket(&b).key("probe").body(aws_sdk_s3::primitives::ByteStream::from(b"x".to_vec())).send(),
    );
    let put_denied = put_denied.expect_err("the read-only identity could PUT");
    assert_eq!(put_denied.code(), Some("AccessDenied"), "PUT by the read-only identity: {put_denied:?}");
    let delete_denied = block_on(ro.delete_object().bucket(&b).key("victim.txt").send())
        .expect_err("the read-only identity could DELETE");
    assert_eq!(delete_denied.code(), Some("AccessDenied"), "DELETE by the read-only identity: {delete_denied:?}");
    assert_eq!(bucket_snapshot(&b), before, "the probes changed the bucket");

    let m = MountBuilder::new().bucket(&b).credentials(&creds).args(["--part-size", "5MiB"]).mount();

    // Reading works.
    assert_eq!(ls(m.path()), ["dir", "victim.txt"]);
    assert_eq!(ls(&m.join("dir")), ["existing.bin"]);
    let (digest, n) = sha256_file(&m.join("dir/existing.bin"), 128 * KIB).expect("read existing.bin");
    assert_eq!(n, existing.len() as u64);
    assert_eq!(digest, sha256_hex(&existing), "content of dir/existing.bin through the mount");

    // New files, below and above the part size, at the root and in a directory.
    for (rel, size) in [("new-small.txt", KIB), ("dir/new-big.bin", 12 * MIB)] {
        let path = m.join(rel);
        let (step, error) = match write_new_file(&path, &gen_data(2, size)) {
            Ok(()) => panic!(
                "creating {rel} ({size} bytes) with read-only credentials succeeded; bucket: {:?}\n{}",
                list_keys(&b, ""),
                m.diagnostics()
            ),
            Err(failure) => failure,
        };
        assert_eq!(
            error.raw_os_error(),
            Some(libc::EACCES),
            "creating {rel} ({size} bytes): {step} failed with {error:?}, expected EACCES\n{}",
            m.diagnostics()
        );
        let (dir, name) = match rel.rsplit_once('/') {
            Some((d, n)) => (m.join(d), n),
            None => (m.path().to_path_buf(), rel),
        };
        let names = ls(&dir);
        assert!(
            !contains(&names, name),
            "{rel} is still listed after the refused write ({step} gave EACCES): {names:?}\n{}",
            m.diagnostics()
        );
        assert_errno(
            std::fs::metadata(&path),
            libc::ENOENT,
            &format!("stat {rel} after the refused write ({step} gave EACCES)"),
        );
        assert!(!contains(&list_keys(&b, ""), rel), "{rel} is in the bucket: {:?}", list_keys(&b, ""));
    }

    // mkdir
    assert_errno(std::fs::create_dir(m.join("newdir")), libc::EACCES, "mkdir newdir");
    assert!(!contains(&ls(m.path()), "newdir"), "newdir listed after the refused mkdir: {:?}", ls(m.path()));
    assert_errno(std::fs::metadata(m.join("newdir")), libc::ENOENT, "stat newdir after the refused mkdir");

    // rm
    assert_errno(std::fs::remove_file(m.join("victim.txt")), libc::EACCES, "unlink victim.txt");
    assert_eq!(get(&b, "victim.txt"), b"keep me", "victim.txt in the bucket after the refused unlink");
    assert!(
        contains(&ls(m.path()), "victim.txt"),
        "victim.txt no longer listed after the refused unlink: {:?}",
        ls(m.path())
    );
    assert_eq!(std::fs::read(m.join("victim.txt")).expect("read victim.txt after the refused unlink"), b"keep me");

    // Nothing changed in the bucket, no upload left open, and the mount shows the same tree.
    assert_eq!(bucket_snapshot(&b), before, "bucket changed");
    assert_eq!(open_uploads(&b), 0, "multipart uploads left open");
    assert_eq!(ls(m.path()), ["dir", "victim.txt"]);
    assert_eq!(ls(&m.join("dir")), ["existing.bin"]);
}

/// The same new name created through two mounts of one bucket: A closes first and wins; B's
/// close fails with EEXIST, B's bytes never reach the bucket, no multipart upload is left,
/// and B then shows A's object. Both commit paths: one PutObject (below the part size) and
/// CompleteMultipartUpload (above it).
#[test]
fn two_mounts_racing_to_create_one_key() {
    let b = create_bucket("perm-race");
    let ma = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let mb = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB", "--metadata-ttl", "0"]).mount();

    let cases = [("small.txt", KIB, KIB + 100, false), ("big.bin", 12 * MIB, 12 * MIB + 3 * KIB, true)];
    for (i, (name, size_a, size_b, multipart)) in cases.into_iter().enumerate() {
        let data_a = gen_data(10 + i as u64, size_a);
        let data_b = gen_data(20 + i as u64, size_b);
        let mut fa = File::create(ma.join(name)).expect("create through mount A");
        let mut fb = File::create(mb.join(name)).expect("create through mount B (nothing in the bucket yet)");
        fa.write_all(&data_a).expect("write through mount A");
        fb.write_all(&data_b).expect("write through mount B");
        close(fa).unwrap_or_else(|e| panic!("close of {name} through mount A: {e}\n{}", ma.diagnostics()));
        assert_eq!(sha256_hex(&get(&b, name)), sha256_hex(&data_a), "{name} in the bucket after A's close");

        // B's upload is still pending: a multipart upload for the big file, none for the
        // small one (a single PutObject at close).
        let expected_open = usize::from(multipart);
        assert!(
            wait_until(Duration::from_secs(5), || open_uploads_of(&b, name) == expected_open),
            "{name}: {} multipart uploads open before B's close, expected {expected_open}",
            open_uploads_of(&b, name)
        );

        match close(fb) {
            Ok(()) => panic!(
                "close of {name} through mount B succeeded although A created it first; \
                 bucket holds {} bytes (A wrote {size_a}, B {size_b})\n{}",
                head(&b, name).size,
                mb.diagnostics()
            ),
            Err(e) => assert_eq!(
                e.raw_os_error(),
                Some(libc::EEXIST),
                "close of {name} through mount B: {e:?}, expected EEXIST\n{}",
                mb.diagnostics()
            ),
        }
        let stored = get(&b, name);
        assert_eq!(stored.len(), size_a, "{name}: size in the bucket after B's close");
        assert_eq!(sha256_hex(&stored), sha256_hex(&data_a), "{name}: the bucket must keep A's content");
        assert_eq!(open_uploads_of(&b, name), 0, "{name}: multipart upload left open");
        assert_eq!(open_uploads(&b), 0, "{name}: multipart uploads left open in the bucket");

        // Mount B now shows A's object (metadata TTL 0), listed once.
        let names = ls_unsorted(mb.path());
        assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{name} in ls of mount B: {names:?}");
        let md = std::fs::metadata(mb.join(name)).expect("stat through mount B");
        assert_eq!(md.len(), size_a as u64, "{name}: size through mount B");
        let (digest, _) = sha256_file(&mb.join(name), 256 * KIB).expect("read through mount B");
        assert_eq!(digest, sha256_hex(&data_a), "{name}: content through mount B");
        let (digest, _) = sha256_file(&ma.join(name), 256 * KIB).expect("read through mount A");
        assert_eq!(digest, sha256_hex(&data_a), "{name}: content through mount A");
    }
    assert_eq!(list_keys(&b, ""), ["big.bin", "small.txt"]);
    assert_eq!(open_uploads(&b), 0);
}
