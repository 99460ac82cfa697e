//! Modes, owners and mtimes kept in object metadata (docs/SEMANTICS.md, "Attributes"):
//! set through the mount they are stored in s3fs's format and read back after a remount;
//! set by another client in that format they show through the mount; `tar x` restores
//! them as on a local disk.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::*;

fn put_with_metadata(bucket: &str, key: &str, data: &[u8], metadata: &[(&str, &str)]) {
    let mut request = s3().put_object().bucket(bucket).key(key).body(data.to_vec().into());
    for (name, value) in metadata {
        request = request.metadata(*name, *value);
    }
    block_on(request.send()).expect("put with metadata");
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("spawn");
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Type, mode, owner, size and mtime of every entry under `root`, sorted by path.
fn tree_attributes(root: &Path) -> String {
    tree_attributes_of(root, true)
}

/// [`tree_attributes`], of every entry but directories unless `dirs`.
fn tree_attributes_of(root: &Path, dirs: bool) -> String {
    let listing = run(Command::new("find").arg(root).args(["-mindepth", "1", "-printf", "%P %y %m %U:%G %s %T@\n"]));
    let mut lines: Vec<&str> = listing.lines().collect();
    lines.sort_unstable();
    // Directory sizes differ between file systems; everything else must match.
    lines
        .iter()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                [path, "d", mode, owner, _size, time] => dirs.then(|| format!("{path} d {mode} {owner} {time}")),
                _ => Some(line.to_string()),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

/// chmod, chown and utimes on existing objects are stored with s3fs's keys, keep the
/// content, the content type and foreign metadata, and read back after a remount.
#[test]
fn changes_are_stored_in_s3fs_format() {
    let b = create_bucket("attrs-store");
    block_on(
        s3().put_object()
            .bucket(&b)
            .key("f")
            .content_type("text/plain")
            .metadata("origin", "camera")
            .body(b"content".to_vec().into())
            .send(),
    )
    .expect("put");
    let etag = head(&b, "f").etag;
    let m = MountBuilder::new().bucket(&b).mount();
    let f = m.join("f");

    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).expect("chown");
    let file = std::fs::File::open(&f).expect("open");
    file.set_modified(at(1_000_000_000)).expect("utime");
    drop(file);

    let stored = stored_metadata(&b, "f");
    assert_eq!(stored.get("mode").map(String::as_str), Some("33256"), "{stored:?}"); // S_IFREG | 0750
    assert_eq!(stored.get("uid").map(String::as_str), Some("1234"));
    assert_eq!(stored.get("gid").map(String::as_str), Some("5678"));
    assert_eq!(stored.get("mtime").map(String::as_str), Some("1000000000"));
    assert_eq!(stored.get("origin").map(String::as_str), Some("camera"), "foreign metadata kept");
    let out = block_on(s3().head_object().bucket(&b).key("f").send()).expect("head");
    assert_eq!(out.content_type(), Some("text/plain"), "content type kept");
    assert_eq!(head(&b, "f").etag, etag, "content unchanged");
    assert_eq!(get(&b, "f"), b"content");

    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    let meta = std::fs::metadata(m.join("f")).expect("stat after remount");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
    assert_eq!(meta.modified().expect("mtime"), at(1_000_000_000));

    // touch sets the time to now.
    let before = SystemTime::now() - Duration::from_secs(2);
    assert!(Command::new("touch").arg(m.join("f")).status().expect("touch").success());
    assert!(std::fs::metadata(m.join("f")).expect("stat").modified().expect("mtime") >= before);
    assert_ne!(stored_metadata(&b, "f").get("mtime").map(String::as_str), Some("1000000000"));

    // The bucket itself has no object to keep attributes in: they last until unmount.
    std::fs::set_permissions(m.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod of the root");
    assert_eq!(std::fs::metadata(m.path()).expect("stat root").permissions().mode() & 0o7777, 0o700);
    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(std::fs::metadata(m.path()).expect("stat root").permissions().mode() & 0o7777, 0o755);
}

/// A directory's chmod is stored in its marker in s3fs's format (an implicit directory
/// gets one), and reads back after a remount.
#[test]
fn directory_changes_are_stored_in_its_marker() {
    require_store_feature!(StoreFeature::DirectoryMarkerMetadata, DROPS_MARKER_METADATA);
    let b = create_bucket("attrs-store-dir");
    put(&b, "d/inner", b"x".to_vec()); // an implicit directory
    let m = MountBuilder::new().bucket(&b).mount();
    std::fs::set_permissions(m.join("d"), std::fs::Permissions::from_mode(0o700)).expect("chmod dir");
    assert_eq!(stored_metadata(&b, "d/").get("mode").map(String::as_str), Some("16832")); // S_IFDIR | 0700
    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(std::fs::metadata(m.join("d")).expect("stat dir").permissions().mode() & 0o7777, 0o700);
    assert_eq!(std::fs::read(m.join("d/inner")).expect("read below"), b"x");
}

/// Why tests of directories' stored attributes skip themselves on some stores.
const DROPS_MARKER_METADATA: &str = "the store drops the metadata of directory markers (dir/), where a directory's \
                                     attributes are stored (bucketfs logs it once and shows them until the TTL)";

/// Attributes another client stored in s3fs's format show in `ls -l` and `stat`.
#[test]
fn attributes_stored_by_others_show() {
    let b = create_bucket("attrs-foreign");
    put_with_metadata(
        &b,
        "dir/script",
        b"#!/bin/sh\n",
        &[("mode", "33261"), ("uid", "12"), ("gid", "34"), ("mtime", "1577934245.5")],
    );
    put_with_metadata(&b, "dir/", b"", &[("mode", "16832"), ("mtime", "1500000000")]);
    put(&b, "dir/plain", b"p".to_vec());
    for i in 0..40 {
        put_with_metadata(&b, &format!("many/f{i:02}"), b"m", &[("mode", "33152")]);
        // 0600
    }
    let m = MountBuilder::new().bucket(&b).mount();

    // Listed first, then stat'ed, as `ls -l` does.
    let listing = run(Command::new("ls").arg("-ln").arg("--time-style=+%s").arg(m.join("dir")));
    let listing = listing.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(listing.contains("-rwxr-xr-x 1 12 34 10 1577934245 script"), "{listing}");
    assert!(listing.contains("-rw-r--r-- 1 0 0 1 "), "defaults for an object without metadata: {listing}");
    let dir = std::fs::metadata(m.join("dir")).expect("stat dir");
    let script = std::fs::metadata(m.join("dir/script")).expect("stat");
    assert_eq!(script.modified().expect("mtime"), at(1_577_934_245) + Duration::from_millis(500));
    // Files advertise 1 MiB reads; directories glibc's own buffer (see SEMANTICS, blksize).
    assert_eq!(script.blksize(), 1 << 20);
    assert_eq!(dir.blksize(), 32 << 10);

    // Every entry of a larger directory, listed then stat'ed, shows its stored mode.
    let listing = run(Command::new("ls").arg("-l").arg(m.join("many")));
    assert_eq!(listing.lines().filter(|l| l.starts_with("-rw------- ")).count(), 40, "{listing}");
}

/// A directory's attributes another client stored in its marker in s3fs's format show.
#[test]
fn directory_attributes_stored_by_others_show() {
    require_store_feature!(StoreFeature::DirectoryMarkerMetadata, DROPS_MARKER_METADATA);
    let b = create_bucket("attrs-foreign-dir");
    put_with_metadata(&b, "dir/", b"", &[("mode", "16832"), ("mtime", "1500000000")]);
    put(&b, "dir/plain", b"p".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();
    run(Command::new("ls").arg("-ln").arg(m.join("dir")));
    let dir = std::fs::metadata(m.join("dir")).expect("stat dir");
    assert_eq!(dir.permissions().mode() & 0o7777, 0o700);
    assert_eq!(dir.modified().expect("mtime"), at(1_500_000_000));
}

/// A small tree with varied modes, owners and mtimes, a symlink, and a file above 5 MiB.
fn make_tree(source: &Path) {
    let tree = [("a", 0o755), ("a/b", 0o700), ("c", 0o750)];
    for (dir, _) in tree {
        std::fs::create_dir_all(source.join(dir)).expect("mkdir");
    }
    let files: [(&str, usize, u32); 5] = [
        ("a/x.sh", 100, 0o755),
        ("a/b/secret", 10, 0o600),
        ("c/big", 6 * MIB + 3, 0o640),
        ("top", 0, 0o444),
        ("a/y", 5000, 0o644),
    ];
    for (i, (path, size, mode)) in files.iter().enumerate() {
        let path = source.join(path);
        std::fs::write(&path, gen_data(i as u64, *size)).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode)).expect("chmod");
        std::os::unix::fs::chown(&path, Some(1000 + i as u32), Some(2000)).expect("chown");
        let file = std::fs::File::options().write(true).open(&path).expect("open");
        file.set_modified(at(1_400_000_000 + i as u64 * 1000)).expect("utime");
    }
    std::os::unix::fs::symlink("x.sh", source.join("a/link")).expect("symlink");
    let status = Command::new("touch").args(["-h", "-d", "@1350000000"]).arg(source.join("a/link")).status();
    assert!(status.expect("touch -h").success());
    for (i, (dir, mode)) in tree.iter().enumerate().rev() {
        std::fs::set_permissions(source.join(dir), std::fs::Permissions::from_mode(*mode)).expect("chmod dir");
        let status =
            Command::new("touch").arg("-d").arg(format!("@{}", 1_300_000_000 + i * 100)).arg(source.join(dir)).status();
        assert!(status.expect("touch").success());
    }
}

/// `tar x` into the mount restores modes, owners and mtimes of files (and symlinks) as
/// on a local disk, also for a file uploaded in several parts, and they stay after a
/// remount.
#[test]
fn untar_restores_attributes() {
    untar_and_compare("attrs-tar", false);
}

/// The same for directories, whose attributes are stored in their markers.
#[test]
fn untar_restores_directory_attributes() {
    require_store_feature!(StoreFeature::DirectoryMarkerMetadata, DROPS_MARKER_METADATA);
    untar_and_compare("attrs-tar-dirs", true);
}

/// `tar x` of [`make_tree`] into a mount, then [`tree_attributes_of`] the mount (with
/// `dirs`) compared with a local `tar x`, then again after a remount.
fn untar_and_compare(bucket: &str, dirs: bool) {
    let b = create_bucket(bucket);
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("src");
    make_tree(&source);
    let archive = work.path().join("tree.tar");
    run(Command::new("tar").arg("cf").arg(&archive).arg("-C").arg(&source).arg("."));
    let local = work.path().join("local");
    std::fs::create_dir(&local).expect("mkdir");
    run(Command::new("tar").arg("xf").arg(&archive).arg("-C").arg(&local));

    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    run(Command::new("tar").arg("xf").arg(&archive).arg("-C").arg(m.path()));
    let expected = tree_attributes_of(&local, dirs);
    assert_eq!(tree_attributes_of(m.path(), dirs), expected, "after tar x");
    run(Command::new("diff").arg("-r").arg(&local).arg(m.path()));
    drop(m);

    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(tree_attributes_of(m.path(), dirs), expected, "after a remount");
}

/// Replacing a file's content (O_TRUNC) keeps its mode and owner; its mtime becomes that
/// of the new content. `cp -p` keeps mode and times.
#[test]
fn overwrite_keeps_mode_and_cp_p_keeps_times() {
    let b = create_bucket("attrs-over");
    put_with_metadata(&b, "f", b"old", &[("mode", "33216"), ("mtime", "1000")]); // 0700
    let m = MountBuilder::new().bucket(&b).mount();
    let before = SystemTime::now() - Duration::from_secs(2);
    std::fs::write(m.join("f"), b"new content").expect("overwrite");
    let meta = std::fs::metadata(m.join("f")).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    assert!(meta.modified().expect("mtime") >= before, "mtime is the new content's");
    assert_eq!(stored_metadata(&b, "f").get("mode").map(String::as_str), Some("33216"));
    assert_eq!(get(&b, "f"), b"new content");

    let work = tempfile::tempdir().expect("tempdir");
    let local = work.path().join("kept");
    std::fs::write(&local, b"keep my time").expect("write");
    std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o604)).expect("chmod");
    std::fs::File::options().write(true).open(&local).expect("open").set_modified(at(1_234_567_890)).expect("utime");
    run(Command::new("cp").arg("-p").arg(&local).arg(m.join("copied")));
    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    let meta = std::fs::metadata(m.join("copied")).expect("stat");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o604);
    assert_eq!(meta.modified().expect("mtime"), at(1_234_567_890));
}

/// `rsync -a` into the mount and back out keeps content, modes, owners and mtimes; a
/// second run finds nothing to update (sizes and times read back exactly).
#[test]
fn rsync_in_and_out() {
    let b = create_bucket("attrs-rsync");
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("src");
    make_tree(&source);
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let into = m.join("copy");
    let rsync = |from: &Path, to: &Path| {
        run(Command::new("rsync").arg("-a").arg("--itemize-changes").arg(format!("{}/", from.display())).arg(to))
    };
    rsync(&source, &into);
    let expected = tree_attributes(&source);
    assert_eq!(tree_attributes(&into), expected, "after rsync -a into the mount");
    assert_eq!(rsync(&source, &into), "", "a second rsync finds nothing to update");

    let back = work.path().join("back");
    rsync(&into, &back);
    assert_eq!(tree_attributes(&back), expected, "after rsync -a out of the mount");
    run(Command::new("diff").arg("-r").arg(&source).arg(&back));
    assert!(
        list_keys(&b, "").iter().all(|k| !k.contains("/.")),
        "rsync's temporary files are gone: {:?}",
        list_keys(&b, "")
    );
}

/// Symlinks are stored as s3fs stores them (the target as content, `S_IFLNK` in the mode),
/// read back after a remount, and s3fs's own show as symlinks.
#[test]
fn symlinks_round_trip_in_s3fs_format() {
    let b = create_bucket("attrs-symlink");
    put_with_metadata(&b, "from-s3fs", b"some/target", &[("mode", "41471")]);
    let m = MountBuilder::new().bucket(&b).mount();
    std::os::unix::fs::symlink("../elsewhere/file name", m.join("made-here")).expect("symlink");
    assert_eq!(get(&b, "made-here"), b"../elsewhere/file name");
    assert_eq!(stored_metadata(&b, "made-here").get("mode").map(String::as_str), Some("41471"));
    assert_errno(std::os::unix::fs::symlink("x", m.join("made-here")), libc::EEXIST, "symlink over an existing name");
    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    for (name, target) in [("made-here", "../elsewhere/file name"), ("from-s3fs", "some/target")] {
        assert_eq!(std::fs::read_link(m.join(name)).expect("readlink"), Path::new(target));
        let meta = std::fs::symlink_metadata(m.join(name)).expect("lstat");
        assert!(meta.file_type().is_symlink(), "{name} is a symlink");
        assert_eq!(meta.len(), target.len() as u64);
    }
}

fn xattr_get(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let c_name = std::ffi::CString::new(name).expect("name");
    let mut buffer = vec![0u8; 4096];
    let n = unsafe { libc::getxattr(c_path.as_ptr(), c_name.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buffer.truncate(n as usize);
    Ok(buffer)
}

fn xattr_set(path: &Path, name: &str, value: &[u8], flags: i32) -> std::io::Result<()> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let c_name = std::ffi::CString::new(name).expect("name");
    let rc = unsafe { libc::setxattr(c_path.as_ptr(), c_name.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn xattr_list(path: &Path) -> Vec<String> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let mut buffer = vec![0u8; 4096];
    let n = unsafe { libc::listxattr(c_path.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len()) };
    assert!(n >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buffer.truncate(n as usize);
    buffer.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect()
}

/// `user.*` extended attributes are the object's S3 metadata, both ways.
#[test]
fn user_xattrs_are_object_metadata() {
    let b = create_bucket("attrs-xattr");
    put_with_metadata(&b, "f", b"x", &[("project", "apollo"), ("mode", "33188")]);
    let m = MountBuilder::new().bucket(&b).mount();
    let f = m.join("f");
    assert_eq!(xattr_get(&f, "user.project").expect("getxattr"), b"apollo");
    assert_eq!(xattr_list(&f), ["user.project"], "s3fs's attribute keys are not xattrs");
    xattr_set(&f, "user.origin", b"camera 7", 0).expect("setxattr");
    assert_eq!(stored_metadata(&b, "f").get("origin").map(String::as_str), Some("camera 7"));
    assert_eq!(get(&b, "f"), b"x", "content unchanged");
    assert_errno(
        xattr_set(&f, "user.origin", b"again", libc::XATTR_CREATE),
        libc::EEXIST,
        "XATTR_CREATE on an existing name",
    );
    assert_errno(xattr_set(&f, "user.mode", b"1", 0), libc::EOPNOTSUPP, "a name holding an attribute");
    assert_errno(xattr_set(&f, "user.note", "café".as_bytes(), 0), libc::EOPNOTSUPP, "a value S3 metadata cannot hold");
    assert_errno(xattr_get(&f, "user.absent"), libc::ENODATA, "missing attribute");
    let c_path = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).expect("path");
    let c_name = std::ffi::CString::new("user.project").expect("name");
    assert_eq!(unsafe { libc::removexattr(c_path.as_ptr(), c_name.as_ptr()) }, 0, "removexattr");
    drop(m);
    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(xattr_list(&m.join("f")), ["user.origin"]);
    let stored = stored_metadata(&b, "f");
    assert!(!stored.contains_key("project"));
    assert_eq!(stored.get("mode").map(String::as_str), Some("33188"), "attributes kept");
}

/// chmod of an object another client replaced since the mount last saw it: the copy is
/// conditional on the ETag the mount knew, fails, and is redone from the new version, so
/// the new content and the new version's own metadata are kept (not the old version's).
#[test]
fn chmod_after_another_client_replaced_the_object_keeps_its_version() {
    let b = create_bucket("attrs-race");
    put_with_metadata(&b, "f", b"version one", &[("origin", "old")]);
    let m = MountBuilder::new().bucket(&b).args(["--metadata-ttl", "60"]).mount();
    assert_eq!(std::fs::metadata(m.join("f")).expect("stat").len(), 11); // cached: version one
    put_with_metadata(&b, "f", b"version two!", &[("origin", "new")]);
    std::fs::set_permissions(m.join("f"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(get(&b, "f"), b"version two!");
    let stored = stored_metadata(&b, "f");
    assert_eq!(stored.get("origin").map(String::as_str), Some("new"), "{stored:?}");
    assert_eq!(stored.get("mode").map(String::as_str), Some("33152"), "{stored:?}");
    // S_IFREG | 0600
}

/// chmod, touch and setxattr rewrite the object onto itself, which gives a multipart
/// object a new ETag; the bytes do not change, so a reader that has the file open keeps
/// reading it (it follows the copy), and reads the same bytes.
#[test]
fn open_readers_survive_metadata_changes() {
    use std::io::Read;
    let b = create_bucket("attr-open-reader");
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "5MiB"]).mount();
    let data = gen_data(31, 12 * MIB + 11);
    std::fs::write(m.join("f"), &data).expect("a multipart object");
    let etag_before = head(&b, "f").etag;
    let mut reader = std::fs::File::open(m.join("f")).expect("open");
    let mut read = vec![0; MIB];
    reader.read_exact(&mut read).expect("read before");
    std::fs::set_permissions(m.join("f"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let mut more = vec![0; 3 * MIB];
    reader.read_exact(&mut more).expect("read after chmod");
    read.extend_from_slice(&more);
    xattr_set(&m.join("f"), "user.color", b"blue", 0).expect("setxattr");
    let status =
        Command::new("touch").args(["-m", "-d", "2001-02-03 04:05:06"]).arg(m.join("f")).status().expect("touch");
    assert!(status.success());
    reader.read_to_end(&mut read).expect("read after setxattr and touch");
    assert_eq!(read.len(), data.len());
    assert!(read == data, "the reader read the same bytes");
    // SeaweedFS keeps a multipart ETag through a copy onto itself (the reader then has no
    // copy to follow); MinIO, like S3, gives the copy a new one.
    if !store_is_not_minio() {
        assert_ne!(head(&b, "f").etag, etag_before, "the rewrite gave the object a new ETag");
    }
}

/// What a web server or CDN reads from an object that bucketfs does not own: its
/// standard headers, foreign user metadata and tags, as `(name, value)` pairs.
fn foreign_headers(bucket: &str, key: &str) -> Vec<(String, String)> {
    let out = block_on(s3().head_object().bucket(bucket).key(key).send()).expect("head");
    let mut found = vec![
        ("cache-control".to_owned(), out.cache_control().unwrap_or_default().to_owned()),
        ("content-disposition".to_owned(), out.content_disposition().unwrap_or_default().to_owned()),
        ("content-encoding".to_owned(), out.content_encoding().unwrap_or_default().to_owned()),
        ("content-language".to_owned(), out.content_language().unwrap_or_default().to_owned()),
        ("content-type".to_owned(), out.content_type().unwrap_or_default().to_owned()),
        ("expires".to_owned(), out.expires_string().unwrap_or_default().to_owned()),
    ];
    let team = out.metadata().and_then(|m| m.get("owner-team")).cloned().unwrap_or_default();
    found.push(("x-amz-meta-owner-team".to_owned(), team));
    let tags = block_on(s3().get_object_tagging().bucket(bucket).key(key).send()).expect("tagging");
    for tag in tags.tag_set() {
        found.push((format!("tag {}", tag.key()), tag.value().to_owned()));
    }
    found
}

/// Every rewrite of an object's metadata through the mount (`chmod`, `chown`, `touch`,
/// `setfattr`, a rename's copy) keeps the headers and metadata bucketfs does not own:
/// Cache-Control, Content-Disposition, Content-Encoding, Content-Language, Expires,
/// Content-Type, foreign user metadata and tags. Also where the mount knew the object
/// from a listing only (MinIO lists no Expires), and after a remount.
#[test]
fn rewrites_keep_headers_bucketfs_does_not_own() {
    let b = create_bucket("attrs-headers");
    let expires = aws_sdk_s3::primitives::DateTime::from_secs(1_922_371_200); // 2030-12-01
    let listed_keys: Vec<String> = (0..10).map(|i| format!("listed/g{i}")).collect();
    for key in ["f", "dir/page"].into_iter().chain(listed_keys.iter().map(String::as_str)) {
        let request = s3()
            .put_object()
            .bucket(&b)
            .key(key)
            .body(b"web page".to_vec().into())
            .cache_control("max-age=60")
            .content_disposition("attachment; filename=\"page.txt\"")
            .content_encoding("identity")
            .content_language("de")
            .content_type("text/plain")
            .expires(expires)
            .metadata("owner-team", "web")
            .tagging("team=web&tier=public");
        block_on(request.send()).expect("put with headers");
    }
    let want = foreign_headers(&b, "f");
    assert!(want.iter().all(|(_, value)| !value.is_empty()), "every header stored at first: {want:?}");
    assert_eq!(want.len(), 9, "two tags: {want:?}");

    let m = MountBuilder::new().bucket(&b).mount();
    let file = m.join("f");
    let steps: [(&str, &dyn Fn()); 4] = [
        ("chmod 600", &|| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod")),
        ("chown", &|| std::os::unix::fs::chown(&file, Some(1234), Some(1234)).expect("chown")),
        ("touch", &|| {
            std::fs::File::options().write(true).open(&file).expect("open").set_modified(at(1_000_000)).expect("touch")
        }),
        ("setfattr", &|| xattr_set(&file, "user.note", b"kept", 0).expect("setfattr")),
    ];
    for (what, step) in steps {
        step();
        assert_eq!(foreign_headers(&b, "f"), want, "after {what}");
    }
    std::fs::rename(&file, m.join("moved")).expect("rename");
    assert_eq!(foreign_headers(&b, "moved"), want, "after a rename");
    std::fs::rename(m.join("dir"), m.join("dir2")).expect("rename of a directory");
    assert_eq!(foreign_headers(&b, "dir2/page"), want, "after a rename of its directory");

    // `ls -l` of a directory takes most files' stored attributes from a listing with
    // metadata (MinIO's), which carries no Expires: a chmod after it must still keep it.
    run(Command::new("ls").arg("-l").arg(m.join("listed")));
    for key in &listed_keys {
        std::fs::set_permissions(m.join(key), std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert_eq!(foreign_headers(&b, key), want, "after ls -l and chmod of {key}");
    }
    drop(m);

    let m = MountBuilder::new().bucket(&b).mount();
    std::fs::set_permissions(m.join("moved"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(foreign_headers(&b, "moved"), want, "after a remount and chmod");
    assert_eq!(std::fs::read(m.join("moved")).expect("read"), b"web page");
}

/// An object copied in parts (past the single-copy limit, here lowered to 5 MiB) keeps
/// its headers, user metadata and tags too: a multipart copy is a new upload, which is
/// told them.
#[test]
fn a_copy_in_parts_keeps_headers_and_tags() {
    let b = create_bucket("attrs-headers-parts");
    let data = vec![7u8; 6 * MIB];
    let request = s3()
        .put_object()
        .bucket(&b)
        .key("big")
        .body(data.clone().into())
        .cache_control("no-cache")
        .content_language("fr")
        .content_type("application/x-big")
        .expires(aws_sdk_s3::primitives::DateTime::from_secs(1_922_371_200))
        .metadata("owner-team", "data")
        .tagging("team=data");
    block_on(request.send()).expect("put");
    let want = foreign_headers(&b, "big");
    let m = MountBuilder::new().bucket(&b).env("BUCKETFS_TEST_SINGLE_COPY_LIMIT", &(5 * MIB).to_string()).mount();
    std::fs::set_permissions(m.join("big"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(foreign_headers(&b, "big"), want, "after chmod (a copy in parts)");
    std::fs::rename(m.join("big"), m.join("moved")).expect("rename");
    assert_eq!(foreign_headers(&b, "moved"), want, "after a rename (a copy in parts)");
    assert_eq!(std::fs::read(m.join("moved")).expect("read"), data);
}
