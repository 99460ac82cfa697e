//! A loopback TCP relay in front of MinIO, written here so that each fault is exactly
//! what a test asks for: it can freeze (hold connections silently), go down (reset every
//! connection, refuse new ones, as a restarting server does), or answer a number of
//! requests with `503 SlowDown`. (toxiproxy, in `toxiproxy.rs`, cannot answer HTTP.)

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
pub struct Faults {
    /// Hold every connection open without forwarding a byte.
    pub frozen: AtomicBool,
    /// Reset open connections and new ones at once.
    pub down: AtomicBool,
    /// Answer this many more requests with `503 SlowDown` (and close their connection).
    pub slow_down: AtomicUsize,
    /// How many requests were answered `503 SlowDown` so far.
    pub slow_downs_answered: AtomicUsize,
    /// Forward this many more requests whose head's first line contains
    /// `lose_answers_to`, and cut their connection instead of forwarding the answer: the
    /// store did the work, the client never hears of it (a store that restarts between
    /// acting and answering).
    pub lose_answers: AtomicUsize,
    pub lose_answers_to: Mutex<String>,
    /// How many answers were lost so far.
    pub answers_lost: AtomicUsize,
}

impl Faults {
    /// Lose the answers to the next `count` requests whose first line contains `pattern`
    /// and which act (not GET or HEAD): e.g. `"?uploads"`, a CreateMultipartUpload.
    pub fn lose_answers(&self, pattern: &str, count: usize) {
        *self.lose_answers_to.lock().unwrap_or_else(|e| e.into_inner()) = pattern.to_owned();
        self.lose_answers.store(count, Ordering::Relaxed);
    }

    /// `sent` (bytes a client sent on one connection) starts a request whose answer is to
    /// be lost: it counts as one of them.
    fn loses_answer_to(&self, sent: &[u8]) -> bool {
        if self.lose_answers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let first_line = sent.split(|&b| b == b'\n').next().unwrap_or_default();
        let pattern = self.lose_answers_to.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Only requests that act (POST, PUT, DELETE): a GET of the same URL changes nothing.
        let first_line = String::from_utf8_lossy(first_line);
        let matches =
            !first_line.starts_with("GET ") && !first_line.starts_with("HEAD ") && first_line.contains(&pattern);
        matches
            && self.lose_answers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(1)).is_ok()
    }

    /// Open connections are cut: the server is down, or the next requests must come on
    /// new connections to be answered 503 (clients keep connections alive).
    fn cut(&self) -> bool {
        self.down.load(Ordering::Relaxed) || self.slow_down.load(Ordering::Relaxed) > 0
    }
}

/// The bytes clients sent, by connection.
type Recording = Arc<Mutex<std::collections::BTreeMap<usize, Vec<u8>>>>;

pub struct Relay {
    /// `http://127.0.0.1:PORT`, for [`super::MountBuilder::endpoint`].
    pub endpoint: String,
    pub faults: Arc<Faults>,
    /// What clients sent, per connection, if the relay records it ([`Relay::recording`]).
    sent: Option<Recording>,
}

impl Relay {
    /// A relay on a free loopback port to `127.0.0.1:target` (e.g. `minio().port`).
    pub fn start(target: u16) -> Self {
        Self::start_with(target, None)
    }

    /// A relay that also keeps every byte clients send (requests, with their bodies).
    pub fn recording(target: u16) -> Self {
        Self::start_with(target, Some(Recording::default()))
    }

    /// The request heads clients sent so far, lower-cased, connection by connection: each
    /// connection's bytes are read as HTTP/1.1 requests one after another, a head, then a
    /// body of its `content-length`.
    pub fn request_heads(&self) -> Vec<String> {
        let connections = self.sent.as_ref().expect("a recording relay").lock().unwrap_or_else(|e| e.into_inner());
        let mut heads = Vec::new();
        for sent in connections.values() {
            let mut at = 0;
            while let Some(end) = sent[at..].windows(4).position(|w| w == b"\r\n\r\n").map(|end| at + end) {
                let head = String::from_utf8_lossy(&sent[at..end]).to_ascii_lowercase();
                let body = head
                    .lines()
                    .find_map(|line| line.strip_prefix("content-length:"))
                    .and_then(|length| length.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                heads.push(head);
                at = end + 4 + body;
                if at >= sent.len() {
                    break;
                }
            }
        }
        heads
    }

    fn start_with(target: u16, sent: Option<Recording>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let faults = Arc::new(Faults::default());
        let shared = faults.clone();
        let recorder = sent.clone();
        let mut connection = 0usize;
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if shared.down.load(Ordering::Relaxed) {
                    reset_connection(&client);
                    continue;
                }
                if shared.slow_down.load(Ordering::Relaxed) > 0 {
                    let faults = shared.clone();
                    std::thread::spawn(move || answer_slow_down(client, &faults));
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                connection += 1;
                let record = recorder.clone().map(|recording| (recording, connection));
                // Set by the client's side when the request it forwards is to lose its
                // answer; the server's side then cuts both connections at the answer.
                let lose_answer = Arc::new(AtomicBool::new(false));
                for (from, to, record, to_client) in [(&client, &server, record, false), (&server, &client, None, true)]
                {
                    let (mut from, mut to) = (from.try_clone().expect("clone"), to.try_clone().expect("clone"));
                    let faults = shared.clone();
                    let lose_answer = lose_answer.clone();
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
                        let mut buffer = vec![0; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buffer) {
                                Ok(n) => n,
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                    ) =>
                                {
                                    if faults.cut() {
                                        break;
                                    }
                                    continue;
                                }
                                Err(_) => break,
                            };
                            while faults.frozen.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            if !to_client && faults.loses_answer_to(&buffer[..n]) {
                                lose_answer.store(true, Ordering::Relaxed);
                            }
                            if to_client && lose_answer.load(Ordering::Relaxed) {
                                faults.answers_lost.fetch_add(1, Ordering::Relaxed);
                                reset_connection(&from);
                                reset_connection(&to);
                                break;
                            }
                            if let Some((recording, connection)) = &record {
                                let mut connections = recording.lock().unwrap_or_else(|e| e.into_inner());
                                connections.entry(*connection).or_default().extend_from_slice(&buffer[..n]);
                            }
                            if faults.cut() || n == 0 || to.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                        if faults.cut() {
                            reset_connection(&from);
                            reset_connection(&to);
                        } else {
                            let _ = to.shutdown(Shutdown::Write);
                        }
                    });
                }
            }
        });
        Relay { endpoint, faults, sent }
    }
}

/// Closes `stream` with a reset (SO_LINGER 0), as a server that dies does.
pub fn reset_connection(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as u32,
        );
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Reads one request's head and answers `503 SlowDown`, as S3 does when throttling.
fn answer_slow_down(mut client: TcpStream, faults: &Faults) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let _ = faults.slow_down.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    faults.slow_downs_answered.fetch_add(1, Ordering::Relaxed);
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>relay</RequestId></Error>";
    let response = format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes());
    let _ = client.shutdown(Shutdown::Both);
}
