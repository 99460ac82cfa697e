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
    let wanted = path.to_string_lossy();
    Ok(mounts()?.into_iter().rev().find(|mount| mount.point == *wanted).map(|mount| mount.device))
}

/// The mount points of type `fuse.bucketfs` in this namespace.
pub fn bucketfs_mounts() -> Result<Vec<PathBuf>> {
    Ok(mounts()?.into_iter().filter(|mount| mount.fs_type == "fuse.bucketfs").map(|mount| mount.point.into()).collect())
}

/// One line of mountinfo: what `mount_device` and `bucketfs_mounts` need of it.
struct Mount {
    device: String,
    point: String,
    fs_type: String,
}

/// The mounts of this namespace, oldest first, as `/proc/self/mountinfo` lists them.
fn mounts() -> Result<Vec<Mount>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(mountinfo.lines().filter_map(parse_mountinfo_line).collect())
}

/// `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER_OPTIONS`
fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|field| *field == "-")?;
    Some(Mount {
        device: (*fields.get(2)?).to_owned(),
        point: unescape_mountinfo(fields.get(4)?),
        fs_type: (*fields.get(separator + 1)?).to_owned(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountinfo_line_gives_its_device_point_and_type() {
        let line = "36 35 0:52 / /mnt/a\\040b rw,nosuid shared:1 - fuse.bucketfs bucketfs rw,user_id=0";
        let mount = parse_mountinfo_line(line).expect("a mount");
        assert_eq!(
            (mount.device.as_str(), mount.point.as_str(), mount.fs_type.as_str()),
            ("0:52", "/mnt/a b", "fuse.bucketfs")
        );
        assert!(parse_mountinfo_line("36 35 0:52 / /mnt").is_none(), "no separator: not a mount line");
    }
}
