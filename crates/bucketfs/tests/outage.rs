//! When the store stops answering, operations fail within a bounded time instead of
//! hanging, and the mount works again once the store is back. The outage is made by a
//! loopback TCP relay in front of the real MinIO that stops forwarding bytes.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// Forwards connections to `target` until `frozen` is set; then holds them open silently.
struct Relay {
    endpoint: String,
    frozen: Arc<AtomicBool>,
}

impl Relay {
    fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (mut from, mut to) = (from.try_clone().expect("clone"), to.try_clone().expect("clone"));
                    let flag = flag.clone();
                    std::thread::spawn(move || {
                        let mut buffer = vec![0; 64 * 1024];
                        while let Ok(n) = from.read(&mut buffer) {
                            while flag.load(Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            if n == 0 || to.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Relay { endpoint, frozen }
    }
}

#[test]
fn unresponsive_store_fails_operations_in_bounded_time() {
    let b = create_bucket("outage");
    put(&b, "dir/file", gen_data(3, 3 * MIB));
    let relay = Relay::start(minio().port);
    let mut m = MountBuilder::new()
        .bucket(&b)
        .endpoint(relay.endpoint.clone())
        .args(["--read-timeout", "1", "--metadata-ttl", "0"])
        .mount();

    relay.frozen.store(true, Ordering::Relaxed);
    let path = m.join("dir/file");
    let (result, elapsed) = run_with_timeout("stat while the store hangs", Duration::from_secs(60), move || {
        let started = Instant::now();
        (std::fs::metadata(path), started.elapsed())
    });
    let error = result.expect_err("stat while the store hangs must fail");
    assert!(
        matches!(error.raw_os_error(), Some(libc::ETIMEDOUT) | Some(libc::EIO)),
        "stat failed with {error}, expected ETIMEDOUT or EIO"
    );
    assert!(elapsed < Duration::from_secs(20), "stat took {elapsed:?} with a 1 s read timeout");

    relay.frozen.store(false, Ordering::Relaxed);
    let data = std::fs::read(m.join("dir/file")).expect("read after the store is back");
    assert_eq!(sha256_hex(&data), sha256_hex(&gen_data(3, 3 * MIB)));
    m.assert_alive();
}
