//! Writing through the mount (docs/SEMANTICS.md, "Writing"): new files stream to S3 and are
//! durable when close() returns, errors come back at close, nothing half-done is left in
//! the bucket, and what the store refused never shows up as a file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::process::Command;

use crate::common::*;

/// sha256 round trips of new files around the 5 MiB minimum part size and a multipart file.
#[test]
fn new_files_round_trip() {
    let b = create_bucket("write-sizes");
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let sizes = [0, 1, 5 * MIB - 1, 5 * MIB, 5 * MIB + 1, 23 * MIB + 7];
    for (i, size) in sizes.iter().enumerate() {
        let data = gen_data(100 + i as u64, *size);
        let name = format!("f{size}");
        let mut file = File::create(m.join(&name)).expect("create");
        // Odd-sized writes, as programs do.
        for chunk in data.chunks(100_003) {
            file.write_all(chunk).expect("write");
        }
        drop(file); // close(): the object must be in the bucket now
        assert_eq!(sha256_hex(&get(&b, &name)), sha256_hex(&data), "object {name} in the bucket");
        assert_eq!(std::fs::metadata(m.join(&name)).expect("stat").len(), *size as u64);
        assert_eq!(sha256_hex(&std::fs::read(m.join(&name)).expect("read back")), sha256_hex(&data));
    }
    assert_eq!(open_uploads(&b), 0, "no multipart upload left behind");
}

/// `echo > file` opens, dup2()s and closes the first descriptor before writing: the content
/// must still arrive.
#[test]
fn shell_redirection_writes_the_file() {
    let b = create_bucket("write-shell");
    let m = MountBuilder::new().bucket(&b).mount();
    let target = m.join("greeting.txt");
    let status = Command::new("bash")
        .arg("-c")
        .arg(format!("echo hello > '{}' && echo more >> /dev/null", target.display()))
        .status()
        .expect("bash");
    assert!(status.success());
    assert_eq!(get(&b, "greeting.txt"), b"hello\n");
    assert_eq!(std::fs::read(&target).expect("read"), b"hello\n");
    // touch creates an empty object.
    assert!(Command::new("touch").arg(m.join("empty")).status().expect("touch").success());
    assert!(wait_until(std::time::Duration::from_secs(5), || list_keys(&b, "").contains(&"empty".to_string())));
    assert_eq!(get(&b, "empty"), b"");
}

/// A file being written is listed and has its size at once, before close.
#[test]
fn file_being_written_is_visible() {
    let b = create_bucket("write-visible");
    put(&b, "dir/existing", b"x".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();
    let mut file = File::create(m.join("dir/new")).expect("create");
    file.write_all(&[7; 1000]).expect("write");
    assert_eq!(ls(&m.join("dir")), ["existing", "new"]);
    assert_eq!(std::fs::metadata(m.join("dir/new")).expect("stat").len(), 1000);
    assert!(!list_keys(&b, "").contains(&"dir/new".to_string()), "not in the bucket before close");
    drop(file);
    assert_eq!(get(&b, "dir/new"), vec![7; 1000]);
}

/// Overwrite with O_TRUNC replaces the object; opening it for writing without changing it
/// uploads nothing; appends one after the other (the kernel may release the previous
/// handle after the next open) all land.
#[test]
fn overwrite_with_truncate() {
    let b = create_bucket("write-over");
    put(&b, "f", b"old content".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();
    std::fs::write(m.join("f"), b"new").expect("overwrite");
    assert_eq!(get(&b, "f"), b"new");
    assert_eq!(std::fs::read(m.join("f")).expect("read"), b"new");
    let etag = head(&b, "f").etag;
    drop(OpenOptions::new().write(true).open(m.join("f")).expect("open for writing in place"));
    assert_eq!(head(&b, "f").etag, etag, "an unchanged file is not uploaded again");
    let script = format!("for i in 1 2 3 4 5 6 7 8; do echo $i >> '{}'; done", m.join("f").display());
    assert!(Command::new("bash").arg("-c").arg(script).status().expect("bash").success());
    assert_eq!(get(&b, "f"), b"new1\n2\n3\n4\n5\n6\n7\n8\n");
}

/// mkdir writes a marker; rmdir refuses non-empty directories; unlink deletes.
#[test]
fn mkdir_rmdir_unlink() {
    let b = create_bucket("write-dirs");
    let m = MountBuilder::new().bucket(&b).mount();
    std::fs::create_dir(m.join("d")).expect("mkdir");
    assert_eq!(list_keys(&b, ""), ["d/"]);
    assert_errno(std::fs::create_dir(m.join("d")), libc::EEXIST, "mkdir of an existing directory");
    std::fs::write(m.join("d/f"), b"1").expect("write");
    assert_errno(std::fs::remove_dir(m.join("d")), libc::ENOTEMPTY, "rmdir of a non-empty directory");
    std::fs::remove_file(m.join("d/f")).expect("unlink");
    assert_errno(std::fs::metadata(m.join("d/f")), libc::ENOENT, "stat after unlink");
    std::fs::remove_dir(m.join("d")).expect("rmdir");
    assert!(list_keys(&b, "").is_empty(), "bucket left with {:?}", list_keys(&b, ""));
    assert_errno(std::fs::remove_file(m.join("nothing")), libc::ENOENT, "unlink of a missing file");
}

/// Two writers creating one key: the one that closes second gets EEXIST and its entry
/// disappears; the first one's object stays.
#[test]
fn create_race_loser_gets_eexist() {
    let b = create_bucket("write-race");
    let m = MountBuilder::new().bucket(&b).mount();
    let mut file = File::create(m.join("contested")).expect("create");
    file.write_all(b"mine").expect("write");
    put(&b, "contested", b"theirs".to_vec()); // another client wins
    let error = file.sync_all().expect_err("fsync must report the lost race");
    assert_eq!(error.raw_os_error(), Some(libc::EEXIST), "{error}");
    drop(file);
    assert_eq!(get(&b, "contested"), b"theirs");
    assert_eq!(open_uploads(&b), 0);
}

/// A write that the store refuses (here: the bucket was deleted under the mount) is
/// reported at close, and no phantom file remains, nor a record of its multipart upload
/// (gone with the bucket) for later mounts to abort.
#[test]
fn refused_upload_is_reported_and_leaves_no_entry() {
    let b = create_bucket("write-refused");
    put(&b, "keep", b"k".to_vec());
    let cache = tempfile::tempdir().expect("cache dir");
    let m = MountBuilder::new().bucket(&b).args(["--cache-dir", cache.path().to_str().expect("utf-8")]).mount();
    let mut file = File::create(m.join("doomed")).expect("create");
    file.write_all(&gen_data(5, 12 * MIB)).expect("write");
    delete(&b, "keep");
    block_on(s3().delete_bucket().bucket(&b).send()).expect("delete bucket");
    let error = file.sync_all().expect_err("upload to a deleted bucket must fail");
    // SeaweedFS answers the next part NoSuchUpload (the upload went with the bucket), which
    // is ECANCELED; MinIO answers NoSuchBucket.
    let errno = error.raw_os_error();
    let canceled = store_is_not_minio() && errno == Some(libc::ECANCELED);
    assert!(matches!(errno, Some(libc::EIO) | Some(libc::ENOENT)) || canceled, "{error}");
    drop(file);
    assert_errno(std::fs::metadata(m.join("doomed")), libc::ENOENT, "failed file is gone");
    let records: Vec<_> =
        std::fs::read_dir(cache.path().join("bucketfs-uploads")).expect("journal").flatten().collect();
    assert!(records.is_empty(), "upload records left: {records:?}");
}

/// Go, Java, Node and thread pools close a file on another thread than the one that
/// opened it. That close commits too (FUSE names the calling thread; bucketfs resolves it
/// to its process): it returns the store's refusal, not 0 with nothing stored.
#[test]
fn close_from_another_thread_commits_and_reports_refusal() {
    let b = create_bucket("write-thread");
    put(&b, "keep", b"k".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();

    let mut file = File::create(m.join("stored")).expect("create");
    file.write_all(b"from the main thread").expect("write");
    std::thread::spawn(move || close(file)).join().expect("thread").expect("close on another thread");
    assert_eq!(get(&b, "stored"), b"from the main thread", "stored when close() returned");

    let mut file = File::create(m.join("doomed")).expect("create");
    file.write_all(&gen_data(7, 100_000)).expect("write");
    delete(&b, "keep");
    delete(&b, "stored");
    block_on(s3().delete_bucket().bucket(&b).send()).expect("delete the bucket under the mount");
    let closed = std::thread::spawn(move || close(file)).join().expect("thread");
    let error = closed.expect_err("close on another thread must report the refused upload");
    assert!(matches!(error.raw_os_error(), Some(libc::EIO) | Some(libc::ENOENT)), "{error}");
}

/// The object `name` holds `expected` after close, and the mount shows its size.
fn assert_stored(bucket: &str, m: &Mount, name: &str, expected: &[u8]) {
    let stored = get(bucket, name);
    assert_eq!(stored.len(), expected.len(), "{name}: size after close");
    assert!(stored == expected, "{name}: content after close");
    assert_eq!(std::fs::metadata(m.join(name)).expect("stat").len(), expected.len() as u64, "{name}: size shown");
}

/// A write after `fsync` (which stored the object) goes on from the stored file, as on a
/// local disk: `write 100 B; fsync; pwrite 10 B at 0; close` leaves 100 bytes with the
/// first 10 new, never a 10-byte object. The same for a multipart file.
#[test]
fn writes_after_fsync_never_shrink_the_file() {
    let b = create_bucket("write-after-fsync");
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    for (name, size) in [("small", 100), ("multipart", 6 * MIB + 3)] {
        let mut expected = gen_data(size as u64, size);
        let mut file = File::create(m.join(name)).expect("create");
        file.write_all(&expected).expect("write");
        file.sync_all().expect("fsync");
        assert_eq!(get(&b, name).len(), size, "{name}: stored by fsync");
        file.write_all_at(b"0123456789", 0).expect("pwrite at 0 after fsync");
        expected[..10].copy_from_slice(b"0123456789");
        file.write_all_at(b"tail", size as u64).expect("append after fsync");
        expected.extend_from_slice(b"tail");
        close(file).expect("close");
        assert_stored(&b, &m, name, &expected);
    }
    assert_eq!(open_uploads(&b), 0);
}

/// What a local disk allows on a file being streamed (new, write-only) works through the
/// mount too, also once parts were sent: writing the header last (a write back over sent
/// bytes), `dd seek=` blocks written backwards, `ftruncate` down and up. Each ends as
/// the bytes a local file would hold, with no upload left behind.
#[test]
fn streamed_files_take_writes_anywhere_and_truncation() {
    let b = create_bucket("write-anywhere");
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let local = tempfile::tempdir().expect("local dir");
    let body = gen_data(7, 13 * MIB + 5);
    type Steps = fn(&File, &[u8]);
    let cases: [(&str, Steps); 4] = [
        ("header-last", |f, body| {
            f.write_all_at(&[0; 64], 0).expect("placeholder");
            f.write_all_at(body, 64).expect("body");
            f.write_all_at(b"HEADER: 13 MiB of data follow", 0).expect("header over sent bytes");
            f.write_all_at(b"trailer", 64 + body.len() as u64).expect("then on at the end");
        }),
        ("blocks-backwards", |f, body| {
            for (index, block) in body.chunks(3 * MIB).enumerate().rev() {
                f.write_all_at(block, (index * 3 * MIB) as u64).expect("block");
            }
        }),
        ("truncate-down-then-on", |f, body| {
            f.write_all_at(body, 0).expect("body");
            f.set_len(6 * MIB as u64 + 1).expect("ftruncate down");
            f.write_all_at(b"after the cut", 6 * MIB as u64 + 1).expect("write at the new end");
        }),
        ("truncate-up", |f, body| {
            f.write_all_at(&body[..MIB], 0).expect("body");
            f.set_len(11 * MIB as u64).expect("ftruncate up");
            f.write_all_at(b"end", 11 * MIB as u64).expect("write past the zeros");
        }),
    ];
    for (name, steps) in cases {
        let reference = local.path().join(name);
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&reference).expect("local file");
        steps(&file, &body);
        drop(file);
        let expected = std::fs::read(&reference).expect("local content");
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(m.join(name)).expect("create");
        steps(&file, &body);
        close(file).expect("close");
        assert_stored(&b, &m, name, &expected);
    }
    assert_eq!(open_uploads(&b), 0);
}

/// A child forked while a file is open closes its inherited copy of the descriptor (at
/// exec); that close must not end the parent's file.
#[test]
fn forked_child_does_not_end_the_upload() {
    let b = create_bucket("write-fork");
    let m = MountBuilder::new().bucket(&b).mount();
    let data = gen_data(9, 3 * MIB);
    let mut file = File::create(m.join("f")).expect("create");
    let (first, second) = data.split_at(MIB);
    file.write_all(first).expect("write");
    assert!(Command::new("true").status().expect("spawn a child").success());
    file.write_all(second).expect("write after the child closed its copy");
    drop(file);
    assert_eq!(sha256_hex(&get(&b, "f")), sha256_hex(&data));
}

/// If the daemon is killed in the middle of a large upload, no partial object appears,
/// and the next mount aborts the unfinished multipart upload.
#[test]
fn killed_daemon_leaves_no_partial_object() {
    let b = create_bucket("write-kill");
    let mut m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let mut file = File::create(m.join("big")).expect("create");
    file.write_all(&gen_data(11, 30 * MIB)).expect("write 30 MiB (parts already uploading)");
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit(std::time::Duration::from_secs(10)).is_some(), "daemon did not die");
    drop(file); // the mount is gone: this close cannot commit anything
    assert!(list_keys(&b, "").is_empty(), "objects after the kill: {:?}", list_keys(&b, ""));
    // The killed daemon could not abort its multipart upload; the next mount of the
    // bucket finds it in the upload journal and aborts it.
    assert!(open_uploads(&b) >= 1, "the killed daemon's upload should still be open");
    let _again = MountBuilder::new().bucket(&b).mount();
    assert_eq!(open_uploads(&b), 0, "the next mount aborts uploads left by a killed daemon");
}

/// Kills the daemon with SIGKILL as soon as `uploads` multipart uploads are open in the
/// bucket, while `operation` runs on another thread (it then fails: the mount is gone).
/// The next mount of the bucket must abort what the killed daemon left.
///
/// The upload exists in the store a moment before its journal record is on disk (its id
/// comes from the store): the kill waits a little past that moment. The next mount uses
/// the same `endpoint` (a record names the endpoint and bucket it was made for).
fn kill_during_upload(bucket: &str, mut m: Mount, endpoint: &str, operation: impl FnOnce() + Send + 'static) {
    let running = std::thread::spawn(operation);
    assert!(
        wait_until(std::time::Duration::from_secs(30), || open_uploads(bucket) >= 1),
        "no multipart upload was started"
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit(std::time::Duration::from_secs(10)).is_some(), "daemon did not die");
    let _ = running.join();
    drop(m);
    assert!(open_uploads(bucket) >= 1, "the killed daemon's upload should still be open");
    let _again = MountBuilder::new().bucket(bucket).endpoint(endpoint).mount();
    assert_eq!(open_uploads(bucket), 0, "the next mount aborts the uploads a killed daemon left");
}

/// A daemon killed after the store started its upload and before the answer (with the
/// upload's id) came back: the next mount aborts that upload too, from the record made
/// before it was asked for (its key and time).
#[test]
fn killed_daemon_while_its_upload_starts_leaves_no_upload() {
    let b = create_bucket("write-kill-start");
    let proxy = ToxiProxy::to_minio();
    let mut m = MountBuilder::new().bucket(&b).endpoint(&proxy.endpoint).args(["--part-size", "5MiB"]).mount();
    // Every answer now arrives 3 s late: the store has started the upload long before
    // the daemon hears of it.
    proxy.add("late", Direction::Downstream, Toxic::Latency { latency_ms: 3000, jitter_ms: 0 });
    let path = m.join("big");
    let writer = std::thread::spawn(move || {
        let mut file = File::create(path)?;
        file.write_all(&gen_data(15, 12 * MIB))
    });
    assert!(wait_until(std::time::Duration::from_secs(30), || open_uploads(&b) >= 1), "no upload was started");
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit(std::time::Duration::from_secs(10)).is_some(), "daemon did not die");
    let _ = writer.join();
    drop(m);
    proxy.remove("late");
    assert_eq!(open_uploads(&b), 1, "the killed daemon's upload is open, its id never reached it");
    let _again = MountBuilder::new().bucket(&b).endpoint(&proxy.endpoint).mount();
    assert_eq!(open_uploads(&b), 0, "the next mount aborts it");
}

/// The upload of a staging file (an append to a large object, stored at close) is in the
/// journal too: killed while it runs, the next mount aborts it.
#[test]
fn killed_daemon_during_an_append_leaves_no_upload() {
    let b = create_bucket("write-kill-append");
    put(&b, "big", gen_data(12, 12 * MIB));
    // Slowed down (20 MB/s a connection, 4 parts at once: about 2.5 s for the 200 MiB),
    // so that the upload still runs when the kill comes, on a busy machine too.
    let proxy = ToxiProxy::to_minio();
    proxy.add("slow", Direction::Upstream, Toxic::Bandwidth { kb_per_s: 20_000 });
    let m = MountBuilder::new().bucket(&b).endpoint(&proxy.endpoint).args(["--part-size", "5MiB"]).mount();
    let path = m.join("big");
    kill_during_upload(&b, m, &proxy.endpoint, move || {
        let mut file = OpenOptions::new().append(true).open(path).expect("open to append");
        file.write_all(&gen_data(13, 200 * MIB)).expect("append 200 MiB to the staging file");
        let _ = file.sync_all(); // the upload the daemon is killed in
    });
    assert_eq!(head(&b, "big").size, 12 * MIB as u64, "the object is unchanged");
}

/// A multipart copy (a rename of an object above the single-copy limit, lowered here
/// from 5 GiB to 5 MiB) is in the journal too: killed while it runs, the next mount
/// aborts it.
#[test]
fn killed_daemon_during_a_multipart_copy_leaves_no_upload() {
    let b = create_bucket("write-kill-copy");
    let data = gen_data(14, 400 * MIB);
    put(&b, "big", data);
    let m = MountBuilder::new().bucket(&b).env("BUCKETFS_TEST_SINGLE_COPY_LIMIT", &(5 * MIB).to_string()).mount();
    let (from, to) = (m.join("big"), m.join("moved"));
    kill_during_upload(&b, m, &minio().endpoint, move || {
        let _ = std::fs::rename(from, to);
    });
    assert_eq!(list_keys(&b, ""), ["big"], "the source is still there, no copy completed");
}

/// 100 files open for writing at once, written in turns (each above one part), all
/// arrive intact, and the daemon's memory stays bounded by --memory-limit, not by the
/// number of files times their size.
#[test]
fn hundred_files_open_for_writing_at_once() {
    let b = create_bucket("write-hundred");
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB", "--memory-limit", "256MiB"]).mount();
    let size = 6 * MIB;
    let mut files: Vec<File> = (0..100).map(|i| File::create(m.join(format!("f{i:03}"))).expect("create")).collect();
    let chunk = 512 * 1024;
    for offset in (0..size).step_by(chunk) {
        for (i, file) in files.iter_mut().enumerate() {
            let data = gen_data(i as u64, size);
            file.write_all(&data[offset..offset + chunk]).expect("write");
        }
    }
    for file in files.drain(..) {
        file.sync_all().expect("fsync");
    }
    for i in [0, 37, 99] {
        let name = format!("f{i:03}");
        assert_eq!(sha256_hex(&get(&b, &name)), sha256_hex(&gen_data(i as u64, size)), "{name}");
    }
    assert_eq!(list_keys(&b, "").len(), 100);
    let peak = peak_rss_kib(m.pid().expect("daemon pid"));
    // 100 files x 6 MiB = 600 MiB passed through; the part buffers of files being
    // written are the floor (about one part each), well below that.
    assert!(peak < 1024 * 1024, "daemon peak RSS {peak} kB");
    eprintln!("daemon peak RSS after 100 concurrent writers: {} MiB", peak / 1024);
}

/// The descriptors of one file open for writing share what is written, as on a local
/// disk: each reads the others' writes, `ftruncate` through one cuts the file for all, and
/// no close throws away what another descriptor wrote (pjdfstest `ftruncate` 00.t, and
/// two appenders of one log). Each case runs on a local file too; the object must be
/// byte for byte what the local file holds. The same with `--write-back`.
#[test]
fn descriptors_of_one_file_share_what_is_written() {
    for write_back in [false, true] {
        let b = create_bucket(if write_back { "write-shared-wb" } else { "write-shared" });
        let args: &[&str] = if write_back { &["--write-back"] } else { &[] };
        let m = MountBuilder::new().bucket(&b).args(args.iter().copied()).mount();
        descriptors_share(&b, &m);
        drop(m); // unmount: with --write-back, every upload is done
        assert_eq!(open_uploads(&b), 0, "no multipart upload left behind");
    }
}

fn descriptors_share(b: &str, m: &Mount) {
    let local = tempfile::tempdir().expect("local dir");
    let data = gen_data(7, 12_345);
    // Each case returns the sizes `stat` showed on the way.
    type Case<'a> = &'a dyn Fn(&std::path::Path) -> Vec<u64>;
    let cases: [(&str, Case); 3] = [
        ("ftruncate", &|path| {
            let first = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).unwrap();
            File::create(path).unwrap().write_all(&data).unwrap();
            first.set_len(23_456).unwrap();
            let after_grow = std::fs::metadata(path).unwrap().len();
            let mut head = [0u8; 3];
            first.read_exact_at(&mut head, 0).unwrap();
            assert_eq!(head, data[..3], "the first descriptor reads what the second wrote");
            let third = OpenOptions::new().write(true).open(path).unwrap();
            third.set_len(1).unwrap();
            let after_cut = std::fs::metadata(path).unwrap().len();
            close(third).unwrap();
            close(first).unwrap();
            vec![after_grow, after_cut]
        }),
        ("appenders", &|path| {
            let open = || OpenOptions::new().append(true).create(true).open(path).unwrap();
            let (mut one, mut two) = (open(), open());
            for line in 0..4 {
                let writer = if line % 2 == 0 { &mut one } else { &mut two };
                writeln!(writer, "line {line}").unwrap();
            }
            close(two).unwrap();
            writeln!(one, "last line").unwrap();
            close(one).unwrap();
            vec![]
        }),
        ("overwrite after close", &|path| {
            let mut first = OpenOptions::new().write(true).create(true).truncate(true).open(path).unwrap();
            first.write_all(&data).unwrap();
            let second = OpenOptions::new().read(true).write(true).open(path).unwrap();
            second.write_all_at(b"HEAD", 0).unwrap();
            close(second).unwrap();
            first.write_all(b"tail").unwrap();
            close(first).unwrap();
            vec![]
        }),
    ];
    for (name, case) in cases {
        let sizes_mounted = case(&m.join(name));
        let sizes_local = case(&local.path().join(name));
        assert_eq!(sizes_mounted, sizes_local, "{name}: sizes seen on the way");
        let expected = std::fs::read(local.path().join(name)).expect("read the local file");
        // With --write-back this read is served from what was written, and the upload
        // of the last close lands within its grace.
        assert_eq!(std::fs::read(m.join(name)).expect("read back"), expected, "{name}: read back");
        let stored = wait_until(std::time::Duration::from_secs(10), || get(b, name) == expected);
        assert!(stored, "{name}: the object is the local file ({} bytes stored)", get(b, name).len());
    }
}
