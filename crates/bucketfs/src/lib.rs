//! bucketfs: mount S3-compatible object storage as a directory.
//!
//! Requests flow one way: [`fuse`] (kernel adapter) → [`fs`] (operations, handles,
//! errno) → [`namespace`] (inodes, listings, metadata cache) and [`read`] (prefetch) →
//! [`store`] (S3); [`cache`] keeps small files read along with their metadata.
//! [`memory`] is the one budget for buffered data; [`metrics`] what is counted; [`cli`] parses the
//! command line and runs the mount; [`csi`] is the Kubernetes CSI driver, which runs mounts. See docs/ARCHITECTURE.md.

pub mod cache;
pub mod cli;
pub mod csi;
pub mod datacache;
pub mod disk_wait;
pub mod fs;
pub mod fuse;
pub mod memory;
pub mod metrics;
pub mod namespace;
pub mod private_dir;
pub mod read;
pub mod store;
pub mod write;
