//! The directories where a daemon keeps its state (the upload journal, the write-back
//! log, saved indexes, logs): private to the user running it. Their records name keys
//! and hold file contents, so no other user may read them, and a directory another user
//! made (or can write) must not be trusted with them: it is refused with a line saying
//! so, never used half (a journal that cannot be written loses crash safety silently).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Root's default `--cache-dir`: a directory only root can make, so no other user can
/// make it first (as anyone could in the world-writable `/var/tmp`, where root's state
/// lived before) and refuse root's mounts. It survives reboots, as the journal of uploads
/// and the write-back log must.
const ROOT_STATE: &str = "/var/lib/bucketfs";

/// The default `--cache-dir`: `/var/lib/bucketfs` for root; for every other user
/// `$XDG_STATE_HOME/bucketfs`, else `~/.local/state/bucketfs` (the XDG base directory
/// rules: state that survives reboots), else, for a user with no home, `/var/tmp/bucketfs-UID`
/// (checked as every state directory is: refused unless it is this user's own).
pub fn default_cache_dir() -> PathBuf {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from(ROOT_STATE);
    }
    let absolute = |name: &str| std::env::var_os(name).map(PathBuf::from).filter(|path| path.is_absolute());
    if let Some(state) = absolute("XDG_STATE_HOME") {
        return state.join("bucketfs");
    }
    if let Some(home) = absolute("HOME").filter(|home| home.is_dir()) {
        return home.join(".local/state/bucketfs");
    }
    PathBuf::from(format!("/var/tmp/bucketfs-{uid}"))
}

/// Where earlier versions kept the state of this user by default: what a crash left
/// there (uploads to abort, files closed with `--write-back` to store) is still dealt
/// with, if the directory is this user's own and private.
pub fn earlier_default_cache_dir() -> Option<PathBuf> {
    let uid = nix::unistd::geteuid();
    let earlier = match uid.is_root() {
        true => PathBuf::from("/var/tmp"),
        false => PathBuf::from(format!("/var/tmp/bucketfs-{uid}")),
    };
    (earlier != default_cache_dir()).then_some(earlier)
}

/// Makes the default cache directory if it is missing, private (and its missing
/// parents). Any other `--cache-dir` is the user's choice: only the state directories
/// made inside it are private.
pub fn prepare_cache_dir(dir: &Path) -> io::Result<()> {
    if dir != default_cache_dir() {
        return Ok(());
    }
    ensure(dir)
}

/// Makes `dir` (and its missing parents) with mode 0700, and checks that it is a
/// directory this user owns, and not a symbolic link (which another user could point at
/// a directory of this user's, to have its mode changed or its files written there); one
/// it owns but others can open is closed to them (0700). The checks and the change are
/// made on the directory opened without following a link, so a link swapped in between
/// cannot redirect them.
pub fn ensure(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY)
        .open(dir)
        .map_err(|error| {
            let is_link = std::fs::symlink_metadata(dir).is_ok_and(|found| found.file_type().is_symlink());
            match error.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR) if is_link => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} is a symbolic link: a state directory must be a directory of its own", dir.display()),
                ),
                Some(libc::ENOTDIR) => io::Error::other(format!("{} is not a directory", dir.display())),
                _ => error,
            }
        })?;
    let found = opened.metadata()?;
    let me = nix::unistd::geteuid().as_raw();
    if found.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} belongs to uid {}, not to this user (uid {me})", dir.display(), found.uid()),
        ));
    }
    if found.mode() & 0o077 != 0 {
        opened.set_permissions(std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_private_and_closed_to_others() {
        let base = tempfile::tempdir().expect("temporary directory");
        let dir = base.path().join("a/b");
        ensure(&dir).expect("made");
        assert_eq!(std::fs::metadata(&dir).expect("stat").mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure(&dir).expect("again");
        assert_eq!(std::fs::metadata(&dir).expect("stat").mode() & 0o777, 0o700);
        let file = base.path().join("file");
        std::fs::write(&file, b"x").expect("write");
        assert!(ensure(&file).is_err(), "a file is no directory");
    }

    /// A state directory that is a symbolic link (another user's, pointing at a directory
    /// of this user's) is refused, and what it points at keeps its mode.
    #[test]
    fn a_symbolic_link_is_refused_and_its_target_unchanged() {
        let base = tempfile::tempdir().expect("temporary directory");
        let target = base.path().join("target");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let link = base.path().join("state");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let error = ensure(&link).expect_err("a link is refused");
        assert!(error.to_string().contains("is a symbolic link"), "{error}");
        assert_eq!(std::fs::metadata(&target).expect("stat").mode() & 0o777, 0o755, "the target is untouched");
    }
}
