//! Running the real `bucketfs` binary: [`MountBuilder`] builds the command line (endpoint,
//! credentials, sources, options) and starts a foreground mount ([`Mount`], unmounted and
//! reaped on drop), a mount expected to fail ([`MountFailure`]) or a background mount
//! ([`BackgroundMount`]); one-shot commands (`run_bucketfs`); unmounting.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{
    is_mounted, minio, mount_count, pids_with_arg_containing, wait_until, S3Request, TempCredentials, ACCESS_KEY,
    REGION, SECRET_KEY,
};

/// How long a mount may take to appear in mountinfo.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a mount that is expected to fail may run before we give up on it.
pub const FAILING_MOUNT_TIMEOUT: Duration = Duration::from_secs(20);

/// `fusermount3 -u` (retried, then `-uz`) until `path` is no longer a mount point.
/// Returns a description of what went wrong, if anything.
pub fn force_unmount(path: &Path) -> Result<(), String> {
    let mut msgs = Vec::new();
    for attempt in 0..8 {
        if !is_mounted(path) {
            return Ok(());
        }
        let lazy = attempt >= 5;
        let out =
            Command::new("fusermount3").arg(if lazy { "-uz" } else { "-u" }).arg(path).stdin(Stdio::null()).output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => msgs.push(format!(
                "fusermount3 {}: {}",
                if lazy { "-uz" } else { "-u" },
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => msgs.push(format!("cannot run fusermount3: {e}")),
        }
        if wait_until(Duration::from_millis(500), || !is_mounted(path)) {
            return Ok(());
        }
    }
    if is_mounted(path) {
        Err(msgs.join("; "))
    } else {
        Ok(())
    }
}

fn wait_child_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn describe_status(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => format!("{st}"),
    }
}

pub fn bucketfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_bucketfs")
}

/// A `bucketfs` command with a controlled environment: no AWS_* / BUCKETFS_* variables from the
/// shell, credentials given explicitly, no config/credential files, no IMDS.
pub fn bucketfs_command(access_key: &str, secret_key: &str) -> Command {
    let mut cmd = Command::new(bucketfs_bin());
    for (k, _) in std::env::vars_os() {
        let ks = k.to_string_lossy();
        if ks.starts_with("AWS_") || ks.starts_with("BUCKETFS_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("AWS_ACCESS_KEY_ID", access_key)
        .env("AWS_SECRET_ACCESS_KEY", secret_key)
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .stdin(Stdio::null());
    cmd
}

fn log_level_passthrough() -> Option<String> {
    std::env::var("BUCKETFS_TEST_LOG_LEVEL").ok().filter(|s| !s.is_empty())
}

/// Whether the bucketfs children may print log lines (then "stderr is one line" is not checked).
pub fn logging_requested() -> bool {
    log_level_passthrough().is_some() || std::env::var_os("RUST_LOG").is_some()
}

/// Runs `bucketfs ARGS` to completion (with a timeout) and returns (status, stdout, stderr).
/// Panics if it does not exit in time (after killing it).
pub fn run_bucketfs(args: &[&str], timeout: Duration) -> (ExitStatus, String, String) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = bucketfs_command(ACCESS_KEY, SECRET_KEY);
    cmd.args(args).stdout(Stdio::from(out.reopen().unwrap())).stderr(Stdio::from(err.reopen().unwrap()));
    let mut child = cmd.spawn().expect("spawn bucketfs");
    let st = match wait_child_timeout(&mut child, timeout) {
        Some(st) => st,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`bucketfs {}` did not exit within {timeout:?}; stderr:\n{}",
                args.join(" "),
                std::fs::read_to_string(err.path()).unwrap_or_default()
            );
        }
    };
    (
        st,
        std::fs::read_to_string(out.path()).unwrap_or_default(),
        std::fs::read_to_string(err.path()).unwrap_or_default(),
    )
}

/// Builds a `bucketfs mount` invocation.
#[derive(Clone)]
pub struct MountBuilder {
    endpoint: String,
    access_key: String,
    secret_key: String,
    session_token: Option<String>,
    sources: Vec<String>,
    extra: Vec<String>,
    mountpoint: Option<PathBuf>,
    foreground: bool,
    log_passthrough: bool,
    request_log: bool,
    env: Vec<(String, String)>,
}

impl MountBuilder {
    /// Against the MinIO of this process.
    pub fn new() -> Self {
        MountBuilder {
            endpoint: minio().endpoint.clone(),
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
            session_token: None,
            sources: Vec::new(),
            extra: Vec::new(),
            mountpoint: None,
            foreground: true,
            log_passthrough: true,
            request_log: false,
            env: Vec::new(),
        }
    }

    /// Sets an environment variable of the bucketfs process (test knobs such as
    /// `BUCKETFS_TEST_SINGLE_COPY_LIMIT`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Makes bucketfs log every S3 request it sends (see [`Mount::s3_requests`]).
    pub fn request_log(mut self) -> Self {
        self.request_log = true;
        self
    }

    /// Adds a raw SOURCE argument (`s3://bucket[/prefix][=subdir]`).
    pub fn source(mut self, s: impl Into<String>) -> Self {
        self.sources.push(s.into());
        self
    }

    /// Adds `s3://BUCKET` as a source.
    pub fn bucket(self, b: &str) -> Self {
        self.source(format!("s3://{b}"))
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.extra.push(a.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.extra.extend(a.into_iter().map(Into::into));
        self
    }

    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        self.endpoint = url.into();
        self
    }

    pub fn secret_key(mut self, k: impl Into<String>) -> Self {
        self.secret_key = k.into();
        self
    }

    pub fn access_key(mut self, k: impl Into<String>) -> Self {
        self.access_key = k.into();
        self
    }

    /// Passed to bucketfs as `AWS_SESSION_TOKEN` (temporary credentials).
    pub fn session_token(mut self, t: impl Into<String>) -> Self {
        self.session_token = Some(t.into());
        self
    }

    /// Mounts with these temporary credentials (access key, secret key, session token).
    pub fn credentials(self, c: &TempCredentials) -> Self {
        self.access_key(&c.access_key).secret_key(&c.secret_key).session_token(&c.session_token)
    }

    /// Uses this path as the mount point instead of a fresh temp dir (not removed afterwards).
    pub fn mountpoint(mut self, p: impl Into<PathBuf>) -> Self {
        self.mountpoint = Some(p.into());
        self
    }

    /// Do not add `--log-level` from BUCKETFS_TEST_LOG_LEVEL (for tests passing their own).
    pub fn no_log_passthrough(mut self) -> Self {
        self.log_passthrough = false;
        self
    }

    /// Without `--foreground` (the command returns once the daemon serves the mount).
    pub fn background(mut self) -> Self {
        self.foreground = false;
        self
    }

    /// Whether the test says where a background daemon logs (`--log-file`, or the
    /// `--cache-dir` holding `bucketfs-logs/`).
    fn chooses_where_logs_go(&self) -> bool {
        self.extra.iter().any(|arg| arg == "--log-file" || arg == "--cache-dir")
    }

    fn command(&self, mountpoint: &Path) -> (Command, Vec<OsString>) {
        let mut cmd = bucketfs_command(&self.access_key, &self.secret_key);
        if let Some(token) = &self.session_token {
            cmd.env("AWS_SESSION_TOKEN", token);
        }
        cmd.envs(self.env.iter().map(|(name, value)| (name, value)));
        let mut args: Vec<OsString> = vec!["mount".into()];
        if self.foreground {
            args.push("--foreground".into());
        }
        args.extend(
            ["--endpoint-url", &self.endpoint, "--force-path-style", "--region", REGION].iter().map(OsString::from),
        );
        if let Some(l) = log_level_passthrough().filter(|_| self.log_passthrough) {
            args.push("--log-level".into());
            args.push(l.into());
        }
        args.extend(self.extra.iter().map(OsString::from));
        if !self.extra.iter().any(|arg| arg == "--fuse-transport") {
            // One transport for the whole run, whatever the kernel's switch says: the one
            // BUCKETFS_TEST_FUSE_TRANSPORT names, /dev/fuse by default (tests/fuse_transport.rs
            // covers io_uring).
            let transport = std::env::var("BUCKETFS_TEST_FUSE_TRANSPORT").unwrap_or_else(|_| "dev-fuse".into());
            args.extend(["--fuse-transport".into(), transport.into()]);
        }
        args.extend(self.sources.iter().map(OsString::from));
        args.push(mountpoint.as_os_str().to_owned());
        cmd.args(&args);
        (cmd, args)
    }

    /// Spawns `bucketfs mount ...` on the chosen mount point, or on a fresh temp dir named
    /// `<temp_prefix><pid>-…`, with its stdout, stderr (and request log) in temp files: the
    /// start that [`Self::mount`] and [`Self::expect_failure`] share.
    fn launch(self, temp_prefix: &str) -> Launched {
        let (dir, path) = match &self.mountpoint {
            Some(p) => (None, p.clone()),
            None => {
                let d = tempfile::Builder::new()
                    .prefix(&format!("{temp_prefix}{}-", std::process::id()))
                    .tempdir()
                    .unwrap();
                let p = d.path().canonicalize().unwrap();
                (Some(d), p)
            }
        };
        let mounts_before = mount_count(&path);
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let stdout = tempfile::NamedTempFile::new().unwrap();
        let request_log = self.request_log.then(|| tempfile::NamedTempFile::new().unwrap());
        let mut builder = self;
        if let Some(log) = &request_log {
            let file = log.path().to_string_lossy().into_owned();
            builder = builder.args(["--log-level", "bucketfs=debug", "--log-file", &file]);
        }
        // A background daemon would log under the default cache directory (/var/tmp).
        let daemon_log = (!builder.foreground && !builder.chooses_where_logs_go()).then(|| {
            let log = tempfile::NamedTempFile::new().unwrap();
            builder = std::mem::take(&mut builder).args(["--log-file", &log.path().to_string_lossy()]);
            log
        });
        let (mut cmd, args) = builder.command(&path);
        cmd.stdout(Stdio::from(stdout.reopen().unwrap())).stderr(Stdio::from(stderr.reopen().unwrap()));
        unsafe {
            cmd.pre_exec(|| {
                // If the test process dies without running Drop, ask the mount to go away
                // cleanly. (Fires when the spawning thread exits; a Mount must therefore be
                // created and dropped on the same thread, which is what tests do.)
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let started = Instant::now();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bucketfs_bin()));
        Launched {
            child,
            dir,
            path,
            mounts_before,
            stderr,
            stdout,
            args,
            request_log,
            _daemon_log: daemon_log,
            started,
        }
    }

    /// Starts `bucketfs mount --foreground ...` and waits until the mount point shows up in
    /// /proc/self/mountinfo. Panics (with the child's stderr) if the child exits first or the
    /// mount does not appear within 20 s.
    pub fn mount(self) -> Mount {
        assert!(self.foreground, "use mount_background() for background mounts");
        let launched = self.launch("bucketfs-mnt-");
        let before = launched.mounts_before;
        let mut m = Mount {
            child: Some(launched.child),
            dir: launched.dir,
            path: launched.path,
            stderr: launched.stderr,
            stdout: launched.stdout,
            args: launched.args,
            request_log: launched.request_log,
        };
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if mount_count(&m.path) > before {
                return m;
            }
            if let Ok(Some(st)) = m.child.as_mut().unwrap().try_wait() {
                m.child = None;
                panic!(
                    "bucketfs exited ({}) before the mount appeared.\ncommand: {}\nstderr:\n{}{}",
                    describe_status(&st),
                    m.command_line(),
                    m.stderr(),
                    m.requests_text()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "mount did not appear in /proc/self/mountinfo within {MOUNT_TIMEOUT:?}\n\
                     command: {}\nstderr:\n{}{}",
                    m.command_line(),
                    m.stderr(),
                    m.requests_text()
                );
                // Drop kills the child
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a mount that is expected to FAIL. Returns its exit status and stderr once it exits.
    /// Panics if the mount appears (after cleaning it up) or if it runs longer than 20 s.
    pub fn expect_failure(self) -> MountFailure {
        let foreground = self.foreground;
        // `_dir` (the temp mount point, if ours) lives until we return.
        let Launched { mut child, dir: _dir, path, mounts_before: before, stderr, stdout, args, started, .. } =
            self.launch("bucketfs-mnt-fail-");
        let cmdline = args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
        let read_err = || std::fs::read_to_string(stderr.path()).unwrap_or_default();
        let cleanup = |child: &mut Child| {
            if path.exists() && mount_count(&path) > before {
                let _ = Command::new("fusermount3").arg("-u").arg(&path).output();
                if mount_count(&path) > before {
                    let _ = Command::new("fusermount3").arg("-uz").arg(&path).output();
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            if !foreground {
                let needle = path.to_str().unwrap();
                for pid in pids_with_arg_containing(needle) {
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        };
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let elapsed = started.elapsed();
                // a background mount could have succeeded and returned
                if path.exists() && mount_count(&path) > before {
                    cleanup(&mut child);
                    panic!(
                        "mount was expected to fail but it succeeded ({}).\ncommand: bucketfs {cmdline}\nstderr:\n{}",
                        describe_status(&st),
                        read_err()
                    );
                }
                return MountFailure {
                    status: st,
                    stderr: read_err(),
                    stdout: std::fs::read_to_string(stdout.path()).unwrap_or_default(),
                    elapsed,
                    command: cmdline,
                };
            }
            if path.exists() && mount_count(&path) > before {
                cleanup(&mut child);
                panic!(
                    "mount was expected to fail but it appeared in mountinfo.\ncommand: bucketfs {cmdline}\nstderr:\n{}",
                    read_err()
                );
            }
            if started.elapsed() > FAILING_MOUNT_TIMEOUT {
                cleanup(&mut child);
                panic!(
                    "mount expected to fail did not exit within {FAILING_MOUNT_TIMEOUT:?}.\n\
                     command: bucketfs {cmdline}\nstderr:\n{}",
                    read_err()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `bucketfs mount` WITHOUT --foreground and waits for the command to return.
    /// The returned guard unmounts and kills the daemon (if still there) on drop.
    pub fn mount_background(mut self) -> BackgroundMount {
        self.foreground = false;
        let dir =
            tempfile::Builder::new().prefix(&format!("bucketfs-mnt-bg-{}-", std::process::id())).tempdir().unwrap();
        let path = dir.path().canonicalize().unwrap();
        let log_dir = tempfile::Builder::new().prefix("bucketfs-bg-log-").tempdir().unwrap();
        let log_file = log_dir.path().join("bucketfs.log");
        if !self.chooses_where_logs_go() {
            // Else the daemon logs under the default cache directory (/var/tmp), for ever.
            self = self.args(["--log-file", &log_file.to_string_lossy()]);
        }
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let (mut cmd, args) = self.command(&path);
        let out = stderr.reopen().unwrap();
        cmd.stdout(Stdio::from(out.try_clone().unwrap())).stderr(Stdio::from(out));
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bucketfs_bin()));
        let status = wait_child_timeout(&mut child, MOUNT_TIMEOUT);
        let elapsed = start.elapsed();
        let bg = BackgroundMount {
            _dir: dir,
            path,
            _log_dir: log_dir,
            log_file,
            output: stderr,
            status,
            elapsed,
            command: args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
        };
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`bucketfs {}` (background) did not return within {MOUNT_TIMEOUT:?}; output:\n{}",
                bg.command,
                bg.output()
            );
        }
        bg
    }
}

impl Default for MountBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// A `bucketfs mount` just spawned, before we know whether it mounts.
struct Launched {
    child: Child,
    /// The temp mount point, when none was given.
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    /// Mounts stacked on `path` before ours (ours is there when the count grows).
    mounts_before: usize,
    stderr: tempfile::NamedTempFile,
    stdout: tempfile::NamedTempFile,
    args: Vec<OsString>,
    request_log: Option<tempfile::NamedTempFile>,
    /// Where a background daemon logs, when the test did not say.
    _daemon_log: Option<tempfile::NamedTempFile>,
    started: Instant,
}

pub struct MountFailure {
    pub status: ExitStatus,
    pub stderr: String,
    pub stdout: String,
    pub elapsed: Duration,
    pub command: String,
}

impl MountFailure {
    /// Checks the failure contract: non-zero exit (not a crash), within 15 s, an error message
    /// on stderr containing `needle` (case-insensitive), on a single line, and no panic.
    #[track_caller]
    pub fn assert_error(&self, needle: &str) {
        let ctx = format!(
            "command: bucketfs {}\n{} after {:?}\nstderr:\n{}\nstdout:\n{}",
            self.command,
            describe_status(&self.status),
            self.elapsed,
            self.stderr,
            self.stdout
        );
        assert!(self.status.code().is_some_and(|c| c != 0), "expected a non-zero exit code\n{ctx}");
        assert!(self.elapsed < Duration::from_secs(15), "took longer than 15 s\n{ctx}");
        assert!(!self.stderr.contains("panicked"), "bucketfs panicked\n{ctx}");
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        let hit = lines.iter().any(|l| l.to_lowercase().contains(&needle.to_lowercase()));
        assert!(hit, "no stderr line contains {needle:?}\n{ctx}");
        if !logging_requested() {
            assert_eq!(lines.len(), 1, "expected a one-line error message on stderr\n{ctx}");
        }
    }

    /// Non-zero exit within 15 s, without a panic (message not checked).
    #[track_caller]
    pub fn assert_failed_cleanly(&self) {
        let ctx = format!(
            "command: bucketfs {}\n{} after {:?}\nstderr:\n{}",
            self.command,
            describe_status(&self.status),
            self.elapsed,
            self.stderr
        );
        assert!(self.status.code().is_some_and(|c| c != 0), "expected a non-zero exit\n{ctx}");
        assert!(self.elapsed < Duration::from_secs(15), "took longer than 15 s\n{ctx}");
        assert!(!self.stderr.contains("panicked"), "bucketfs panicked\n{ctx}");
        assert!(!self.stderr.trim().is_empty(), "no error message on stderr\n{ctx}");
    }
}

/// A running `bucketfs mount --foreground` child. Dropping it unmounts (fusermount3 -u, then
/// -uz), waits for the child (kills it after 10 s) and removes the temp mount point. When the
/// test is panicking, the child's stderr is printed.
pub struct Mount {
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    stderr: tempfile::NamedTempFile,
    stdout: tempfile::NamedTempFile,
    args: Vec<OsString>,
    request_log: Option<tempfile::NamedTempFile>,
}

impl Mount {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `mountpoint/rel`
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.stdout.path()).unwrap_or_default()
    }

    pub fn command_line(&self) -> String {
        let mut s = String::from(bucketfs_bin());
        for a in &self.args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }

    /// The S3 requests bucketfs has sent so far (needs [`MountBuilder::request_log`]),
    /// parsed from its debug log lines `s3 GET bucket=B key="K" start=S len=L`.
    pub fn s3_requests(&self) -> Vec<S3Request> {
        let log = self.request_log.as_ref().expect("mount built without request_log()");
        std::fs::read_to_string(log.path()).unwrap_or_default().lines().filter_map(S3Request::parse).collect()
    }

    /// The keys of the S3 requests of `op` (`PUT`, `COPY`, `DELETE`…) so far, in order.
    pub fn requests_of(&self, op: &str) -> Vec<String> {
        self.s3_requests().into_iter().filter(|r| r.op == op).map(|r| r.key).collect()
    }

    /// The keys deleted so far, by `DeleteObject` or within a `DeleteObjects` request (as
    /// `--write-back` sends the deletes of `unlink` and `rmdir`), in order.
    pub fn deleted_keys(&self) -> Vec<String> {
        let deletes = self.s3_requests().into_iter().filter(|r| r.op == "DELETE" || r.op == "DELETE-OBJECTS");
        deletes.map(|r| r.key).collect()
    }

    /// The whole debug log (needs [`MountBuilder::request_log`]): warnings, not only requests.
    pub fn log_text(&self) -> String {
        let log = self.request_log.as_ref().expect("mount built without request_log()");
        std::fs::read_to_string(log.path()).unwrap_or_default()
    }

    fn requests_text(&self) -> String {
        if self.request_log.is_none() {
            return String::new();
        }
        let lines: Vec<String> = self.s3_requests().iter().map(|r| format!("{r:?}")).collect();
        format!("\nS3 requests:\n{}", lines.join("\n"))
    }

    pub fn is_mounted(&self) -> bool {
        is_mounted(&self.path)
    }

    /// Whether the child process is still running.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: i32) {
        let pid = self.pid().expect("child already reaped") as i32;
        let r = unsafe { libc::kill(pid, sig) };
        assert_eq!(r, 0, "kill({pid}, {sig}): {}", io::Error::last_os_error());
    }

    /// Waits for the child to exit (reaps it). None on timeout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        let st = wait_child_timeout(c, timeout);
        if st.is_some() {
            self.child = None;
        }
        st
    }

    /// A description for assertion messages: command, stderr, S3 request log.
    pub fn diagnostics(&self) -> String {
        format!("command: {}\nbucketfs stderr:\n{}{}", self.command_line(), self.stderr(), self.requests_text())
    }

    /// Asserts that the mount is still alive: the child runs and the mount point answers.
    #[track_caller]
    pub fn assert_alive(&mut self) {
        let running = self.is_running();
        assert!(running, "bucketfs process died\n{}", self.diagnostics());
        assert!(self.is_mounted(), "mount point vanished\n{}", self.diagnostics());
        if let Err(e) = std::fs::metadata(&self.path) {
            panic!("mount point does not answer: {e}\n{}", self.diagnostics());
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let unmount = force_unmount(&self.path);
        let mut problems = Vec::new();
        if let Err(e) = &unmount {
            problems.push(format!("could not unmount {}: {e}", self.path.display()));
        }
        if let Some(mut c) = self.child.take() {
            if wait_child_timeout(&mut c, Duration::from_secs(10)).is_none() {
                problems.push("bucketfs did not exit within 10 s of the unmount; killed".into());
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if unmount.is_err() {
            // don't let TempDir try to delete through a mount
            if let Some(d) = self.dir.take() {
                let _ = d.keep();
            }
        }
        if panicking || !problems.is_empty() {
            eprintln!(
                "---- bucketfs mount {} ----\n{}\n{}",
                self.path.display(),
                problems.join("\n"),
                self.diagnostics()
            );
        }
    }
}

/// A mount started without --foreground.
pub struct BackgroundMount {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    _log_dir: tempfile::TempDir,
    /// A path bucketfs may use with --log-file (tests pass it explicitly if they want it).
    pub log_file: PathBuf,
    output: tempfile::NamedTempFile,
    /// Exit status of the `bucketfs mount` command.
    pub status: Option<ExitStatus>,
    pub elapsed: Duration,
    pub command: String,
}

impl BackgroundMount {
    /// stdout+stderr of the `bucketfs mount` command (and of the daemon if it kept them).
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.output.path()).unwrap_or_default()
    }

    pub fn daemon_pids(&self) -> Vec<i32> {
        pids_with_arg_containing(self.path.to_str().unwrap())
    }

    pub fn diagnostics(&self) -> String {
        format!(
            "command: bucketfs {}\nstatus: {:?}\noutput:\n{}\nlog file:\n{}",
            self.command,
            self.status.as_ref().map(describe_status),
            self.output(),
            std::fs::read_to_string(&self.log_file).unwrap_or_default()
        )
    }
}

impl Drop for BackgroundMount {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let r = force_unmount(&self.path);
        // the daemon is a grandchild of ours: give it a moment, then kill what is left
        let gone = wait_until(Duration::from_secs(5), || self.daemon_pids().is_empty());
        if !gone {
            for pid in self.daemon_pids() {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if panicking || r.is_err() {
            eprintln!(
                "---- bucketfs background mount {} ----\nunmount: {r:?}\n{}",
                self.path.display(),
                self.diagnostics()
            );
        }
    }
}

/// A `--cache-dir` for a mount and the next one (the write-back log lives there), and
/// its path as an argument.
pub fn temp_cache_dir() -> (tempfile::TempDir, String) {
    let cache = tempfile::tempdir().expect("cache dir");
    let path = cache.path().to_str().expect("UTF-8").to_owned();
    (cache, path)
}

/// `kill -9` of the mount's daemon; returns once it is gone.
pub fn kill_daemon(mut m: Mount) {
    m.signal(libc::SIGKILL);
    assert!(m.wait_exit(Duration::from_secs(10)).is_some(), "daemon did not die");
}
