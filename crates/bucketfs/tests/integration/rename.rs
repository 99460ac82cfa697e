//! rename(2) and mv (docs/SEMANTICS.md, "Rename"): files move by server-side copy and
//! delete with their metadata, directories move key by key, open files move with their
//! name, and what POSIX forbids is refused with its errno.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::*;

/// A small and a multipart file move with their content and stored mode; a rename over
/// an existing file replaces it.
#[test]
fn files_move_with_content_and_mode() {
    let b = create_bucket("mv-files");
    let big = gen_data(1, 12 * MIB + 5);
    put(&b, "small", b"small file".to_vec());
    put(&b, "big", big.clone());
    put(&b, "victim", b"to be replaced".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();
    std::fs::set_permissions(m.join("small"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::create_dir(m.join("d")).expect("mkdir");

    std::fs::rename(m.join("small"), m.join("d/moved")).expect("rename small");
    std::fs::rename(m.join("big"), m.join("victim")).expect("rename over an existing file");

    assert_eq!(list_keys(&b, ""), ["d/", "d/moved", "victim"]);
    assert_eq!(get(&b, "d/moved"), b"small file");
    assert_eq!(sha256_hex(&get(&b, "victim")), sha256_hex(&big));
    assert_eq!(ls(m.path()), ["d", "victim"]);
    assert_errno(std::fs::metadata(m.join("small")), libc::ENOENT, "old name");
    let moved = std::fs::metadata(m.join("d/moved")).expect("stat new name");
    assert_eq!(moved.permissions().mode() & 0o7777, 0o600, "mode moves with the file");
    assert_eq!(sha256_hex(&std::fs::read(m.join("victim")).expect("read")), sha256_hex(&big));
    assert_eq!(open_uploads(&b), 0);
}

/// A directory tree moves whole (markers, nested entries, attributes); the old names are
/// gone from the mount and the bucket. Each object is HEADed once for its whole metadata
/// (a listing's, even MinIO's, lacks Expires: see attributes::rewrites_keep_headers…).
#[test]
fn directories_move_recursively() {
    let b = create_bucket("mv-dirs");
    put(&b, "src/", Vec::new());
    put(&b, "src/a", b"a".to_vec());
    put(&b, "src/sub/b", b"b".to_vec());
    put(&b, "src/sub/deeper/c", b"c".to_vec());
    put(&b, "srcsibling", b"not moved".to_vec());
    let m = MountBuilder::new().bucket(&b).request_log().mount();
    std::fs::set_permissions(m.join("src/sub"), std::fs::Permissions::from_mode(0o700)).expect("chmod dir");
    let (_, files_before) = walk(&m.join("src"));

    let before = m.s3_requests().len();
    let status = Command::new("mv").arg(m.join("src")).arg(m.join("dst")).status().expect("mv");
    assert!(status.success());
    let heads: Vec<String> = m.s3_requests()[before..]
        .iter()
        .filter(|r| r.op == "HEAD" && r.key.starts_with("src/"))
        .map(|r| r.key.clone())
        .collect();
    let mut headed = heads.clone();
    headed.sort();
    headed.dedup();
    assert!(heads.len() == headed.len() && heads.len() <= 5, "each moved object HEADed once at most: {heads:?}");

    assert_eq!(list_keys(&b, ""), ["dst/", "dst/a", "dst/sub/", "dst/sub/b", "dst/sub/deeper/c", "srcsibling"]);
    assert_eq!(get(&b, "dst/sub/deeper/c"), b"c");
    let (_, files_after) = walk(&m.join("dst"));
    assert_eq!(files_after, files_before);
    assert_eq!(std::fs::read(m.join("dst/sub/deeper/c")).expect("read moved"), b"c");
    assert_eq!(std::fs::metadata(m.join("dst/sub")).expect("stat").permissions().mode() & 0o7777, 0o700);
    assert_errno(std::fs::metadata(m.join("src")), libc::ENOENT, "old directory");
    assert_eq!(ls(m.path()), ["dst", "srcsibling"]);
    // A new directory of the old name is a new, empty directory.
    std::fs::create_dir(m.join("src")).expect("mkdir old name");
    assert!(ls(&m.join("src")).is_empty());
}

/// What POSIX refuses: a directory over a non-empty one or a file, a file over a
/// directory, a directory into itself, and RENAME_NOREPLACE over an existing name.
#[test]
fn forbidden_renames_are_refused() {
    let b = create_bucket("mv-refused");
    put(&b, "d1/x", b"x".to_vec());
    put(&b, "d2/y", b"y".to_vec());
    put(&b, "f", b"f".to_vec());
    put(&b, "g", b"g".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();
    assert_errno(std::fs::rename(m.join("d1"), m.join("d2")), libc::ENOTEMPTY, "dir over non-empty dir");
    assert_errno(std::fs::rename(m.join("d1"), m.join("f")), libc::ENOTDIR, "dir over file");
    assert_errno(std::fs::rename(m.join("f"), m.join("d1")), libc::EISDIR, "file over dir");
    assert_errno(std::fs::rename(m.join("d1"), m.join("d1/inner")), libc::EINVAL, "dir into itself");
    let status =
        Command::new("mv").arg("--no-clobber").arg("-T").arg(m.join("f")).arg(m.join("g")).status().expect("mv -n");
    assert!(status.success());
    assert_eq!(get(&b, "g"), b"g", "mv -n keeps the target");
    assert_eq!(list_keys(&b, ""), ["d1/x", "d2/y", "f", "g"], "nothing moved");
    // An empty directory may be replaced.
    std::fs::create_dir(m.join("empty")).expect("mkdir");
    std::fs::rename(m.join("d1"), m.join("empty")).expect("dir over an empty dir");
    assert_eq!(list_keys(&b, "empty/"), ["empty/x"]);
}

/// A file open for reading keeps reading after it is renamed; a file open for writing is
/// stored under its new name at close (small, and in several parts).
#[test]
fn open_files_move_with_their_name() {
    let b = create_bucket("mv-open");
    let data = gen_data(3, 3 * MIB);
    put(&b, "reading", data.clone());
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();

    let mut reader = File::open(m.join("reading")).expect("open");
    let mut head = vec![0; 1000];
    reader.read_exact(&mut head).expect("read before");
    std::fs::rename(m.join("reading"), m.join("read-moved")).expect("rename while open");
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).expect("read after the rename");
    head.extend_from_slice(&rest);
    assert_eq!(sha256_hex(&head), sha256_hex(&data));

    for (name, size) in [("small-writing", 1000), ("big-writing", 12 * MIB)] {
        let content = gen_data(size as u64, size);
        let mut writer = File::create(m.join(name)).expect("create");
        let (first, second) = content.split_at(size / 2);
        writer.write_all(first).expect("write");
        let new_name = format!("{name}-moved");
        std::fs::rename(m.join(name), m.join(&new_name)).expect("rename while writing");
        writer.write_all(second).expect("write after the rename");
        drop(writer);
        assert_eq!(sha256_hex(&get(&b, &new_name)), sha256_hex(&content), "{new_name} in the bucket");
        assert_eq!(sha256_hex(&std::fs::read(m.join(&new_name)).expect("read")), sha256_hex(&content));
    }
    // An existing object being replaced (O_TRUNC) and renamed before close: only the new
    // name remains, with the new content.
    put(&b, "replaced", b"old".to_vec());
    let mut writer = File::create(m.join("replaced")).expect("open O_TRUNC");
    writer.write_all(b"new").expect("write");
    std::fs::rename(m.join("replaced"), m.join("replaced-moved")).expect("rename while replacing");
    drop(writer);
    assert_eq!(get(&b, "replaced-moved"), b"new");
    assert_eq!(list_keys(&b, ""), ["big-writing-moved", "read-moved", "replaced-moved", "small-writing-moved"]);
    assert_eq!(open_uploads(&b), 0);
}

/// Between two buckets of one mount rename(2) gives EXDEV, so mv copies and deletes.
#[test]
fn across_sources_mv_copies() {
    let one = create_bucket("mv-one");
    let two = create_bucket("mv-two");
    put(&one, "f", b"travelling".to_vec());
    let m = MountBuilder::new().source(format!("s3://{one}=one")).source(format!("s3://{two}=two")).mount();
    assert_errno(std::fs::rename(m.join("one/f"), m.join("two/f")), libc::EXDEV, "rename across buckets");
    let status = Command::new("mv").arg(m.join("one/f")).arg(m.join("two/f")).status().expect("mv");
    assert!(status.success());
    assert!(list_keys(&one, "").is_empty());
    assert_eq!(get(&two, "f"), b"travelling");
}

/// Open files below a directory move with it: a reader keeps reading (a multipart
/// object, whose copy has a new ETag), a new file and an appended file being written are
/// stored under the new name at close, and nothing is left under the old one. 10 rounds
/// back and forth, each opening the moved file again within the metadata TTL.
///
/// Each round drops the reader's cached pages, so its reads reach the daemon: with the
/// pages cached (same ETag as the last open), a reader pinned to a stale ETag went
/// unnoticed until memory pressure evicted them, then failed with ENOENT after the rename.
#[test]
fn open_files_move_with_their_directory() {
    let b = create_bucket("rn-open-dir");
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    std::fs::create_dir(m.join("d")).expect("mkdir");
    let read_data = gen_data(21, 12 * MIB + 7);
    std::fs::write(m.join("d/read"), &read_data).expect("a multipart object");
    std::fs::write(m.join("d/append"), b"base;").expect("an object to append to");
    let mut appended = b"base;".to_vec();
    for round in 0..10 {
        let (from, to) = if round % 2 == 0 { ("d", "e") } else { ("e", "d") };
        let mut reader = File::open(m.join(from).join("read")).expect("open for reading");
        drop_cached_pages(&reader);
        let mut head = vec![0; MIB + 3];
        reader.read_exact(&mut head).unwrap_or_else(|e| panic!("round {round}: read before the rename: {e}"));
        let mut writer = File::create(m.join(from).join(format!("new{round}"))).expect("create");
        writer.write_all(b"first half;").expect("write");
        let mut appender =
            std::fs::OpenOptions::new().append(true).open(m.join(from).join("append")).expect("open to append");
        appender.write_all(format!("{round};").as_bytes()).expect("append");
        appended.extend_from_slice(format!("{round};").as_bytes());

        std::fs::rename(m.join(from), m.join(to))
            .unwrap_or_else(|e| panic!("round {round}: rename with open files: {e}"));

        writer.write_all(b"second half").expect("write after the rename");
        drop(writer);
        drop(appender);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).unwrap_or_else(|e| panic!("round {round}: read after the rename: {e}"));
        head.extend_from_slice(&rest);
        assert!(head == read_data, "round {round}: the reader read the same bytes");
        assert_eq!(get(&b, &format!("{to}/new{round}")), b"first half;second half", "round {round}");
        assert_eq!(get(&b, &format!("{to}/append")), appended, "round {round}: appended under the new name");
        assert!(
            list_keys(&b, &format!("{from}/")).is_empty(),
            "round {round}: left under {from}/: {:?}",
            list_keys(&b, &format!("{from}/"))
        );
    }
    assert_eq!(list_keys(&b, "d/").len(), 13, "marker, read, append and 10 new files, back in d/");
    assert_eq!(open_uploads(&b), 0);
}

/// A file closed by its opener but written again through a duplicated descriptor (what
/// shells do for `exec 3>f`) moves with its directory: the later writes are stored under
/// the new name, and nothing is left under the old one.
#[test]
fn file_written_again_after_close_moves_with_its_directory() {
    let b = create_bucket("rn-dup");
    let m = MountBuilder::new().bucket(&b).mount();
    std::fs::create_dir(m.join("d")).expect("mkdir");
    let first = File::create(m.join("d/f")).expect("create");
    let mut second = first.try_clone().expect("dup");
    drop(first); // the opener's close: an empty object is stored
    second.write_all(b"written later").expect("write through the duplicate");
    std::fs::rename(m.join("d"), m.join("e")).expect("rename while written again");
    drop(second);
    assert_eq!(get(&b, "e/f"), b"written later");
    assert!(list_keys(&b, "d/").is_empty(), "nothing left under the old name");
}

/// Drops the kernel's cached pages of `file`, so that its next reads go to the daemon.
fn drop_cached_pages(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a descriptor `file` keeps open.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise(DONTNEED)");
}
