//! `--index` against MinIO: the tree served from a listing index (no request per walk),
//! saved and loaded by the next mount, refreshed on request, on SIGHUP and on its
//! interval (docs/SEMANTICS.md, "Listing index").

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn fill(bucket: &str, keys: &[String]) {
    put_many(bucket, keys.iter().map(|k| (k.clone(), k.as_bytes().to_vec())).collect(), 64);
}

/// A mount with `--index`, saving its index in `cache`, fetching no stored attributes
/// in the background (so that the requests a test counts are its own).
fn indexed(bucket: &str, cache: &Path) -> MountBuilder {
    MountBuilder::new()
        .bucket(bucket)
        .request_log()
        .args(["--index", "--index-attributes-rate", "0", "--cache-dir"])
        .arg(cache.to_string_lossy())
}

/// `bucketfs refresh MOUNTPOINT`: its output; panics if it fails.
fn refresh(m: &Mount) -> String {
    let out = Command::new(bucketfs_bin()).arg("refresh").arg(m.path()).output().expect("bucketfs refresh");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "bucketfs refresh failed: {}{text}", String::from_utf8_lossy(&out.stderr));
    text
}

/// `find MOUNT` (names only, as `find -name` walks).
fn find_names(m: &Mount) -> usize {
    let out = Command::new("find").arg(m.path()).output().expect("find");
    assert!(out.status.success(), "find failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout.iter().filter(|b| **b == b'\n').count()
}

fn requests_since(m: &Mount, before: usize) -> Vec<S3Request> {
    m.s3_requests().into_iter().skip(before).collect()
}

/// The tree an indexed mount shows is the one ListObjectsV2 describes, the same as
/// without `--index`; once the index is built, a walk costs no request, and a second
/// mount loads the saved index and walks without listing anything.
#[test]
fn an_indexed_tree_is_the_bucket_and_walks_without_requests() {
    let bucket = create_bucket("index");
    let keys = tree_keys(40, 25, 19); // 20,007 keys
    fill(&bucket, &keys);
    let want = model(&bucket);
    let cache = tempfile::tempdir().expect("cache dir");

    let first = indexed(&bucket, cache.path()).mount();
    let status = refresh(&first);
    assert!(status.contains(&format!("files={}", keys.len() - 3)), "index status: {status}");
    let before = first.s3_requests().len();
    let entries = find_names(&first);
    let sent = requests_since(&first, before);
    assert_eq!(entries, want.len() + 1, "find shows every entry and the root");
    assert!(
        sent.is_empty(),
        "a walk of an indexed tree sent {} requests: {:?}",
        sent.len(),
        &sent[..sent.len().min(5)]
    );
    assert_same_tree(&find_tree(&first), &want, "an indexed mount");
    drop(first);

    let plain = MountBuilder::new().bucket(&bucket).mount();
    assert_same_tree(&find_tree(&plain), &want, "a mount without --index");
    drop(plain);

    // Once mounted (its access check, one LIST of one key, comes before), the second
    // mount lists nothing: it loaded the saved index.
    let second = indexed(&bucket, cache.path()).arg("--read-only").mount();
    let before = second.s3_requests().len();
    let entries = find_names(&second);
    let sent = requests_since(&second, before);
    assert_eq!(entries, want.len() + 1);
    assert!(sent.is_empty(), "the second mount's walk sent {sent:?}");
    assert!(second.log_text().contains("saved index loaded"), "the mount says it loaded the index");
    assert!(refresh(&second).contains("files="), "a read-only mount refreshes too");
    let plain = MountBuilder::new().bucket(&bucket).mount();
    let out = Command::new(bucketfs_bin()).arg("refresh").arg(plain.path()).output().expect("bucketfs refresh");
    assert!(!out.status.success(), "refresh of a mount without --index");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("not a bucketfs mount with --index"), "{said}");
}

/// A damaged or foreign index file is not used: the mount says why, lists the bucket
/// again, and shows the tree as it is.
#[test]
fn a_damaged_saved_index_is_ignored_with_a_warning_and_rebuilt() {
    let bucket = create_bucket("idxbad");
    let keys: Vec<String> = (0..300).map(|i| format!("d{}/f{i}", i % 7)).collect();
    fill(&bucket, &keys);
    let cache = tempfile::tempdir().expect("cache dir");
    let first = indexed(&bucket, cache.path()).mount();
    refresh(&first);
    drop(first);
    let files: Vec<_> = std::fs::read_dir(cache.path().join("bucketfs-index"))
        .expect("index dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "one saved index: {files:?}");
    let saved = std::fs::read(&files[0]).expect("read index");

    let mut corrupted = saved.clone();
    let at = corrupted.len() - 10;
    corrupted[at] ^= 0x55;
    let mut old_format = saved.clone();
    old_format[8] = 0; // the format version
    for (damage, bytes, reason) in [("corrupted", corrupted, "checksum"), ("old format", old_format, "version")] {
        std::fs::write(&files[0], &bytes).expect("damage the index");
        let m = indexed(&bucket, cache.path()).mount();
        assert_eq!(find_names(&m), 300 + 7 + 1, "{damage}: the whole tree");
        let lists = m.s3_requests().iter().filter(|r| r.op == "LIST").count();
        assert!(lists > 0, "{damage}: listed again");
        let log = m.log_text();
        let warning = log.lines().find(|line| line.contains("saved index not used"));
        assert!(warning.is_some_and(|w| w.contains(reason)), "{damage}: no warning naming the {reason}:\n{log}");
        refresh(&m);
        drop(m);
        assert_ne!(std::fs::read(&files[0]).expect("saved again"), bytes, "{damage}: rebuilt and saved");
    }
}

/// Keys added, deleted and replaced behind the mount show after `bucketfs refresh`,
/// after SIGHUP, and after the refresh interval; changes through the mount show at once.
#[test]
fn changes_behind_the_mount_show_after_a_refresh() {
    let bucket = create_bucket("idxref");
    fill(&bucket, &["d/a".into(), "d/b".into(), "d/c".into(), "e/x".into()]);
    let cache = tempfile::tempdir().expect("cache dir");
    // The default refresh interval (5 minutes): a short one could fall among the
    // changes below on a loaded machine and show them before the refresh.
    let m = indexed(&bucket, cache.path()).args(["--metadata-ttl", "0.2"]).mount();
    refresh(&m);
    let names = |dir: &str| ls(&m.join(dir));
    assert_eq!(names("d"), ["a", "b", "c"]);

    put(&bucket, "d/new", b"n".to_vec());
    delete(&bucket, "d/a");
    put(&bucket, "d/b", b"replaced".to_vec());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(names("d"), ["a", "b", "c"], "not before a refresh");
    refresh(&m);
    std::thread::sleep(Duration::from_millis(300)); // past the TTL of what the kernel cached
    assert_eq!(names("d"), ["b", "c", "new"]);
    assert_eq!(std::fs::read(m.join("d/b")).expect("read d/b"), b"replaced");

    put(&bucket, "e/by-sighup", b"s".to_vec());
    m.signal(libc::SIGHUP);
    let shown = wait_until(Duration::from_secs(10), || names("e").contains(&"by-sighup".to_owned()));
    assert!(shown, "a key added behind the mount shows after SIGHUP");

    drop(m);
    let m = indexed(&bucket, cache.path()).args(["--metadata-ttl", "0.2", "--index-refresh", "3"]).mount();
    let names = |dir: &str| ls(&m.join(dir));
    assert_eq!(names("e"), ["by-sighup", "x"], "the saved index");
    put(&bucket, "e/by-interval", b"i".to_vec());
    let shown = wait_until(Duration::from_secs(15), || names("e").contains(&"by-interval".to_owned()));
    assert!(shown, "a key added behind the mount shows after the refresh interval");

    // Through the mount: at once, no refresh, no listing. On a mount of the saved index
    // that refreshes every 5 minutes (the default): one every 3 s could fall among the
    // changes and list the bucket.
    drop(m);
    let m = indexed(&bucket, cache.path()).args(["--metadata-ttl", "0.2"]).mount();
    let names = |dir: &str| ls(&m.join(dir));
    assert_eq!(names("e"), ["by-interval", "by-sighup", "x"], "the saved index");
    let before = m.s3_requests().len();
    std::fs::write(m.join("d/written"), b"w").expect("write");
    std::fs::create_dir(m.join("d/made")).expect("mkdir");
    std::fs::remove_file(m.join("d/c")).expect("rm");
    std::fs::rename(m.join("e/x"), m.join("d/moved")).expect("rename");
    assert_eq!(names("d"), ["b", "made", "moved", "new", "written"]);
    assert_eq!(names("e"), ["by-interval", "by-sighup"]);
    let lists: Vec<_> = requests_since(&m, before).into_iter().filter(|r| r.op == "LIST").collect();
    // rename and rmdir-style checks list what they move; nothing else lists.
    assert!(lists.len() <= 2, "changes through the mount listed: {lists:?}");
}

/// A directory read while a refresh swaps the index shows the old listing or the new
/// one, never a mix.
#[test]
fn a_directory_read_across_a_refresh_is_one_listing() {
    let bucket = create_bucket("idxmix");
    let old: Vec<String> = (0..3000).map(|i| format!("d/old{i:04}")).collect();
    fill(&bucket, &old);
    let cache = tempfile::tempdir().expect("cache dir");
    let m = indexed(&bucket, cache.path()).mount();
    refresh(&m);
    let mut reader = std::fs::read_dir(m.join("d")).expect("opendir");
    let mut seen: Vec<String> =
        (&mut reader).take(100).map(|e| e.expect("entry").file_name().into_string().expect("utf-8")).collect();
    let new: Vec<String> = (0..3000).map(|i| format!("d/new{i:04}")).collect();
    fill(&bucket, &new);
    for key in &old {
        delete(&bucket, key);
    }
    refresh(&m);
    seen.extend(reader.map(|e| e.expect("entry").file_name().into_string().expect("utf-8")));
    let olds = seen.iter().filter(|n| n.starts_with("old")).count();
    assert!(olds == seen.len() || olds == 0, "{olds} old and {} new names in one listing", seen.len() - olds);
    assert_eq!(seen.len(), 3000);
    let after = ls(&m.join("d"));
    assert!(after.iter().all(|n| n.starts_with("new")) && after.len() == 3000, "a new listing shows the refresh");
}

/// Files' stored attributes are fetched in the background after the listing and kept in
/// the saved index: then `ls -l` (modes, owners, times) costs no request, in this mount
/// and in the next. That is the path of servers whose listings carry no metadata
/// (`--no-listing-metadata` here); MinIO's listings carry it, and the index has every
/// attribute as soon as it is built.
#[test]
fn stored_attributes_are_fetched_in_the_background_and_saved() {
    let bucket = create_bucket("idxattr");
    let keys: Vec<String> = (0..200).map(|i| format!("d{}/f{i}", i % 4)).collect();
    fill(&bucket, &keys);
    let m = MountBuilder::new().bucket(&bucket).mount();
    std::fs::set_permissions(m.join("d1/f1"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    drop(m);
    let cache = tempfile::tempdir().expect("cache dir");
    let with_rate = |rate: &str| {
        MountBuilder::new()
            .bucket(&bucket)
            .request_log()
            .args(["--index", "--no-listing-metadata", "--index-attributes-rate", rate, "--cache-dir"])
            .arg(cache.path().to_string_lossy())
    };
    let long_listing = |m: &Mount| {
        let out = Command::new("ls").args(["-lR", "."]).current_dir(m.path()).output().expect("ls -lR");
        assert!(out.status.success());
        // Directories without a marker show the mount's start time: two mounts a minute
        // apart differ there (a flaky failure when they straddled a minute).
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines().filter(|line| !line.starts_with('d')).collect::<Vec<_>>().join("\n")
    };
    let first = with_rate("1000").mount();
    refresh(&first);
    // 200 HEADs, 8 at a time, take well under a second alone; the bound is for a loaded
    // CI machine, where the other tests of this file (thousands of PUTs and DELETEs on the
    // same MinIO) once held the pass to 133 HEADs in 20 s.
    let done = wait_until(Duration::from_secs(90), || first.log_text().contains("stored attributes fetched"));
    let heads = first.s3_requests().iter().filter(|r| r.op == "HEAD").count();
    assert!(done, "the background pass ended ({heads} HEADs sent)");
    assert!(heads >= 200, "{heads} HEADs: one per file");
    // The refresh above may have swapped in a new index while the pass that logged was
    // running: the pass that follows the refresh fetches what the swap left unknown.
    let mut listing = String::new();
    let mut sent = Vec::new();
    let quiet = wait_until(Duration::from_secs(20), || {
        let before = first.s3_requests().len();
        listing = long_listing(&first);
        sent = requests_since(&first, before);
        sent.is_empty()
    });
    assert!(quiet, "ls -lR after the background passes still sent {sent:?}");
    assert!(listing.contains("-rw------- 1"), "the stored mode shows:\n{listing}");
    drop(first);

    let second = with_rate("0").mount();
    let before = second.s3_requests().len();
    assert!(long_listing(&second) == listing, "the next mount shows the same");
    let sent = requests_since(&second, before);
    assert!(sent.is_empty(), "ls -lR with the saved attributes sent {sent:?}");
    drop(second);

    let other_cache = tempfile::tempdir().expect("cache dir");
    let listed = MountBuilder::new()
        .bucket(&bucket)
        .request_log()
        .args(["--index", "--index-attributes-rate", "1000", "--cache-dir"])
        .arg(other_cache.path().to_string_lossy())
        .mount();
    refresh(&listed); // the index is in use (until then, the mount walks the store)
    assert!(long_listing(&listed) == listing, "an index built from MinIO's listing shows the same");
    let heads: Vec<String> = listed.s3_requests().into_iter().filter(|r| r.op == "HEAD").map(|r| r.key).collect();
    assert!(heads.is_empty(), "the listing carried every stored attribute, yet HEADs of {heads:?}");
}

/// Several sources under one mount, each with its own index (and saved file): the
/// tree of each shows under its directory, and a walk costs no request.
#[test]
fn each_source_of_a_multiplexed_mount_has_its_index() {
    let one = create_bucket("idxone");
    let two = create_bucket("idxtwo");
    fill(&one, &["a/x".into(), "a/y".into(), "b".into()]);
    fill(&two, &["pre/c/z".into(), "pre/d".into(), "elsewhere".into()]);
    let cache = tempfile::tempdir().expect("cache dir");
    let m = MountBuilder::new()
        .source(format!("s3://{one}=one"))
        .source(format!("s3://{two}/pre=two"))
        .request_log()
        .args(["--index", "--index-attributes-rate", "0", "--cache-dir"])
        .arg(cache.path().to_string_lossy())
        .mount();
    let status = refresh(&m);
    assert_eq!(status.matches("files=").count(), 2, "one index per source: {status}");
    let before = m.s3_requests().len();
    let out = Command::new("find").arg(m.path()).args(["-mindepth", "1", "-printf", "%P\n"]).output().expect("find");
    let sent = requests_since(&m, before);
    assert!(sent.is_empty(), "a walk of two indexed sources sent {sent:?}");
    let mut paths: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    paths.sort();
    assert_eq!(paths, ["one", "one/a", "one/a/x", "one/a/y", "one/b", "two", "two/c", "two/c/z", "two/d"]);
    drop(m);
    let saved = std::fs::read_dir(cache.path().join("bucketfs-index")).expect("index dir").count();
    assert_eq!(saved, 2, "one saved index per source");
}

/// A name another client created since the last refresh is missing from the index, but
/// creating it through the mount never overwrites the other client's object: the new
/// file is stored only if the key is still free, so `close` fails with EEXIST.
#[test]
fn a_create_over_a_key_the_index_has_not_seen_yet_does_not_overwrite_it() {
    let bucket = create_bucket("idxexcl");
    fill(&bucket, &["d/a".into()]);
    let cache = tempfile::tempdir().expect("cache dir");
    let m = indexed(&bucket, cache.path()).mount();
    refresh(&m);
    put(&bucket, "d/theirs", b"their bytes".to_vec());
    assert!(!ls(&m.join("d")).contains(&"theirs".to_owned()), "not in the index before a refresh");
    let mut file = std::fs::File::create(m.join("d/theirs")).expect("create: the index says the name is free");
    std::io::Write::write_all(&mut file, b"mine").expect("write");
    assert_errno(close(file), libc::EEXIST, "close of a create over a key another client stored");
    assert_eq!(get(&bucket, "d/theirs"), b"their bytes", "their object stays");
}

/// An indexed directory's listing is kept by the kernel: a walk done again sends no
/// READDIR(PLUS); a change through the mount shows at once (the kernel drops its copy of
/// the directory it changed); a key added behind the mount shows after a refresh.
#[test]
fn a_walk_done_again_is_served_by_the_kernel() {
    let bucket = create_bucket("index-kernel-cache");
    let keys: Vec<String> = (0..30).map(|i| format!("d{}/e{}/f{i}", i % 3, i % 5)).collect();
    fill(&bucket, &keys);
    let cache = tempfile::tempdir().expect("cache dir");
    let address = format!("127.0.0.1:{}", free_port());
    let m = indexed(&bucket, cache.path()).args(["--metrics-addr", &address]).mount();
    refresh(&m);
    let readdirs = || {
        let samples = scrape(&address);
        value(&samples, r#"bucketfs_fuse_requests_total{op="readdirplus"}"#)
            + value(&samples, r#"bucketfs_fuse_requests_total{op="readdir"}"#)
    };
    let first = find_names(&m);
    let before = readdirs();
    assert!(before > 0.0, "the first walk reads the directories");
    assert_eq!(find_names(&m), first);
    assert_eq!(readdirs(), before, "the second walk is answered by the kernel");
    // Every directory is in the index: the kernel opens them without asking (one OPENDIR,
    // answered ENOSYS, for the whole mount).
    let opendirs = value(&scrape(&address), r#"bucketfs_fuse_requests_total{op="opendir"}"#);
    assert_eq!(opendirs, 1.0, "directories opened through OPENDIR");

    std::fs::write(m.join("d0/new"), b"x").expect("create through the mount");
    assert_eq!(find_names(&m), first + 1, "a name created through the mount shows at once");
    put(&bucket, "d1/behind", b"y".to_vec());
    assert_eq!(find_names(&m), first + 1, "not before a refresh");
    refresh(&m);
    assert_eq!(find_names(&m), first + 2, "after a refresh");
}

/// Directories of an indexed mount are read without handles (fs/dirs.rs): with more such
/// reads in progress at once than the daemon keeps cursors for (64), a read whose cursor
/// was dropped goes on where it was, and every directory lists each of its names once.
#[test]
fn interleaved_directory_reads_each_list_every_name_once() {
    let bucket = create_bucket("idxinterleave");
    // Long names: a first READDIRPLUS (32 KiB) holds about 90 of each directory's 100.
    let stem = "n".repeat(200);
    let keys: Vec<String> =
        (0..70).flat_map(|d| (0..100).map(move |f| format!("d{d:02}/{}{f:03}", "n".repeat(200)))).collect();
    fill(&bucket, &keys);
    let cache = tempfile::tempdir().expect("cache dir");
    let m = indexed(&bucket, cache.path()).mount();
    refresh(&m);
    let name =
        |entry: std::io::Result<std::fs::DirEntry>| entry.expect("entry").file_name().into_string().expect("utf-8");
    let mut readers: Vec<_> =
        (0..70).map(|d| std::fs::read_dir(m.join(format!("d{d:02}"))).expect("opendir")).collect();
    // One name from each: every read has had its first reply and is in progress.
    let mut seen: Vec<Vec<String>> = readers.iter_mut().map(|r| vec![name(r.next().expect("a first name"))]).collect();
    for (reader, names) in readers.into_iter().zip(&mut seen) {
        names.extend(reader.map(name));
    }
    for (d, names) in seen.iter().enumerate() {
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        let expected: Vec<String> = (0..100).map(|f| format!("{stem}{f:03}")).collect();
        let missing = expected.iter().filter(|n| unique.binary_search(n).is_err()).count();
        assert!(unique == expected, "d{d:02}: {missing} names missing, {} listed", unique.len());
        assert_eq!(names.len(), 100, "d{d:02}: a name listed twice");
    }
}
