//! bucketfs's filesystem core: everything a mount does between the FUSE adapter and the
//! store client, with no CLI and no kernel transport, so that it is built and tested
//! without a mount (`fs/model_test.rs` runs it over the in-memory store).
//!
//! Calls flow one way: [`fs`] (operations, handles, files open for writing, errno) →
//! [`namespace`] (inodes, listings, metadata) and [`read`] (read-ahead) and [`write`]
//! (uploads, staging, the write-back log) → `bucketfs_client::store` (S3). [`datacache`]
//! keeps blocks on local disk and in a shared bucket; [`cache`] keeps small bodies fetched
//! with their metadata; [`memory`] is the one budget for buffered data. See
//! docs/ARCHITECTURE.md.

pub mod cache;
pub mod datacache;
pub mod disk_wait;
pub mod fs;
pub mod memory;
pub mod namespace;
pub mod private_dir;
pub mod read;
pub mod write;
