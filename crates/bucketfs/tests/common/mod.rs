//! Shared harness for the bucketfs integration tests. The integration binary
//! (tests/integration/main.rs) declares it once (`#[path = "../common/mod.rs"] mod common;`)
//! and each of its modules says `use crate::common::*;`; the files that are binaries of their
//! own (tests/NAME.rs) say `mod common;` and `use common::*;`. Each concern lives in its own
//! file, all re-exported here:
//!
//! * `minio`: one MinIO server per test process (shared by every test of the integration
//!   binary), the root credentials, free ports;
//! * `s3`: an S3 client built explicitly (nothing from the shell's AWS_* environment) and sync
//!   helpers around it (`create_bucket`, `put`, `get`, `delete`, `list_keys`, `open_uploads`…);
//! * `sts`: restricted identities ([`restricted_credentials`], [`read_only_credentials`]),
//!   which [`MountBuilder::credentials`] and [`s3_client_with`] use;
//! * `mount`: [`MountBuilder`] / [`Mount`] run the real `bucketfs` binary against MinIO, wait
//!   until the mount shows up in /proc/self/mountinfo, and unmount + reap it on drop;
//! * `request_log`: with [`MountBuilder::request_log`] the S3 requests bucketfs sends can be
//!   inspected ([`S3Request`]);
//! * `toxiproxy`: fault injection, a toxiproxy server per test process and a proxy to MinIO
//!   per test with toxics (latency, bandwidth, resets, timeouts, sliced or cut bodies);
//!   `relay`: a hand-written relay that can freeze, go down or answer `503 SlowDown`;
//! * `procfs`: mountinfo, processes by command line, peak RSS;
//! * `data`: deterministic data, sha256, byte comparisons; `files`: positional reads, listings,
//!   errno checks through the mount; `wait`: bounded waits;
//! * `metrics`: a scrape of the daemon's `--metrics-addr` endpoint;
//! * `tree`: walks of a mount (`find`) against the model ListObjectsV2 of the bucket gives.
//!
//! Environment knobs:
//! * `BUCKETFS_MINIO`: path of the MinIO binary (default `~/.cache/bucketfs-deps/bin/minio`);
//! * `BUCKETFS_TOXIPROXY`: path of toxiproxy-server (default `~/.cache/bucketfs-deps/bin/toxiproxy-server`);
//! * `RUST_LOG`: passed through to the bucketfs child processes (it is inherited);
//! * `BUCKETFS_TEST_LOG_LEVEL`: when set, the mounts get `--log-level <value>`;
//! * `BUCKETFS_TEST_STORE_ENDPOINT` (`http://127.0.0.1:PORT`) with `BUCKETFS_TEST_STORE_KIND`:
//!   run against that store, started elsewhere (scripts/test-stores), instead of a MinIO of
//!   this process; `BUCKETFS_TEST_STORE_LOG`: its log, for failure messages;
//!   `BUCKETFS_TEST_SKIP_LOG`: a file where tests skipped by [`require_minio!`] or
//!   [`require_store_feature!`] are listed; `BUCKETFS_TEST_STORE_DRIVES`: an erasure set's
//!   drive directories, `:`-separated (tests/drives.rs); `BUCKETFS_TEST_STORE_GATEWAYS`:
//!   more S3 gateways of the store as `URL=PID,...` (tests/integration/endpoints.rs).

// Each test binary compiles this harness and uses a part of it.
#![allow(dead_code)]

mod data;
mod files;
mod metrics;
mod minio;
mod mount;
mod procfs;
mod relay;
mod request_log;
mod s3;
mod sts;
mod toxiproxy;
mod tree;
mod wait;

// Everything is reachable as `common::NAME`, whichever file it lives in.
#[allow(unused_imports)]
pub use self::{
    data::*, files::*, metrics::*, minio::*, mount::*, procfs::*, relay::*, request_log::*, s3::*, sts::*,
    toxiproxy::*, tree::*, wait::*,
};
// The skip macros (`#[macro_export]`: at the crate's root) for the modules of the integration
// binary, which reach the harness through `use crate::common::*`.
#[allow(unused_imports)]
pub use crate::{require_minio, require_store_feature};

use std::sync::OnceLock;

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * 1024;

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
