//! With `--read-only`, every mutation fails with EROFS and the bucket does not change.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::*;

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno_result(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[test]
fn mutations_fail_with_erofs() {
    let b = create_bucket("readonly");
    put(&b, "file.txt", b"original".to_vec());
    put(&b, "dir/inner.txt", b"inner".to_vec());
    put(&b, "emptydir/", Vec::new());
    let before = bucket_snapshot(&b);
    let m = MountBuilder::new().bucket(&b).arg("--read-only").mount();
    let p = |r: &str| m.join(r);

    type Op<'a> = (&'a str, Box<dyn Fn() -> io::Result<()> + 'a>);
    let ops: Vec<Op> = vec![
        ("create a new file", Box::new(|| File::create(p("new.txt")).map(drop))),
        ("create a file in a subdir", Box::new(|| File::create(p("dir/new.txt")).map(drop))),
        ("create_new", Box::new(|| OpenOptions::new().write(true).create_new(true).open(p("n2")).map(drop))),
        ("mkdir", Box::new(|| std::fs::create_dir(p("newdir")))),
        ("mkdir in a subdir", Box::new(|| std::fs::create_dir(p("dir/sub")))),
        ("unlink", Box::new(|| std::fs::remove_file(p("file.txt")))),
        ("unlink in a subdir", Box::new(|| std::fs::remove_file(p("dir/inner.txt")))),
        ("rmdir of an empty (marker) dir", Box::new(|| std::fs::remove_dir(p("emptydir")))),
        ("rename a file", Box::new(|| std::fs::rename(p("file.txt"), p("renamed.txt")))),
        ("rename a file into a dir", Box::new(|| std::fs::rename(p("file.txt"), p("dir/f.txt")))),
        ("rename a dir", Box::new(|| std::fs::rename(p("dir"), p("dir2")))),
        (
            "open an existing file for writing",
            Box::new(|| OpenOptions::new().write(true).open(p("file.txt")).map(drop)),
        ),
        (
            "open an existing file for appending",
            Box::new(|| OpenOptions::new().append(true).open(p("file.txt")).map(drop)),
        ),
        (
            "open an existing file read-write",
            Box::new(|| OpenOptions::new().read(true).write(true).open(p("file.txt")).map(drop)),
        ),
        ("open with O_TRUNC", Box::new(|| OpenOptions::new().write(true).truncate(true).open(p("file.txt")).map(drop))),
        ("truncate(2)", Box::new(|| errno_result(unsafe { libc::truncate(c_path(&p("file.txt")).as_ptr(), 0) }))),
        ("chmod", Box::new(|| std::fs::set_permissions(p("file.txt"), std::fs::Permissions::from_mode(0o600)))),
        ("symlink", Box::new(|| std::os::unix::fs::symlink("file.txt", p("link")))),
        ("hard link", Box::new(|| std::fs::hard_link(p("file.txt"), p("hard")))),
        ("mknod (fifo)", Box::new(|| errno_result(unsafe { libc::mkfifo(c_path(&p("fifo")).as_ptr(), 0o644) }))),
    ];
    let mut failures = Vec::new();
    for (name, op) in &ops {
        match op() {
            Ok(()) => failures.push(format!("{name}: succeeded")),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {}
            Err(e) => failures.push(format!("{name}: {e:?} instead of EROFS")),
        }
    }
    // a handle opened read-only cannot be used to write either
    let mut f = File::open(p("file.txt")).unwrap();
    if io::Write::write(&mut f, b"x").is_ok() {
        failures.push("write(2) through a read-only handle succeeded".into());
    }
    drop(f);

    assert!(failures.is_empty(), "mutations that did not fail with EROFS:\n  {}", failures.join("\n  "));
    // nothing changed, neither in the bucket nor through the mount
    assert_eq!(bucket_snapshot(&b), before, "the bucket changed");
    assert_eq!(get(&b, "file.txt"), b"original");
    assert_eq!(ls(m.path()), ["dir", "emptydir", "file.txt"]);
    assert_eq!(ls(&m.join("dir")), ["inner.txt"]);
    assert_eq!(std::fs::read(p("file.txt")).unwrap(), b"original");
}
