//! Whether the daemon that left records in a cache directory (uploads in the journal,
//! files in the write-back log) still runs, so that a mount deals only with what stopped
//! daemons left. A running daemon holds an exclusive `flock` on its mark,
//! `<cache-dir>/bucketfs-running/BOOT-PID-START`, for its whole life; the kernel lets go
//! of it when the daemon dies, however it dies. A lock is seen across PID namespaces
//! (two pods sharing one hostPath, a rolling update), where a PID and its start time in
//! `/proc` name another process or none. The mark appears under its name already locked
//! (made under a temporary name, locked, then renamed), so it is never seen free while its
//! daemon runs. Records of a daemon that left no mark (a version before marks, or a cache
//! directory whose file system refuses locks) are judged from `/proc` as before.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::journal::{daemon_alive, this_daemon};

/// The marks of the daemons using one cache directory.
#[derive(Debug, Clone)]
pub struct Liveness {
    dir: PathBuf,
}

/// This daemon's mark, locked for as long as it is held; removed when dropped.
#[derive(Debug)]
pub struct HeldMark {
    path: PathBuf,
    _lock: Flock<File>,
}

impl Drop for HeldMark {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Liveness {
    /// The marks under `cache_dir` (the directory is made, private, when a mark is held).
    pub fn new(cache_dir: &Path) -> Self {
        Self { dir: cache_dir.join("bucketfs-running") }
    }

    /// Marks this daemon as running until the mark is dropped.
    pub fn hold(&self) -> io::Result<HeldMark> {
        crate::private_dir::ensure(&self.dir)?;
        let name = this_daemon();
        let path = self.dir.join(&name);
        let temporary = self.dir.join(format!(".{name}.new"));
        let file = File::create(&temporary)?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| io::Error::from(errno))?;
        std::fs::rename(&temporary, &path)?;
        File::open(&self.dir)?.sync_all()?;
        Ok(HeldMark { path, _lock: lock })
    }

    /// Whether the daemon `name` (`BOOT-PID-START`) runs: its mark is locked, or, where it
    /// left none, `/proc` says so.
    pub fn runs(&self, name: &str) -> bool {
        if name.starts_with('.') || name.contains('/') {
            return true; // not a daemon's name: not ours to judge
        }
        match File::open(self.dir.join(name)) {
            Ok(mark) => Flock::lock(mark, FlockArg::LockSharedNonblock).is_err(),
            Err(error) if error.kind() == io::ErrorKind::NotFound => daemon_alive(name),
            Err(_) => true, // cannot tell: leave its records alone
        }
    }

    /// Removes the marks of daemons that stopped and left nothing `named` (the daemons
    /// with records still here).
    pub fn sweep(&self, named: &HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
            if name.starts_with('.') || named.contains(&name) {
                continue;
            }
            let Ok(mark) = File::open(entry.path()) else { continue };
            // Removed while locked here, so no daemon can be holding it.
            if let Ok(_gone) = Flock::lock(mark, FlockArg::LockExclusiveNonblock) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon whose PID `/proc` cannot tell apart (another PID namespace) is running
    /// while its mark is locked, and stopped once the lock is let go.
    #[test]
    fn a_locked_mark_runs_and_a_free_one_does_not() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let liveness = Liveness::new(dir.path());
        let held = liveness.hold().expect("held");
        assert!(liveness.runs(&this_daemon()));
        // A name `/proc` calls dead: boot 0, PID 1 started at tick 1.
        let other = format!("{}-1-1", "0".repeat(32));
        assert!(!liveness.runs(&other), "no mark: /proc judges");
        let mark = File::create(liveness.dir.join(&other)).expect("mark");
        let lock = Flock::lock(mark, FlockArg::LockExclusiveNonblock).expect("locked");
        assert!(liveness.runs(&other), "a locked mark runs");
        liveness.sweep(&HashSet::new());
        assert!(liveness.dir.join(&other).exists(), "a locked mark stays");
        drop(lock);
        assert!(!liveness.runs(&other), "a mark let go is a stopped daemon");
        liveness.sweep(&HashSet::from([other.clone()]));
        assert!(liveness.dir.join(&other).exists(), "a stopped daemon's mark stays while its records do");
        liveness.sweep(&HashSet::new());
        assert!(!liveness.dir.join(&other).exists(), "then it is swept");
        assert!(liveness.dir.join(this_daemon()).exists(), "this daemon's own stays");
        drop(held);
        assert!(!liveness.dir.join(this_daemon()).exists(), "dropped: removed");
    }
}
