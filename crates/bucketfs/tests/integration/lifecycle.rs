//! Starting and stopping mounts: background mode + `bucketfs unmount`, signals, external
//! unmount.

use std::time::Duration;

use crate::common::*;

#[test]
fn background_mount_then_unmount_command() {
    let b = create_bucket("bg");
    put(&b, "hello.txt", b"hello".to_vec());
    let bg = MountBuilder::new().bucket(&b).mount_background();
    let st = bg.status.expect("mount command finished");
    assert!(st.success(), "`bucketfs mount` (background) failed: {}\n{}", describe_status(&st), bg.diagnostics());
    // returns only once the mount answers: no waiting here
    assert!(is_mounted(&bg.path), "not mounted when `bucketfs mount` returned\n{}", bg.diagnostics());
    assert_eq!(std::fs::read(bg.path.join("hello.txt")).unwrap(), b"hello");
    let pids = bg.daemon_pids();
    assert!(!pids.is_empty(), "no process with {} in its command line", bg.path.display());

    let (st, out, err) = run_bucketfs(&["unmount", bg.path.to_str().unwrap()], Duration::from_secs(20));
    assert!(st.success(), "`bucketfs unmount` failed: {}\nstdout:\n{out}\nstderr:\n{err}", describe_status(&st));
    assert!(!is_mounted(&bg.path), "still mounted after `bucketfs unmount`");
    assert!(
        wait_until(Duration::from_secs(5), || bg.daemon_pids().is_empty()),
        "daemon still running 5 s after the unmount: {:?}",
        bg.daemon_pids()
    );
    assert_eq!(ls(&bg.path), Vec::<String>::new(), "the mount point is an empty dir again");
}

#[test]
fn unmount_command_on_a_foreground_mount() {
    let b = create_bucket("fg-unmount");
    put(&b, "f", b"x".to_vec());
    let mut m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(std::fs::read(m.join("f")).unwrap(), b"x");
    let (st, out, err) = run_bucketfs(&["unmount", m.path().to_str().unwrap()], Duration::from_secs(20));
    assert!(st.success(), "`bucketfs unmount` failed: {}\nstdout:\n{out}\nstderr:\n{err}", describe_status(&st));
    assert!(!m.is_mounted());
    let st = m.wait_exit(Duration::from_secs(10)).expect("foreground process still running after unmount");
    assert_eq!(st.code(), Some(0), "foreground process: {}\n{}", describe_status(&st), m.diagnostics());
}

/// A mount busy for a moment (a file of it open in another process, closed 300 ms later)
/// is unmounted once it is free; one that stays busy fails with the reason.
#[test]
fn unmount_command_waits_out_a_moment_of_busy() {
    let b = create_bucket("busy-unmount");
    put(&b, "f", b"x".to_vec());
    let mut m = MountBuilder::new().bucket(&b).mount();
    let mut holder = hold_open(&m.join("f"), "0.3");
    let (st, out, err) = run_bucketfs(&["unmount", m.path().to_str().unwrap()], Duration::from_secs(20));
    assert!(st.success(), "`bucketfs unmount` failed: {}\nstdout:\n{out}\nstderr:\n{err}", describe_status(&st));
    assert!(!m.is_mounted());
    holder.wait().expect("sh");
    m.wait_exit(Duration::from_secs(10)).expect("foreground process still running after unmount");

    let m = MountBuilder::new().bucket(&b).mount();
    let mut holder = hold_open(&m.join("f"), "5");
    let (st, _, err) = run_bucketfs(&["unmount", m.path().to_str().unwrap()], Duration::from_secs(20));
    assert!(!st.success() && err.contains("busy"), "unmounting a busy mount: {}\n{err}", describe_status(&st));
    assert!(m.is_mounted());
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Another process holding `path` open for `seconds` (once it has opened it).
fn hold_open(path: &std::path::Path, seconds: &str) -> std::process::Child {
    let script = format!("exec 3<\"$1\"; sleep {seconds}");
    let holder = std::process::Command::new("sh").args(["-c", &script, "sh"]).arg(path).spawn().expect("sh");
    std::thread::sleep(Duration::from_millis(100));
    holder
}

#[test]
fn unmount_command_on_a_directory_that_is_not_mounted() {
    let dir = tempfile::tempdir().unwrap();
    let (st, _, err) = run_bucketfs(&["unmount", dir.path().to_str().unwrap()], Duration::from_secs(20));
    assert!(!st.success(), "unmounting a plain directory succeeded");
    assert!(!err.trim().is_empty(), "no error message");
    assert!(!err.contains("panicked"), "{err}");
}

fn signal_unmounts_cleanly(sig: i32) {
    let b = create_bucket("signal");
    put(&b, "f", b"x".to_vec());
    let mut m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(std::fs::read(m.join("f")).unwrap(), b"x");
    m.signal(sig);
    let st = m
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s after signal {sig}\n{}", m.diagnostics()));
    assert_eq!(st.code(), Some(0), "after signal {sig}: {}\n{}", describe_status(&st), m.diagnostics());
    assert!(!m.is_mounted(), "mount point still in mountinfo after signal {sig}");
    assert_eq!(ls(m.path()), Vec::<String>::new());
}

#[test]
fn sigterm_unmounts_and_exits_zero() {
    signal_unmounts_cleanly(libc::SIGTERM);
}

#[test]
fn sigint_unmounts_and_exits_zero() {
    signal_unmounts_cleanly(libc::SIGINT);
}

/// SIGHUP (a terminal closing on a foreground mount, `kill -HUP` meant as "reload") does
/// not kill a mount without `--index`: it keeps serving (with `--index` it refreshes,
/// see tests/integration/index.rs).
#[test]
fn sighup_leaves_the_mount_serving() {
    let b = create_bucket("sighup");
    put(&b, "f", b"still here".to_vec());
    let mut m = MountBuilder::new().bucket(&b).mount();
    m.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    m.assert_alive();
    assert_eq!(std::fs::read(m.join("f")).expect("read after SIGHUP"), b"still here");
}

#[test]
fn external_fusermount_ends_the_process() {
    let b = create_bucket("ext-unmount");
    let mut m = MountBuilder::new().bucket(&b).mount();
    force_unmount(m.path()).expect("fusermount3 -u");
    let st = m
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s after fusermount3 -u\n{}", m.diagnostics()));
    assert_eq!(st.code(), Some(0), "{}\n{}", describe_status(&st), m.diagnostics());
}

/// --log-file: logs go to the file, not to stderr.
#[test]
fn log_file_receives_the_logs() {
    let b = create_bucket("logfile");
    let (m, text) = logged_session(&b, MountBuilder::new(), "debug", |_| {});
    assert!(!text.trim().is_empty(), "the log file is empty at --log-level debug");
    if std::env::var_os("RUST_LOG").is_none() {
        assert_eq!(m.stderr().trim(), "", "logs must go to --log-file, not stderr");
    }
}

/// A background mount without `--log-file` is not silent: `bucketfs mount` says where
/// the logs go, and warnings land there (here: the store refusing a write because the
/// bucket was deleted under the mount).
#[test]
fn background_mount_logs_warnings_by_default() {
    if std::path::Path::new("/run/systemd/journal/socket").exists() {
        eprintln!("journald runs here: logs go there, not to a file");
    }
    let b = create_bucket("bg-logs");
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("utf-8").to_owned();
    let bg = MountBuilder::new().bucket(&b).args(["--cache-dir", &cache_dir]).mount_background();
    assert!(bg.status.is_some_and(|s| s.success()), "{}", bg.diagnostics());
    let output = bg.output();
    let journald = std::path::Path::new("/run/systemd/journal/socket").exists();
    let expected = if journald { "journald".to_owned() } else { format!("{cache_dir}/bucketfs-logs/") };
    assert!(output.contains(&format!("logged to {expected}")), "mount says where logs go: {output}");
    block_on(s3().delete_bucket().bucket(&b).send()).expect("delete the bucket under the mount");
    assert!(std::fs::write(bg.path.join("refused"), b"x").is_err(), "the write is refused");
    if journald {
        return;
    }
    let logs = cache.path().join("bucketfs-logs");
    let found = wait_until(Duration::from_secs(10), || {
        std::fs::read_dir(&logs)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| std::fs::read_to_string(entry.path()).is_ok_and(|text| text.contains("does not exist")))
    });
    assert!(found, "the warning is in a log file under {}", logs.display());
    let (status, _, _) = run_bucketfs(&["unmount", bg.path.to_str().expect("utf-8")], Duration::from_secs(20));
    assert!(status.success());
}

/// Credentials never reach the logs, even at `--log-level trace` (which includes the
/// SDK's own request tracing): neither the secret key nor a session token, through
/// reads, writes, listings, a refused write and an unmount.
#[test]
fn credentials_never_appear_in_the_logs() {
    require_minio!("a read-only identity with a session token comes from MinIO's STS (AssumeRole)");
    let b = create_bucket("logsecret");
    let creds = read_only_credentials(&b);
    let (_, text) = logged_session(&b, MountBuilder::new().credentials(&creds), "trace", |m| {
        let refused = std::fs::File::create(m.join("refused")).and_then(|mut f| {
            std::io::Write::write_all(&mut f, b"y")?;
            close(f) // std::fs::write would not see the error close() returns
        });
        assert!(refused.is_err(), "a read-only identity cannot write");
    });
    assert!(text.lines().count() > 100, "a trace log of a few operations: {} lines", text.lines().count());
    assert!(text.contains(&creds.access_key), "the access key id (not a secret) shows that requests were logged");
    for (what, secret) in [("secret key", &creds.secret_key), ("session token", &creds.session_token)] {
        let at = text.find(secret.as_str());
        assert!(at.is_none(), "the {what} is in the log at byte {at:?} of the log file");
    }
}

/// A mount of `bucket` holding `f` (put here), logging at `level` to a file: reads `f`,
/// lists the root, runs `more`, then stops the daemon with SIGTERM (which must exit 0).
/// Returns the mount, exited, and the log file's text.
fn logged_session(bucket: &str, builder: MountBuilder, level: &str, more: impl FnOnce(&Mount)) -> (Mount, String) {
    put(bucket, "f", b"x".to_vec());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bucketfs.log");
    let mut m = builder
        .bucket(bucket)
        .no_log_passthrough()
        .args(["--log-level", level, "--log-file", log.to_str().unwrap()])
        .mount();
    assert_eq!(std::fs::read(m.join("f")).unwrap(), b"x");
    assert_eq!(ls(m.path()), ["f"]);
    more(&m);
    m.signal(libc::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(10)).expect("exit after SIGTERM");
    assert_eq!(st.code(), Some(0), "{}", m.diagnostics());
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("log file {}: {e}", log.display()));
    (m, text)
}
