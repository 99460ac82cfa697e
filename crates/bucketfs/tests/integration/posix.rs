//! POSIX details kept the way s3fs keeps them (docs/SEMANTICS.md, "Attributes" and
//! "Operations"): special files made by `mknod` are empty objects whose stored mode holds
//! their type; ctime and atime are stored next to the mtime, with nanoseconds; a
//! directory's times change when its entries do; names longer than 255 bytes work up to
//! S3's 1024-byte key limit.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;

fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> std::io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes()).expect("no NUL in the path");
    // SAFETY: a valid NUL-terminated path; mknod only reads it.
    match unsafe { libc::mknod(path.as_ptr(), mode, dev) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn ctime(meta: &std::fs::Metadata) -> SystemTime {
    UNIX_EPOCH + Duration::new(meta.ctime() as u64, meta.ctime_nsec() as u32)
}

fn atime(meta: &std::fs::Metadata) -> SystemTime {
    UNIX_EPOCH + Duration::new(meta.atime() as u64, meta.atime_nsec() as u32)
}

/// A stored time (`x-amz-meta-*time`, seconds with an optional fraction) as a `SystemTime`.
fn stored_time(metadata: &std::collections::HashMap<String, String>, name: &str) -> Option<SystemTime> {
    let value = metadata.get(name)?;
    let (seconds, fraction) = value.split_once('.').unwrap_or((value, ""));
    let nanos = format!("{fraction:0<9}").parse().ok()?;
    Some(UNIX_EPOCH + Duration::new(seconds.parse().ok()?, nanos))
}

fn nap() {
    // Shorter than a second: times must move with nanoseconds, not Last-Modified's seconds.
    std::thread::sleep(Duration::from_millis(20));
}

/// FIFOs, sockets and devices are stored as s3fs stores them, show with their type (and
/// device number) after a remount, follow chmod, rename and unlink, and opening them is
/// the kernel's business (nothing hangs).
#[test]
fn special_files_are_empty_objects_with_their_type_in_the_mode() {
    let b = create_bucket("posix-mknod");
    let m = MountBuilder::new().bucket(&b).mount();
    mknod(&m.join("fifo"), libc::S_IFIFO | 0o640, 0).expect("mkfifo");
    mknod(&m.join("chr"), libc::S_IFCHR | 0o600, libc::makedev(1, 3)).expect("mknod c 1 3");
    mknod(&m.join("blk"), libc::S_IFBLK | 0o600, libc::makedev(7, 0)).expect("mknod b 7 0");
    let socket = std::os::unix::net::UnixListener::bind(m.join("sock")).expect("bind a socket");
    drop(socket);

    let stored = stored_metadata(&b, "fifo");
    assert_eq!(stored.get("mode").map(String::as_str), Some(&*(libc::S_IFIFO | 0o640).to_string()), "{stored:?}");
    assert_eq!(head(&b, "fifo").size, 0);
    let stored = stored_metadata(&b, "chr");
    assert_eq!(stored.get("mode").map(String::as_str), Some(&*(libc::S_IFCHR | 0o600).to_string()));
    assert_eq!(stored.get("rdev").map(String::as_str), Some(&*libc::makedev(1, 3).to_string()), "{stored:?}");
    let sock_mode = stored_metadata(&b, "sock").get("mode").and_then(|m| m.parse::<u32>().ok());
    assert_eq!(sock_mode.map(|m| m & libc::S_IFMT), Some(libc::S_IFSOCK), "bind stores a socket");

    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(ls(m.path()), ["blk", "chr", "fifo", "sock"]);
    let meta = |name: &str| std::fs::symlink_metadata(m.join(name)).expect(name);
    assert!(meta("fifo").file_type().is_fifo());
    assert_eq!(meta("fifo").permissions().mode() & 0o7777, 0o640);
    assert!(meta("sock").file_type().is_socket());
    assert!(meta("chr").file_type().is_char_device());
    assert_eq!(meta("chr").rdev(), libc::makedev(1, 3));
    assert!(meta("blk").file_type().is_block_device());
    assert_eq!(meta("blk").rdev(), libc::makedev(7, 0));
    // d_type once the attributes are known (as `find -type p` after a stat).
    let kinds: Vec<(String, bool)> = std::fs::read_dir(m.path())
        .expect("readdir")
        .map(|e| e.expect("entry"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.file_type().expect("d_type").is_fifo()))
        .collect();
    assert!(kinds.contains(&("fifo".into(), true)), "{kinds:?}");

    // Opening a FIFO without a writer, non-blocking, is answered by the kernel.
    let fifo = m.join("fifo");
    let opened = run_with_timeout("open a FIFO", Duration::from_secs(10), move || {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(fifo).map(drop)
    });
    opened.expect("open FIFO O_RDONLY|O_NONBLOCK");
    // A device on a FUSE mount (nodev) cannot be opened; the answer comes at once.
    let chr = m.join("chr");
    let opened = run_with_timeout("open a device", Duration::from_secs(10), move || std::fs::File::open(chr).map(drop));
    assert!(opened.is_err(), "devices are not usable on a nodev mount");

    std::fs::set_permissions(m.join("fifo"), std::fs::Permissions::from_mode(0o600)).expect("chmod fifo");
    assert_eq!(
        stored_metadata(&b, "fifo").get("mode").map(String::as_str),
        Some(&*(libc::S_IFIFO | 0o600).to_string())
    );
    assert!(meta("fifo").file_type().is_fifo(), "chmod keeps the type");
    std::fs::rename(m.join("chr"), m.join("chr2")).expect("rename a device");
    assert_eq!(stored_metadata(&b, "chr2").get("rdev").map(String::as_str), Some(&*libc::makedev(1, 3).to_string()));
    assert!(meta("chr2").file_type().is_char_device());
    std::fs::remove_file(m.join("blk")).expect("unlink a device");
    assert_eq!(list_keys(&b, ""), ["chr2", "fifo", "sock"]);
    assert_errno(mknod(&m.join("fifo"), libc::S_IFIFO | 0o644, 0), libc::EEXIST, "mkfifo over a name");
}

/// chmod, chown, utimens and setxattr store a ctime with the change; utimens stores an
/// atime apart from the mtime; writes give the content time with nanoseconds. All read
/// back after a remount.
#[test]
fn ctime_and_atime_are_stored_with_each_change() {
    let b = create_bucket("posix-times");
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0"]).mount();
    let f = m.join("f");
    std::fs::write(&f, b"one").expect("write");
    let written = std::fs::metadata(&f).expect("stat");
    let stored = stored_metadata(&b, "f");
    assert_eq!(stored_time(&stored, "mtime"), Some(written.modified().expect("mtime")), "{stored:?}");
    assert_eq!(ctime(&written), written.modified().expect("mtime"));

    nap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let changed = std::fs::metadata(&f).expect("stat");
    assert!(ctime(&changed) > ctime(&written), "chmod changes ctime");
    assert_eq!(changed.modified().expect("mtime"), written.modified().expect("mtime"), "chmod keeps mtime");
    assert_eq!(stored_time(&stored_metadata(&b, "f"), "ctime"), Some(ctime(&changed)));

    nap();
    std::os::unix::fs::chown(&f, Some(4321), None).expect("chown");
    let owned = std::fs::metadata(&f).expect("stat");
    assert!(ctime(&owned) > ctime(&changed), "chown changes ctime");

    nap();
    let status = std::process::Command::new("setfattr").args(["-n", "user.note", "-v", "x"]).arg(&f).status();
    if status.is_ok_and(|s| s.success()) {
        assert!(ctime(&std::fs::metadata(&f).expect("stat")) > ctime(&owned), "setxattr changes ctime");
    }

    // utimensat with different atime and mtime (as `touch -a -d`, `cp -p`).
    let file = std::fs::File::options().write(true).open(&f).expect("open");
    let times = std::fs::FileTimes::new()
        .set_accessed(UNIX_EPOCH + Duration::new(100_000_000, 100_000_000))
        .set_modified(UNIX_EPOCH + Duration::new(200_000_000, 200_000_000));
    file.set_times(times).expect("utimens");
    drop(file);
    let stored = stored_metadata(&b, "f");
    assert_eq!(stored.get("atime").map(String::as_str), Some("100000000.100000000"), "{stored:?}");
    assert_eq!(stored.get("mtime").map(String::as_str), Some("200000000.200000000"));

    // A write (O_TRUNC) changes mtime and ctime within a second of the last change.
    nap();
    let before = std::fs::metadata(&f).expect("stat");
    std::fs::write(&f, b"two").expect("rewrite");
    let after = std::fs::metadata(&f).expect("stat");
    assert!(after.modified().expect("mtime") > before.modified().expect("mtime"));
    assert!(ctime(&after) > ctime(&before), "a write changes ctime");
    assert_eq!(atime(&after), UNIX_EPOCH + Duration::new(100_000_000, 100_000_000), "writes keep the atime");

    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    let again = std::fs::metadata(m.join("f")).expect("stat after remount");
    assert_eq!(again.modified().expect("mtime"), after.modified().expect("mtime"), "no jump to Last-Modified");
    assert_eq!(ctime(&again), ctime(&after));
    assert_eq!(atime(&again), atime(&after));
}

/// A directory's mtime and ctime change when an entry is created, removed or renamed in
/// it, without writing its marker (no request per created file); the next change of the
/// directory's own attributes stores them in the marker. With `--metadata-ttl 0` the
/// times kept in memory win over re-reads of the marker.
#[test]
fn directory_times_follow_their_entries() {
    require_store_feature!(
        StoreFeature::DirectoryMarkerMetadata,
        "a directory's times are stored in its marker's metadata, which the store drops"
    );
    let b = create_bucket("posix-dirtimes");
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0"]).request_log().mount();
    let d = m.join("d");
    let made = SystemTime::now();
    std::fs::create_dir(&d).expect("mkdir");
    let created = std::fs::metadata(&d).expect("stat").modified().expect("mtime");
    assert!(created >= made - Duration::from_secs(1), "mkdir stores its own time, not the mount's");
    assert_eq!(stored_time(&stored_metadata(&b, "d/"), "mtime"), Some(created));

    let mut last = created;
    let mut step = |what: &str, change: &dyn Fn()| {
        nap();
        change();
        let meta = std::fs::metadata(&d).expect("stat dir");
        let mtime = meta.modified().expect("mtime");
        assert!(mtime > last, "{what} changes the directory's mtime");
        assert_eq!(ctime(&meta), mtime, "{what} changes the directory's ctime");
        last = mtime;
    };
    step("create", &|| std::fs::write(d.join("f"), b"x").expect("create"));
    step("symlink", &|| std::os::unix::fs::symlink("f", d.join("l")).expect("symlink"));
    step("mkfifo", &|| mknod(&d.join("p"), libc::S_IFIFO | 0o644, 0).expect("mkfifo"));
    step("rename", &|| std::fs::rename(d.join("f"), d.join("g")).expect("rename"));
    step("unlink", &|| std::fs::remove_file(d.join("g")).expect("unlink"));
    step("mkdir", &|| std::fs::create_dir(d.join("sub")).expect("mkdir below"));
    step("rmdir", &|| std::fs::remove_dir(d.join("sub")).expect("rmdir below"));
    let marker_puts = m.s3_requests().iter().filter(|r| r.op == "PUT" && r.key == "d/").count();
    assert_eq!(marker_puts, 1, "only mkdir wrote the marker: entries' changes cost no request");

    // The next metadata write of the directory stores the times kept in memory.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o750)).expect("chmod dir");
    assert_eq!(stored_time(&stored_metadata(&b, "d/"), "mtime"), Some(last));
    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(std::fs::metadata(m.join("d")).expect("stat").modified().expect("mtime"), last);
}

/// Names longer than 255 bytes reach the store as they are (AWS S3 holds them, and the
/// namespace shows them: see its unit tests); MinIO refuses a component over 255 bytes,
/// which shows as ENAMETOOLONG rather than an I/O error (so does SeaweedFS; moto takes
/// them: then they work). A key over S3's 1024 bytes is ENAMETOOLONG before any request.
#[test]
fn long_names_go_to_the_store_and_its_refusal_is_enametoolong() {
    let b = create_bucket("posix-names");
    let long = "é".repeat(150); // 300 bytes
                                // Whether the store takes such a name, asked directly (the probe's key is in no directory
                                // the test looks at).
    let probe = block_on(s3().put_object().bucket(&b).key(format!("probe/{long}")).body(Vec::new().into()).send());
    let m = MountBuilder::new().bucket(&b).request_log().mount();
    std::fs::create_dir(m.join("dir")).expect("mkdir");
    if probe.is_err() {
        // MinIO refuses the HEAD too; SeaweedFS refuses only a PUT (a HEAD gets 404).
        let stat = std::fs::metadata(m.join(&long)).err().and_then(|e| e.raw_os_error());
        let not_found_here = store_is_not_minio() && stat == Some(libc::ENOENT);
        assert!(stat == Some(libc::ENAMETOOLONG) || not_found_here, "stat of a name the store refuses: {stat:?}");
        assert_errno(std::fs::create_dir(m.join(&long)), libc::ENAMETOOLONG, "mkdir of a name the store refuses");
        // Where a lookup of the name finds nothing (SeaweedFS), the refusal comes at close.
        let created = std::fs::File::create(m.join(&long)).and_then(|mut f| {
            std::io::Write::write_all(&mut f, b"x")?;
            close(f)
        });
        assert_errno(created, libc::ENAMETOOLONG, "create of a name the store refuses");
    } else {
        assert_errno(std::fs::metadata(m.join(&long)), libc::ENOENT, "stat of a long name not stored");
        std::fs::create_dir(m.join(&long)).expect("mkdir of a name the store takes");
        let file = m.join(&long).join(&long);
        std::fs::write(&file, b"x").expect("create of a name the store takes");
        assert_eq!(std::fs::read(&file).expect("read back"), b"x");
        assert_eq!(get(&b, &format!("{long}/{long}")), b"x");
    }
    assert!(m.s3_requests().iter().any(|r| r.key == long), "the name was asked of the store");

    // "dir/" and two levels of "k{200}/k{200}/" are 808 bytes: a name of 230 more makes a
    // key of 1038 bytes.
    let components = format!("{}/{}", "k".repeat(200), "k".repeat(200));
    let deep = m.join("dir").join(&components).join(&components);
    std::fs::create_dir_all(&deep).expect("a deep tree of short names");
    let too_long = deep.join("x".repeat(230));
    let key_len = too_long.strip_prefix(m.path()).expect("below the mount").as_os_str().len();
    assert!(key_len > 1024, "{key_len}");
    let before = m.s3_requests().len();
    assert_errno(std::fs::write(&too_long, b"x"), libc::ENAMETOOLONG, "a key over 1024 bytes");
    assert_errno(std::fs::create_dir(&too_long), libc::ENAMETOOLONG, "a marker over 1024 bytes");
    let sent: Vec<_> = m.s3_requests().into_iter().skip(before).collect();
    assert!(sent.is_empty(), "nothing asked of the store: {sent:?}");
}

/// A file unlinked while open stays usable through its descriptor, and `fstat` shows a
/// link count of 0 (as on a local disk) rather than ENOENT; nothing is stored.
#[test]
fn an_unlinked_open_file_has_no_links_and_still_works() {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let b = create_bucket("posix-unlinked");
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "0"]).mount();
    let path = m.join("f");
    let mut file = std::fs::File::options().read(true).write(true).create_new(true).open(&path).expect("create");
    std::fs::remove_file(&path).expect("unlink while open");
    let meta = file.metadata().expect("fstat after unlink");
    assert_eq!(meta.nlink(), 0);
    file.write_all(b"Hello, World!").expect("write after unlink");
    // s3fs-fuse's test_unlink_open_file: fsync, pread, fstat of the unlinked file.
    file.sync_all().expect("fsync after unlink");
    let mut buf = [0; 13];
    file.read_exact_at(&mut buf, 0).expect("pread after unlink");
    assert_eq!(&buf, b"Hello, World!");
    assert_eq!(file.metadata().expect("fstat after the write").len(), 13);
    file.write_all(b" Again.").expect("write after fsync");
    // SAFETY: the descriptor is the file's own, closed once here (into_raw_fd gives it up).
    let closed = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(file)) };
    assert_eq!(closed, 0, "close of the unlinked file: {}", std::io::Error::last_os_error());
    assert_errno(std::fs::metadata(&path), libc::ENOENT, "gone after close");
    assert!(list_keys(&b, "").is_empty(), "nothing stored");
}
