//! What happens when objects change under the mount.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Duration;

use crate::common::*;

/// An object overwritten while it is open: reads of ranges not fetched yet must fail with ESTALE,
/// never return bytes of the new version.
#[test]
fn overwrite_during_read_fails_with_eio() {
    let b = create_bucket("etag-change");
    let size = 20 * MIB;
    let old = gen_data(1, size);
    let new = gen_data(2, size);
    put(&b, "obj", old.clone());
    let old_etag = head(&b, "obj").etag;
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "1MiB"]).mount();

    let f1 = File::open(m.join("obj")).unwrap();
    let first = read_at(&f1, 0, MIB).unwrap();
    assert_same_bytes(&first, &old[..MIB], "first MiB before the overwrite");
    let f2 = File::open(m.join("obj")).unwrap(); // opened before the overwrite, never read yet

    put(&b, "obj", new.clone());
    assert_ne!(head(&b, "obj").etag, old_etag, "the overwrite must change the ETag");

    let check = |f: &File, name: &str, off: usize, len: usize| {
        let what = format!("{name}: pread({off}, {len}) after the overwrite");
        match read_at(f, off as u64, len) {
            Err(e) => assert_eq!(
                e.raw_os_error(),
                Some(libc::ESTALE),
                "{what}: expected ESTALE, got {e:?}\n{}",
                m.diagnostics()
            ),
            Ok(got) => {
                if got == new[off..off + len] {
                    panic!("{what}: returned bytes of the NEW version (must fail with ESTALE)");
                } else if got == old[off..off + len] {
                    panic!("{what}: returned bytes of the old version, expected ESTALE");
                } else {
                    panic!("{what}: returned bytes of neither version (mixed?), expected ESTALE");
                }
            }
        }
    };
    check(&f1, "handle 1", 12 * MIB, 64 * KIB);
    check(&f1, "handle 1", 19 * MIB, MIB);
    check(&f1, "handle 1", 16 * MIB + 123, 1000);
    check(&f2, "handle 2", 8 * MIB, 128 * KIB);
    check(&f2, "handle 2", 15 * MIB + 4096, 4096);
    // failing again is still ESTALE (no recovery onto the new version through an old handle)
    check(&f1, "handle 1 (again)", 12 * MIB, 64 * KIB);

    // Continuing sequentially on handle 1: whatever was already prefetched may still be served,
    // but only bytes of the old version, and the first error is ESTALE.
    let mut f1 = f1;
    let mut off = MIB;
    f1.seek(SeekFrom::Start(off as u64)).unwrap(); // pread above did not move the position
    let mut buf = vec![0u8; MIB];
    let err = loop {
        match f1.read(&mut buf) {
            Ok(0) => break None,
            Ok(n) => {
                assert_same_bytes(&buf[..n], &old[off..off + n], &format!("sequential read at {off}"));
                off += n;
            }
            Err(e) => break Some(e),
        }
    };
    let e = err.unwrap_or_else(|| panic!("read the whole object ({off} bytes) of an overwritten object without error"));
    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "sequential read at {off}: {e:?}");
}

/// With --metadata-ttl 1, a new object, a deleted object and an overwritten object (new size,
/// new content) are all visible through the mount once the TTL has passed; the overwritten
/// object read through a new handle is entirely the new version.
#[test]
fn changes_are_visible_after_the_metadata_ttl() {
    let b = create_bucket("ttl");
    let v1 = gen_data(10, MIB + 10);
    let v2 = gen_data(11, 2 * MIB + 20);
    put(&b, "dir/changing", v1.clone());
    put(&b, "dir/doomed", b"bye".to_vec());
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "1", "--part-size", "1MiB"]).mount();
    assert_eq!(ls(&m.join("dir")), ["changing", "doomed"]);
    assert_file_content(&m.join("dir/changing"), MIB, &v1);

    put(&b, "dir/changing", v2.clone());
    put(&b, "dir/newcomer", b"hello".to_vec());
    delete(&b, "dir/doomed");
    std::thread::sleep(Duration::from_millis(2500));

    assert_eq!(ls(&m.join("dir")), ["changing", "newcomer"], "{}", m.diagnostics());
    assert_errno(std::fs::metadata(m.join("dir/doomed")), libc::ENOENT, "stat a deleted object");
    assert_eq!(std::fs::read(m.join("dir/newcomer")).unwrap(), b"hello");
    assert_eq!(std::fs::metadata(m.join("dir/changing")).unwrap().len(), v2.len() as u64);
    assert_file_content(&m.join("dir/changing"), MIB, &v2);
}
