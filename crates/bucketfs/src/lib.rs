//! bucketfs: mount S3-compatible object storage as a directory.
//!
//! This crate is the program: [`cli`] parses the command line and runs a mount, [`csi`] is
//! the Kubernetes CSI driver, which runs mounts, and [`fuse`] adapts the kernel's requests
//! (`/dev/fuse` or io_uring) to the filesystem core. Both `cli` and `csi` build a mount's
//! arguments in [`mount_args`] and find and end mounts through [`mounts`]. Below them:
//! the core, `bucketfs_core` (namespace, reads, writes, caches), and the store client,
//! `bucketfs_client` (S3). See docs/ARCHITECTURE.md.

pub mod cli;
pub mod csi;
pub mod fuse;
pub mod mount_args;
pub mod mounts;
