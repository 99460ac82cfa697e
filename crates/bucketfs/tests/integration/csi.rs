//! The Kubernetes CSI driver (`bucketfs csi`), called over its unix socket as the kubelet
//! and the external-provisioner call it, with MinIO behind it: volumes published for a
//! pod are real mounts that read and write the bucket, an unpublish returns once what
//! was written is stored, the mounts outlive a restart of the driver, and dynamic
//! volumes are prefixes the controller makes and deletes (and nothing else).
//! scripts/csi-sanity runs the CSI conformance suite against the same driver.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::*;
use bucketfs::csi::proto::controller_client::ControllerClient;
use bucketfs::csi::proto::node_client::NodeClient;
use bucketfs::csi::proto::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
use bucketfs::csi::proto::*;
use tonic::transport::Channel;

/// A `bucketfs csi` process on a socket in its own directory, with no credentials of its
/// own: every call brings the store's key as the volume's secret.
struct Driver {
    dir: PathBuf,
    process: Child,
}

impl Driver {
    fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// `bucketfs csi --supervise`: the driver runs as its child (see [`Driver::child`]).
    fn start_supervised(dir: &Path) -> Self {
        Self::start_with(dir, &["--supervise"])
    }

    fn start_with(dir: &Path, options: &[&str]) -> Self {
        let socket = dir.join("csi.sock");
        let _ = std::fs::remove_file(&socket);
        let mut command = bucketfs_command("", "");
        command
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .args(["csi", "--endpoint", &format!("unix://{}", socket.display()), "--node-id", "test-node"])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(options)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("driver.log")).expect("driver log"));
        let process = command.spawn().expect("start bucketfs csi");
        assert!(wait_until(Duration::from_secs(20), || socket.exists()), "the driver's socket never appeared");
        Driver { dir: dir.to_owned(), process }
    }

    fn channel(&self) -> Channel {
        self.try_channel().expect("connect to the driver")
    }

    /// A channel to the driver, if its socket takes connections.
    fn try_channel(&self) -> Option<Channel> {
        let socket = self.dir.join("csi.sock");
        block_on(async move {
            tonic::transport::Endpoint::from_static("http://driver")
                .connect_with_connector(tower::service_fn(move |_| {
                    let socket = socket.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(socket).await?,
                        ))
                    }
                }))
                .await
                .ok()
        })
    }

    fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel())
    }

    fn try_node(&self) -> Option<NodeClient<Channel>> {
        self.try_channel().map(NodeClient::new)
    }

    /// What the driver (and a supervisor) wrote to stderr.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("driver.log")).unwrap_or_default()
    }

    fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel())
    }

    /// The driver a supervising process runs (the other process on its socket), if one runs.
    fn child(&self) -> Option<i32> {
        let socket = self.dir.join("csi.sock");
        let me = self.process.id() as i32;
        pids_with_arg_containing(socket.to_str().expect("UTF-8")).into_iter().find(|&pid| pid != me)
    }

    /// SIGKILL: what a crash, an OOM kill or `kill -9` does.
    fn kill(mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.process.try_wait().is_ok_and(|status| status.is_some()) {
            return; // ended (and reaped): its pid may be another process's now
        }
        // SIGTERM first: a supervisor stops its driver too (SIGKILL would leave it running).
        let pid = nix::unistd::Pid::from_raw(self.process.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if !wait_until(Duration::from_secs(5), || self.process.try_wait().is_ok_and(|status| status.is_some())) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// A test's directory (the driver's socket and state, the pods' directories); what a
/// failed test left mounted in it is unmounted before it is removed.
struct Workspace(tempfile::TempDir);

impl Workspace {
    fn new() -> Self {
        Workspace(tempfile::tempdir().expect("tempdir"))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        for (mountpoint, _, _) in mount_entries() {
            if Path::new(&mountpoint).starts_with(self.path()) {
                let _ = force_unmount(Path::new(&mountpoint));
            }
        }
    }
}

fn secret() -> HashMap<String, String> {
    HashMap::from([
        ("AWS_ACCESS_KEY_ID".to_owned(), ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY".to_owned(), SECRET_KEY.to_owned()),
    ])
}

fn capability(mode: Mode, mount_flags: &[&str]) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            mount_flags: mount_flags.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        })),
    }
}

/// What the kubelet sends for a static PV naming `bucket` and `prefix`.
fn publish_request(
    volume_id: &str,
    target: &Path,
    context: HashMap<String, String>,
    flags: &[&str],
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: volume_id.to_owned(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(Mode::MultiNodeMultiWriter, flags)),
        volume_context: context,
        secrets: secret(),
        ..Default::default()
    }
}

fn static_context(bucket: &str, prefix: &str) -> HashMap<String, String> {
    HashMap::from([
        ("bucket".to_owned(), bucket.to_owned()),
        ("prefix".to_owned(), prefix.to_owned()),
        ("endpointUrl".to_owned(), minio().endpoint.clone()),
    ])
}

fn unpublish(node: &mut NodeClient<Channel>, volume_id: &str, target: &Path) {
    let request = NodeUnpublishVolumeRequest { volume_id: volume_id.into(), target_path: target.display().to_string() };
    block_on(node.node_unpublish_volume(request)).expect("NodeUnpublishVolume");
}

/// The pod's directory, as the kubelet makes it: the driver creates the target in it.
fn pod_dir(work: &Path) -> PathBuf {
    let pod = work.join("pods/uid-1/volumes/kubernetes.io~csi/pv-1");
    std::fs::create_dir_all(&pod).expect("pod dir");
    pod
}

#[test]
fn a_pods_volume_reads_and_writes_the_bucket_and_is_stored_when_unpublished() {
    let bucket = create_bucket("csi-static");
    put(&bucket, "team/in.txt", b"from the bucket".to_vec());
    put(&bucket, "elsewhere.txt", b"not in the volume".to_vec());
    let work = Workspace::new();
    let driver = Driver::start(work.path());
    let mut node = driver.node();
    let target = pod_dir(work.path()).join("mount");

    // The store is reached through a proxy that will slow it down.
    let proxy = ToxiProxy::to_minio();
    let mut context = static_context(&bucket, "team");
    context.insert("endpointUrl".into(), proxy.endpoint.clone());
    let request = publish_request("pv-static", &target, context, &["write-back"]);
    block_on(node.node_publish_volume(request.clone())).expect("NodePublishVolume");
    assert_eq!(mount_fstype(&target).as_deref(), Some("fuse.bucketfs"));
    assert_eq!(std::fs::read(target.join("in.txt")).expect("read in the pod"), b"from the bucket");
    assert!(!target.join("elsewhere.txt").exists(), "only the prefix is mounted");

    // The kubelet repeats calls: the same volume again is done, another one is refused.
    block_on(node.node_publish_volume(request.clone())).expect("a repeated NodePublishVolume");
    let daemons = pids_with_arg_containing(target.to_str().expect("UTF-8"));
    assert_eq!(daemons.len(), 1, "one daemon for the target");
    // The Secret's key is nowhere root on the node could read it back from.
    let environment = std::fs::read(format!("/proc/{}/environ", daemons[0])).expect("the daemon's environment");
    assert!(!contains(&environment, SECRET_KEY.as_bytes()), "the Secret is in the daemon's environment");
    for file in files_below(&work.path().join("state")) {
        let content = std::fs::read(&file).unwrap_or_default();
        assert!(!contains(&content, SECRET_KEY.as_bytes()), "the Secret is in {}", file.display());
    }
    // The mounts' logs (paths, keys, errors) are root's alone.
    let logs = files_below(&work.path().join("state/logs"));
    assert!(!logs.is_empty(), "the daemon logs under the state directory");
    for log in logs {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&log).expect("log").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the mode of {}", log.display());
    }
    let other = publish_request("pv-other", &target, static_context(&bucket, "other"), &[]);
    let refused = block_on(node.node_publish_volume(other)).expect_err("another volume on a used target");
    assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");

    // With --write-back, close() returns before the upload, which the latency makes take
    // seconds: only the unpublish's wait puts the file in the bucket before it returns.
    proxy.add("latency", Direction::Downstream, Toxic::Latency { latency_ms: 500, jitter_ms: 0 });
    let written = gen_data(7, 8 * MIB);
    std::fs::write(target.join("out.bin"), &written).expect("write in the pod");
    unpublish(&mut node, "pv-static", &target);
    assert_eq!(get(&bucket, "team/out.bin"), written, "stored when NodeUnpublishVolume returned");
    assert!(!target.exists(), "the target path is removed");
    assert!(pids_with_arg_containing(target.to_str().expect("UTF-8")).is_empty(), "the daemon exited");
    // Repeated, it finds nothing to do.
    unpublish(&mut node, "pv-static", &target);
}

#[test]
fn a_reader_access_mode_mounts_read_only_and_a_wrong_key_mounts_nothing() {
    let bucket = create_bucket("csi-modes");
    put(&bucket, "a.txt", b"a".to_vec());
    let work = Workspace::new();
    let driver = Driver::start(work.path());
    let mut node = driver.node();
    let pod = pod_dir(work.path());

    let reader = pod.join("reader");
    let mut request = publish_request("pv-reader", &reader, static_context(&bucket, ""), &[]);
    request.volume_capability = Some(capability(Mode::MultiNodeReaderOnly, &[]));
    block_on(node.node_publish_volume(request)).expect("NodePublishVolume, reader");
    assert_eq!(std::fs::read(reader.join("a.txt")).expect("read"), b"a");
    let error = std::fs::write(reader.join("b.txt"), b"b").expect_err("a write to a reader volume");
    assert_eq!(error.raw_os_error(), Some(libc::EROFS), "{error}");
    unpublish(&mut node, "pv-reader", &reader);

    let refused = pod.join("refused");
    let mut request = publish_request("pv-refused", &refused, static_context(&bucket, ""), &[]);
    request.secrets.insert("AWS_SECRET_ACCESS_KEY".into(), "not-the-key".into());
    let error = block_on(node.node_publish_volume(request)).expect_err("a mount with a wrong key");
    assert!(error.message().contains(&bucket), "the error names the source: {error:?}");
    assert!(!is_mounted(&refused), "nothing is mounted");
    let mut request = publish_request("pv-typo", &refused, static_context(&bucket, ""), &[]);
    request.secrets.insert("AWS_SECRET_KEY".into(), "x".into());
    let error = block_on(node.node_publish_volume(request)).expect_err("a secret with an unknown key");
    assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error:?}");
}

/// The chart's node plugin: a driver that dies is started again in the same container,
/// whose daemons serve on; SIGTERM stops the driver and the supervisor, not the mounts.
#[test]
fn a_supervised_driver_that_dies_is_started_again_and_its_mounts_serve_on() {
    let bucket = create_bucket("csi-supervised");
    put(&bucket, "a.txt", b"before".to_vec());
    let work = Workspace::new();
    let target = pod_dir(work.path()).join("mount");
    let request = publish_request("pv-supervised", &target, static_context(&bucket, ""), &[]);
    let mut supervisor = Driver::start_supervised(work.path());
    block_on(supervisor.node().node_publish_volume(request.clone())).expect("NodePublishVolume");
    let daemons = pids_with_arg_containing(target.to_str().expect("UTF-8"));
    let first = supervisor.child().expect("the driver runs as the supervisor's child");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first), nix::sys::signal::Signal::SIGKILL).expect("kill -9");

    assert_eq!(std::fs::read(target.join("a.txt")).expect("read while the driver is down"), b"before");
    let restarted = wait_until(Duration::from_secs(10), || supervisor.child().is_some_and(|pid| pid != first));
    assert!(restarted, "a new driver within 10 s: {}", supervisor.log());
    // The new driver answers once its socket is up; it finds the mount its predecessor made.
    let published = wait_until(Duration::from_secs(10), || {
        supervisor.try_node().is_some_and(|mut node| block_on(node.node_publish_volume(request.clone())).is_ok())
    });
    assert!(published, "NodePublishVolume to the new driver: {}", supervisor.log());
    assert_eq!(pids_with_arg_containing(target.to_str().expect("UTF-8")), daemons, "the same daemon serves");
    unpublish(&mut supervisor.node(), "pv-supervised", &target);

    let second = supervisor.child().expect("the new driver");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor.process.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = supervisor.process.wait().expect("the supervisor exits");
    assert!(status.success(), "the supervisor stops cleanly on SIGTERM: {status:?}");
    assert!(!std::path::Path::new(&format!("/proc/{second}")).exists(), "its driver stopped too");
}

#[test]
fn mounts_keep_serving_while_the_driver_restarts_and_the_new_driver_knows_them() {
    let bucket = create_bucket("csi-restart");
    put(&bucket, "a.txt", b"before".to_vec());
    let work = Workspace::new();
    let target = pod_dir(work.path()).join("mount");
    let request = publish_request("pv-restart", &target, static_context(&bucket, ""), &[]);
    let driver = Driver::start(work.path());
    block_on(driver.node().node_publish_volume(request.clone())).expect("NodePublishVolume");
    let daemons = pids_with_arg_containing(target.to_str().expect("UTF-8"));
    driver.kill();

    // The pod goes on reading and writing while no driver runs.
    assert_eq!(std::fs::read(target.join("a.txt")).expect("read without a driver"), b"before");
    std::fs::write(target.join("b.txt"), b"during").expect("write without a driver");
    assert_eq!(get(&bucket, "b.txt"), b"during");

    let driver = Driver::start(work.path());
    let mut node = driver.node();
    // The kubelet publishes again after a restart: the new driver finds the mount its
    // predecessor made and leaves it alone; another volume there is still refused.
    block_on(node.node_publish_volume(request)).expect("NodePublishVolume after the restart");
    assert_eq!(pids_with_arg_containing(target.to_str().expect("UTF-8")), daemons, "the same daemon serves");
    let other = publish_request("pv-other", &target, static_context(&bucket, "x"), &[]);
    let refused = block_on(node.node_publish_volume(other)).expect_err("another volume on the target");
    assert_eq!(refused.code(), tonic::Code::AlreadyExists, "{refused:?}");
    unpublish(&mut node, "pv-restart", &target);
    assert!(!target.exists() && !is_mounted(&target));
}

#[test]
fn dynamic_volumes_are_prefixes_the_controller_makes_and_deletes_and_nothing_else() {
    let bucket = create_bucket("csi-dynamic");
    put(&bucket, "claims/pvc-2/keep.txt", b"another claim".to_vec());
    put(&bucket, "claims-neighbour.txt", b"beside the claims".to_vec());
    put(&bucket, "static/data.txt", b"a static volume".to_vec());
    let work = Workspace::new();
    let driver = Driver::start(work.path());
    let mut controller = driver.controller();
    let parameters = HashMap::from([
        ("bucket".to_owned(), bucket.clone()),
        ("prefix".to_owned(), "claims".to_owned()),
        ("endpointUrl".to_owned(), minio().endpoint.clone()),
        // What the external-provisioner adds; not the driver's business.
        ("csi.storage.k8s.io/pvc/name".to_owned(), "data".to_owned()),
    ]);
    let create = |capacity: i64| CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(CapacityRange { required_bytes: capacity, limit_bytes: 0 }),
        volume_capabilities: vec![capability(Mode::MultiNodeMultiWriter, &[])],
        parameters: parameters.clone(),
        secrets: secret(),
        ..Default::default()
    };
    let volume = block_on(controller.create_volume(create(1 << 30)))
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("a volume");
    assert_eq!(volume.volume_context.get("prefix").map(String::as_str), Some("claims/pvc-1/"));
    let again = block_on(controller.create_volume(create(1 << 30))).expect("CreateVolume again").into_inner();
    assert_eq!(again.volume.map(|v| v.volume_id), Some(volume.volume_id.clone()));
    let resized = block_on(controller.create_volume(create(2 << 30))).expect_err("the same name, another size");
    assert_eq!(resized.code(), tonic::Code::AlreadyExists, "{resized:?}");

    // A pod writes into the claim through the node service.
    let mut node = driver.node();
    let target = pod_dir(work.path()).join("mount");
    let request = publish_request(&volume.volume_id, &target, volume.volume_context.clone(), &[]);
    block_on(node.node_publish_volume(request)).expect("NodePublishVolume");
    // What init containers do to a volume's root: none of it may lose the claim's mark.
    change_everything_of(&target);
    std::fs::create_dir(target.join("out")).expect("mkdir in the pod");
    std::fs::write(target.join("out/result.txt"), b"done").expect("write in the pod");
    unpublish(&mut node, &volume.volume_id, &target);
    assert_eq!(get(&bucket, "claims/pvc-1/out/result.txt"), b"done");

    let delete = |volume_id: &str| DeleteVolumeRequest { volume_id: volume_id.into(), secrets: secret() };
    block_on(controller.delete_volume(delete(&volume.volume_id))).expect("DeleteVolume");
    assert!(list_keys(&bucket, "claims/pvc-1").is_empty(), "the claim's objects are gone");
    block_on(controller.delete_volume(delete(&volume.volume_id))).expect("DeleteVolume, repeated");
    // Ids of prefixes the controller did not make delete nothing: a static volume, the
    // claims' base, the bucket, something that is no id of ours.
    let location =
        format!("?endpoint={}", minio().endpoint.replace(':', "%3A").replace('/', "%2F").replace('.', "%2E"));
    for id in
        ["static/", "claims/", ""].map(|prefix| format!("s3://{bucket}/{prefix}{location}")).iter().chain([&bucket])
    {
        block_on(controller.delete_volume(delete(id))).unwrap_or_else(|e| panic!("DeleteVolume {id}: {e:?}"));
    }
    assert_eq!(
        list_keys(&bucket, ""),
        ["claims-neighbour.txt", "claims/pvc-2/keep.txt", "static/data.txt"],
        "everything outside the claim is left"
    );
}

/// Whether `haystack` holds `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// Every file below `dir`, at any depth (sockets and the like included).
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => files.extend(files_below(&entry.path())),
            Ok(_) => files.push(entry.path()),
            Err(_) => {}
        }
    }
    files
}

/// `chmod 777`, `chown`, `touch`, and `setfattr` (set one, remove another) of `root`.
fn change_everything_of(root: &Path) {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o777)).expect("chmod 777 of the root");
    std::os::unix::fs::chown(root, Some(1000), Some(1000)).expect("chown of the root");
    set_times_by_name(root, std::time::SystemTime::now()).expect("touch of the root");
    let path = std::ffi::CString::new(root.as_os_str().as_bytes()).expect("path");
    let value = b"init";
    // SAFETY: plain xattr calls on a NUL-terminated path with a buffer of the length given.
    let set = unsafe { libc::setxattr(path.as_ptr(), c"user.note".as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(set, 0, "setfattr of the root: {}", std::io::Error::last_os_error());
    // SAFETY: as above.
    unsafe { libc::removexattr(path.as_ptr(), c"user.bucketfs-csi-capacity".as_ptr()) };
}

/// Two volumes of one bucket on one node (two tenants: each its own prefix, its own
/// Secret): the files a killed daemon of one volume closed with `--write-back` and had not
/// stored are stored by that volume's next mount, never by the other volume's daemons,
/// which keep their work files apart (one `--cache-dir` per volume).
#[test]
fn what_a_killed_volume_left_is_stored_by_that_volume_and_no_other() {
    let bucket = create_bucket("csi-tenants");
    let work = Workspace::new();
    let driver = Driver::start(work.path());
    let mut node = driver.node();
    // Both volumes reach the store at one endpoint (a proxy that can slow it down): the
    // write-back log tells stores apart by endpoint and bucket.
    let proxy = ToxiProxy::to_minio();
    let context = |prefix: &str| {
        let mut context = static_context(&bucket, prefix);
        context.insert("endpointUrl".into(), proxy.endpoint.clone());
        context
    };
    let pods = pod_dir(work.path());
    let (target_a, target_b) = (pods.join("a"), pods.join("b"));
    let publish_a = publish_request("pv-tenant-a", &target_a, context("tenant-a"), &["write-back"]);
    block_on(node.node_publish_volume(publish_a.clone())).expect("publish A");

    // A file closed and not stored yet (the store is slow) when A's daemon is killed.
    proxy.add("latency", Direction::Downstream, Toxic::Latency { latency_ms: 3000, jitter_ms: 0 });
    std::fs::write(target_a.join("pending.txt"), b"tenant A's").expect("write in A");
    let daemons = pids_with_arg_containing(target_a.to_str().expect("UTF-8"));
    assert_eq!(daemons.len(), 1, "one daemon for A");
    // SAFETY: a plain kill(2) of the daemon this test started.
    unsafe { libc::kill(daemons[0], libc::SIGKILL) };
    assert!(
        wait_until(Duration::from_secs(10), || pids_with_arg_containing(target_a.to_str().expect("UTF-8")).is_empty())
    );
    proxy.remove("latency");

    // B mounts (and would replay what it finds in its work directory before answering).
    let publish_b = publish_request("pv-tenant-b", &target_b, context("tenant-b"), &["write-back"]);
    block_on(node.node_publish_volume(publish_b)).expect("publish B");
    std::fs::write(target_b.join("b.txt"), b"tenant B's").expect("write in B");
    unpublish(&mut node, "pv-tenant-b", &target_b);
    assert_eq!(list_keys(&bucket, ""), ["tenant-b/b.txt"], "B stored its own file and none of A's");

    // A's next mount stores what A's killed daemon left.
    block_on(node.node_publish_volume(publish_a)).expect("publish A again");
    assert_eq!(std::fs::read(target_a.join("pending.txt")).expect("read in A"), b"tenant A's");
    unpublish(&mut node, "pv-tenant-a", &target_a);
    assert_eq!(get(&bucket, "tenant-a/pending.txt"), b"tenant A's");
}

/// The driver's socket takes calls that carry Secrets: it is made 0600. Whatever else is
/// at its path (a file someone put there) is left as it is, and the driver does not start.
#[test]
fn the_socket_is_roots_alone_and_nothing_else_is_removed_for_it() {
    use std::os::unix::fs::PermissionsExt as _;
    let work = Workspace::new();
    let driver = Driver::start(work.path());
    let mode = std::fs::metadata(work.path().join("csi.sock")).expect("socket").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket's mode");
    drop(driver);

    let elsewhere = tempfile::tempdir().expect("dir");
    let socket = elsewhere.path().join("csi.sock");
    std::fs::write(&socket, b"not a socket").expect("a file at the socket's path");
    let endpoint = format!("unix://{}", socket.display());
    let state = elsewhere.path().join("state");
    let line = ["csi", "--endpoint", &endpoint, "--node-id", "n", "--state-dir", state.to_str().expect("UTF-8")];
    let (status, _, err) = run_bucketfs(&line, Duration::from_secs(20));
    assert!(!status.success() && err.contains("is not a socket: left as it is"), "{err}");
    assert_eq!(std::fs::read(&socket).expect("still there"), b"not a socket");
}
