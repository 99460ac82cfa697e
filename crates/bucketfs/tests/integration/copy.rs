//! copy_file_range(2) inside a mount (docs/SEMANTICS.md, "Copies"): `cp` of a whole
//! file into a new or truncated one is a copy inside the store, with no byte through
//! the machine; every other copy is made by the kernel through reads and writes, and
//! each gives the bytes a local file would.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::*;

/// copy_file_range(2) of `len` bytes between two open files at the given offsets,
/// repeated while it copies something, as `cp` does; the bytes copied in all.
fn copy_range(from: &File, from_offset: u64, to: &File, to_offset: u64, len: usize) -> std::io::Result<u64> {
    copy_range_in_rounds(from, from_offset, to, to_offset, len, usize::MAX)
}

/// [`copy_range`] asking for at most `round` bytes a call (Go's `io.Copy` asks for 2 GiB − 4 KiB).
fn copy_range_in_rounds(
    from: &File,
    from_offset: u64,
    to: &File,
    to_offset: u64,
    len: usize,
    round: usize,
) -> std::io::Result<u64> {
    let (mut from_offset, mut to_offset) = (from_offset as i64, to_offset as i64);
    let mut copied = 0u64;
    while (copied as usize) < len {
        // SAFETY: both descriptors are open for the call; the offsets are ours.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut from_offset,
                to.as_raw_fd(),
                &mut to_offset,
                (len - copied as usize).min(round),
                0,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
        copied += n as u64;
    }
    Ok(copied)
}

/// A new bucket holding `len` bytes (of `seed`) at `src`, and a mount of it that logs its
/// requests.
fn source_and_mount(hint: &str, seed: u64, len: usize) -> (String, Vec<u8>, Mount) {
    let b = create_bucket(hint);
    let data = gen_data(seed, len);
    put(&b, "src", data.clone());
    let m = MountBuilder::new().bucket(&b).request_log().mount();
    (b, data, m)
}

/// `cp` of a file inside the mount, into a new name and over an existing file, with and
/// without `--write-back`: one COPY in the store each, no GET of the source, no upload of
/// its bytes; the copies hold the source's bytes, and the metadata a file `cp` writes
/// from outside gets, through the mount and in the bucket.
#[test]
fn cp_inside_the_mount_copies_in_the_store() {
    let b = create_bucket("cp-store");
    let data = gen_data(7, 12 * MIB + 5);
    put(&b, "src", data.clone());
    let outside = tempfile::NamedTempFile::new().expect("local file");
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    for (new, old, args) in [("new", "old", &[][..]), ("wb-new", "wb-old", &["--write-back"][..])] {
        put(&b, old, b"replaced by the copy".to_vec());
        let m = MountBuilder::new().bucket(&b).args(args.iter().copied()).request_log().mount();
        for target in [new, old] {
            let status = Command::new("cp").arg(m.join("src")).arg(m.join(target)).status().expect("cp");
            assert!(status.success(), "cp src {target}");
        }
        drop(Command::new(bucketfs_bin()).arg("unmount").arg(m.path()).status());
        let sent = m.s3_requests();
        let of = |op: &str| sent.iter().filter(|r| r.op == op).map(|r| r.key.clone()).collect::<Vec<_>>();
        assert_eq!(of("COPY"), [new, old], "one copy in the store per cp {args:?}\n{}", m.diagnostics());
        assert_eq!(of("GET"), Vec::<String>::new(), "the source is not read");
        assert_eq!(of("UPLOAD-PART"), Vec::<String>::new(), "no byte is uploaded");
        // The new name is claimed (an empty PUT that fails if another client created it).
        assert_eq!(of("PUT"), [new]);
    }
    let m = MountBuilder::new().bucket(&b).mount();
    Command::new("cp").arg(outside.path()).arg(m.join("written")).status().expect("cp in");
    let without_times = |key: &str| {
        let mut metadata = stored_metadata(&b, key);
        metadata.retain(|name, _| name != "mtime" && name != "ctime");
        metadata
    };
    for target in ["new", "old", "wb-new", "wb-old"] {
        assert_eq!(sha256_hex(&get(&b, target)), sha256_hex(&data), "{target} in the bucket");
        let through_mount = std::fs::read(m.join(target)).expect("read the copy");
        assert_eq!(sha256_hex(&through_mount), sha256_hex(&data), "{target} through the mount");
        assert_eq!(without_times(target), without_times("written"), "{target}'s metadata");
        assert!(stored_metadata(&b, target).contains_key("mtime"), "the copy's time is stored with it");
    }
    assert_eq!(open_uploads(&b), 0);
}

/// Copies the store cannot make are the kernel's, and come out as on a local disk: a
/// part of a file, at an offset, into a file already written to, and writes after a
/// whole copy (they go on from the copy).
#[test]
fn other_copies_give_the_bytes_of_a_local_file() {
    let (b, data, m) = source_and_mount("cp-kernel", 3, 6 * MIB + 11);
    let local = tempfile::tempdir().expect("local dir");
    std::fs::write(local.path().join("src"), &data).expect("local source");

    // The cases are plain functions (no captures): the source's length is this one's.
    fn data_len() -> usize {
        6 * MIB + 11
    }
    type Case = fn(&File, &File) -> std::io::Result<()>;
    let cases: [(&str, Case); 4] = [
        ("part", |from, to| copy_range(from, 0, to, 0, 1_000_000).map(drop)),
        ("offsets", |from, to| copy_range(from, 4096, to, 100, 3 * MIB).map(drop)),
        ("after-a-write", |from, to| {
            (&*to).write_all(b"header")?;
            copy_range(from, 0, to, 6, data_len()).map(drop)
        }),
        ("write-after", |from, to| {
            copy_range(from, 0, to, 0, data_len())?;
            std::os::unix::fs::FileExt::write_all_at(to, b"patched", 1000)?;
            std::os::unix::fs::FileExt::write_all_at(to, b"tail", data_len() as u64 + 5)
        }),
    ];
    for (name, case) in cases {
        for dir in [m.path(), local.path()] {
            let from = File::open(dir.join("src")).expect("open source");
            let to = OpenOptions::new().write(true).create_new(true).open(dir.join(name)).expect("create target");
            case(&from, &to).unwrap_or_else(|e| panic!("{name} in {}: {e}", dir.display()));
            close(to).unwrap_or_else(|e| panic!("close {name}: {e}"));
        }
        let expected = std::fs::read(local.path().join(name)).expect("local result");
        assert_same_bytes(&get(&b, name), &expected, name);
        assert_same_bytes(&std::fs::read(m.join(name)).expect("read back"), &expected, name);
    }
    assert_eq!(m.requests_of("COPY"), ["write-after"], "only the whole copy is made in the store");
    assert_eq!(open_uploads(&b), 0);
}

/// A copy into a name another client created meanwhile, unseen by the mount, does not
/// overwrite their object: the copy fails with EEXIST, as the new file's own upload would.
#[test]
fn a_copy_never_overwrites_a_key_created_meanwhile() {
    let b = create_bucket("cp-claim");
    put(&b, "src", gen_data(5, 64 * KIB));
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "60"]).mount();
    assert_eq!(ls(m.path()), ["src"], "the mount lists the directory, without `theirs`");
    put(&b, "theirs", b"their bytes".to_vec());
    let from = File::open(m.join("src")).expect("open source");
    let to = File::create(m.join("theirs")).expect("create: the mount still takes the name as free");
    assert_errno(copy_range(&from, 0, &to, 0, 64 * KIB), libc::EEXIST, "copy over a key created meanwhile");
    assert_errno(close(to), libc::EEXIST, "close after the refused copy");
    assert_eq!(get(&b, "theirs"), b"their bytes", "their object stays");
}

/// A copy asked for in rounds (`cp`, for objects over 4 GiB, gets what one reply can
/// count, and asks again from there) is parts copied inside the store,
/// one round after another; a last round smaller than a part may be is the kernel's, and
/// is uploaded as the last part.
#[test]
fn copies_in_rounds_are_parts_copied_in_the_store() {
    let (b, data, m) = source_and_mount("cp-rounds", 9, 14 * MIB + 3);
    let from = File::open(m.join("src")).expect("open source");
    let to = File::create(m.join("rounds")).expect("create");
    let copied = copy_range_in_rounds(&from, 0, &to, 0, data.len(), 6 * MIB).expect("copy in rounds");
    assert_eq!(copied, data.len() as u64);
    close(to).expect("close");
    assert_same_bytes(&get(&b, "rounds"), &data, "copied in rounds");
    let count = |op: &str| m.requests_of(op).iter().filter(|key| *key == "rounds").count();
    assert_eq!(count("UPLOAD-PART-COPY"), 2, "two rounds of 6 MiB copied in the store\n{}", m.diagnostics());
    assert_eq!(count("UPLOAD-PART"), 1, "the last 2 MiB, written by the kernel");
    assert_eq!((count("CREATE-MULTIPART"), count("COMPLETE-MULTIPART"), count("COPY")), (1, 1, 0));
    assert_eq!(open_uploads(&b), 0);
}

/// Go's `os.Create` opens for reading too (`O_RDWR | O_CREAT | O_TRUNC`): a whole copy into
/// such a file is a copy inside the store as well, and the file goes on from it: reads
/// through the same descriptor give the copy's bytes, and a write after it is stored at
/// close with the rest of the copy.
#[test]
fn a_copy_into_a_file_open_for_reading_too_is_made_in_the_store() {
    let (b, data, m) = source_and_mount("cp-rdwr", 11, 9 * MIB + 7);
    let from = File::open(m.join("src")).expect("open source");
    let to = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.join("go")).expect("create");
    assert_eq!(copy_range(&from, 0, &to, 0, data.len()).expect("copy"), data.len() as u64);
    assert_eq!(m.requests_of("COPY"), ["go"], "copied in the store\n{}", m.diagnostics());
    assert_same_bytes(
        &pread_full(&to, 5 * MIB as u64, 1000).expect("read back"),
        &data[5 * MIB..5 * MIB + 1000],
        "read back",
    );
    std::os::unix::fs::FileExt::write_all_at(&to, b"patched", 100).expect("write after the copy");
    close(to).expect("close");
    let mut expected = data;
    expected[100..107].copy_from_slice(b"patched");
    assert_same_bytes(&get(&b, "go"), &expected, "the copy with the write");
    assert_eq!(open_uploads(&b), 0);
}

/// A copy is of the version the source was opened at: replaced in the store since, the
/// copy fails with ESTALE (as a read of it would), and leaves nothing at the new name.
#[test]
fn a_copy_of_a_source_replaced_since_its_open_fails_and_leaves_nothing() {
    let b = create_bucket("cp-stale");
    put(&b, "src", gen_data(13, 7 * MIB));
    let m = MountBuilder::new().bucket(&b).mount();
    let from = File::open(m.join("src")).expect("open source");
    put(&b, "src", gen_data(14, 7 * MIB)); // another client replaces it
    let to = File::create(m.join("copy")).expect("create");
    assert_errno(copy_range(&from, 0, &to, 0, 7 * MIB), libc::ESTALE, "copy of a replaced source");
    drop(close(to));
    assert_eq!(list_keys(&b, ""), ["src"], "no copy, no claim left behind");
    assert_eq!(open_uploads(&b), 0);
}

/// A store answers a copy only once its bytes are copied (MinIO sends nothing meanwhile),
/// so no copy request may take on more than a part's worth (128 MiB): one CopyObject of
/// 4 GiB took 12-13 s here, past a short `--read-timeout`. Larger objects, copied by
/// `cp` or moved by `mv`, are copied in parts.
#[test]
fn copies_of_large_objects_are_made_in_parts() {
    let (b, data, m) = source_and_mount("cp-parts", 17, 129 * MIB);
    let status = Command::new("cp").arg(m.join("src")).arg(m.join("copy")).status().expect("cp");
    assert!(status.success(), "cp");
    std::fs::rename(m.join("copy"), m.join("moved")).expect("mv");
    let part_copies = |key: &str| m.requests_of("UPLOAD-PART-COPY").iter().filter(|k| *k == key).count();
    assert_eq!((part_copies("copy"), part_copies("moved")), (2, 2), "128 MiB, then the rest\n{}", m.diagnostics());
    assert_eq!(m.requests_of("COPY"), Vec::<String>::new(), "no single copy of 129 MiB");
    assert_eq!(sha256_hex(&get(&b, "moved")), sha256_hex(&data));
    assert_eq!(list_keys(&b, ""), ["moved", "src"]);
    assert_eq!(open_uploads(&b), 0);
}
