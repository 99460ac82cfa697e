//! Who may access the mount: --allow-other.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::common::*;

const NOBODY: u32 = 65534;

/// `cat FILE` as user nobody: Ok(stdout) or Err(stderr).
fn cat_as_nobody(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let out =
        Command::new("cat").arg(path).uid(NOBODY).gid(NOBODY).stdin(Stdio::null()).output().expect("run cat as nobody");
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn other_users_need_allow_other() {
    let b = create_bucket("allow-other");
    put(&b, "f.txt", b"shared".to_vec());

    let m = MountBuilder::new().bucket(&b).mount();
    let r = cat_as_nobody(&m.join("f.txt"));
    assert!(r.is_err(), "user nobody could read a mount made without --allow-other");
    drop(m);

    let m = MountBuilder::new().bucket(&b).arg("--allow-other").mount();
    let opts = mount_options(m.path()).unwrap();
    assert!(opts.contains("allow_other"), "mount options: {opts}");
    match cat_as_nobody(&m.join("f.txt")) {
        Ok(data) => assert_eq!(data, b"shared"),
        Err(e) => panic!("user nobody cannot read with --allow-other: {e}\n{}", m.diagnostics()),
    }
}

/// Runs `sh -c SCRIPT` as user nobody; panics with its stderr if it fails.
fn sh_as_nobody(script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .output()
        .expect("run sh as nobody");
    assert!(out.status.success(), "sh -c {script:?} as nobody: {}", String::from_utf8_lossy(&out.stderr));
}

/// A write by a user without CAP_FSETID drops the file's set-user-ID bit, and its
/// set-group-ID bit when the file is group-executable, in the mount and in the store; a
/// write by root keeps them. Write-only descriptors write straight through (the kernel
/// leaves the bits to the daemon there), so both a new file and one opened again are
/// checked; so are `chown`, `truncate` and `open(O_TRUNC)`, which the kernel leaves to
/// the daemon too, and a truncate or `open(O_TRUNC)` by root without CAP_FSETID.
#[test]
fn a_write_by_another_user_drops_set_id_bits() {
    use std::os::unix::fs::PermissionsExt;
    let b = create_bucket("setid");
    let m = MountBuilder::new().bucket(&b).arg("--allow-other").mount();
    let mode_of = |name: &str| std::fs::metadata(m.join(name)).expect("stat").permissions().mode() & 0o7777;
    let set_mode = |name: &str, mode: u32| {
        std::fs::set_permissions(m.join(name), std::fs::Permissions::from_mode(mode)).expect("chmod")
    };

    // Group-executable: both bits go. Not group-executable: set-group-ID stays.
    for (name, mode, after) in [("exec", 0o6777, 0o777), ("lock", 0o6766, 0o2766)] {
        std::fs::write(m.join(name), b"by root").expect("write as root");
        set_mode(name, mode);
        // Root may write and keep them.
        let mut file = std::fs::OpenOptions::new().append(true).open(m.join(name)).expect("open as root");
        std::io::Write::write_all(&mut file, b", root again").expect("append as root");
        close(file).expect("close");
        assert_eq!(mode_of(name), mode, "{name}: a write by root keeps the set-ID bits");

        sh_as_nobody(&format!("printf ', nobody' >> '{}'", m.join(name).display()));
        assert_eq!(mode_of(name), after, "{name}: after a write by nobody\n{}", m.diagnostics());
        let stored = stored_metadata(&b, name);
        assert_eq!(stored.get("mode"), Some(&(libc::S_IFREG | after).to_string()), "{name}: stored {stored:?}");
        assert_eq!(std::fs::read(m.join(name)).expect("read"), b"by root, root again, nobody");
    }

    // What else takes them (the kernel leaves it to the daemon, FUSE_HANDLE_KILLPRIV_V2):
    // a chown, by root too, of a file but not of a directory; a truncate, and an
    // open(O_TRUNC), by nobody. A chmod by root after them sets them again.
    std::fs::write(m.join("chowned"), b"x").expect("write");
    set_mode("chowned", 0o6755);
    std::os::unix::fs::chown(m.join("chowned"), Some(NOBODY), None).expect("chown");
    assert_eq!(mode_of("chowned"), 0o755, "after chown by root\n{}", m.diagnostics());
    std::fs::create_dir(m.join("dir")).expect("mkdir");
    set_mode("dir", 0o2775);
    std::os::unix::fs::chown(m.join("dir"), Some(NOBODY), None).expect("chown dir");
    assert_eq!(mode_of("dir"), 0o2775, "a directory keeps set-group-ID through chown");
    for (name, how) in [("truncated", "truncate -s 1"), ("emptied", ": >")] {
        std::fs::write(m.join(name), b"by root").expect("write");
        set_mode(name, 0o6777);
        sh_as_nobody(&format!("{how} '{}'", m.join(name).display()));
        assert_eq!(mode_of(name), 0o777, "{name}: after `{how}` by nobody\n{}", m.diagnostics());
        let stored = stored_metadata(&b, name);
        assert_eq!(stored.get("mode"), Some(&(libc::S_IFREG | 0o777).to_string()), "{name}: stored {stored:?}");
    }

    // Root's truncate and open(O_TRUNC) keep them; a root process without CAP_FSETID loses
    // them, as on a local disk: only the kernel knows the capability, and says so
    // (FATTR_KILL_SUIDGID, FUSE_OPEN_KILL_SUIDGID).
    let capless = "setpriv --bounding-set -fsetid";
    for (name, how, after) in [
        ("by-root", "truncate -s 1".to_owned(), 0o6777),
        ("capless", format!("{capless} truncate -s 1"), 0o777),
        ("by-root-emptied", ": >".to_owned(), 0o6777),
        ("capless-emptied", format!("{capless} sh -c ': > \"$0\"'"), 0o777),
    ] {
        std::fs::write(m.join(name), b"by root").expect("write");
        set_mode(name, 0o6777);
        let out = Command::new("sh").arg("-c").arg(format!("{how} '{}'", m.join(name).display())).output().expect("sh");
        assert!(out.status.success(), "{how}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(mode_of(name), after, "{name}: after `{how}` by root\n{}", m.diagnostics());
    }

    // A file nobody creates and then makes set-user-ID, written again by nobody.
    std::fs::set_permissions(m.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod of the root");
    sh_as_nobody(&format!("cd '{}' && printf a > own && chmod 4755 own && printf b >> own", m.path().display()));
    assert_eq!(mode_of("own"), 0o755, "{}", m.diagnostics());
    assert_eq!(std::fs::read(m.join("own")).expect("read"), b"ab");
}
