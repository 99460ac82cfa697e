//! The data cache on local disk (`--cache DIR`) against MinIO and real mounts: bytes read
//! through it are the object's, a remount or a second mount reads cached objects without
//! a GET, a changed object is never served from old blocks, the cap holds while reading
//! more than it, and a corrupted block is fetched again. See docs/SEMANTICS.md, "Data
//! cache".

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;

const BLOCK: usize = MIB;

fn cached_mount(bucket: &str, cache: &Path, extra: &[&str]) -> Mount {
    MountBuilder::new()
        .bucket(bucket)
        .args(["--cache", cache.to_str().expect("utf-8 path")])
        .args(extra.iter().copied())
        .request_log()
        .mount()
}

/// A bucket holding `f` (`size` bytes of `seed`), and an empty cache directory.
fn one_object(hint: &str, seed: u64, size: usize) -> (String, tempfile::TempDir, Vec<u8>) {
    let bucket = create_bucket(hint);
    let data = gen_data(seed, size);
    put(&bucket, "f", data.clone());
    (bucket, tempfile::tempdir_in("/var/tmp").expect("cache dir"), data)
}

fn gets(m: &Mount) -> Vec<(u64, u64)> {
    m.s3_requests().into_iter().filter(|r| r.op == "GET").filter_map(|r| r.range).collect()
}

/// Bytes the cache directory takes on disk (allocated blocks, as `du`).
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    walk_files(dir).iter().filter_map(|file| std::fs::metadata(file).ok()).map(|meta| meta.blocks() * 512).sum()
}

/// Every size around a block boundary, and a large object: read cold through one mount,
/// then through a new mount from the cache alone (no GET), the bytes are the object's.
#[test]
fn cached_bytes_are_the_objects_and_a_remount_reads_them_without_a_get() {
    let b = create_bucket("dc-sizes");
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let sizes = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17, 100 * MIB];
    for (i, size) in sizes.iter().enumerate() {
        put(&b, &format!("f{i}"), gen_data(i as u64, *size));
    }
    for round in ["cold", "from the cache"] {
        let m = cached_mount(&b, cache.path(), &[]);
        for (i, size) in sizes.iter().enumerate() {
            let (sha, len) = sha256_file(&m.join(format!("f{i}")), 128 * KIB).expect("read");
            assert_eq!(len, *size as u64, "{round}: size of f{i}");
            assert_eq!(sha, sha256_hex(&gen_data(i as u64, *size)), "{round}: bytes of f{i} ({size} bytes)");
        }
        if round == "from the cache" {
            assert_eq!(gets(&m), vec![], "a remount read every cached object without a GET");
        } else {
            assert!(!gets(&m).is_empty());
        }
    }
    let status = run_bucketfs(&["cache", "status", cache.path().to_str().expect("utf-8")], Duration::from_secs(30));
    assert!(status.0.success(), "{status:?}");
    assert!(status.1.contains(&format!("{} objects", sizes.len() - 1)), "the empty object is not cached: {status:?}");
}

/// Files written through a mount with `--cache` (those of one PUT: up to `--part-size`)
/// enter the cache once stored: the same mount and a new one read them back without a
/// GET, byte for byte; a larger file is not cached by its writing.
#[test]
fn files_written_through_the_mount_are_read_back_from_the_cache() {
    let b = create_bucket("dc-written");
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let sizes = [1, 64 * KIB + 1, 3 * BLOCK + 17, 8 * MIB - 1, 8 * MIB + 1];
    let writer = cached_mount(&b, cache.path(), &[]);
    for (i, size) in sizes.iter().enumerate() {
        std::fs::write(writer.join(format!("w{i}")), gen_data(50 + i as u64, *size)).expect("write");
    }
    let check = |m: &Mount, round: &str| {
        for (i, size) in sizes.iter().enumerate() {
            let (sha, len) = sha256_file(&m.join(format!("w{i}")), 128 * KIB).expect("read");
            assert_eq!((len, sha), (*size as u64, sha256_hex(&gen_data(50 + i as u64, *size))), "{round}: w{i}");
        }
    };
    // The cache is written in the background after close (and checked whole).
    let cached = || status_line(cache.path()).contains(" 4 objects, 4 whole,");
    assert!(wait_until(Duration::from_secs(20), cached), "{}", status_line(cache.path()));
    let before = gets(&writer).len();
    check(&writer, "the writing mount");
    let read_back: Vec<_> = m_gets_of(&writer)[before..].to_vec();
    assert!(read_back.iter().all(|(key, _)| key == "w4"), "only the multipart file was fetched: {read_back:?}");
    drop(writer);
    let m = cached_mount(&b, cache.path(), &[]);
    check(&m, "a new mount");
    let fetched: Vec<_> = m_gets_of(&m).into_iter().map(|(key, _)| key).collect();
    assert!(fetched.iter().all(|key| key == "w4"), "only the multipart file was fetched: {fetched:?}");
}

/// The GETs a mount sent, with their keys.
fn m_gets_of(m: &Mount) -> Vec<(String, Option<(u64, u64)>)> {
    m.s3_requests().into_iter().filter(|r| r.op == "GET").map(|r| (r.key.clone(), r.range)).collect()
}

/// Small files read through a mount (`grep -r` over a directory of them) are cached too,
/// and a remount reads them all with no request per file: their metadata comes with the
/// listings, their content from the cache.
#[test]
fn small_files_read_after_a_remount_cost_no_request_each() {
    let b = create_bucket("dc-small");
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let files: Vec<(String, Vec<u8>)> =
        (0..60).map(|i| (format!("src/f{i:02}.c"), gen_data(300 + i, 1000 + 37 * i as usize))).collect();
    put_many(&b, files.clone(), 8);
    for round in ["cold", "after a remount"] {
        let m = cached_mount(&b, cache.path(), &[]);
        let grep = std::process::Command::new("grep").args(["-r", "-c", "zzz"]).arg(m.join("src")).output();
        assert!(grep.is_ok_and(|out| out.status.code() == Some(1)), "grep -r read every file, matched none");
        for (key, data) in &files {
            assert_same_bytes(&std::fs::read(m.join(key)).expect("read"), data, &format!("{round}: {key}"));
        }
        if round == "after a remount" {
            let sent = m.s3_requests();
            let gets: Vec<_> = sent.iter().filter(|r| r.op.starts_with("GET")).collect();
            assert!(gets.is_empty(), "GETs after a remount: {gets:?}");
            // The lookups before the first listing (the directory, the first file).
            let heads = sent.iter().filter(|r| r.op == "HEAD").count();
            assert!(heads <= 2, "{heads} HEADs for {} files: {sent:?}", files.len());
        }
    }
}

/// Two mounts on one cache directory at once: what one cached, the other reads without
/// a GET; both reading many objects together, with evictions under a small cap, only
/// ever get the right bytes.
#[test]
fn two_mounts_share_one_cache_and_read_only_right_bytes() {
    let b = create_bucket("dc-shared");
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let objects: Vec<(String, Vec<u8>)> =
        (0..24).map(|i| (format!("o{i:02}"), gen_data(100 + i, 2 * MIB + 1000))).collect();
    put_many(&b, objects.clone(), 8);
    let first = cached_mount(&b, cache.path(), &["--cache-size", "24MiB"]);
    let second = cached_mount(&b, cache.path(), &["--cache-size", "24MiB"]);
    assert_file_content(&first.join("o00"), 256 * KIB, &objects[0].1);
    // Blocks are written to the cache beside the read, not before it returns: on a loaded
    // machine the second mount could ask before the last one is on disk.
    let cached = || status_line(cache.path()).contains(" 1 objects, 1 whole,");
    assert!(wait_until(Duration::from_secs(20), cached), "{}", status_line(cache.path()));
    assert_file_content(&second.join("o00"), 256 * KIB, &objects[0].1);
    assert_eq!(gets(&second), vec![], "the second mount read what the first cached");

    let failed = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for (n, mount) in [&first, &second, &first, &second].into_iter().enumerate() {
            let (objects, failed) = (&objects, &failed);
            scope.spawn(move || {
                for round in 0..3 {
                    for (i, (key, data)) in objects.iter().enumerate() {
                        if (i + n + round) % 2 == 0 {
                            continue;
                        }
                        let (sha, _) = sha256_file(&mount.join(key), 128 * KIB).expect("read");
                        if sha != sha256_hex(data) {
                            failed.store(true, Ordering::Relaxed);
                            eprintln!("reader {n}: wrong bytes in {key}");
                        }
                    }
                }
            });
        }
    });
    assert!(!failed.load(Ordering::Relaxed), "a reader got wrong bytes");
    assert!(disk_usage(cache.path()) <= 24 * MIB as u64 + 4 * BLOCK as u64, "over the cap");
}

/// An object replaced in the store is read anew after the metadata TTL: its old blocks
/// stay on disk under the old ETag but are never served for the new version.
#[test]
fn a_replaced_object_is_never_served_from_old_blocks() {
    let b = create_bucket("dc-replaced");
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let old = gen_data(1, 3 * MIB);
    let new = gen_data(2, 3 * MIB);
    put(&b, "f", old.clone());
    let m = cached_mount(&b, cache.path(), &["--metadata-ttl", "1"]);
    assert_file_content(&m.join("f"), MIB, &old);
    put(&b, "f", new.clone());
    std::thread::sleep(Duration::from_millis(1500));
    assert_file_content(&m.join("f"), MIB, &new);
    drop(m);
    let again = cached_mount(&b, cache.path(), &[]);
    assert_file_content(&again.join("f"), 100 * KIB, &new);
    assert_eq!(gets(&again), vec![], "the new version was cached too");
}

/// Reading three times the cap, the cache directory never holds more than the cap plus
/// a block per reader, and what is left is still read right.
#[test]
fn the_cap_holds_while_reading_more_than_it() {
    let b = create_bucket("dc-cap");
    let cache = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let cap = 16 * MIB as u64;
    let objects: Vec<(String, Vec<u8>)> = (0..6).map(|i| (format!("o{i}"), gen_data(200 + i, 8 * MIB))).collect();
    put_many(&b, objects.clone(), 6);
    let m = cached_mount(&b, cache.path(), &["--cache-size", "16MiB"]);
    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (peak, done, dir) = (peak.clone(), done.clone(), cache.path().to_path_buf());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(disk_usage(&dir), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    for (key, data) in &objects {
        assert_file_content(&m.join(key), 512 * KIB, data);
    }
    done.store(true, Ordering::Relaxed);
    watcher.join().expect("watcher");
    let peak = peak.load(Ordering::Relaxed);
    eprintln!("peak cache directory size {peak} bytes, cap {cap}");
    assert!(peak <= cap + BLOCK as u64 + 64 * KIB as u64, "the cache took {peak} bytes, cap {cap}");
    assert!(peak >= cap / 2, "the cache was used: {peak} bytes");
    let (key, data) = objects.last().expect("objects");
    assert_file_content(&m.join(key), 512 * KIB, data);
}

/// A flipped byte in a cached block is noticed by its checksum: the block is fetched
/// again (one GET of it), and the program gets the right bytes.
#[test]
fn a_corrupted_block_is_fetched_again() {
    use std::os::unix::fs::FileExt;
    let (b, cache, data) = one_object("dc-corrupt", 7, 4 * MIB);
    drop({
        let m = cached_mount(&b, cache.path(), &[]);
        assert_file_content(&m.join("f"), MIB, &data);
        m
    });
    let data_files: Vec<_> =
        walk_files(cache.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "data")).collect();
    assert_eq!(data_files.len(), 1, "{data_files:?}");
    let file = std::fs::OpenOptions::new().write(true).open(&data_files[0]).expect("open");
    let offset = 2 * MIB as u64 + 12_345;
    file.write_all_at(&[data[offset as usize] ^ 0xff], offset).expect("flip");
    drop(file);
    let m = cached_mount(&b, cache.path(), &[]);
    assert_file_content(&m.join("f"), MIB, &data);
    assert_eq!(gets(&m), vec![(2 * MIB as u64, MIB as u64)], "only the corrupted block is fetched");
}

/// A file whole in the cache is read through FUSE passthrough, from the kernel to the
/// cache file (the daemon says so in its log), with the right bytes, on the mount that
/// cached it and after a remount; while it is open that way, the same file can be opened
/// for writing and rewritten.
#[test]
fn whole_cached_files_are_passed_through() {
    const PASSED: &str = "open: passthrough to the data cache";
    let (b, cache, data) = one_object("dc-passthrough", 11, 8 * MIB);
    {
        let m = cached_mount(&b, cache.path(), &[]);
        assert!(m.log_text().contains("FUSE passthrough on"), "{}", m.log_text());
        assert_file_content(&m.join("f"), MIB, &data);
        let passed: Vec<String> = m.log_text().lines().filter(|l| l.contains(PASSED)).map(str::to_owned).collect();
        // Which process opened it (the span's pid), should another one have: a flake seen
        // once in a dozen runs of the suite.
        let me = std::process::id();
        assert!(passed.is_empty(), "not whole in the cache at the first open (this test is pid {me}): {passed:#?}");
        // Checked as a whole after its last block was written, for the next open.
        let checked = || m.log_text().contains("object whole and checked");
        assert!(wait_until(Duration::from_secs(20), checked), "never checked whole");
        let status = status_line(cache.path());
        assert!(status.contains(" 1 objects, 1 whole,"), "{status}");
        // The second open passes through, unless the kernel's RELEASE of the first (sent
        // after `close` returned) reaches the daemon after it: then the next one does.
        let mut opens = 0;
        while m.log_text().matches(PASSED).count() == 0 && opens < 20 {
            assert_file_content(&m.join("f"), MIB, &data);
            opens += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(m.log_text().matches(PASSED).count(), 1, "an open after the first's release passes through");
    }
    let m = cached_mount(&b, cache.path(), &[]);
    assert_file_content(&m.join("f"), 256 * KIB, &data);
    assert_eq!(m.log_text().matches(PASSED).count(), 1, "a remount passes through at once");
    assert_eq!(gets(&m), vec![]);
    // The kernel lets no other kind of open in while a file is passed through.
    let reader = std::fs::File::open(m.join("f")).expect("open for reading");
    let new = gen_data(12, 3 * MIB);
    assert_errno(std::fs::write(m.join("f"), &new), libc::ETXTBSY, "rewrite while a reader is passed through");
    assert_same_bytes(&get(&b, "f"), &data, "the refused open changed nothing");
    drop(reader);
    std::fs::write(m.join("f"), &new).expect("rewrite once the reader closed");
    assert_same_bytes(&get(&b, "f"), &new, "the object after the rewrite");
    assert_file_content(&m.join("f"), MIB, &new);
    drop(m);

    // Without passthrough, both at once work.
    let m = cached_mount(&b, cache.path(), &["--no-passthrough"]);
    assert_file_content(&m.join("f"), MIB, &new);
    assert!(wait_until(Duration::from_secs(20), || status_line(cache.path()).contains(" 2 objects, 2 whole,")));
    let reader = std::fs::File::open(m.join("f")).expect("open for reading");
    std::fs::write(m.join("f"), &data).expect("rewrite while a reader is open");
    drop(reader);
    assert!(!m.log_text().contains(PASSED));
    assert_same_bytes(&get(&b, "f"), &data, "the object after the second rewrite");
}

/// A plain unmount by the kernel (`umount`, as the harness's drop does) right after a
/// program read a file: the daemon writes every block it fetched to the cache before it
/// exits, so the next mount reads the file without a GET.
#[test]
fn a_plain_unmount_right_after_a_read_keeps_every_block() {
    let (b, cache, data) = one_object("dc-umount", 13, 256 * MIB);
    {
        let m = cached_mount(&b, cache.path(), &[]);
        assert_file_content(&m.join("f"), MIB, &data);
    } // unmounted at once; the drop waits for the daemon to exit
    let m = cached_mount(&b, cache.path(), &[]);
    assert_file_content(&m.join("f"), MIB, &data);
    let fetched = gets(&m);
    assert!(fetched.is_empty(), "{} GETs after the remount: blocks lost at the unmount", fetched.len());
}

fn status_line(cache: &Path) -> String {
    run_bucketfs(&["cache", "status", cache.to_str().expect("utf-8")], Duration::from_secs(30)).1
}

/// A cache with no room for a block (a cap below a block), and a cache disk that fills
/// up, then turns read-only, never fail a read: the program gets the right bytes from the
/// store, and each mount says so once in its log.
#[test]
fn a_full_or_failing_cache_disk_degrades_to_uncached_reads() {
    let b = create_bucket("dc-full");
    let objects: Vec<(String, Vec<u8>)> = (0..3).map(|i| (format!("o{i}"), gen_data(400 + i, 6 * MIB))).collect();
    put_many(&b, objects.clone(), 3);
    let warnings = |m: &Mount| -> Vec<String> {
        m.log_text().lines().filter(|l| l.contains("WARN") && l.contains("data cache")).map(str::to_owned).collect()
    };

    let tiny = tempfile::tempdir_in("/var/tmp").expect("cache dir");
    let m = cached_mount(&b, tiny.path(), &["--cache-size", "100KiB"]);
    assert_file_content(&m.join("o0"), MIB, &objects[0].1);
    assert_file_content(&m.join("o1"), MIB, &objects[1].1);
    let said = warnings(&m);
    assert!(said.len() == 1 && said[0].contains("no room"), "one warning: {said:?}");
    drop(m);

    // A file system of its own, of 4 MiB, under a cap that would allow 64 MiB.
    let full = SmallDisk::new(4 * MIB);
    let m = cached_mount(&b, full.path(), &["--cache-size", "64MiB"]);
    for (key, data) in &objects {
        assert_file_content(&m.join(key), MIB, data);
    }
    let said = warnings(&m);
    assert_eq!(said.len(), 1, "one warning: {said:?}");
    drop(m);

    // A cache disk that fails (turns read-only) under a running mount.
    let failing = SmallDisk::new(64 * MIB);
    let m = cached_mount(&b, failing.path(), &[]);
    assert_file_content(&m.join("o0"), MIB, &objects[0].1);
    failing.make_read_only();
    assert_file_content(&m.join("o1"), MIB, &objects[1].1);
    assert_file_content(&m.join("o2"), MIB, &objects[2].1);
    let said = warnings(&m);
    assert_eq!(said.len(), 1, "one warning: {said:?}");
}

/// A tmpfs of `size` bytes mounted on a temporary directory (the tests run as root),
/// unmounted on drop.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn new(size: usize) -> Self {
        let dir = tempfile::tempdir_in("/var/tmp").expect("dir");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "bucketfs-test"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mount -t tmpfs (the tests need root)");
        Self(dir)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// A remount fails (EBUSY) while a file is open for writing on the disk: the cache may
    /// still be writing the blocks of the last read in the background, so try for a while.
    fn make_read_only(&self) {
        let remounted = wait_until(Duration::from_secs(10), || {
            let status = std::process::Command::new("mount").args(["-o", "remount,ro"]).arg(self.path()).status();
            status.is_ok_and(|s| s.success())
        });
        assert!(remounted, "remount read-only");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// `bucketfs cache clear` empties the directory; a mount reads through it again.
#[test]
fn cache_clear_empties_it() {
    let (b, cache, data) = one_object("dc-clear", 9, 2 * MIB);
    let m = cached_mount(&b, cache.path(), &[]);
    assert_file_content(&m.join("f"), MIB, &data);
    let dir = cache.path().to_str().expect("utf-8");
    let (status, out, err) = run_bucketfs(&["cache", "clear", dir], Duration::from_secs(30));
    assert!(status.success(), "{out}{err}");
    let (_, out, _) = run_bucketfs(&["cache", "status", dir], Duration::from_secs(30));
    assert!(out.contains(" 0 objects, 0 whole, 0 bytes"), "{out}");
    // Into a pipe whose reader is gone (`| head -0`), it still ends well.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let piped = std::process::Command::new(bucketfs_bin())
        .args(["cache", "status", dir])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&piped.stderr);
    assert!(piped.status.success() && !stderr.contains("panicked"), "{stderr}");
    let before = gets(&m).len();
    drop(m);
    let m = cached_mount(&b, cache.path(), &[]);
    assert_file_content(&m.join("f"), MIB, &data);
    assert!(!gets(&m).is_empty(), "read from the store again (had {before} GETs before)");
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(entry.path());
            } else {
                files.push(entry.path());
            }
        }
    }
    files
}
