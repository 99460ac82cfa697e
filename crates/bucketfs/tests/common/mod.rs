//! Shared harness for the bucketfs integration tests.
//!
//! * one MinIO server per test process, started lazily on a free loopback port with a fresh
//!   data directory; it is killed when the test process exits (PR_SET_PDEATHSIG from a parked
//!   thread), even when a test panics or the process is killed;
//! * an S3 client built explicitly (nothing taken from the shell's AWS_* environment) and sync
//!   helpers around it (`create_bucket`, `put`, `get`, `delete`, `list_keys`, ...);
//! * [`MountBuilder`] / [`Mount`]: runs the real `bucketfs` binary against MinIO, waits until
//!   the mount shows up in /proc/self/mountinfo, and unmounts + reaps it on drop; with
//!   [`MountBuilder::request_log`] the S3 requests bucketfs sends can be inspected;
//! * restricted identities: [`restricted_credentials`] / [`read_only_credentials`] get
//!   temporary credentials from MinIO's STS (AssumeRole with a session policy), which
//!   [`MountBuilder::credentials`] and [`s3_client_with`] use;
//! * small utilities: deterministic data, sha256 of a file read with a given buffer size,
//!   positional reads, byte-slice comparison with a readable failure message.
//!
//! Environment knobs:
//! * `BUCKETFS_MINIO`: path of the MinIO binary (default `~/.cache/bucketfs-deps/bin/minio`);
//! * `RUST_LOG`: passed through to the bucketfs child processes (it is inherited);
//! * `BUCKETFS_TEST_LOG_LEVEL`: when set, the mounts get `--log-level <value>`.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use sha2::{Digest, Sha256};

pub const ACCESS_KEY: &str = "bucketfsadmin";
pub const SECRET_KEY: &str = "bucketfsadmin-secret";
pub const REGION: &str = "us-east-1";
pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * 1024;

/// How long a mount may take to appear in mountinfo.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a mount that is expected to fail may run before we give up on it.
pub const FAILING_MOUNT_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// tokio runtime
// ---------------------------------------------------------------------------------------------

/// The runtime shared by every test of this process (S3 calls of the helpers run on it).
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .thread_name("test-rt")
            .build()
            .expect("cannot build the tokio runtime for the tests")
    })
}

/// Runs a future to completion on the shared runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    rt().block_on(f)
}

// ---------------------------------------------------------------------------------------------
// MinIO
// ---------------------------------------------------------------------------------------------

pub struct Minio {
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    pub pid: u32,
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

/// The MinIO server of this test process, started on first use.
pub fn minio() -> &'static Minio {
    static MINIO: OnceLock<Minio> = OnceLock::new();
    MINIO.get_or_init(start_minio)
}

fn tmp_root() -> PathBuf {
    std::env::temp_dir()
}

/// Leftovers of earlier test processes that are gone (a killed test run cannot clean up after
/// itself: statics are never dropped, Drop does not run): MinIO data dirs are deleted, empty
/// mount point dirs removed (never anything still mounted).
fn remove_stale_test_dirs() {
    let Ok(rd) = std::fs::read_dir(tmp_root()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let (rest, minio) = if let Some(r) = name.strip_prefix("bucketfs-test-minio-") {
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
        if minio {
            let _ = std::fs::remove_dir_all(e.path());
        } else if !is_mounted(&e.path()) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// (pid, base dir) of the MinIO started by this process, for the exit handler.
static MINIO_CLEANUP: OnceLock<(u32, PathBuf)> = OnceLock::new();

/// Runs when the test binary exits normally (libtest returns from main even when tests
/// failed): kill MinIO now rather than waiting for PDEATHSIG, and delete its data directory.
extern "C" fn cleanup_minio_at_exit() {
    if let Some((pid, base)) = MINIO_CLEANUP.get() {
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

fn start_minio() -> Minio {
    let bin = minio_binary();
    if !bin.exists() {
        panic!("MinIO not found at {}: run scripts/install-deps (or set BUCKETFS_MINIO)", bin.display());
    }
    remove_stale_test_dirs();
    let mut last_err = String::new();
    // The port is free when we pick it but someone could take it before MinIO binds it:
    // retry a couple of times with fresh ports.
    for attempt in 0..3 {
        match try_start_minio(&bin, attempt) {
            Ok(m) => {
                let base = m.data_dir.parent().unwrap().to_path_buf();
                if MINIO_CLEANUP.set((m.pid, base)).is_ok() {
                    unsafe { libc::atexit(cleanup_minio_at_exit) };
                }
                return m;
            }
            Err(e) => last_err = e,
        }
    }
    panic!("could not start MinIO ({}): {last_err}", bin.display());
}

fn try_start_minio(bin: &Path, attempt: u32) -> Result<Minio, String> {
    let base = tmp_root().join(format!("bucketfs-test-minio-{}-{attempt}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let data_dir = base.join("data");
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("create {}: {e}", data_dir.display()))?;
    let log_path = base.join("minio.log");
    let log = File::create(&log_path).map_err(|e| format!("create log: {e}"))?;
    let log2 = log.try_clone().unwrap();
    let port = free_port();
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
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off");
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
        .name(format!("minio-keeper-{attempt}"))
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
        .expect("spawn minio keeper thread");
    let pid = rx.recv().map_err(|e| e.to_string())??;

    let m = Minio { endpoint: format!("http://127.0.0.1:{port}"), port, data_dir, log_path, pid, exit };
    let deadline = Instant::now() + Duration::from_secs(30);
    // 1. the health endpoint answers
    loop {
        if let Some(st) = m.exit_status() {
            return Err(format!("MinIO exited early ({st}); log:\n{}", m.log()));
        }
        if health_live(port) {
            break;
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return Err(format!("MinIO did not answer within 30 s; log:\n{}", m.log()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // 2. S3 requests work (the object layer may come up a bit after the health endpoint)
    let client = s3_client_for(&m.endpoint, ACCESS_KEY, SECRET_KEY);
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

// ---------------------------------------------------------------------------------------------
// S3 client + sync helpers
// ---------------------------------------------------------------------------------------------

/// An S3 client for `endpoint`, configured only from the arguments (no env, no profile files).
pub fn s3_client_for(endpoint: &str, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(access_key, secret_key, None, None, "bucketfs-tests"))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// The client for the MinIO of this process.
pub fn s3() -> &'static aws_sdk_s3::Client {
    static CLIENT: OnceLock<aws_sdk_s3::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let m = minio();
        s3_client_for(&m.endpoint, ACCESS_KEY, SECRET_KEY)
    })
}

fn err_text<E: std::error::Error>(e: E) -> String {
    format!("{}", aws_sdk_s3::error::DisplayErrorContext(e))
}

/// A lowercase bucket name unique to this process and call: `t-<hint>-<counter>-<pid>`.
pub fn unique_bucket_name(hint: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let suffix = format!("-{n}-{}", std::process::id());
    let mut h: String =
        hint.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let max_hint = 63 - 2 - suffix.len();
    h.truncate(max_hint);
    let h = h.trim_matches('-');
    let h = if h.is_empty() { "b" } else { h };
    format!("t-{h}{suffix}")
}

/// Creates a fresh bucket in MinIO and returns its name.
pub fn create_bucket(hint: &str) -> String {
    let name = unique_bucket_name(hint);
    block_on(s3().create_bucket().bucket(&name).send())
        .unwrap_or_else(|e| panic!("create bucket {name}: {}", err_text(e)));
    name
}

pub fn put(bucket: &str, key: &str, data: impl Into<Vec<u8>>) {
    let data: Vec<u8> = data.into();
    block_on(s3().put_object().bucket(bucket).key(key).body(ByteStream::from(data)).send())
        .unwrap_or_else(|e| panic!("put s3://{bucket}/{key}: {}", err_text(e)));
}

/// PUTs many objects concurrently (up to `concurrency` requests in flight).
pub fn put_many(bucket: &str, objects: Vec<(String, Vec<u8>)>, concurrency: usize) {
    let client = s3().clone();
    let bucket = bucket.to_string();
    block_on(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        for (key, data) in objects {
            let permit = sem.clone().acquire_owned().await.unwrap();
            let client = client.clone();
            let bucket = bucket.clone();
            set.spawn(async move {
                let r = client.put_object().bucket(&bucket).key(&key).body(ByteStream::from(data)).send().await;
                drop(permit);
                r.map_err(|e| format!("put s3://{bucket}/{key}: {}", err_text(e)))
            });
        }
        while let Some(r) = set.join_next().await {
            if let Err(e) = r.expect("put task panicked") {
                panic!("{e}");
            }
        }
    });
}

pub fn delete(bucket: &str, key: &str) {
    block_on(s3().delete_object().bucket(bucket).key(key).send())
        .unwrap_or_else(|e| panic!("delete s3://{bucket}/{key}: {}", err_text(e)));
}

pub fn get(bucket: &str, key: &str) -> Vec<u8> {
    block_on(async {
        let out = s3()
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("get s3://{bucket}/{key}: {}", err_text(e)));
        out.body.collect().await.expect("read body").into_bytes().to_vec()
    })
}

#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
}

fn to_system_time(t: &aws_sdk_s3::primitives::DateTime) -> SystemTime {
    let secs = t.secs();
    let nanos = t.subsec_nanos();
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs((-secs) as u64) + Duration::from_nanos(nanos as u64)
    }
}

pub fn head(bucket: &str, key: &str) -> ObjectInfo {
    let out = block_on(s3().head_object().bucket(bucket).key(key).send())
        .unwrap_or_else(|e| panic!("head s3://{bucket}/{key}: {}", err_text(e)));
    ObjectInfo {
        key: key.to_string(),
        size: out.content_length().unwrap_or(0) as u64,
        etag: out.e_tag().unwrap_or_default().to_string(),
        last_modified: out.last_modified().map(to_system_time).expect("LastModified"),
    }
}

/// All objects of the bucket under `prefix` (flat listing, all pages).
/// The user metadata (`x-amz-meta-*`, without the prefix) of an object.
pub fn stored_metadata(bucket: &str, key: &str) -> std::collections::HashMap<String, String> {
    let out = block_on(s3().head_object().bucket(bucket).key(key).send()).expect("head");
    out.metadata().cloned().unwrap_or_default()
}

pub fn list_objects(bucket: &str, prefix: &str) -> Vec<ObjectInfo> {
    block_on(async {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = s3().list_objects_v2().bucket(bucket).prefix(prefix);
            if let Some(t) = &token {
                req = req.continuation_token(t);
            }
            let page = req.send().await.unwrap_or_else(|e| panic!("list s3://{bucket}/{prefix}: {}", err_text(e)));
            for o in page.contents() {
                out.push(ObjectInfo {
                    key: o.key().unwrap_or_default().to_string(),
                    size: o.size().unwrap_or(0) as u64,
                    etag: o.e_tag().unwrap_or_default().to_string(),
                    last_modified: o.last_modified().map(to_system_time).expect("LastModified"),
                });
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        out
    })
}

pub fn list_keys(bucket: &str, prefix: &str) -> Vec<String> {
    list_objects(bucket, prefix).into_iter().map(|o| o.key).collect()
}

/// Key -> (size, etag) of every object: a snapshot to check that "nothing changed".
pub fn bucket_snapshot(bucket: &str) -> Vec<(String, u64, String)> {
    list_objects(bucket, "").into_iter().map(|o| (o.key, o.size, o.etag)).collect()
}

/// Multipart uploads started and neither completed nor aborted in the bucket.
pub fn open_uploads(bucket: &str) -> usize {
    let out = block_on(s3().list_multipart_uploads().bucket(bucket).send())
        .unwrap_or_else(|e| panic!("list multipart uploads of {bucket}: {}", err_text(e)));
    out.uploads().len()
}

/// Multipart uploads of exactly `key` still open (MinIO lists a key's uploads from disk,
/// independently of the bucket-wide listing above).
pub fn open_uploads_of(bucket: &str, key: &str) -> usize {
    let out = block_on(s3().list_multipart_uploads().bucket(bucket).prefix(key).send())
        .unwrap_or_else(|e| panic!("list multipart uploads of s3://{bucket}/{key}: {}", err_text(e)));
    out.uploads().iter().filter(|u| u.key() == Some(key)).count()
}

// ---------------------------------------------------------------------------------------------
// restricted identities (STS)
// ---------------------------------------------------------------------------------------------

/// Temporary credentials handed out by MinIO's STS.
#[derive(Clone, Debug)]
pub struct TempCredentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: String,
}

/// An IAM policy allowing only to list and read `bucket` (no PutObject, no DeleteObject,
/// no multipart uploads).
pub fn read_only_policy(bucket: &str) -> String {
    format!(
        r#"{{
  "Version": "2012-10-17",
  "Statement": [
    {{"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
      "Resource": ["arn:aws:s3:::{bucket}"]}},
    {{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::{bucket}/*"]}}
  ]
}}"#
    )
}

/// Temporary credentials limited to `policy`: an STS `AssumeRole` call by the root user
/// with `policy` as the inline session policy. MinIO evaluates the session policy even for
/// credentials derived from the root user (they are then no longer treated as the owner),
/// so the result can do exactly what `policy` allows. Needs no tool besides MinIO.
pub fn restricted_credentials(policy: &str) -> TempCredentials {
    let m = minio();
    let conf = aws_sdk_sts::Config::builder()
        .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
        .region(aws_sdk_sts::config::Region::new(REGION))
        .endpoint_url(&m.endpoint)
        .credentials_provider(aws_sdk_sts::config::Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "bucketfs-tests",
        ))
        .build();
    let sts = aws_sdk_sts::Client::from_conf(conf);
    let out = block_on(
        sts.assume_role()
            // MinIO ignores the role (the policy comes from the caller and the session
            // policy), but the API requires one.
            .role_arn("arn:minio:iam:::role/bucketfs-tests")
            .role_session_name("bucketfs-tests")
            .policy(policy)
            .duration_seconds(3600)
            .send(),
    )
    .unwrap_or_else(|e| {
        panic!(
            "cannot create a restricted identity: STS AssumeRole at {} with a session policy \
             failed: {}\npolicy: {policy}\nMinIO log:\n{}",
            m.endpoint,
            aws_sdk_s3::error::DisplayErrorContext(&e),
            m.log()
        )
    });
    let c = out.credentials().unwrap_or_else(|| {
        panic!("cannot create a restricted identity: STS AssumeRole returned no credentials: {out:?}")
    });
    TempCredentials {
        access_key: c.access_key_id().to_string(),
        secret_key: c.secret_access_key().to_string(),
        session_token: c.session_token().to_string(),
    }
}

/// Temporary credentials that can list and read `bucket` and nothing else.
pub fn read_only_credentials(bucket: &str) -> TempCredentials {
    restricted_credentials(&read_only_policy(bucket))
}

/// An S3 client (configured only from the arguments) using temporary credentials.
pub fn s3_client_with(creds: &TempCredentials) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(&minio().endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            &creds.access_key,
            &creds.secret_key,
            Some(creds.session_token.clone()),
            None,
            "bucketfs-tests",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

// ---------------------------------------------------------------------------------------------
// data + file utilities
// ---------------------------------------------------------------------------------------------

/// Deterministic pseudo-random bytes (xorshift64*), fast enough for 100 MiB in a debug build.
pub fn gen_data(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    if state == 0 {
        state = 0x2545_F491_4F6C_DD1D;
    }
    let mut v = vec![0u8; len];
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        c.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    let rem = chunks.into_remainder();
    if !rem.is_empty() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let w = state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        let n = rem.len();
        rem.copy_from_slice(&w[..n]);
    }
    v
}

/// Small deterministic PRNG for offsets/lengths (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// sha256 of a file, read sequentially with `read(2)` calls of `buf_size` bytes.
/// Returns the digest and the number of bytes read.
pub fn sha256_file(path: &Path, buf_size: usize) -> io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; buf_size];
    let mut total = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex::encode(h.finalize()), total))
}

/// close(2) of `file` with its result (dropping a `File` ignores it). This is where
/// bucketfs commits a file written through the mount.
pub fn close(file: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = file.into_raw_fd();
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Peak resident memory of a process, from /proc (KiB).
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM value")
}

/// `len` bytes at `offset` with pread (`read_exact_at`).
pub fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// Up to `len` bytes at `offset` with pread, stopping early only at end of file (a short
/// result means EOF was reached).
pub fn pread_full(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Reads `path` sequentially with `read(2)` calls of `buf_size` bytes and compares every chunk
/// with `expected` as it goes (reports the first differing offset).
#[track_caller]
pub fn assert_file_content(path: &Path, buf_size: usize, expected: &[u8]) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut buf = vec![0u8; buf_size];
    let mut off = 0usize;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("read {} at offset {off}: {e}", path.display()),
        };
        assert!(
            off + n <= expected.len(),
            "{}: read past the expected size {} (got {} bytes at offset {off})",
            path.display(),
            expected.len(),
            n
        );
        if buf[..n] != expected[off..off + n] {
            let d = buf[..n].iter().zip(&expected[off..off + n]).position(|(a, b)| a != b).unwrap();
            panic!("{}: content differs at offset {} (buffer size {buf_size})", path.display(), off + d);
        }
        off += n;
    }
    assert_eq!(off, expected.len(), "{}: short read (buffer size {buf_size})", path.display());
}

/// Like `assert_eq!` for big byte slices: reports lengths and the first difference instead of
/// dumping megabytes.
#[track_caller]
pub fn assert_same_bytes(actual: &[u8], expected: &[u8], what: &str) {
    if actual == expected {
        return;
    }
    let first_diff = actual.iter().zip(expected).position(|(a, b)| a != b);
    panic!(
        "{what}: bytes differ (actual len {}, expected len {}, first differing offset {:?})",
        actual.len(),
        expected.len(),
        first_diff.or(Some(actual.len().min(expected.len())))
    );
}

/// Sorted names of a directory, or the error of the first failing call.
pub fn try_ls(dir: &Path) -> io::Result<Vec<String>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        v.push(e?.file_name().into_string().expect("non-UTF-8 name"));
    }
    v.sort();
    Ok(v)
}

/// Sorted names of a directory (what `ls -A` shows).
pub fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("read_dir {} entry: {e}", dir.display())))
        .map(|e| e.file_name().into_string().expect("non-UTF-8 name"))
        .collect();
    v.sort();
    v
}

/// Names of a directory in the order readdir returned them (to detect duplicates).
pub fn ls_unsorted(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("read_dir {} entry: {e}", dir.display())))
        .map(|e| e.file_name().into_string().expect("non-UTF-8 name"))
        .collect()
}

/// Recursive walk (like `find ROOT -type f`): relative paths of the regular files, plus the
/// relative paths of the directories.
pub fn walk(root: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut files = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        for e in std::fs::read_dir(&abs).unwrap_or_else(|e| panic!("read_dir {}: {e}", abs.display())) {
            let e = e.unwrap();
            let name = e.file_name().into_string().expect("non-UTF-8 name");
            let r = if rel.as_os_str().is_empty() { PathBuf::from(&name) } else { rel.join(&name) };
            let md = std::fs::symlink_metadata(root.join(&r)).unwrap();
            let rs = r.to_str().unwrap().to_string();
            if md.is_dir() {
                assert!(dirs.insert(rs.clone()), "directory {rs} seen twice");
                stack.push(r);
            } else {
                assert!(md.is_file(), "{rs} is neither a file nor a directory");
                assert!(files.insert(rs.clone()), "file {rs} seen twice");
            }
        }
    }
    (files, dirs)
}

/// Asserts that `r` failed with errno `errno`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, errno: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected errno {errno} ({}), got success: {v:?}", errno_name(errno)),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(errno),
            "{what}: expected errno {errno} ({}), got {e:?}",
            errno_name(errno)
        ),
    }
}

pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EROFS => "EROFS",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::EEXIST => "EEXIST",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "?",
    }
}

/// Runs `f` on its own thread and panics if it does not finish within `timeout` (so that a
/// hung FUSE request fails the test instead of hanging the suite). A panic inside `f` is
/// propagated.
#[track_caller]
pub fn run_with_timeout<T: Send + 'static>(what: &str, timeout: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(timeout) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {timeout:?} (hung?)")
        }
    }
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// mountinfo / processes
// ---------------------------------------------------------------------------------------------

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo (octal)
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.len() >= i + 4 && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (mount point, filesystem type, source) of every entry of /proc/self/mountinfo.
pub fn mount_entries() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    text.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let mp = unescape_mountinfo(fields.get(4)?);
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?.to_string();
            let source = unescape_mountinfo(fields.get(sep + 2).unwrap_or(&""));
            Some((mp, fstype, source))
        })
        .collect()
}

/// Mount options + super options of the top-most mount on `path` (comma-separated, merged).
pub fn mount_options(path: &Path) -> Option<String> {
    let p = path.to_str().expect("UTF-8 path");
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    text.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            if unescape_mountinfo(fields.get(4)?) != p {
                return None;
            }
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(format!("{},{}", fields.get(5)?, fields.get(sep + 3).unwrap_or(&"")))
        })
        .next_back()
}

/// How many mounts are stacked on `path`.
pub fn mount_count(path: &Path) -> usize {
    let p = path.to_str().expect("UTF-8 path");
    mount_entries().iter().filter(|(mp, _, _)| mp == p).count()
}

pub fn is_mounted(path: &Path) -> bool {
    mount_count(path) > 0
}

/// Filesystem type of the top-most mount on `path` (e.g. `fuse.bucketfs`, `fuse`).
pub fn mount_fstype(path: &Path) -> Option<String> {
    let p = path.to_str().expect("UTF-8 path");
    mount_entries().into_iter().rfind(|(mp, _, _)| mp == p).map(|(_, t, _)| t)
}

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

/// Pids of live processes (other than us) whose command line has an argument containing
/// `needle` (used to find the background daemon of a mount point).
pub fn pids_with_arg_containing(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmdline.split(|b| *b == 0).any(|a| {
            let a = String::from_utf8_lossy(a);
            a.contains(needle)
        }) {
            // zombies have an empty cmdline already, but be explicit
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next().unwrap_or('?')));
            if state != Some('Z') {
                out.push(pid);
            }
        }
    }
    out
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

// ---------------------------------------------------------------------------------------------
// bucketfs processes
// ---------------------------------------------------------------------------------------------

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
        args.extend(self.sources.iter().map(OsString::from));
        args.push(mountpoint.as_os_str().to_owned());
        cmd.args(&args);
        (cmd, args)
    }

    /// Starts `bucketfs mount --foreground ...` and waits until the mount point shows up in
    /// /proc/self/mountinfo. Panics (with the child's stderr) if the child exits first or the
    /// mount does not appear within 20 s.
    pub fn mount(self) -> Mount {
        assert!(self.foreground, "use mount_background() for background mounts");
        let (dir, path) = match &self.mountpoint {
            Some(p) => (None, p.clone()),
            None => {
                let d = tempfile::Builder::new()
                    .prefix(&format!("bucketfs-mnt-{}-", std::process::id()))
                    .tempdir()
                    .unwrap();
                let p = d.path().canonicalize().unwrap();
                (Some(d), p)
            }
        };
        let before = mount_count(&path);
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let stdout = tempfile::NamedTempFile::new().unwrap();
        let request_log = self.request_log.then(|| tempfile::NamedTempFile::new().unwrap());
        let mut builder = self;
        if let Some(log) = &request_log {
            let file = log.path().to_string_lossy().into_owned();
            builder = builder.args(["--log-level", "bucketfs=debug", "--log-file", &file]);
        }
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
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bucketfs_bin()));
        let mut m = Mount { child: Some(child), dir, path, stderr, stdout, args, request_log };
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
        let path = self.mountpoint.clone().unwrap_or_else(|| {
            // keep the dir around for the duration of the call
            std::env::temp_dir().join(format!("bucketfs-mnt-fail-{}-{}", std::process::id(), unique_bucket_name("x")))
        });
        let owned = self.mountpoint.is_none();
        if owned {
            std::fs::create_dir_all(&path).unwrap();
        }
        let before = if path.exists() { mount_count(&path) } else { 0 };
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let stdout = tempfile::NamedTempFile::new().unwrap();
        let (mut cmd, args) = self.command(&path);
        cmd.stdout(Stdio::from(stdout.reopen().unwrap())).stderr(Stdio::from(stderr.reopen().unwrap()));
        let cmdline = args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bucketfs_bin()));
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
            if !self.foreground {
                let needle = path.to_str().unwrap();
                for pid in pids_with_arg_containing(needle) {
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        };
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let elapsed = start.elapsed();
                // a background mount could have succeeded and returned
                if path.exists() && mount_count(&path) > before {
                    cleanup(&mut child);
                    panic!(
                        "mount was expected to fail but it succeeded ({}).\ncommand: bucketfs {cmdline}\nstderr:\n{}",
                        describe_status(&st),
                        read_err()
                    );
                }
                if owned {
                    let _ = std::fs::remove_dir(&path);
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
            if start.elapsed() > FAILING_MOUNT_TIMEOUT {
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

/// One S3 request, as bucketfs logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Request {
    pub op: String,
    pub key: String,
    /// Range of a GET: (start, length).
    pub range: Option<(u64, u64)>,
}

impl S3Request {
    fn parse(line: &str) -> Option<Self> {
        let rest = &line[line.find(" s3 ")? + 4..];
        let (op, fields) = rest.split_once(' ')?;
        let field = |name: &str| -> Option<String> {
            let at = fields.find(&format!("{name}="))? + name.len() + 1;
            let value = &fields[at..];
            if let Some(quoted) = value.strip_prefix('"') {
                Some(quoted[..quoted.find('"')?].to_owned())
            } else {
                Some(value.split(' ').next()?.to_owned())
            }
        };
        let key = field("key").or_else(|| field("prefix")).unwrap_or_default();
        let range = match (field("start"), field("len")) {
            (Some(start), Some(len)) => Some((start.parse().ok()?, len.parse().ok()?)),
            _ => None,
        };
        Some(S3Request { op: op.to_owned(), key, range })
    }
}
