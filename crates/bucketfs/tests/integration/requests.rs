//! The S3 requests behind file operations, observed through bucketfs's own request log
//! against MinIO (docs/SEMANTICS.md: listings carry attributes, random reads fetch what they ask for,
//! sequential reads fetch every byte about once).

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};

use crate::common::*;

fn get_bytes_for(m: &Mount, key: &str) -> (usize, u64) {
    let gets: Vec<_> = m.s3_requests().into_iter().filter(|r| r.op == "GET" && r.key == key).collect();
    (gets.len(), gets.iter().map(|r| r.range.map_or(0, |(_, len)| len)).sum())
}

/// `stat` of every entry after a directory listing. A plain S3 listing carries no
/// metadata, so each entry's stored attributes cost one HEAD (fetched in parallel
/// batches), never more, and nothing else: that is the path of every server but MinIO,
/// taken here with `--no-listing-metadata`. MinIO lists the metadata too when asked (its
/// `metadata=true` extension): then the files' metadata comes with one LIST of the
/// directory (after the first file or two, fetched alone, as without); a sub-directory,
/// listed as a common prefix, still costs the HEAD of its marker. With
/// `--attributes-from-listing`, the listing answers alone, without the stored attributes.
#[test]
fn stat_after_listing_costs_one_head_per_entry_at_most() {
    let bucket = create_bucket("rq");
    let mut objects: Vec<_> = (0..50).map(|i| (format!("d/f{i:02}"), vec![b'x'; i])).collect();
    objects.push(("d/sub/inner".to_owned(), b"i".to_vec()));
    put_many(&bucket, objects, 16);
    {
        let m = MountBuilder::new().bucket(&bucket).mount();
        std::fs::set_permissions(m.join("d/f07"), PermissionsExt::from_mode(0o600)).expect("chmod file");
        std::fs::create_dir(m.join("d/made")).expect("mkdir");
        std::fs::set_permissions(m.join("d/made"), PermissionsExt::from_mode(0o700)).expect("chmod dir");
    }
    for mode in ["--no-listing-metadata", "listing metadata", "--attributes-from-listing"] {
        let mut builder = MountBuilder::new().bucket(&bucket).request_log();
        if mode.starts_with("--") {
            builder = builder.arg(mode);
        }
        let m = builder.mount();
        let names = ls(&m.join("d"));
        assert_eq!(names.len(), 52);
        let before = m.s3_requests().len();
        for n in &names {
            let md = std::fs::metadata(m.join("d").join(n)).expect("stat");
            if let Some(number) = n.strip_prefix('f') {
                let i: usize = number.parse().expect("number");
                assert_eq!(md.len(), i as u64, "size of d/{n}");
            }
            let stored = match n.as_str() {
                "f07" => Some(0o100600),
                "made" => Some(0o40700),
                _ => None,
            };
            if let (Some(stored), false) = (stored, mode == "--attributes-from-listing") {
                assert_eq!(md.mode(), stored, "{mode}: the stored mode of d/{n}");
            }
        }
        let sent: Vec<S3Request> = m.s3_requests()[before..].to_vec();
        let describe = || sent.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>().join("\n");
        if mode == "--attributes-from-listing" {
            assert!(sent.is_empty(), "{mode}: stat after a listing sent S3 requests:\n{}", describe());
            continue;
        }
        if mode == "listing metadata" {
            let count =
                |op: &str, dirs: bool| sent.iter().filter(|r| r.op == op && r.key.ends_with('/') == dirs).count();
            assert_eq!(count("HEAD", true), 2, "{mode}: a HEAD per directory marker:\n{}", describe());
            assert!(count("HEAD", false) <= 2, "{mode}: files fetched one by one:\n{}", describe());
            assert_eq!(count("LIST", true), 1, "{mode}: one LIST for the files' attributes:\n{}", describe());
            assert_eq!(sent.len(), 3 + count("HEAD", false), "{mode}: nothing else:\n{}", describe());
            continue;
        }
        assert!(sent.iter().all(|r| r.op == "HEAD"), "only HEADs expected:\n{}", describe());
        let mut keys: Vec<&str> = sent.iter().map(|r| r.key.as_str()).collect();
        keys.sort_unstable();
        let count = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), count, "an entry was fetched twice:\n{}", describe());
        assert_eq!(count, 52, "one HEAD per entry (the directories' markers included):\n{}", describe());
    }
    // A directory looked up by name: the LIST that finds it shows its marker, with the
    // marker's metadata on MinIO, so no HEAD of the marker follows.
    let m = MountBuilder::new().bucket(&bucket).request_log().mount();
    let before = m.s3_requests().len();
    assert_eq!(std::fs::metadata(m.join("d/made")).expect("stat").mode(), 0o40700);
    let sent: Vec<S3Request> = m.s3_requests()[before..].to_vec();
    assert!(!sent.iter().any(|r| r.key == "d/made/" && r.op == "HEAD"), "the marker was HEADed: {sent:?}");
}

/// A small read in the middle of a big object is a small ranged GET, not a part or the whole
/// object.
/// Reading small files one after another (`grep -r`, `cat *`). Where the listing
/// carries no metadata (`--no-listing-metadata`, every server but MinIO): once one file
/// of the directory was opened, the metadata of the others is fetched with a GET that
/// brings the content too, and their open and read send nothing more; the first file
/// costs a HEAD and a GET, as does a file larger than 64 KiB. Where it does (MinIO), the
/// same: the GETs that bring the content along beat one LIST of the metadata followed
/// by a GET at each open (`grep -r` twice as fast).
#[test]
fn small_files_are_read_with_their_metadata() {
    let bucket = create_bucket("rq-small");
    let mut objects: Vec<_> = (0..40).map(|i| (format!("d/f{i:02}"), gen_data(i, 1 + i as usize * 1500))).collect();
    objects.push(("d/large".to_owned(), gen_data(99, 100_000)));
    put_many(&bucket, objects.clone(), 16);
    for listing_metadata in [false, true] {
        let mut builder = MountBuilder::new().bucket(&bucket).request_log();
        if !listing_metadata {
            builder = builder.arg("--no-listing-metadata");
        }
        let m = builder.mount();
        assert_eq!(ls(&m.join("d")).len(), 41);
        let before = m.s3_requests().len();
        for (key, data) in &objects {
            let read = std::fs::read(m.join(key)).expect("read");
            assert_same_bytes(&read, data, key);
        }
        let sent: Vec<S3Request> = m.s3_requests()[before..].to_vec();
        let describe = || sent.iter().map(|r| format!("{r:?}")).collect::<Vec<_>>().join("\n");
        let ops_on = |key: &str| sent.iter().filter(|r| r.key == key).map(|r| r.op.as_str()).collect::<Vec<_>>();
        let large = ops_on("d/large");
        assert_eq!(ops_on("d/f00"), ["HEAD", "GET"], "the first file read:\n{}", describe());
        for (key, _) in &objects[1..40] {
            assert_eq!(ops_on(key), ["GET-SMALL"], "{key}: one request:\n{}", describe());
        }
        assert_eq!(large.first(), Some(&"HEAD"), "{}", describe());
        assert!(large.len() > 1 && large[1..].iter().all(|op| *op == "GET"), "{}", describe());
    }
}

/// Random 256 KiB reads through the page cache (buffered `pread`, fio's `randread`
/// shape) cost one GET each: the mount's read-ahead is raised to 1 MiB, so the kernel
/// hands each read over whole. With the kernel's 128 KiB it came in two pieces, the
/// second looked sequential and started read-ahead: ten GETs and 40 times the bytes.
#[test]
fn random_buffered_reads_cost_one_get_each() {
    let bucket = create_bucket("rq-rand");
    let size = 64 * MIB;
    let data = gen_data(7, size);
    put(&bucket, "big", data.clone());
    let m = MountBuilder::new().bucket(&bucket).request_log().mount();
    let device = std::fs::metadata(m.path()).expect("stat mount").dev();
    let setting = format!("/sys/class/bdi/{}:{}/read_ahead_kb", libc::major(device), libc::minor(device));
    assert_eq!(std::fs::read_to_string(&setting).expect("read-ahead setting").trim(), "1024", "{setting}");
    let f = File::open(m.join("big")).expect("open");
    let before = m.s3_requests().len();
    let mut rng = Rng::new(11);
    let reads = 40;
    for _ in 0..reads {
        let offset = rng.below(((size - 256 * KIB) / 4096) as u64) * 4096;
        let got = read_at(&f, offset, 256 * KIB).expect("pread");
        let at = offset as usize;
        assert_same_bytes(&got, &data[at..at + 256 * KIB], "256 KiB at a random offset");
    }
    std::thread::sleep(std::time::Duration::from_millis(300)); // let any read-ahead show up
    let gets: Vec<S3Request> = m.s3_requests()[before..].iter().filter(|r| r.op == "GET").cloned().collect();
    let fetched: u64 = gets.iter().map(|r| r.range.map_or(0, |(_, len)| len)).sum();
    assert!(gets.len() <= reads + 2, "{} GETs for {reads} random reads: {gets:?}", gets.len());
    assert!(fetched <= (reads as u64 + 2) * 256 * KIB as u64, "{fetched} bytes fetched for {reads} reads of 256 KiB");
}

#[test]
fn small_random_read_fetches_little() {
    let bucket = create_bucket("rq");
    let size = 32 * MIB;
    let data = gen_data(42, size);
    put(&bucket, "big", data.clone());
    let m = MountBuilder::new().bucket(&bucket).request_log().mount();

    let f = File::open(m.join("big")).unwrap();
    let off = 20 * MIB + 12_345;
    let got = read_at(&f, off as u64, 100).unwrap();
    assert_same_bytes(&got, &data[off..off + 100], "100 bytes at 20 MiB");
    std::thread::sleep(std::time::Duration::from_millis(300)); // let any read-ahead show up
    let (n, bytes) = get_bytes_for(&m, "big");
    assert!(n >= 1 && bytes <= MIB as u64, "a 100-byte read fetched {bytes} bytes in {n} GETs:\n{}", m.diagnostics());
}

/// Reading a file from start to end fetches every byte about once (read-ahead must not
/// re-download ranges).
#[test]
fn sequential_read_fetches_each_byte_about_once() {
    let bucket = create_bucket("rq");
    let size = 24 * MIB + 5;
    let data = gen_data(43, size);
    put(&bucket, "seq", data.clone());
    put(&bucket, "seq4k", data[..8 * MIB].to_vec());
    let m = MountBuilder::new().bucket(&bucket).args(["--part-size", "1MiB"]).request_log().mount();

    assert_file_content(&m.join("seq"), MIB, &data);
    let (n, bytes) = get_bytes_for(&m, "seq");
    assert!(
        bytes >= size as u64 && bytes <= (size + MIB) as u64,
        "reading {size} bytes sequentially fetched {bytes} bytes in {n} GETs:\n{}",
        m.diagnostics()
    );

    assert_file_content(&m.join("seq4k"), 4 * KIB, &data[..8 * MIB]);
    let (n, bytes) = get_bytes_for(&m, "seq4k");
    assert!(
        bytes >= (8 * MIB) as u64 && bytes <= (9 * MIB) as u64,
        "reading 8 MiB with 4 KiB reads fetched {bytes} bytes in {n} GETs:\n{}",
        m.diagnostics()
    );
}

/// Within the metadata TTL, listing a directory again and looking up a name that the
/// listing did not contain are answered from memory.
#[test]
fn relisting_and_missing_names_send_no_requests() {
    let bucket = create_bucket("rq");
    put_many(&bucket, (0..30).map(|i| (format!("d/f{i:02}"), vec![b'x'; 3])).collect(), 16);
    let m = MountBuilder::new().bucket(&bucket).args(["--metadata-ttl", "60"]).request_log().mount();
    let first = ls(&m.join("d"));
    assert_eq!(first.len(), 30);
    let before = m.s3_requests().len();
    assert_eq!(ls(&m.join("d")), first);
    assert_errno(std::fs::metadata(m.join("d/not-there")), libc::ENOENT, "stat of a missing name");
    let after = m.s3_requests();
    assert_eq!(after.len(), before, "requests after the first listing: {:?}", &after[before..]);
}

/// `rmdir` of a directory listed whole within the TTL and emptied since through this mount
/// lists nothing again: the mount knows it is empty (as `rm -r` does it, after its walk).
/// What it sends is the delete of the marker.
#[test]
fn rmdir_of_a_directory_emptied_here_sends_no_list() {
    let bucket = create_bucket("rq");
    put_many(&bucket, vec![("d/".into(), Vec::new()), ("d/a".into(), b"a".to_vec()), ("d/b".into(), b"b".to_vec())], 4);
    let m = MountBuilder::new().bucket(&bucket).args(["--metadata-ttl", "60"]).request_log().mount();
    assert_eq!(ls(&m.join("d")).len(), 2);
    std::fs::remove_file(m.join("d/a")).expect("unlink a");
    std::fs::remove_file(m.join("d/b")).expect("unlink b");
    let before = m.s3_requests().len();
    std::fs::remove_dir(m.join("d")).expect("rmdir");
    let after = m.s3_requests();
    let ops: Vec<_> = after[before..].iter().map(|r| format!("{} {}", r.op, r.key)).collect();
    assert_eq!(ops, ["DELETE d/"], "what rmdir sent");
    drop(m);
    assert_eq!(list_keys(&bucket, ""), Vec::<String>::new());
}

/// Opening a file whose metadata is fresh costs no request, and the first read of it
/// (O_DIRECT, as a time-to-first-byte probe) costs one ranged GET of what it asks for.
#[test]
fn open_of_a_fresh_file_costs_nothing_and_its_first_read_one_get() {
    let bucket = create_bucket("rq-open");
    let data = gen_data(3, 4 * MIB);
    put(&bucket, "f", data.clone());
    let m = MountBuilder::new().bucket(&bucket).args(["--metadata-ttl", "60"]).request_log().mount();
    std::fs::metadata(m.join("f")).expect("stat");
    for round in 0..3u64 {
        let before = m.s3_requests().len();
        let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(m.join("f")).expect("open");
        let sent = m.s3_requests()[before..].to_vec();
        assert!(sent.is_empty(), "open sent {sent:?}");
        let offset = (round + 1) * MIB as u64;
        let mut buf = AlignedBuffer::new(4096);
        let n = std::os::unix::fs::FileExt::read_at(&f, buf.bytes(), offset).expect("read");
        assert_eq!(&buf.bytes()[..n], &data[offset as usize..offset as usize + n]);
        drop(f);
        let sent = m.s3_requests()[before..].to_vec();
        assert_eq!(sent.len(), 1, "the first read: {sent:?}");
        assert_eq!((sent[0].op.as_str(), sent[0].range), ("GET", Some((offset, 4096))), "{sent:?}");
    }
}

/// Files created in a directory made through the mount cost no lookup request: the new
/// directory is known to be empty, and creates keep its cached listing complete. Only
/// the uploads go to S3.
#[test]
fn creating_files_in_a_new_directory_sends_only_uploads() {
    let bucket = create_bucket("rq");
    let m = MountBuilder::new().bucket(&bucket).request_log().mount();
    std::fs::create_dir(m.join("fresh")).expect("mkdir");
    let before = m.s3_requests().len();
    for i in 0..20 {
        std::fs::write(m.join(format!("fresh/f{i:02}")), b"x").expect("write");
    }
    assert_eq!(ls(&m.join("fresh")).len(), 20);
    let sent: Vec<S3Request> = m.s3_requests()[before..].to_vec();
    let other: Vec<&S3Request> = sent.iter().filter(|r| r.op != "PUT").collect();
    assert!(other.is_empty(), "requests besides the uploads: {other:?}");
    assert_eq!(sent.len(), 20, "one PUT per file: {sent:?}");
}
