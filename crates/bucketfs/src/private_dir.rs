//! The directories where a daemon keeps its state (the upload journal, the write-back
//! log, saved indexes, logs): private to the user running it. Their records name keys
//! and hold file contents, so no other user may read them, and a directory another user
//! made (or can write) must not be trusted with them: it is refused with a line saying
//! so, never used half (a journal that cannot be written loses crash safety silently).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The default `--cache-dir`: `/var/tmp` for root (as before), and a directory of one's
/// own below it for every other user (`/var/tmp/bucketfs-UID`), so users of one machine
/// never share state. `/var/tmp` survives reboots, which the journal and the
/// write-back log need.
pub fn default_cache_dir() -> PathBuf {
    match nix::unistd::geteuid().as_raw() {
        0 => PathBuf::from("/var/tmp"),
        uid => PathBuf::from(format!("/var/tmp/bucketfs-{uid}")),
    }
}

/// Makes a user's default cache directory (not root's `/var/tmp`, which is everyone's
/// and stays as it is) if it is missing, private. Any other `--cache-dir` is the user's
/// choice: only the state directories made inside it are private.
pub fn prepare_cache_dir(dir: &Path) -> io::Result<()> {
    if nix::unistd::geteuid().is_root() || dir != default_cache_dir() {
        return Ok(());
    }
    ensure(dir)
}

/// Makes `dir` (and its missing parents) with mode 0700, and checks that it is a
/// directory this user owns; one it owns but others can open is closed to them (0700).
pub fn ensure(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let found = std::fs::metadata(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    if !found.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    if found.uid() != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} belongs to uid {}, not to this user (uid {me})", dir.display(), found.uid()),
        ));
    }
    if found.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
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
}
