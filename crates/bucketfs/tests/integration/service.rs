//! bucketfs as a systemd `Type=notify` service: the daemon tells the service manager
//! (the datagram socket named by `NOTIFY_SOCKET`, as systemd sets it) `READY=1` once the
//! mount answers and `STOPPING=1` when it goes. systemd is not the init of the test
//! machines, so the test plays its part with a socket of its own.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use crate::common::*;

fn next_message(socket: &UnixDatagram) -> String {
    let mut buffer = [0u8; 4096];
    let length = socket.recv(&mut buffer).expect("a notification within the timeout");
    String::from_utf8_lossy(&buffer[..length]).into_owned()
}

#[test]
fn the_service_manager_hears_ready_once_mounted_and_stopping_at_unmount() {
    let bucket = create_bucket("notify");
    put(&bucket, "a.txt", b"a".to_vec());
    let dir = tempfile::tempdir().expect("tempdir");
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    socket.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");

    let mount = MountBuilder::new().bucket(&bucket).env("NOTIFY_SOCKET", socket_path.to_str().expect("UTF-8")).mount();
    let ready = next_message(&socket);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.contains("STATUS=serving "), "{ready:?}");
    assert_eq!(std::fs::read(mount.join("a.txt")).expect("read"), b"a");

    drop(mount); // unmounts, and waits for the daemon
    let stopping = next_message(&socket);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
}
