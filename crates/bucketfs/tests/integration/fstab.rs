//! bucketfs started the way mount(8) and `/etc/fstab` start it: `mount -t fuse.bucketfs`
//! runs fuse3's `mount.fuse3`, which runs `bucketfs SOURCE MOUNTPOINT -o OPTIONS` found on
//! the fixed PATH it gives helpers (so the binary must be installed there: the test links
//! the built one into /usr/local/bin for its duration).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::*;

const INSTALLED: &str = "/usr/local/bin/bucketfs";

/// The built binary as `/usr/local/bin/bucketfs` while this lives; whatever symlink was
/// there is put back.
struct OnPath {
    previous: Option<PathBuf>,
}

impl OnPath {
    fn install() -> Self {
        let path = Path::new(INSTALLED);
        let previous = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => std::fs::read_link(path).ok(),
            Ok(_) => panic!("{INSTALLED} is an installed bucketfs: this test would run it instead of the one built"),
            Err(_) => None,
        };
        let _ = std::fs::remove_file(path);
        std::os::unix::fs::symlink(bucketfs_bin(), path).expect("link the binary into /usr/local/bin");
        Self { previous }
    }
}

impl Drop for OnPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(INSTALLED);
        if let Some(previous) = &self.previous {
            let _ = std::os::unix::fs::symlink(previous, INSTALLED);
        }
    }
}

/// `mount ARGS` (or `umount`) with the MinIO credentials in the environment, which
/// mount(8) hands on to the helper.
fn run(program: &str, args: &[&str]) -> Output {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("AWS_") {
            command.env_remove(name);
        }
    }
    command
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .args(args)
        .stdin(Stdio::null());
    command.output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Unmounts whatever is still mounted on the mount point when the test ends, also when it
/// panics half-way (mount(8) starts daemons this process does not own).
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let _ = force_unmount(&self.0);
    }
}

fn unmount_and_wait(mountpoint: &Path) {
    let out = run("umount", &[mountpoint.to_str().expect("UTF-8")]);
    assert!(out.status.success(), "umount: {}", String::from_utf8_lossy(&out.stderr));
    let daemon_gone = wait_until(Duration::from_secs(10), || {
        pids_with_arg_containing(mountpoint.to_str().expect("UTF-8")).is_empty()
    });
    assert!(daemon_gone, "the daemon of {} outlived its unmount", mountpoint.display());
}

#[test]
fn mount_t_fuse_bucketfs_and_an_fstab_line_mount_with_their_options() {
    let bucket = create_bucket("fstab");
    put(&bucket, "dir/hello.txt", b"hello from fstab".to_vec());
    let _installed = OnPath::install();
    let dir = tempfile::tempdir().expect("tempdir");
    let mountpoint = dir.path().canonicalize().expect("canonical");
    let _cleanup = UnmountOnDrop(mountpoint.clone());
    let mnt = mountpoint.to_str().expect("UTF-8");
    // The daemons log to a file of the test's (by default: under /var/tmp, for ever).
    let log = tempfile::NamedTempFile::new().expect("log file");
    let store =
        format!("endpoint-url={},force-path-style,region={REGION},log-file={}", minio().endpoint, log.path().display());

    // `mount -t`, with what s3fs and rclone users write, and what mount(8) adds.
    let options = format!("{store},allow_other,noexec,uid=1234,gid=2345,umask=027,_netdev,nofail,x-systemd.automount");
    let source = format!("s3://{bucket}");
    let out = run("mount", &["-t", "fuse.bucketfs", &source, mnt, "-o", &options]);
    assert!(out.status.success(), "mount -t fuse.bucketfs: {}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(&mountpoint), "mount returned but nothing is mounted");
    assert_eq!(std::fs::read(mountpoint.join("dir/hello.txt")).expect("read"), b"hello from fstab");
    let file = std::fs::metadata(mountpoint.join("dir/hello.txt")).expect("stat file");
    let dir_meta = std::fs::metadata(mountpoint.join("dir")).expect("stat dir");
    assert_eq!((file.uid(), file.gid()), (1234, 2345), "uid= and gid=");
    assert_eq!(file.permissions().mode() & 0o777, 0o640, "umask=027 on a file");
    assert_eq!(dir_meta.permissions().mode() & 0o777, 0o750, "umask=027 on a directory");
    let shown = mount_options(&mountpoint).expect("in mountinfo");
    assert!(shown.contains("allow_other"), "allow_other reached the kernel: {shown}");
    assert!(shown.split(',').any(|o| o == "noexec"), "noexec reached the kernel: {shown}");
    let kind = mount_entries().into_iter().find(|(at, _, _)| at == mnt).map(|(_, kind, _)| kind);
    assert_eq!(kind.as_deref(), Some("fuse.bucketfs"));
    unmount_and_wait(&mountpoint);

    // The same from an fstab line, read-only, with `mount -a`.
    let fstab = tempfile::NamedTempFile::new().expect("fstab");
    let line = format!("{source}/dir {mnt} fuse.bucketfs ro,{store},_netdev,nofail 0 0\n");
    std::fs::write(fstab.path(), line).expect("write fstab");
    let out = run("mount", &["--fstab", fstab.path().to_str().expect("UTF-8"), "-a"]);
    assert!(out.status.success(), "mount -a: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(mountpoint.join("hello.txt")).expect("read"), b"hello from fstab", "the prefix");
    let refused = std::fs::write(mountpoint.join("new.txt"), b"x").expect_err("ro");
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "ro: {refused}");
    unmount_and_wait(&mountpoint);

    // An option bucketfs does not know fails the mount, and says which.
    let out = run("mount", &["-t", "fuse.bucketfs", &source, mnt, "-o", &format!("{store},fast")]);
    assert!(!out.status.success(), "an unknown option was accepted");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("unknown mount option 'fast'"), "{said}");
    assert!(!is_mounted(&mountpoint));
}
