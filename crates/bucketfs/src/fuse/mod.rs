//! The thin adapter from kernel requests to [`Fs`](bucketfs_core::fs::Fs), over two transports.
//!
//! `operations.rs` runs each request (decoded arguments in, an `answer` out);
//! `dispatch.rs` decodes a request (`wire.rs`: the kernel's byte layouts) and hands it
//! over, with a `wire_answer` for its transport: `dev_fuse.rs` reads requests from
//! `/dev/fuse`, `ring/` takes what the kernel carries over io_uring, one queue per CPU.
//! `io_modes.rs` and `kept_listings.rs` hold the only state kept here, the kernel's;
//! `names_only.rs` which callers' listings go without inodes for their files.

mod answer;
pub mod dev_fuse;
mod dispatch;
mod io_modes;
mod kept_listings;
mod names_only;
mod operations;
pub mod ring;
pub mod wire;
mod wire_answer;

pub use dev_fuse::DevFuse;
pub use operations::FuseAdapter;

/// Largest read or write request the kernel may send us (reads: see `cli::mount`'s
/// `raise_read_ahead`, without which the kernel sends at most 128 KiB).
pub const MAX_REQUEST: u32 = 1024 * 1024;

/// Keeps the calling thread on `cpu` (a ring queue's thread, a `/dev/fuse` reader).
fn pin_this_thread(cpu: usize) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// On the mount's root: setting this attribute changes the daemon's log level (`bucketfs
/// log-level`; see `cli::logging`).
pub const LOG_LEVEL: &str = "bucketfs.log-level";

/// Installs a new log level (a tracing filter), or says why it is not one.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// On a directory: setting this attribute to a name undeletes that file (`bucketfs
/// undelete`; see `Fs::undelete`).
pub const UNDELETE: &str = "bucketfs.undelete";

/// On the mount's root: reading this attribute gives the mount's state (`bucketfs status`).
pub const STATUS: &str = "bucketfs.status";

/// The mount's state as text.
pub type Status = Box<dyn Fn() -> String + Send + Sync>;
