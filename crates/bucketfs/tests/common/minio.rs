//! The MinIO server of a test process: built by scripts/install-deps, started lazily on a
//! free loopback port with a fresh data directory, killed when the test process exits
//! (PR_SET_PDEATHSIG from a parked thread, plus an atexit handler), even when a test panics
//! or the process is killed; the root credentials every client and mount uses; free ports.
//!
//! Or a store started outside the test process (scripts/test-stores): with
//! `BUCKETFS_TEST_STORE_ENDPOINT=http://127.0.0.1:PORT` and `BUCKETFS_TEST_STORE_KIND` (a kind
//! of scripts/start-store: minio, minio-erasure, seaweedfs, moto) [`minio()`] describes that
//! store instead, taking the same keys; nothing is started, and the harness never stops it or
//! deletes anything of it (it has no pid here and registers no exit handler). Optional
//! `BUCKETFS_TEST_STORE_LOG`: its log file, for failure messages. Tests that need what only
//! MinIO does start with [`require_minio!`], which skips them on other stores.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{block_on, is_mounted, s3_client_for, s3_client_tls};

pub const ACCESS_KEY: &str = "bucketfsadmin";
pub const SECRET_KEY: &str = "bucketfsadmin-secret";
pub const REGION: &str = "us-east-1";
/// The KMS key MinIO is started with: its id, and the 32-byte key in base64.
pub const KMS_KEY_ID: &str = "bucketfs-test-key";
const KMS_KEY: &str = "MzJieXRlc29mdGVzdGtleW5vdHNlY3JldGF0YWxsISE=";

pub struct Minio {
    /// `http://127.0.0.1:PORT` (`https://` for [`minio_tls`])
    pub endpoint: String,
    /// For [`minio_tls`]: the self-signed certificate it serves (PEM), to trust.
    pub certificate: Option<Vec<u8>>,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    /// The server process, when this test process started it (None for an external store:
    /// never signalled, never waited for).
    pub pid: Option<u32>,
    exit: Arc<Mutex<Option<ExitStatus>>>,
}

impl Minio {
    /// The MinIO log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Exit status if the server died.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.lock().unwrap()
    }
}

pub fn minio_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("BUCKETFS_MINIO") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/bucketfs-deps/bin/minio")
}

/// Picks a free loopback port (bind :0, read it, release it).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// A port on which nothing listens (for the "unreachable endpoint" case). Port 1 is the one the
/// task names, it is privileged and never used by anything on this machine.
pub const UNREACHABLE_ENDPOINT: &str = "http://127.0.0.1:1";

/// The MinIO server of this test process, started on first use; or the external store of
/// `BUCKETFS_TEST_STORE_ENDPOINT` (see the module's documentation).
pub fn minio() -> &'static Minio {
    static MINIO: OnceLock<Minio> = OnceLock::new();
    MINIO.get_or_init(|| match external_store_kind() {
        Some(kind) => external_store(kind),
        None => start_minio(false),
    })
}

/// The kind of the external store in use (`BUCKETFS_TEST_STORE_KIND`), or None when the tests
/// start their own MinIO (`BUCKETFS_TEST_STORE_ENDPOINT` unset or empty).
pub fn external_store_kind() -> Option<&'static str> {
    static KIND: OnceLock<Option<String>> = OnceLock::new();
    KIND.get_or_init(|| {
        std::env::var("BUCKETFS_TEST_STORE_ENDPOINT").ok().filter(|e| !e.is_empty())?;
        let kind = std::env::var("BUCKETFS_TEST_STORE_KIND").unwrap_or_default();
        if kind.is_empty() {
            panic!(
                "BUCKETFS_TEST_STORE_ENDPOINT is set: set BUCKETFS_TEST_STORE_KIND too (minio, seaweedfs, moto, ...)"
            );
        }
        Some(kind)
    })
    .as_deref()
}

/// The kind of store the tests run against: `minio` unless an external store is in use.
pub fn store_kind() -> &'static str {
    external_store_kind().unwrap_or("minio")
}

/// Whether the tests run against a store that is not MinIO (an external one of another kind).
pub fn store_is_not_minio() -> bool {
    external_store_kind().is_some_and(|kind| kind != "minio" && !kind.starts_with("minio-"))
}

/// Skips the calling test (returns from it) when the store is not MinIO, printing
/// `SKIPPED on KIND: WHY` (see [`skipped_on_this_store`]); does nothing otherwise.
#[macro_export]
macro_rules! require_minio {
    ($why:expr) => {
        if $crate::common::skipped_on_this_store($why) {
            return;
        }
    };
}

/// True (after saying so, see [`skip`]) when the store is not MinIO; false, silently,
/// otherwise. Use [`require_minio!`].
pub fn skipped_on_this_store(why: &str) -> bool {
    if !store_is_not_minio() {
        return false;
    }
    skip(why);
    true
}

/// What a test needs that some stores lack, for tests whose subject is exactly that
/// (docs/STORES.md, "Why tests fail on the other stores"); such a test skips itself there
/// with [`require_store_feature!`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFeature {
    /// A directory marker (`dir/`) keeps the user metadata it is written with, where
    /// directories' modes, owners and times are stored. SeaweedFS answers 200 and drops it.
    DirectoryMarkerMetadata,
    /// Drive directories a test can take away (`BUCKETFS_TEST_STORE_DRIVES`, set by
    /// scripts/test-stores for minio-erasure): only an erasure set has them.
    FailingDrives,
}

/// Whether the store the tests run against has `feature`.
pub fn store_has(feature: StoreFeature) -> bool {
    match feature {
        StoreFeature::DirectoryMarkerMetadata => store_kind() != "seaweedfs",
        StoreFeature::FailingDrives => store_drives().is_some(),
    }
}

/// The drive directories of the store under test (`BUCKETFS_TEST_STORE_DRIVES`,
/// `:`-separated), if it has them.
pub fn store_drives() -> Option<Vec<std::path::PathBuf>> {
    let drives = std::env::var("BUCKETFS_TEST_STORE_DRIVES").ok().filter(|drives| !drives.is_empty())?;
    Some(drives.split(':').map(std::path::PathBuf::from).collect())
}

/// Skips the calling test (returns from it) when the store lacks a [`StoreFeature`],
/// printing and logging `WHY` as [`require_minio!`] does; does nothing otherwise.
#[macro_export]
macro_rules! require_store_feature {
    ($feature:expr, $why:expr) => {
        if $crate::common::skipped_without($feature, $why) {
            return;
        }
    };
}

/// True (after saying so, see [`skip`]) when the store lacks `feature`. Use
/// [`require_store_feature!`].
pub fn skipped_without(feature: StoreFeature, why: &str) -> bool {
    if store_has(feature) {
        return false;
    }
    skip(why);
    true
}

/// Says that the calling test skips itself on this store: `SKIPPED on KIND: WHY` on
/// stdout and stderr, and `BINARY<TAB>TEST<TAB>KIND<TAB>WHY` appended to the file
/// `BUCKETFS_TEST_SKIP_LOG` if set (scripts/test-stores lists them).
fn skip(why: &str) {
    let kind = store_kind();
    let line = format!("SKIPPED on {kind}: {why}");
    println!("{line}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("BUCKETFS_TEST_SKIP_LOG").filter(|p| !p.is_empty()) {
        // The test's name is its thread's (libtest names each test's thread after it:
        // MODULE::TEST in the integration binary); the binary's name is its target's
        // (`integration`, or the file's of a binary of its own), without cargo's hash.
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        let exe = std::env::current_exe().ok().and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()));
        let exe = exe.unwrap_or_default();
        let binary = exe.rsplit_once('-').map_or(exe.as_str(), |(name, _)| name);
        let entry = format!("{binary}\t{test}\t{kind}\t{why}\n");
        // One write of a file opened to append: lines of tests running at once do not mix.
        let written =
            File::options().create(true).append(true).open(&path).and_then(|mut f| f.write_all(entry.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot append to BUCKETFS_TEST_SKIP_LOG {}: {e}", Path::new(&path).display());
        }
    }
}

/// The [`Minio`] of an external store: its endpoint, nothing to start or stop.
fn external_store(kind: &str) -> Minio {
    let endpoint = std::env::var("BUCKETFS_TEST_STORE_ENDPOINT").unwrap_or_default();
    let endpoint = endpoint.trim_end_matches('/').to_owned();
    // Toxiproxy and the relay reach the store at 127.0.0.1:port.
    let port = endpoint
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("BUCKETFS_TEST_STORE_ENDPOINT must be http://127.0.0.1:PORT, not {endpoint:?}"));
    let log_path = std::env::var_os("BUCKETFS_TEST_STORE_LOG").map(PathBuf::from).unwrap_or_default();
    eprintln!("tests run against an external {kind} store at {endpoint}");
    Minio {
        endpoint,
        certificate: None,
        port,
        data_dir: PathBuf::new(),
        log_path,
        pid: None,
        exit: Arc::new(Mutex::new(None)),
    }
}

/// A second MinIO of this test process that serves HTTPS with a self-signed certificate
/// for 127.0.0.1 (made with openssl): for SSE-C, which MinIO serves over TLS only, and for
/// `--ca-bundle`. Started on first use.
pub fn minio_tls() -> &'static Minio {
    static MINIO_TLS: OnceLock<Minio> = OnceLock::new();
    MINIO_TLS.get_or_init(|| start_minio(true))
}

/// A certificate for 127.0.0.1 in `dir` (`public.crt`, `private.key`, the names MinIO
/// looks for), signed by a CA made for it (in `dir/../ca`); returns the CA's certificate,
/// the one to trust. (rustls refuses a self-signed certificate that is its own CA.)
fn make_certificate(dir: &Path) -> Result<Vec<u8>, String> {
    let ca = dir.parent().unwrap_or(dir).join("ca");
    for made in [dir, &ca] {
        std::fs::create_dir_all(made).map_err(|e| format!("create {}: {e}", made.display()))?;
    }
    std::fs::write(ca.join("leaf.ext"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
        .map_err(|e| format!("write leaf.ext: {e}"))?;
    let openssl = |args: &[&str]| -> Result<(), String> {
        let out = Command::new("openssl").args(args).current_dir(&ca).output().map_err(|e| format!("openssl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)))
        }
    };
    let (key, certificate) = (dir.join("private.key"), dir.join("public.crt"));
    let (key, certificate) = (key.to_str().ok_or("path")?, certificate.to_str().ok_or("path")?);
    let ca_request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=bucketfs-test-ca"];
    openssl(&[&ca_request[..], &["-keyout", "ca.key", "-out", "ca.crt"]].concat())?;
    openssl(&["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", "leaf.csr"])?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
        "-out",
        certificate,
    ])?;
    std::fs::read(ca.join("ca.crt")).map_err(|e| format!("read the CA certificate: {e}"))
}

/// Bytes available on the disk that holds the data of the MinIO servers tests start.
pub fn minio_disk_available() -> u64 {
    let stat = nix::sys::statvfs::statvfs(&tmp_root()).expect("statvfs of the temporary directory");
    stat.blocks_available() as u64 * stat.fragment_size() as u64
}

fn tmp_root() -> PathBuf {
    std::env::temp_dir()
}

/// Leftovers of earlier test processes that are gone (a killed test run cannot clean up after
/// itself: statics are never dropped, Drop does not run): MinIO data dirs and toxiproxy logs
/// are deleted, empty
/// mount point dirs removed (never anything still mounted).
fn remove_stale_test_dirs() {
    let Ok(rd) = std::fs::read_dir(tmp_root()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (rest, server_dir) = if let Some(r) =
            name.strip_prefix("bucketfs-test-minio-").or_else(|| name.strip_prefix("bucketfs-test-toxiproxy-"))
        {
            (r, true)
        } else if let Some(r) = name
            .strip_prefix("bucketfs-mnt-bg-")
            .or_else(|| name.strip_prefix("bucketfs-mnt-fail-"))
            .or_else(|| name.strip_prefix("bucketfs-mnt-"))
        {
            (r, false)
        } else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if server_dir {
            let _ = std::fs::remove_dir_all(e.path());
        } else if !is_mounted(&e.path()) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// (pid, base dir) of the MinIO started by this process, for the exit handler.
static MINIO_CLEANUP: OnceLock<(u32, PathBuf)> = OnceLock::new();
static MINIO_TLS_CLEANUP: OnceLock<(u32, PathBuf)> = OnceLock::new();

/// Runs when the test binary exits normally (libtest returns from main even when tests
/// failed): kill MinIO now rather than waiting for PDEATHSIG, and delete its data directory.
extern "C" fn cleanup_minio_at_exit() {
    cleanup(&MINIO_CLEANUP);
}

extern "C" fn cleanup_minio_tls_at_exit() {
    cleanup(&MINIO_TLS_CLEANUP);
}

fn cleanup(server: &OnceLock<(u32, PathBuf)>) {
    if let Some((pid, base)) = server.get() {
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        // wait until it is a zombie (nobody reaps it at this point) or gone
        let stat = format!("/proc/{pid}/stat");
        for _ in 0..100 {
            let state = std::fs::read_to_string(&stat)
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next().unwrap_or('?')));
            if matches!(state, None | Some('Z') | Some('X')) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = std::fs::remove_dir_all(base);
    }
}

fn start_minio(tls: bool) -> Minio {
    let bin = minio_binary();
    if !bin.exists() {
        panic!("MinIO not found at {}: run scripts/install-deps (or set BUCKETFS_MINIO)", bin.display());
    }
    remove_stale_test_dirs();
    let mut last_err = String::new();
    // The port is free when we pick it but someone could take it before MinIO binds it:
    // retry a couple of times with fresh ports.
    for attempt in 0..3 {
        match try_start_minio(&bin, attempt, tls) {
            Ok(m) => {
                let base = m.data_dir.parent().unwrap().to_path_buf();
                let cleanup = if tls { &MINIO_TLS_CLEANUP } else { &MINIO_CLEANUP };
                let pid = m.pid.expect("a MinIO started here has a pid");
                if cleanup.set((pid, base)).is_ok() {
                    unsafe { libc::atexit(if tls { cleanup_minio_tls_at_exit } else { cleanup_minio_at_exit }) };
                }
                return m;
            }
            Err(e) => last_err = e,
        }
    }
    panic!("could not start MinIO ({}): {last_err}", bin.display());
}

fn try_start_minio(bin: &Path, attempt: u32, tls: bool) -> Result<Minio, String> {
    let kind = if tls { "tls-" } else { "" };
    let base = tmp_root().join(format!("bucketfs-test-minio-{}-{kind}{attempt}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    launch_minio(bin, &base, free_port(), tls, &format!("minio-keeper-{kind}{attempt}"), &[])
}

/// Starts MinIO on `port` with its data and log under `base` (kept if there already) and
/// waits until it serves S3 requests.
/// `settings` are more `MINIO_*` variables (e.g. request limits).
fn launch_minio(
    bin: &Path,
    base: &Path,
    port: u16,
    tls: bool,
    keeper: &str,
    settings: &[(&str, &str)],
) -> Result<Minio, String> {
    let data_dir = base.join("data");
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("create {}: {e}", data_dir.display()))?;
    let log_path = base.join("minio.log");
    let log = File::options().create(true).append(true).open(&log_path).map_err(|e| format!("create log: {e}"))?;
    let log2 = log.try_clone().unwrap();
    let mut console_port = free_port();
    while console_port == port {
        console_port = free_port();
    }

    let mut cmd = Command::new(bin);
    cmd.arg("server")
        .arg("--quiet")
        .arg("--address")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--console-address")
        .arg(format!("127.0.0.1:{console_port}"))
        .arg(&data_dir)
        .args(if tls { vec!["--certs-dir".into(), base.join("certs")] } else { Vec::new() })
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("MINIO_") || k.starts_with("AWS_") {
            cmd.env_remove(&*k);
        }
    }
    cmd.env("MINIO_ROOT_USER", ACCESS_KEY)
        .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
        // A static KMS key, so that SSE-S3 and SSE-KMS work (tests/integration/store_options.rs).
        .env("MINIO_KMS_SECRET_KEY", format!("{KMS_KEY_ID}:{KMS_KEY}"))
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off")
        .envs(settings.iter().copied());
    let certificate = if tls { Some(make_certificate(&base.join("certs"))?) } else { None };
    let (pid, exit) = spawn_for_process_lifetime(cmd, keeper)?;

    let scheme = if tls { "https" } else { "http" };
    let endpoint = format!("{scheme}://127.0.0.1:{port}");
    let m = Minio { endpoint, certificate, port, data_dir, log_path, pid: Some(pid), exit };
    let deadline = Instant::now() + Duration::from_secs(30);
    // 1. the health endpoint answers (over TLS: the port accepts connections)
    loop {
        if let Some(st) = m.exit_status() {
            return Err(format!("MinIO exited early ({st}); log:\n{}", m.log()));
        }
        if (tls && TcpStream::connect(("127.0.0.1", port)).is_ok()) || (!tls && health_live(port)) {
            break;
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return Err(format!("MinIO did not answer within 30 s; log:\n{}", m.log()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // 2. S3 requests work (the object layer may come up a bit after the health endpoint)
    let client = match &m.certificate {
        Some(certificate) => s3_client_tls(&m.endpoint, certificate),
        None => s3_client_for(&m.endpoint, ACCESS_KEY, SECRET_KEY),
    };
    loop {
        match block_on(client.list_buckets().send()) {
            Ok(_) => break,
            Err(e) => {
                if Instant::now() > deadline {
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    return Err(format!(
                        "MinIO ListBuckets still failing after 30 s: {}; log:\n{}",
                        aws_sdk_s3::error::DisplayErrorContext(&e),
                        m.log()
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(m)
}

/// A MinIO of one test, which the test may stop and start again (same port, same data):
/// for what a store outage does. Killed with the test process, like [`minio`].
pub struct OwnMinio {
    pub server: Minio,
    base: tempfile::TempDir,
    settings: Vec<(&'static str, &'static str)>,
}

impl OwnMinio {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With more `MINIO_*` settings, e.g. `MINIO_API_REQUESTS_MAX`.
    pub fn start_with(settings: &[(&'static str, &'static str)]) -> Self {
        let base = tempfile::Builder::new().prefix("bucketfs-test-own-minio-").tempdir().expect("temporary directory");
        let server = launch_minio(&minio_binary(), base.path(), free_port(), false, "own-minio-keeper", settings)
            .unwrap_or_else(|e| panic!("could not start MinIO: {e}"));
        OwnMinio { server, base, settings: settings.to_vec() }
    }

    /// An S3 client of this server.
    pub fn client(&self) -> aws_sdk_s3::Client {
        s3_client_for(&self.server.endpoint, ACCESS_KEY, SECRET_KEY)
    }

    /// Creates `bucket` on this server.
    pub fn create_bucket(&self, bucket: &str) {
        crate::common::block_on(self.client().create_bucket().bucket(bucket).send()).expect("create bucket");
    }

    /// Puts `body` at `key` of `bucket` on this server.
    pub fn put(&self, bucket: &str, key: &str, body: impl Into<Vec<u8>>) {
        let body = aws_sdk_s3::primitives::ByteStream::from(body.into());
        crate::common::block_on(self.client().put_object().bucket(bucket).key(key).body(body).send())
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
    }

    /// The bytes at `key` of `bucket` on this server.
    pub fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        crate::common::block_on(async {
            let object = self.client().get_object().bucket(bucket).key(key).send().await;
            let object = object.unwrap_or_else(|e| panic!("get {key}: {e}"));
            object.body.collect().await.expect("body").into_bytes().to_vec()
        })
    }

    /// The keys of `bucket` on this server (up to 1,000).
    pub fn keys(&self, bucket: &str) -> Vec<String> {
        let listed = crate::common::block_on(self.client().list_objects_v2().bucket(bucket).max_keys(1000).send());
        listed.expect("list").contents().iter().filter_map(|object| object.key().map(str::to_owned)).collect()
    }

    /// Stops the server (SIGTERM) and waits until it has exited.
    pub fn stop(&self) {
        let pid = self.server.pid.expect("an OwnMinio is started here");
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.server.exit_status().is_none() {
            assert!(Instant::now() < deadline, "MinIO did not stop within 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again on its port, with its data.
    pub fn start_again(&mut self) {
        let (bin, port) = (minio_binary(), self.server.port);
        self.server = launch_minio(&bin, self.base.path(), port, false, "own-minio-keeper", &self.settings)
            .unwrap_or_else(|e| panic!("could not start MinIO again: {e}"));
    }
}

impl Drop for OwnMinio {
    fn drop(&mut self) {
        if let (None, Some(pid)) = (self.server.exit_status(), self.server.pid) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

fn health_live(port: u16) -> bool {
    let Ok(mut s) =
        TcpStream::connect_timeout(&format!("127.0.0.1:{port}").parse().unwrap(), Duration::from_millis(500))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /minio/health/live HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")
}

/// Where a server's exit status appears if it dies.
pub(super) type ExitSlot = Arc<Mutex<Option<ExitStatus>>>;

/// Spawns `cmd` as a server that lives exactly as long as this test process: it gets
/// SIGKILL when the thread that spawned it exits (PR_SET_PDEATHSIG), and that thread
/// parks forever, watching for the server's exit. Returns its pid and where its exit
/// status appears if it dies.
pub(super) fn spawn_for_process_lifetime(mut cmd: Command, thread_name: &str) -> Result<(u32, ExitSlot), String> {
    unsafe {
        cmd.pre_exec(|| {
            // Dies with the thread that spawned it, which parks forever: i.e. with the process.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let exit = Arc::new(Mutex::new(None));
    let exit2 = exit.clone();
    let (tx, rx) = mpsc::channel::<Result<u32, String>>();
    std::thread::Builder::new()
        .name(thread_name.to_owned())
        .spawn(move || {
            let mut child: Child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(format!("spawn failed: {e}")));
                    return;
                }
            };
            let _ = tx.send(Ok(child.id()));
            // This thread must never exit while the process lives (PDEATHSIG is per thread).
            loop {
                if exit2.lock().unwrap().is_none() {
                    if let Ok(Some(st)) = child.try_wait() {
                        *exit2.lock().unwrap() = Some(st);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .map_err(|e| format!("spawn the {thread_name} thread: {e}"))?;
    let pid = rx.recv().map_err(|e| e.to_string())??;
    Ok((pid, exit))
}
