//! Changing files in place through staging files (docs/SEMANTICS.md, "Writing"): append,
//! writes anywhere, truncate to any size, O_RDWR read-your-writes, all stored at close,
//! with the unchanged part of a large object copied server side.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::Command;

use crate::common::*;

/// `>>` onto a large object uploads the appended bytes and copies the rest inside the
/// store: no byte of the object is downloaded.
#[test]
fn append_copies_the_unchanged_part_server_side() {
    let b = create_bucket("stage-append");
    let data = gen_data(1, 12 * MIB + 17);
    put(&b, "log", data.clone());
    let m = MountBuilder::new().bucket(&b).request_log().mount();
    let status = Command::new("bash").arg("-c").arg(format!("echo appended >> '{}'", m.join("log").display())).status();
    assert!(status.expect("bash").success());
    let mut expected = data;
    expected.extend_from_slice(b"appended\n");
    assert_eq!(sha256_hex(&get(&b, "log")), sha256_hex(&expected));
    let requests = m.s3_requests();
    assert!(!requests.iter().any(|r| r.op == "GET"), "the object was downloaded: {requests:?}");
    assert!(requests.iter().any(|r| r.op == "UPLOAD-PART-COPY"), "no server-side copy: {requests:?}");
    assert_eq!(std::fs::metadata(m.join("log")).expect("stat").len(), expected.len() as u64);
    assert_eq!(sha256_hex(&std::fs::read(m.join("log")).expect("read")), sha256_hex(&expected));
}

/// Random writes, reads and truncates through one O_RDWR handle behave like a local file
/// (checked against a model after every step and in the bucket after close), for an
/// existing object of several parts and for a new file.
#[test]
fn random_changes_match_a_local_file() {
    let b = create_bucket("stage-random");
    let original = gen_data(2, 11 * MIB + 3);
    put(&b, "existing", original.clone());
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    for (name, start) in [("existing", original), ("new", Vec::new())] {
        let mut model = start;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(m.join(name))
            .expect("open O_RDWR");
        let mut rng = Rng::new(7);
        for step in 0..60 {
            match rng.below(10) {
                0 => {
                    let size = rng.below(14 * MIB as u64) as usize;
                    file.set_len(size as u64).expect("ftruncate");
                    model.resize(size, 0);
                }
                1..=5 => {
                    let offset = rng.below(13 * MIB as u64) as usize;
                    let chunk = gen_data(step, 1 + rng.below(300_000) as usize);
                    file.write_all_at(&chunk, offset as u64).expect("pwrite");
                    if model.len() < offset + chunk.len() {
                        model.resize(offset + chunk.len(), 0);
                    }
                    model[offset..offset + chunk.len()].copy_from_slice(&chunk);
                }
                _ => {
                    let offset = rng.below(model.len() as u64 + 1000) as usize;
                    let want = rng.below(200_000) as usize;
                    let got = pread_full(&file, offset as u64, want).expect("pread");
                    let end = model.len().min(offset + want).max(offset.min(model.len()));
                    assert_same_bytes(&got, &model[offset.min(model.len())..end], &format!("{name} step {step}"));
                }
            }
        }
        assert_eq!(file.metadata().expect("fstat").len(), model.len() as u64);
        drop(file);
        assert_eq!(sha256_hex(&get(&b, name)), sha256_hex(&model), "{name} in the bucket");
        assert_eq!(sha256_hex(&std::fs::read(m.join(name)).expect("read back")), sha256_hex(&model));
    }
    assert_eq!(open_uploads(&b), 0, "no multipart upload left behind");
}

/// `truncate` without an open file, to shrink and to grow; a sparse file written with a
/// seek past the end; a write in the middle with `dd conv=notrunc`.
#[test]
fn truncate_sparse_and_in_place_writes() {
    let b = create_bucket("stage-trunc");
    let data = gen_data(3, 7 * MIB);
    put(&b, "shrink", data.clone());
    put(&b, "grow", b"short".to_vec());
    put(&b, "patch", b"hello world".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();
    let sh = |script: String| {
        assert!(Command::new("bash").arg("-c").arg(&script).status().expect("bash").success(), "{script}")
    };
    sh(format!("truncate -s 6MiB '{}'", m.join("shrink").display()));
    sh(format!("truncate -s 100 '{}'", m.join("grow").display()));
    sh(format!("printf J | dd of='{}' bs=1 seek=6 conv=notrunc status=none", m.join("patch").display()));
    sh(format!("dd if=/dev/zero of='{}' bs=1 count=1 seek=9999999 status=none", m.join("sparse").display()));
    assert_eq!(sha256_hex(&get(&b, "shrink")), sha256_hex(&data[..6 * MIB]));
    let mut grown = b"short".to_vec();
    grown.resize(100, 0);
    assert_eq!(get(&b, "grow"), grown);
    assert_eq!(get(&b, "patch"), b"hello Jorld");
    let sparse = get(&b, "sparse");
    assert_eq!(sparse.len(), 10_000_000);
    assert!(sparse.iter().all(|&byte| byte == 0));
    assert_eq!(std::fs::metadata(m.join("shrink")).expect("stat").len(), 6 * MIB as u64);
}

/// Another handle opened while a file is being written reads what was written: all of a
/// staging file; of a streamed file, what is not yet uploaded (EBUSY for the rest until
/// close, then the object).
#[test]
fn other_handles_see_staged_writes() {
    let b = create_bucket("stage-other");
    put(&b, "f", b"0123456789".to_vec());
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let writer = OpenOptions::new().read(true).write(true).open(m.join("f")).expect("open O_RDWR");
    writer.write_all_at(b"abc", 4).expect("pwrite");
    let mut seen = String::new();
    File::open(m.join("f")).expect("open for reading").read_to_string(&mut seen).expect("read");
    assert_eq!(seen, "0123abc789");
    assert_eq!(get(&b, "f"), b"0123456789", "not stored before close");
    writer.sync_all().expect("fsync");
    assert_eq!(get(&b, "f"), b"0123abc789", "stored at fsync");
    writer.write_all_at(b"Z", 0).expect("write after fsync");
    drop(writer);
    assert_eq!(get(&b, "f"), b"Z123abc789");

    // A new file streamed to S3: what is still buffered reads back before close; bytes
    // already sent as parts read back too (the file is stored so far and goes on in a
    // staging file), and so do the writes after that.
    let mut streaming = File::create(m.join("streamed")).expect("create");
    streaming.write_all(b"partial").expect("write");
    let reader = File::open(m.join("streamed")).expect("open while streaming");
    assert_eq!(pread_full(&reader, 0, 100).expect("read buffered bytes"), b"partial");
    let big = gen_data(5, 6 * MIB);
    streaming.write_all(&big).expect("write past one part");
    let mut expected = b"partial".to_vec();
    expected.extend_from_slice(&big);
    // O_DIRECT: from the daemon, not from what the kernel kept of the writes.
    let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(m.join("streamed")).expect("open");
    let mut aligned = AlignedBuffer::new(MIB);
    let read = direct.read_at(aligned.bytes(), 0).expect("read bytes already sent");
    assert_eq!(&aligned.bytes()[..read], &expected[..read], "bytes already sent, read back");
    assert!(read > 0);
    streaming.write_all(b"more").expect("write on after the read");
    expected.extend_from_slice(b"more");
    let tail = pread_full(&reader, (expected.len() - 10) as u64, 10).expect("read the newest bytes");
    assert_eq!(tail, &expected[expected.len() - 10..]);
    drop(streaming);
    assert_eq!(sha256_hex(&pread_full(&reader, 0, expected.len()).expect("read after close")), sha256_hex(&expected));
    assert_eq!(sha256_hex(&get(&b, "streamed")), sha256_hex(&expected), "stored whole");
    assert_eq!(open_uploads(&b), 0);
}

/// Staging files count against --staging-limit: a write past it fails with ENOSPC. As on a
/// full disk, the writes that succeeded before it stay (and are stored at close).
#[test]
fn staging_limit_gives_enospc() {
    let b = create_bucket("stage-limit");
    put(&b, "f", gen_data(4, 100_000));
    let m = MountBuilder::new().bucket(&b).args(["--staging-limit", "1MiB"]).mount();
    let mut file = OpenOptions::new().append(true).open(m.join("f")).expect("open for append");
    let error = file.write_all(&vec![1; 2 * MIB]).expect_err("past the staging limit");
    assert_eq!(error.raw_os_error(), Some(libc::ENOSPC), "{error}");
    drop(file);
    let stored = get(&b, "f");
    let original = gen_data(4, 100_000);
    assert!(stored.len() < original.len() + 2 * MIB && stored.len() <= MIB, "{} bytes stored", stored.len());
    assert_eq!(sha256_hex(&stored[..original.len()]), sha256_hex(&original));
    assert!(stored[original.len()..].iter().all(|&byte| byte == 1), "only bytes that were written");
}
