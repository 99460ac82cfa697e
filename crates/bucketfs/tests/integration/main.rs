//! The integration tests of bucketfs as one test binary: each module is the file of one
//! concern (tests/integration/NAME.rs, its tests named `NAME::TEST`), all sharing the
//! harness of `tests/common/` and its one MinIO (and toxiproxy) per process. One binary
//! compiles the harness and links the SDKs once, where a binary per file did it for each
//! of the 42 files (most of CI's build of the tests). One file's tests:
//! `cargo test --release -p bucketfs --test integration -- NAME::`.
//!
//! Apart, as binaries of their own (tests/NAME.rs, each with the harness and a MinIO of
//! its own), are the files that must not share a process with the others, which run four
//! at a time (`--test-threads=4`):
//! * `load`: 100 readers and 100 writers of 32 MiB files through one mount for a minute,
//!   with the daemon's peak RSS bounded and 6.4 GB of objects in MinIO: it would starve
//!   the tests beside it, and their own mounts and objects would compete for its memory
//!   and disk;
//! * `stress`: six threads listing, `stat`ing, deleting and creating as fast as they can
//!   for 6 s, each operation timed: the two cores it takes would slow the timed tests
//!   beside it (faults, outage, endpoints), and their load would stretch its timings;
//! * `fuse_transport`: sets the kernel's `enable_uring` switch and `io_uring_disabled`,
//!   which are the whole machine's: other tests' mounts that keep the default transport
//!   (`bucketfs run`, `mount -t fuse.bucketfs`, the CSI driver, users' mounts) would go over
//!   io_uring or not by chance;
//! * `drives`: takes a drive away from the erasure-coded store under test
//!   (`scripts/test-stores minio-erasure`; it skips itself elsewhere), which every test
//!   running beside it would share;
//! * `flat_listing`: a walk of a 10,000-entry subtree must be served by the one flat
//!   listing that follows it, which serves only for the metadata TTL: beside the other
//!   tests the walk outlasted it and the directories were listed one by one
//!   (`a_walk_through_a_large_subtree_is_served_by_one_flat_listing` failed so in both full
//!   runs of the suite with it here; it passes with its own file's tests alone).

#[path = "../common/mod.rs"]
mod common;

mod access;
mod attributes;
mod consistency;
mod content_type;
mod copy;
mod csi;
mod datacache;
mod endpoints;
mod faults;
mod fstab;
mod harness_smoke;
mod index;
mod lifecycle;
mod listing;
mod logging;
mod metrics;
mod mount_errors;
mod multiplex;
mod odd_keys;
mod outage;
mod permissions;
mod posix;
mod programs;
mod read;
mod readonly;
mod rename;
mod requests;
mod run;
mod service;
mod shared_cache;
mod staging;
mod status;
mod store_options;
mod throttling;
mod users;
mod versions;
mod write;
mod write_back;
mod write_back_deletes;
