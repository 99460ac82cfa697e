//! Ordinary users on a shared machine: a user who is not root mounts with state of its
//! own (`/var/tmp/bucketfs-UID`, mode 0700: the journal of uploads, the write-back log,
//! the logs), whoever mounted before, and a state directory it cannot use fails the
//! mount with one line instead of silently losing crash safety. The user is `nobody`;
//! it mounts through the setuid `fusermount3`, as users do.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;

const NOBODY: u32 = 65534;

/// `bucketfs ARGS` run as `nobody` (its home does not exist), with the test's credentials.
fn as_nobody(args: &[&str]) -> Command {
    let mut command = bucketfs_command(ACCESS_KEY, SECRET_KEY);
    command.args(args).env("HOME", "/nonexistent").uid(NOBODY).gid(NOBODY);
    command
}

/// A shell command run as `nobody`; its output, or a panic with its stderr.
fn shell_as_nobody(script: &str) -> String {
    let out =
        Command::new("sh").args(["-c", script]).uid(NOBODY).gid(NOBODY).stdin(Stdio::null()).output().expect("sh");
    assert!(out.status.success(), "`{script}` as nobody: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A directory `nobody` owns, to mount on.
fn mountpoint_of_nobody() -> tempfile::TempDir {
    let device = std::fs::metadata("/dev/fuse").expect("/dev/fuse");
    assert_eq!(device.mode() & 0o006, 0o006, "/dev/fuse is closed to users: run scripts/install-deps");
    let dir = tempfile::Builder::new().prefix("bucketfs-user-mnt-").tempdir_in("/tmp").expect("mountpoint");
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown the mountpoint");
    dir
}

fn mount_args<'a>(bucket: &'a str, mountpoint: &'a str, extra: &[&'a str]) -> Vec<String> {
    let endpoint = minio().endpoint.clone();
    let mut args = vec!["mount".to_owned(), "--endpoint-url".into(), endpoint, "--force-path-style".into()];
    args.extend(["--region", REGION].map(str::to_owned));
    args.extend(extra.iter().map(|arg| arg.to_string()));
    args.extend([format!("s3://{bucket}"), mountpoint.to_owned()]);
    args
}

fn mode_and_owner(path: &Path) -> (u32, u32) {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.mode() & 0o777, meta.uid())
}

#[test]
fn an_ordinary_user_mounts_with_state_of_its_own() {
    let b = create_bucket("user-state");
    let state = Path::new("/var/tmp/bucketfs-65534");
    let _ = std::fs::remove_dir_all(state);
    // Root's state directories exist already (root mounted before), as on the machine
    // where the issue was found.
    for dir in ["bucketfs-logs", "bucketfs-uploads", "bucketfs-write-back"] {
        std::fs::create_dir_all(Path::new("/var/tmp").join(dir)).expect("root's state directory");
    }
    let mountpoint = mountpoint_of_nobody();
    let mnt = mountpoint.path().to_str().expect("utf-8").to_owned();
    let args = mount_args(&b, &mnt, &["--part-size", "5MiB"]);
    let out = as_nobody(&args.iter().map(String::as_str).collect::<Vec<_>>()).output().expect("bucketfs mount");
    assert!(out.status.success(), "mount as nobody failed: {}", String::from_utf8_lossy(&out.stderr));
    let unmounted = std::panic::catch_unwind(|| {
        // 12 MiB: a multipart upload, recorded in the journal while it runs.
        shell_as_nobody(&format!("head -c 12582912 /dev/zero > {mnt}/big && ls -l {mnt}/big"));
        assert_eq!(mode_and_owner(state), (0o700, NOBODY), "{}", state.display());
        assert_eq!(mode_and_owner(&state.join("bucketfs-uploads")), (0o700, NOBODY));
        assert_eq!(mode_and_owner(&state.join("bucketfs-write-back")), (0o700, NOBODY));
        assert_eq!(mode_and_owner(&state.join("bucketfs-logs")), (0o700, NOBODY));
    });
    let unmount = as_nobody(&["unmount", &mnt]).output().expect("bucketfs unmount");
    if let Err(panic) = unmounted {
        let _ = force_unmount(mountpoint.path());
        std::panic::resume_unwind(panic);
    }
    assert!(unmount.status.success(), "unmount: {}", String::from_utf8_lossy(&unmount.stderr));
    assert_eq!(head(&b, "big").size, 12 * MIB as u64, "the file is stored");
    let logs = std::fs::read_dir(state.join("bucketfs-logs")).expect("the user's logs").count();
    assert!(logs > 0, "the daemon logged in the user's own directory");
    let log_text: String = std::fs::read_dir(state.join("bucketfs-logs"))
        .expect("logs")
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .collect();
    assert!(!log_text.contains("cannot record upload"), "the journal failed:\n{log_text}");
    let _ = std::fs::remove_dir_all(state);
}

#[test]
fn a_state_directory_the_user_cannot_use_fails_the_mount() {
    let b = create_bucket("user-state-refused");
    // A directory open to all (as /var/tmp) where root keeps its journal of uploads:
    // nobody could write staging files there, but not its journal.
    let theirs = tempfile::Builder::new().prefix("bucketfs-shared-").tempdir_in("/var/tmp").expect("dir");
    std::fs::set_permissions(theirs.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    std::fs::create_dir(theirs.path().join("bucketfs-uploads")).expect("root's journal");
    let mountpoint = mountpoint_of_nobody();
    let mnt = mountpoint.path().to_str().expect("utf-8").to_owned();
    let cache_dir = theirs.path().to_str().expect("utf-8");
    let args = mount_args(&b, &mnt, &["--cache-dir", cache_dir, "--log-file", "/dev/null"]);
    let out = as_nobody(&args.iter().map(String::as_str).collect::<Vec<_>>()).output().expect("bucketfs mount");
    if out.status.success() {
        let _ = force_unmount(mountpoint.path());
        panic!("nobody mounted with root's state directory {cache_dir}");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot keep the journal of uploads in {cache_dir}"))
            && stderr.contains("belongs to uid 0")
            && stderr.lines().count() == 1,
        "the mount does not say why:\n{stderr}"
    );
    assert!(!is_mounted(mountpoint.path()), "nothing is mounted");
}

/// A user's state follows the XDG base directory rules (`$XDG_STATE_HOME/bucketfs`), and a
/// state directory that is a symbolic link (another user's, pointing at a directory of
/// this user's) fails the mount with one line, leaving what it points at as it was.
#[test]
fn a_users_state_is_under_xdg_state_home_and_a_link_there_is_refused() {
    let b = create_bucket("user-xdg-state");
    let home = tempfile::Builder::new().prefix("bucketfs-user-home-").tempdir_in("/var/tmp").expect("home");
    std::os::unix::fs::chown(home.path(), Some(NOBODY), Some(NOBODY)).expect("chown");
    let state_home = home.path().join("state");
    let mountpoint = mountpoint_of_nobody();
    let mnt = mountpoint.path().to_str().expect("utf-8").to_owned();
    let args = mount_args(&b, &mnt, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = as_nobody(&args).env("XDG_STATE_HOME", &state_home).output().expect("bucketfs mount");
    assert!(out.status.success(), "mount as nobody failed: {}", String::from_utf8_lossy(&out.stderr));
    let unmount = as_nobody(&["unmount", &mnt]).output().expect("bucketfs unmount");
    assert!(unmount.status.success(), "unmount: {}", String::from_utf8_lossy(&unmount.stderr));
    let state = state_home.join("bucketfs");
    assert_eq!(mode_and_owner(&state), (0o700, NOBODY), "{}", state.display());
    for dir in ["bucketfs-uploads", "bucketfs-write-back", "bucketfs-logs"] {
        assert_eq!(mode_and_owner(&state.join(dir)), (0o700, NOBODY), "{dir}");
    }

    // Another user swaps the state directory for a link to a directory of nobody's.
    let target = home.path().join("shared-with-others");
    std::fs::create_dir(&target).expect("mkdir");
    std::os::unix::fs::chown(&target, Some(NOBODY), Some(NOBODY)).expect("chown");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::remove_dir_all(&state).expect("remove the state directory");
    std::os::unix::fs::symlink(&target, &state).expect("symlink");
    let out = as_nobody(&args).env("XDG_STATE_HOME", &state_home).output().expect("bucketfs mount");
    if out.status.success() {
        let _ = force_unmount(mountpoint.path());
        panic!("nobody mounted with a state directory that is a symbolic link");
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is a symbolic link") && stderr.lines().count() == 1,
        "the mount does not say why:\n{stderr}"
    );
    assert_eq!(mode_and_owner(&target), (0o755, NOBODY), "the link's target keeps its mode");
    assert!(std::fs::read_dir(&target).expect("target").next().is_none(), "nothing was written there");
    assert!(!is_mounted(mountpoint.path()), "nothing is mounted");
}

/// `--credentials-from-stdin` (how the CSI driver hands a volume's Secret to its daemon):
/// the key works, it is in no process's environment, and the daemon is not dumpable, so
/// its own user cannot read its memory or environment (`/proc/PID/*` belong to root).
#[test]
fn a_key_on_standard_input_is_in_no_environment_and_the_daemon_is_closed_to_its_user() {
    use std::io::Write as _;
    let b = create_bucket("user-key-stdin");
    let mountpoint = mountpoint_of_nobody();
    let mnt = mountpoint.path().to_str().expect("utf-8").to_owned();
    let args = mount_args(&b, &mnt, &["--credentials-from-stdin", "--log-file", "/dev/null"]);
    let mut command = bucketfs_command("", "");
    command.args(&args).env("HOME", "/nonexistent").uid(NOBODY).gid(NOBODY);
    let mut mount = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("mount");
    let key = format!("AWS_ACCESS_KEY_ID={ACCESS_KEY}\nAWS_SECRET_ACCESS_KEY={SECRET_KEY}\n");
    mount.stdin.take().expect("stdin").write_all(key.as_bytes()).expect("hand over the key");
    let out = mount.wait_with_output().expect("bucketfs mount");
    assert!(out.status.success(), "mount failed: {}", String::from_utf8_lossy(&out.stderr));
    let checked = std::panic::catch_unwind(|| {
        shell_as_nobody(&format!("echo stored > {mnt}/file"));
        let daemons = pids_with_arg_containing(&mnt);
        assert_eq!(daemons.len(), 1, "one daemon");
        let proc_dir = format!("/proc/{}", daemons[0]);
        let environment = std::fs::read(format!("{proc_dir}/environ")).expect("environ");
        let secret = SECRET_KEY.as_bytes();
        assert!(!environment.windows(secret.len()).any(|w| w == secret), "the key is in the environment");
        // The files of a process that is not dumpable are root's (the directory keeps its uid).
        let owner = std::fs::metadata(format!("{proc_dir}/environ")).expect("proc").uid();
        assert_eq!(owner, 0, "{proc_dir}/environ is its user's: the daemon is dumpable");
        let read = Command::new("cat").arg(format!("{proc_dir}/environ")).uid(NOBODY).gid(NOBODY).output();
        assert!(!read.expect("cat").status.success(), "its user reads the daemon's environment");
    });
    let unmount = as_nobody(&["unmount", &mnt]).output().expect("bucketfs unmount");
    if let Err(panic) = checked {
        let _ = force_unmount(mountpoint.path());
        std::panic::resume_unwind(panic);
    }
    assert!(unmount.status.success(), "unmount: {}", String::from_utf8_lossy(&unmount.stderr));
    assert_eq!(get(&b, "file"), b"stored\n");
}
