//! `bucketfs run`: a command run inside a mount of its inputs and outputs, with real
//! commands; what they wrote is checked in the bucket, and no mount or daemon is left.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// `bucketfs run` with the store options of the test MinIO, then `args`.
fn run_command(args: &[&str], credentials: Option<&TempCredentials>) -> Command {
    let mut command = match credentials {
        Some(c) => {
            let mut command = bucketfs_command(&c.access_key, &c.secret_key);
            command.env("AWS_SESSION_TOKEN", &c.session_token);
            command
        }
        None => bucketfs_command(ACCESS_KEY, SECRET_KEY),
    };
    command.args(["run", "--endpoint-url", &minio().endpoint, "--force-path-style", "--region", REGION]);
    command.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn wait_with_timeout(child: Child, timeout: Duration) -> (ExitStatus, String) {
    let output = wait_with_timeout_output(child, timeout);
    (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn wait_with_timeout_output(mut child: Child, timeout: Duration) -> Output {
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("bucketfs run did not end within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_gone(mountpoint: &Path) {
    assert!(!is_mounted(mountpoint), "{} is still mounted", mountpoint.display());
    let daemons = pids_with_arg_containing(mountpoint.to_str().expect("UTF-8"));
    assert!(daemons.is_empty(), "daemons left: {daemons:?}");
}

#[test]
fn a_command_reads_inputs_writes_outputs_and_its_exit_code_is_returned() {
    let bucket = create_bucket("run");
    put(&bucket, "refs/genome.fa", b">chr1\nACGT\n".to_vec());
    let seen = tempfile::tempdir().expect("tempdir");
    let script = format!(
        "pwd > {seen}/pwd; echo \"$BUCKETFS_MOUNT\" > {seen}/env; \
         tr ACGT TGCA < ref/genome.fa > out/complement.fa; mkdir -p out/logs; echo done > out/logs/step.log",
        seen = seen.path().display()
    );
    let refs = format!("s3://{bucket}/refs=ref");
    let outs = format!("s3://{bucket}/out=out");
    let child = run_command(&[&refs, &outs, "--", "sh", "-c", &script], None).spawn().expect("spawn");
    let (status, stderr) = wait_with_timeout(child, Duration::from_secs(60));
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(get(&bucket, "out/complement.fa"), b">chr1\nTGCA\n");
    assert_eq!(get(&bucket, "out/logs/step.log"), b"done\n");
    let pwd = std::fs::read_to_string(seen.path().join("pwd")).expect("pwd");
    let env = std::fs::read_to_string(seen.path().join("env")).expect("env");
    assert_eq!(pwd, env, "the working directory is BUCKETFS_MOUNT");
    let mountpoint = PathBuf::from(pwd.trim());
    assert!(mountpoint.file_name().is_some_and(|n| n.to_string_lossy().starts_with("bucketfs-run-")));
    assert_gone(&mountpoint);
    assert!(!mountpoint.exists(), "the private mount point is removed");
}

#[test]
fn a_failing_or_killed_command_gives_its_code_and_its_outputs_are_stored() {
    let bucket = create_bucket("run-fail");
    let outs = format!("s3://{bucket}=out");
    let child =
        run_command(&[&outs, "--", "sh", "-c", "echo partial > out/p.txt; exit 3"], None).spawn().expect("spawn");
    let (status, stderr) = wait_with_timeout(child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert_eq!(get(&bucket, "p.txt"), b"partial\n");

    let child =
        run_command(&[&outs, "--", "sh", "-c", "echo last > out/k.txt; kill -9 $$"], None).spawn().expect("spawn");
    let (status, stderr) = wait_with_timeout(child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(128 + 9), "killed by SIGKILL: {stderr}");
    assert_eq!(get(&bucket, "k.txt"), b"last\n");

    let child = run_command(&[&outs, "--", "/no/such/program"], None).spawn().expect("spawn");
    let (status, stderr) = wait_with_timeout(child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(127), "{stderr}");
    assert!(stderr.contains("cannot run /no/such/program"), "{stderr}");
}

#[test]
fn sigterm_to_run_goes_to_the_command_first() {
    let bucket = create_bucket("run-term");
    let outs = format!("s3://{bucket}=out");
    // The command writes a file, then waits; on SIGTERM it writes another and exits 143.
    let script = "trap 'echo stopped > out/after.txt; exit 143' TERM; echo started > out/before.txt; \
                  while true; do sleep 0.1; done";
    let child = run_command(&[&outs, "--", "sh", "-c", script], None).spawn().expect("spawn");
    let started = wait_until(Duration::from_secs(30), || list_keys(&bucket, "").contains(&"before.txt".to_owned()));
    assert!(started, "the command never started");
    // SAFETY: sends a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (status, stderr) = wait_with_timeout(child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert_eq!(get(&bucket, "after.txt"), b"stopped\n", "the command handled the signal in the mount");
}

#[test]
fn outputs_the_store_refuses_fail_run_and_are_named() {
    let bucket = create_bucket("run-refused");
    let read_only = read_only_credentials(&bucket);
    let outs = format!("s3://{bucket}=out");
    // With --write-back the command's close() succeeds (cp opens, writes and closes
    // once; a shell's `>` would close an empty file first, whose refusal the write after
    // it reports); the upload fails afterwards, where only the daemon sees it.
    let script = "cp /etc/hostname out/refused.txt && echo closed";
    // The refused file is kept in the write-back log: in a directory of this test's.
    let cache = tempfile::tempdir().expect("cache dir");
    let cache_dir = cache.path().to_str().expect("utf-8 path");
    let args = ["--write-back", "--cache-dir", cache_dir, &outs, "--", "sh", "-c", script];
    let child = run_command(&args, Some(&read_only)).spawn().expect("spawn");
    let output = wait_with_timeout_output(child, Duration::from_secs(60));
    let (status, stderr) = (output.status, String::from_utf8_lossy(&output.stderr).into_owned());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "closed\n", "the command saw no error: {stderr}");
    assert_eq!(status.code(), Some(1), "run failed though the command succeeded: {stderr}");
    assert!(stderr.contains("refused.txt"), "the file is named: {stderr}");
    assert!(list_keys(&bucket, "").is_empty());
    let kept = std::fs::read_dir(cache.path().join("bucketfs-write-back")).expect("the write-back log");
    let kept: Vec<_> = kept.flatten().filter(|e| e.file_name().to_string_lossy().contains(".failed-")).collect();
    assert_eq!(kept.len(), 1, "the refused file is kept for a retry by the next mount");
}
