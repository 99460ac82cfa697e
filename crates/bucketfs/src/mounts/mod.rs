//! The mounts of this machine as the commands see them from outside: found in
//! `/proc/self/mountinfo` (here), asked through attributes of their paths
//! ([`attributes`]: status, refresh, log level, undelete, write-back), and ended
//! ([`unmount`]). `cli` and `csi` both use it; it knows nothing of either.

pub mod attributes;
pub mod unmount;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use unmount::unmount;

/// Whether something is mounted on `path`.
pub fn is_mount_point(path: &Path) -> Result<bool> {
    Ok(mount_device(path)?.is_some())
}

/// The device (`MAJOR:MINOR`) of the newest mount on `path`, if any.
pub fn mount_device(path: &Path) -> Result<Option<String>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let wanted = path.to_string_lossy();
    let device = mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.len() > 4 && unescape_mountinfo(fields[4]) == wanted).then(|| fields[2].to_owned())
    });
    Ok(device)
}

/// The mount points of type `fuse.bucketfs` in this namespace.
pub fn bucketfs_mounts() -> Result<Vec<PathBuf>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let separator = fields.iter().position(|f| *f == "-")?;
            let mountpoint = fields.get(4)?;
            (fields.get(separator + 1) == Some(&"fuse.bucketfs")).then(|| PathBuf::from(unescape_mountinfo(mountpoint)))
        })
        .collect())
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let value = bytes[i + 1..i + 4].iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(value as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
