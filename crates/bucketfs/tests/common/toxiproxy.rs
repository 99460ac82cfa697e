//! Fault injection with toxiproxy: one `toxiproxy-server` per test process (built by
//! scripts/install-deps, started lazily on a free loopback port, killed with the process
//! like MinIO), a proxy to MinIO per test ([`ToxiProxy`], deleted on drop) that a mount is
//! pointed at with [`super::MountBuilder::endpoint`], and toxics added to and removed from
//! it ([`Toxic`]: latency, bandwidth, reset_peer, timeout, slicer, limit_data) in either
//! direction. The API is three kinds of plain HTTP/1.1 request with a JSON body, spoken
//! over a `TcpStream` here rather than adding an HTTP client to the dev-dependencies.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{free_port, minio, spawn_for_process_lifetime, ExitSlot};

/// The toxiproxy server of this test process.
pub struct Toxiproxy {
    /// `127.0.0.1:PORT` of its HTTP API.
    pub api: String,
    pub pid: u32,
    pub log_path: PathBuf,
    exit: ExitSlot,
    _dir: tempfile::TempDir,
}

pub fn toxiproxy_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("BUCKETFS_TOXIPROXY") {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/bucketfs-deps/bin/toxiproxy-server")
}

/// The toxiproxy server of this test process, started on first use.
pub fn toxiproxy() -> &'static Toxiproxy {
    static TOXIPROXY: OnceLock<Toxiproxy> = OnceLock::new();
    TOXIPROXY.get_or_init(start_toxiproxy)
}

impl Toxiproxy {
    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.lock().unwrap()
    }

    /// Sends one request to the API; returns (status code, body).
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), String> {
        api_request(&self.api, method, path, body)
    }
}

fn start_toxiproxy() -> Toxiproxy {
    let bin = toxiproxy_binary();
    if !bin.exists() {
        panic!("toxiproxy-server not found at {}: run scripts/install-deps (or set BUCKETFS_TOXIPROXY)", bin.display());
    }
    let mut last_err = String::new();
    // As with MinIO: the free port could be taken before the server binds it.
    for _ in 0..3 {
        match try_start_toxiproxy(&bin) {
            Ok(t) => return t,
            Err(e) => last_err = e,
        }
    }
    panic!("could not start toxiproxy ({}): {last_err}", bin.display());
}

fn try_start_toxiproxy(bin: &Path) -> Result<Toxiproxy, String> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("bucketfs-test-toxiproxy-{}-", std::process::id()))
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?;
    let log_path = dir.path().join("toxiproxy.log");
    let log = File::create(&log_path).map_err(|e| format!("create log: {e}"))?;
    let log2 = log.try_clone().map_err(|e| format!("clone log: {e}"))?;
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args(["-host", "127.0.0.1", "-port", &port.to_string()])
        // One line per connection at the default level: only what goes wrong.
        .env("LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2));
    let (pid, exit) = spawn_for_process_lifetime(cmd, "toxiproxy-keeper")?;
    let t = Toxiproxy { api: format!("127.0.0.1:{port}"), pid, log_path, exit, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = t.exit_status() {
            return Err(format!("toxiproxy exited early ({st}); log:\n{}", t.log()));
        }
        if matches!(t.request("GET", "/version", None), Ok((200, _))) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return Err(format!("toxiproxy did not answer within 20 s; log:\n{}", t.log()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request with `Connection: close`; the answer is read to the end.
fn api_request(api: &str, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String), String> {
    let addr = api.parse().map_err(|e| format!("{api}: {e}"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| format!("connect {api}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {api}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).map_err(|e| format!("{method} {path}: {e}"))?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).map_err(|e| format!("{method} {path}: reading the answer: {e}"))?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{method} {path}: not an HTTP answer: {response:?}"))?;
    // toxiproxy answers small JSON documents; a chunked one comes as a single chunk.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body.split_once("\r\n").map(|(_, rest)| rest).unwrap_or("").rsplit_once("\r\n0\r\n").map_or("", |(b, _)| b)
    } else {
        body
    };
    Ok((status, body.to_owned()))
}

/// Which way a toxic acts: on what the client sends (requests, upload bodies) or on what
/// the server sends back (responses, download bodies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Upstream,
    Downstream,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// The toxics of toxiproxy 2.5 that the fault tests use (times in milliseconds).
#[derive(Clone, Debug)]
pub enum Toxic {
    /// Every chunk is delayed by `latency_ms` ± `jitter_ms`.
    Latency { latency_ms: u64, jitter_ms: u64 },
    /// At most `kb_per_s` KB (1,000 bytes) per second, per connection.
    Bandwidth { kb_per_s: u64 },
    /// Connections are reset (TCP RST) `after_ms` after data arrives (0: at once).
    ResetPeer { after_ms: u64 },
    /// Data is dropped and the connection closed after `after_ms` (0: held open forever).
    Timeout { after_ms: u64 },
    /// Data is split into slices of about `average_bytes` (± `variation_bytes`), each
    /// sent `delay_us` microseconds after the last.
    Slicer { average_bytes: u64, variation_bytes: u64, delay_us: u64 },
    /// The connection is closed once `bytes` have gone through it.
    LimitData { bytes: u64 },
}

impl Toxic {
    fn kind(&self) -> &'static str {
        match self {
            Toxic::Latency { .. } => "latency",
            Toxic::Bandwidth { .. } => "bandwidth",
            Toxic::ResetPeer { .. } => "reset_peer",
            Toxic::Timeout { .. } => "timeout",
            Toxic::Slicer { .. } => "slicer",
            Toxic::LimitData { .. } => "limit_data",
        }
    }

    fn attributes(&self) -> String {
        match self {
            Toxic::Latency { latency_ms, jitter_ms } => format!(r#"{{"latency":{latency_ms},"jitter":{jitter_ms}}}"#),
            Toxic::Bandwidth { kb_per_s } => format!(r#"{{"rate":{kb_per_s}}}"#),
            Toxic::ResetPeer { after_ms } | Toxic::Timeout { after_ms } => format!(r#"{{"timeout":{after_ms}}}"#),
            Toxic::Slicer { average_bytes, variation_bytes, delay_us } => {
                format!(r#"{{"average_size":{average_bytes},"size_variation":{variation_bytes},"delay":{delay_us}}}"#)
            }
            Toxic::LimitData { bytes } => format!(r#"{{"bytes":{bytes}}}"#),
        }
    }
}

/// A toxiproxy proxy in front of this process's MinIO, for one test. Deleted on drop.
pub struct ToxiProxy {
    name: String,
    /// `http://127.0.0.1:PORT`, for [`super::MountBuilder::endpoint`].
    pub endpoint: String,
}

impl ToxiProxy {
    /// A new proxy on a free loopback port that forwards to MinIO.
    pub fn to_minio() -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let name = format!("minio-{}", COUNTER.fetch_add(1, Ordering::SeqCst));
        let upstream = format!("127.0.0.1:{}", minio().port);
        let body = format!(r#"{{"name":"{name}","listen":"127.0.0.1:0","upstream":"{upstream}","enabled":true}}"#);
        let answer = toxiproxy().request("POST", "/proxies", Some(&body));
        let listen = match &answer {
            Ok((201, json)) => json_string_field(json, "listen"),
            _ => None,
        };
        let listen = listen.unwrap_or_else(|| {
            panic!("toxiproxy: creating proxy {name} failed: {answer:?}\ntoxiproxy log:\n{}", toxiproxy().log())
        });
        ToxiProxy { name, endpoint: format!("http://{listen}") }
    }

    /// Adds `toxic` under `name` (names are unique per proxy), acting in `direction` on
    /// every connection, open or new.
    #[track_caller]
    pub fn add(&self, name: &str, direction: Direction, toxic: Toxic) {
        let body = format!(
            r#"{{"name":"{name}","type":"{}","stream":"{}","toxicity":1.0,"attributes":{}}}"#,
            toxic.kind(),
            direction.as_str(),
            toxic.attributes()
        );
        let path = format!("/proxies/{}/toxics", self.name);
        match toxiproxy().request("POST", &path, Some(&body)) {
            Ok((200, _)) => {}
            other => panic!("toxiproxy: adding toxic {body} failed: {other:?}\ntoxiproxy log:\n{}", toxiproxy().log()),
        }
    }

    /// Removes the toxic added as `name`.
    #[track_caller]
    pub fn remove(&self, name: &str) {
        let path = format!("/proxies/{}/toxics/{name}", self.name);
        match toxiproxy().request("DELETE", &path, None) {
            Ok((204, _)) => {}
            other => {
                panic!("toxiproxy: removing toxic {name} failed: {other:?}\ntoxiproxy log:\n{}", toxiproxy().log())
            }
        }
    }
}

impl Drop for ToxiProxy {
    fn drop(&mut self) {
        // Best effort: the server goes away with the test process anyway.
        let _ = toxiproxy().request("DELETE", &format!("/proxies/{}", self.name), None);
    }
}

/// The value of `"field":"value"` in a flat JSON object (toxiproxy's answers).
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let at = json.find(&format!(r#""{field}":"#))? + field.len() + 3;
    let rest = json[at..].trim_start().strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_owned())
}
