//! `--fuse-transport`: with `uring`, the kernel carries requests over io_uring (one queue
//! per CPU) and every operation the mount serves works that way, passthrough included;
//! `auto` follows the kernel's switch; `dev-fuse` keeps requests on /dev/fuse. Each test
//! holds the kernel's switch (the whole machine's) and puts it back as it found it.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use common::*;

const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";
const RING_REQUESTS: &str = "bucketfs_fuse_ring_requests_total";
const NAMES_ONLY: &str = "bucketfs_fuse_names_only_entries_total";
const LOOKUPS: &str = "bucketfs_fuse_requests_total{op=\"lookup\"}";

/// The kernel's switch, held by one test at a time and set back as found.
struct KernelSwitch {
    found: String,
    _one_test_at_a_time: MutexGuard<'static, ()>,
}

fn kernel_switch(value: &str) -> KernelSwitch {
    static HELD: Mutex<()> = Mutex::new(());
    let held = HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let found = std::fs::read_to_string(SWITCH)
        .unwrap_or_else(|e| panic!("{SWITCH}: {e} (FUSE over io_uring needs Linux 6.14 or later)"));
    std::fs::write(SWITCH, value).unwrap_or_else(|e| panic!("set {SWITCH} to {value}: {e} (needs root)"));
    KernelSwitch { found: found.trim().to_owned(), _one_test_at_a_time: held }
}

impl Drop for KernelSwitch {
    fn drop(&mut self) {
        let _ = std::fs::write(SWITCH, &self.found);
    }
}

fn switch_now() -> String {
    std::fs::read_to_string(SWITCH).expect("read the switch").trim().to_owned()
}

fn mount_with(bucket: &str, transport: &str, metrics: &str, extra: &[&str]) -> Mount {
    MountBuilder::new()
        .bucket(bucket)
        .args(["--fuse-transport", transport, "--metrics-addr", metrics])
        .args(extra.iter().copied())
        .request_log()
        .mount()
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("no NUL")
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (path, name) = (c_path(path), CString::new(name).expect("no NUL"));
    // SAFETY: valid NUL-terminated strings and a live buffer of the given length.
    match unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (path, name) = (c_path(path), CString::new(name).expect("no NUL"));
    let mut buffer = vec![0u8; 4096];
    // SAFETY: as above; the kernel writes at most `buffer.len()` bytes.
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buffer.truncate(n as usize);
    Ok(buffer)
}

fn list_xattr(path: &Path) -> std::io::Result<Vec<u8>> {
    let path = c_path(path);
    let mut buffer = vec![0u8; 4096];
    // SAFETY: as above.
    let n = unsafe { libc::listxattr(path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buffer.truncate(n as usize);
    Ok(buffer)
}

fn remove_xattr(path: &Path, name: &str) -> std::io::Result<()> {
    let (path, name) = (c_path(path), CString::new(name).expect("no NUL"));
    // SAFETY: as above.
    match unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Every kind of request the mount serves, through the ring: the kernel's switch is off,
/// `uring` turns it on; each operation gives what it gives on /dev/fuse, and the store
/// holds the result; nearly every request the daemon counted came over the ring.
#[test]
fn every_operation_works_over_io_uring() {
    let _switch = kernel_switch("N");
    let bucket = create_bucket("ring-ops");
    put(&bucket, "stored.bin", gen_data(1, 5 * MIB));
    let metrics = format!("127.0.0.1:{}", free_port());
    let m = mount_with(&bucket, "uring", &metrics, &[]);
    assert_eq!(switch_now(), "Y", "uring turns the kernel's switch on");
    // Said once the queues are registered, just after the mount shows.
    let on_the_ring = || m.log_text().contains("FUSE requests go over io_uring");
    assert!(wait_until(Duration::from_secs(10), on_the_ring), "{}", m.log_text());
    let before = scrape(&metrics);

    // Reads: a stored object, sequentially and at an offset.
    assert_file_content(&m.join("stored.bin"), MIB, &gen_data(1, 5 * MIB));
    let file = std::fs::File::open(m.join("stored.bin")).expect("open");
    assert_eq!(read_at(&file, 3 * MIB as u64 + 7, 100).expect("pread"), gen_data(1, 5 * MIB)[3 * MIB + 7..][..100]);
    drop(file);

    // Directories, files written in large and small pieces, listings, attributes.
    std::fs::create_dir(m.join("d")).expect("mkdir");
    let data = gen_data(2, 3 * MIB + 123);
    std::fs::write(m.join("d/f"), &data).expect("write 3 MiB");
    assert_same_bytes(&get(&bucket, "d/f"), &data, "stored through the ring");
    assert_file_content(&m.join("d/f"), 128 * KIB, &data);
    assert_eq!(std::fs::metadata(m.join("d/f")).expect("stat").len(), data.len() as u64);
    let names: Vec<String> = (0..300).map(|i| format!("n{i:03}")).collect();
    for name in &names {
        std::fs::write(m.join("d").join(name), name.as_bytes()).expect("small file");
    }
    let mut listed = ls(&m.join("d"));
    listed.retain(|name| name != "f");
    assert_eq!(listed, names, "a listing of several READDIRPLUS answers");
    std::fs::set_permissions(m.join("d/f"), std::fs::Permissions::from_mode(0o640)).expect("chmod");
    assert_eq!(std::fs::metadata(m.join("d/f")).expect("stat").permissions().mode() & 0o777, 0o640);
    let mtime = UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    set_times_by_name(&m.join("d/f"), mtime).expect("utimensat");
    assert_eq!(std::fs::metadata(m.join("d/f")).expect("stat").modified().expect("mtime"), mtime);

    // Changed in place: an offset write, a truncate, fsync.
    let file = std::fs::OpenOptions::new().read(true).write(true).open(m.join("d/f")).expect("open rw");
    file.write_all_at(b"XYZ", 10).expect("pwrite");
    file.set_len(1000).expect("ftruncate");
    file.sync_all().expect("fsync");
    drop(file);
    let mut expected = data[..1000].to_vec();
    expected[10..13].copy_from_slice(b"XYZ");
    assert_same_bytes(&get(&bucket, "d/f"), &expected, "changed in place");

    // Names: rename, symlink, a FIFO, a copy, extended attributes.
    std::fs::rename(m.join("d/f"), m.join("d/g")).expect("rename");
    assert!(!m.join("d/f").exists() && m.join("d/g").exists());
    std::os::unix::fs::symlink("g", m.join("d/link")).expect("symlink");
    assert_eq!(std::fs::read_link(m.join("d/link")).expect("readlink"), Path::new("g"));
    assert_eq!(std::fs::read(m.join("d/link")).expect("through the link"), expected);
    nix::unistd::mkfifo(&m.join("d/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    assert!(std::fs::symlink_metadata(m.join("d/fifo")).expect("stat").file_type().is_fifo());
    std::fs::copy(m.join("d/g"), m.join("d/copy")).expect("copy");
    assert_eq!(get(&bucket, "d/copy"), expected);
    set_xattr(&m.join("d/g"), "user.color", b"blue").expect("setxattr");
    assert_eq!(get_xattr(&m.join("d/g"), "user.color").expect("getxattr"), b"blue");
    assert!(list_xattr(&m.join("d/g")).expect("listxattr").windows(10).any(|w| w == b"user.color"));
    remove_xattr(&m.join("d/g"), "user.color").expect("removexattr");
    assert_errno(get_xattr(&m.join("d/g"), "user.color"), libc::ENODATA, "removed attribute");
    let statfs = nix::sys::statvfs::statvfs(m.path()).expect("statfs");
    assert!(statfs.blocks() > 0);

    // Errors come back as errors; deletes reach the store.
    assert_errno(std::fs::metadata(m.join("missing")), libc::ENOENT, "a missing name");
    assert_errno(std::fs::remove_dir(m.join("d")), libc::ENOTEMPTY, "rmdir of a full directory");
    for name in &names {
        std::fs::remove_file(m.join("d").join(name)).expect("unlink");
    }
    for name in ["g", "link", "fifo", "copy"] {
        std::fs::remove_file(m.join("d").join(name)).expect("unlink");
    }
    std::fs::remove_dir(m.join("d")).expect("rmdir");
    assert_eq!(list_keys(&bucket, "d"), Vec::<String>::new());
    assert_eq!(std::fs::metadata(m.path()).expect("stat the root").mode() & libc::S_IFMT, libc::S_IFDIR);

    let after = scrape(&metrics);
    let moved = |sample: &str| value(&after, sample) - value(&before, sample);
    let all: f64 = after
        .iter()
        .filter(|(name, _)| name.starts_with("bucketfs_fuse_requests_total{") && !name.contains("forget"))
        .map(|(name, count)| count - value(&before, name))
        .sum();
    let ring = moved(RING_REQUESTS);
    assert!(all > 1000.0, "requests counted: {all}");
    assert!(ring >= 0.95 * all, "{ring} of {all} requests came over the ring");
}

/// `dev-fuse` keeps every request on /dev/fuse even where the kernel would carry them
/// over io_uring; `auto` takes the ring where the switch is on, and /dev/fuse where not.
#[test]
fn the_transport_follows_the_option_and_the_kernel_switch() {
    let bucket = create_bucket("ring-choice");
    let data = gen_data(3, MIB);
    let cases = [("Y", "dev-fuse", false), ("Y", "auto", true), ("N", "auto", false)];
    for (switch, transport, over_the_ring) in cases {
        let _switch = kernel_switch(switch);
        let metrics = format!("127.0.0.1:{}", free_port());
        let m = mount_with(&bucket, transport, &metrics, &[]);
        std::fs::write(m.join("f"), &data).expect("write");
        assert_file_content(&m.join("f"), 64 * KIB, &data);
        let ring = value(&scrape(&metrics), RING_REQUESTS);
        assert_eq!(ring > 0.0, over_the_ring, "switch {switch}, --fuse-transport {transport}: {ring} over the ring");
        assert_eq!(switch_now(), switch, "only uring changes the switch");
    }
}

/// With a data cache, a file whole in it is passed through to the cache file (the open
/// answered over the ring carries the backing file's id) and reads right; writing it
/// afterwards works once the reader closed.
#[test]
fn files_whole_in_the_data_cache_are_passed_through_over_io_uring() {
    const PASSED: &str = "open: passthrough to the data cache";
    let _switch = kernel_switch("Y");
    let bucket = create_bucket("ring-passthrough");
    let data = gen_data(4, 4 * MIB);
    put(&bucket, "f", data.clone());
    let cache = tempfile::tempdir().expect("cache dir");
    let metrics = format!("127.0.0.1:{}", free_port());
    let cache_arg = cache.path().to_str().expect("utf-8").to_owned();
    let m = mount_with(&bucket, "uring", &metrics, &["--cache", &cache_arg]);
    assert_file_content(&m.join("f"), MIB, &data);
    let checked = || m.log_text().contains("object whole and checked");
    assert!(wait_until(Duration::from_secs(20), checked), "never checked whole");
    let mut opens = 0;
    while !m.log_text().contains(PASSED) && opens < 20 {
        assert_file_content(&m.join("f"), MIB, &data);
        opens += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(m.log_text().contains(PASSED), "an open after the first's release passes through");
    assert_file_content(&m.join("f"), MIB, &data);
    let new = gen_data(5, MIB);
    std::fs::write(m.join("f"), &new).expect("rewrite once the readers closed");
    assert_same_bytes(&get(&bucket, "f"), &new, "the object after the rewrite");
    assert!(value(&scrape(&metrics), RING_REQUESTS) > 0.0);
}

/// Where io_uring is refused (as in containers that turn it off), `uring` says so in the
/// log and the mount serves everything through /dev/fuse: nothing waits for a ring that
/// never starts.
#[test]
fn a_ring_that_cannot_start_leaves_requests_on_dev_fuse() {
    const DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";
    let _switch = kernel_switch("Y");
    let found = std::fs::read_to_string(DISABLED).expect("read io_uring_disabled");
    std::fs::write(DISABLED, "2").expect("turn io_uring off");
    let bucket = create_bucket("ring-refused");
    let metrics = format!("127.0.0.1:{}", free_port());
    let m = mount_with(&bucket, "uring", &metrics, &[]);
    let said = || m.log_text().contains("FUSE over io_uring could not start");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(wait_until(Duration::from_secs(10), said), "{}", m.log_text());
        let data = gen_data(6, 2 * MIB);
        std::fs::write(m.join("f"), &data).expect("write");
        assert_file_content(&m.join("f"), 64 * KIB, &data);
        assert_eq!(value(&scrape(&metrics), RING_REQUESTS), 0.0);
    }));
    std::fs::write(DISABLED, found.trim()).expect("put io_uring_disabled back");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Queues that cannot start after the kernel was asked for the ring (here refused by a
/// test knob just before they would register): the daemon tells the kernel, which goes on
/// through /dev/fuse instead of holding requests for a ring that never comes.
#[test]
fn queues_that_cannot_start_hand_requests_back_to_dev_fuse() {
    let _switch = kernel_switch("Y");
    let bucket = create_bucket("ring-gave-up");
    let metrics = format!("127.0.0.1:{}", free_port());
    let m = MountBuilder::new()
        .bucket(&bucket)
        .args(["--fuse-transport", "uring", "--metrics-addr", &metrics])
        .env("BUCKETFS_TEST_RING_REFUSED", "1")
        .request_log()
        .mount();
    let said = || m.log_text().contains("FUSE over io_uring could not start");
    assert!(wait_until(Duration::from_secs(10), said), "{}", m.log_text());
    let data = gen_data(7, MIB);
    std::fs::write(m.join("f"), &data).expect("write");
    assert_file_content(&m.join("f"), 64 * KIB, &data);
    assert_eq!(value(&scrape(&metrics), RING_REQUESTS), 0.0);
}

/// The kernel's switch turned off while a mount is served over the ring (another program
/// setting it back, as the bench does at its end): the mount keeps its ring and answers.
#[test]
fn turning_the_switch_off_leaves_a_mounted_ring_serving() {
    let _switch = kernel_switch("Y");
    let bucket = create_bucket("ring-switch-off");
    let metrics = format!("127.0.0.1:{}", free_port());
    let m = mount_with(&bucket, "uring", &metrics, &[]);
    let on_the_ring = || m.log_text().contains("FUSE requests go over io_uring");
    assert!(wait_until(Duration::from_secs(10), on_the_ring), "{}", m.log_text());
    std::fs::write(SWITCH, "N").expect("switch off");
    let before = value(&scrape(&metrics), RING_REQUESTS);
    for i in 0..50 {
        let data = gen_data(i, 10 * KIB);
        std::fs::write(m.join(format!("f{i}")), &data).expect("write");
        assert_eq!(std::fs::read(m.join(format!("f{i}"))).expect("read"), data);
    }
    assert!(value(&scrape(&metrics), RING_REQUESTS) - before >= 200.0, "still over the ring");
}

/// Over either transport, a walk that only wants names (`find -name`) gets its files as
/// names only from its second directory on, with every name found; a walk that stats what
/// it lists (`find -printf %s`) is told by its first LOOKUP of such a name and gets whole
/// entries after it, with the right sizes; a name given alone keeps its inode number.
#[test]
fn a_walk_that_does_not_stat_gets_names_only_and_one_that_does_gets_whole_entries() {
    let _switch = kernel_switch("Y");
    names_only_walks("uring");
}

#[test]
fn a_walk_that_does_not_stat_gets_names_only_on_dev_fuse_too() {
    names_only_walks("dev-fuse");
}

/// Waits until the mount's requests go over the ring, if that is the transport asked for.
fn wait_for_transport(m: &Mount, transport: &str) {
    if transport == "uring" {
        let on_the_ring = || m.log_text().contains("FUSE requests go over io_uring");
        assert!(wait_until(Duration::from_secs(10), on_the_ring), "{}", m.log_text());
    }
}

fn names_only_walks(transport: &str) {
    let bucket = create_bucket("names-only");
    let (dirs, files) = (20, 10);
    let mut objects = Vec::new();
    for tree in ["names", "sizes", "inodes"] {
        for d in 0..dirs {
            for f in 0..files {
                objects.push((format!("{tree}/d{d:02}/f{f}.txt"), vec![b'x'; d * files + f]));
            }
        }
    }
    put_many(&bucket, objects, 16);
    let metrics = format!("127.0.0.1:{}", free_port());
    let m = mount_with(&bucket, transport, &metrics, &[]);
    wait_for_transport(&m, transport);
    let find = |args: &[&str]| {
        let out = std::process::Command::new("find").args(args).output().expect("run find");
        assert!(out.status.success(), "find {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let mut lines: Vec<String> = String::from_utf8(out.stdout).expect("utf-8").lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    let expected = |tree: &str, line: &dyn Fn(usize, usize, String) -> String| {
        let mut lines: Vec<String> = (0..dirs)
            .flat_map(|d| (0..files).map(move |f| (d, f)))
            .map(|(d, f)| line(d, f, m.join(format!("{tree}/d{d:02}/f{f}.txt")).display().to_string()))
            .collect();
        lines.sort();
        lines
    };

    let before = scrape(&metrics);
    let found = find(&[m.join("names").to_str().expect("utf-8"), "-name", "*.txt"]);
    assert_eq!(found, expected("names", &|_, _, path| path), "every name found");
    let after = scrape(&metrics);
    let moved = |sample: &str| value(&after, sample) - value(&before, sample);
    // Its first listing is names/ (directories only): every file of d00..d19 goes alone.
    assert_eq!(moved(NAMES_ONLY), (dirs * files) as f64, "find -name: all {} files as names only", dirs * files);
    // (LOOKUPs of directories may come: those whose markers' attributes are not known.)
    assert!(moved(LOOKUPS) <= (dirs + 5) as f64, "and no LOOKUP of them: {}", moved(LOOKUPS));

    let before = scrape(&metrics);
    let sizes = find(&[m.join("sizes").to_str().expect("utf-8"), "-type", "f", "-printf", "%s %p\n"]);
    assert_eq!(sizes, expected("sizes", &|d, f, path| format!("{} {path}", d * files + f)), "stat of every file");
    let after = scrape(&metrics);
    let moved = |sample: &str| value(&after, sample) - value(&before, sample);
    // d00 goes as names only; the lookups of its files say this walk stats. (Files listed
    // from the store are looked up anyway: a listing does not give their metadata.)
    assert_eq!(moved(NAMES_ONLY), files as f64, "find -printf %s: one directory as names only");

    // This thread: the first listing whole, the second as names only; a name given alone
    // has the inode number its stat shows.
    let listed = |dir: &str| -> Vec<(String, u64)> {
        let mut entries: Vec<(String, u64)> = std::fs::read_dir(m.join(dir))
            .expect("read_dir")
            .map(|entry| entry.expect("entry"))
            .map(|entry| (entry.file_name().into_string().expect("utf-8"), std::os::unix::fs::DirEntryExt::ino(&entry)))
            .collect();
        entries.sort();
        entries
    };
    let before = value(&scrape(&metrics), NAMES_ONLY);
    listed("inodes/d00");
    assert_eq!(value(&scrape(&metrics), NAMES_ONLY) - before, 0.0, "a caller's first listing is whole");
    for (name, ino) in listed("inodes/d01") {
        let path = m.join(format!("inodes/d01/{name}"));
        assert_eq!(std::fs::metadata(&path).expect("stat").ino(), ino, "{name}: d_ino is st_ino");
        assert_eq!(
            std::fs::read(&path).expect("read").len(),
            10 + name[1..name.len() - 4].parse::<usize>().expect("n")
        );
    }
    assert_eq!(value(&scrape(&metrics), NAMES_ONLY) - before, files as f64, "the second as names only");
    drop(m);

    let metrics = format!("127.0.0.1:{}", free_port());
    let m = mount_with(&bucket, transport, &metrics, &["--whole-listings"]);
    let out = std::process::Command::new("find").arg(m.join("names")).args(["-name", "*.txt"]).output().expect("find");
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), dirs * files);
    assert_eq!(value(&scrape(&metrics), NAMES_ONLY), 0.0, "--whole-listings: every entry whole");
}

/// With `--index` the kernel keeps every listing: a `find -name` leaves names-only
/// listings there, and a `find -printf %s` of the same tree afterwards is not left to
/// look up every file. Its first LOOKUP of such a name drops them, so it costs about two
/// directories' LOOKUPs, not one per file.
#[test]
fn a_stat_walk_after_a_names_walk_of_an_indexed_tree_is_not_left_names_only() {
    let _switch = kernel_switch("Y");
    names_walk_then_stat_walk("uring");
}

#[test]
fn a_stat_walk_after_a_names_walk_of_an_indexed_tree_is_not_left_names_only_on_dev_fuse() {
    names_walk_then_stat_walk("dev-fuse");
}

fn names_walk_then_stat_walk(transport: &str) {
    let bucket = create_bucket("names-kept");
    let (dirs, files) = (20, 10);
    let objects = (0..dirs)
        .flat_map(|d| (0..files).map(move |f| (format!("tree/d{d:02}/f{f}.txt"), vec![b'x'; d * files + f])))
        .collect();
    put_many(&bucket, objects, 16);
    let cache = tempfile::tempdir().expect("cache dir");
    let metrics = format!("127.0.0.1:{}", free_port());
    let cache_arg = cache.path().to_str().expect("utf-8").to_owned();
    let m = mount_with(
        &bucket,
        transport,
        &metrics,
        &["--index", "--index-attributes-rate", "0", "--cache-dir", &cache_arg],
    );
    wait_for_transport(&m, transport);
    let refreshed = std::process::Command::new(bucketfs_bin()).arg("refresh").arg(m.path()).output().expect("refresh");
    assert!(refreshed.status.success(), "{}", String::from_utf8_lossy(&refreshed.stderr));
    let tree = m.join("tree").display().to_string();
    let find = |args: &[&str]| {
        let out = std::process::Command::new("find").arg(&tree).args(args).output().expect("run find");
        assert!(out.status.success(), "find {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let mut lines: Vec<String> = String::from_utf8(out.stdout).expect("utf-8").lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };

    let before = scrape(&metrics);
    assert_eq!(find(&["-name", "*.txt"]).len(), dirs * files);
    let given = value(&scrape(&metrics), NAMES_ONLY) - value(&before, NAMES_ONLY);
    assert_eq!(given, (dirs * files) as f64, "find -name: every file as a name only");

    let before = scrape(&metrics);
    let mut expected: Vec<String> = (0..dirs)
        .flat_map(|d| (0..files).map(move |f| (d, f)))
        .map(|(d, f)| format!("{} {tree}/d{d:02}/f{f}.txt", d * files + f))
        .collect();
    expected.sort();
    assert_eq!(find(&["-type", "f", "-printf", "%s %p\n"]), expected, "stat of every file");
    let lookups = value(&scrape(&metrics), LOOKUPS) - value(&before, LOOKUPS);
    assert!(lookups <= (2 * files + dirs + 5) as f64, "{lookups} LOOKUPs for {} files", dirs * files);
}
