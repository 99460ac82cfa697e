//! How the commands talk to a running daemon: attributes of paths in its mount, which
//! only bucketfs answers (`bucketfs.refresh`, `bucketfs.status`, `bucketfs.log-level`,
//! `bucketfs.undelete`). The kernel passes any attribute name to a FUSE daemon and
//! checks the caller's access to the path on the way.

use std::ffi::CString;
use std::io;
use std::path::Path;

use anyhow::Result;

fn c_strings(path: &Path, name: &str) -> io::Result<(CString, CString)> {
    let invalid = |_| io::Error::from_raw_os_error(libc::EINVAL);
    Ok((CString::new(path.as_os_str().as_encoded_bytes()).map_err(invalid)?, CString::new(name).map_err(invalid)?))
}

/// Reads attribute `name` of `path` (at most 64 KiB).
pub fn get(path: &Path, name: &str) -> io::Result<Vec<u8>> {
    let (path, name) = c_strings(path, name)?;
    let mut value = vec![0u8; 64 * 1024];
    // SAFETY: both strings are NUL-terminated and live across the call; `value` is
    // writable for the length passed.
    let length = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    if length < 0 {
        return Err(io::Error::last_os_error());
    }
    value.truncate(length as usize);
    Ok(value)
}

/// Sets attribute `name` of `path` to `value`.
pub fn set(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let (path, name) = c_strings(path, name)?;
    // SAFETY: both strings are NUL-terminated and live across the call; `value` is
    // readable for the length passed.
    let set = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if set == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `error` says that the path is not in a bucketfs mount (no daemon there
/// answers the attribute).
pub fn not_bucketfs(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENODATA) | Some(libc::EOPNOTSUPP))
}

/// From a status report: the files closed whose upload is still running, and their bytes.
pub fn uploads_left(report: &str) -> Option<(u64, u64)> {
    let line = report.lines().find_map(|line| line.strip_prefix("uploads after close: "))?;
    let files = line.split(' ').next()?.parse().ok()?;
    let bytes = line.rsplit_once('(')?.1.strip_suffix(" bytes)")?.parse().ok()?;
    Some((files, bytes))
}

/// The status report of the mount at `mountpoint` (`bucketfs status`).
pub fn read_status(mountpoint: &Path) -> Result<String> {
    let report = get(mountpoint, crate::fuse::STATUS).map_err(|error| {
        if not_bucketfs(&error) {
            anyhow::anyhow!("{} is not a bucketfs mount", mountpoint.display())
        } else {
            anyhow::Error::new(error).context(format!("asking {}", mountpoint.display()))
        }
    })?;
    Ok(String::from_utf8_lossy(&report).into_owned())
}
