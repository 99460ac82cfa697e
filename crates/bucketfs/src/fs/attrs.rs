//! POSIX attributes kept in object metadata, in the format s3fs uses, so that files
//! written by either tool look the same in both:
//!
//! | metadata key       | value                                              |
//! |--------------------|----------------------------------------------------|
//! | `x-amz-meta-mode`  | the whole `st_mode` in decimal (type and permission bits) |
//! | `x-amz-meta-uid`   | decimal uid                                        |
//! | `x-amz-meta-gid`   | decimal gid                                        |
//! | `x-amz-meta-mtime` | seconds since the epoch, optionally `.nanoseconds` |
//!
//! A key that is missing (or unreadable) means "not set": the mount's defaults apply
//! (mode and owner from the mount options, mtime from the object's Last-Modified).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::Metadata;

const MODE: &str = "mode";
const UID: &str = "uid";
const GID: &str = "gid";
const MTIME: &str = "mtime";

/// The attributes an object's metadata sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoredAttrs {
    /// Full `st_mode` (file type bits included, as s3fs writes it).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
}

impl StoredAttrs {
    pub fn from_metadata(metadata: &Metadata) -> Self {
        let number = |name: &str| metadata.user.get(name).and_then(|v| v.trim().parse::<u32>().ok());
        Self {
            mode: number(MODE),
            uid: number(UID),
            gid: number(GID),
            mtime: metadata.user.get(MTIME).and_then(|v| parse_time(v)),
        }
    }

    /// Writes the attributes that are set into `metadata`, leaving its other entries
    /// (and attributes not set here) as they are.
    pub fn apply_to(&self, metadata: &mut Metadata) {
        let user = &mut metadata.user;
        if let Some(mode) = self.mode {
            user.insert(MODE.into(), mode.to_string());
        }
        if let Some(uid) = self.uid {
            user.insert(UID.into(), uid.to_string());
        }
        if let Some(gid) = self.gid {
            user.insert(GID.into(), gid.to_string());
        }
        if let Some(mtime) = self.mtime {
            user.insert(MTIME.into(), format_time(mtime));
        }
    }

    /// Forgets a stored mtime: new content makes Last-Modified the file's time again.
    pub fn forget_mtime(metadata: &mut Metadata) {
        metadata.user.remove(MTIME);
    }
}

fn parse_time(value: &str) -> Option<SystemTime> {
    let value = value.trim();
    let (seconds, fraction) = value.split_once('.').unwrap_or((value, ""));
    let seconds: u64 = seconds.parse().ok()?;
    let nanos = if fraction.is_empty() {
        0
    } else {
        // "5" means 500 ms: pad or cut to nine digits.
        let digits: String = fraction.chars().chain(std::iter::repeat('0')).take(9).collect();
        digits.parse::<u32>().ok()?
    };
    UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))
}

fn format_time(time: SystemTime) -> String {
    // Times before 1970 cannot be written in this format; they are kept as the epoch.
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    match since.subsec_nanos() {
        0 => since.as_secs().to_string(),
        nanos => format!("{}.{nanos:09}", since.as_secs()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn reads_what_s3fs_writes() {
        // As s3fs 1.90 stored a file after `touch -d`, `chmod 750` and `chown 12:34`.
        let mut metadata = Metadata::default();
        for (k, v) in
            [("mode", "33256"), ("uid", "12"), ("gid", "34"), ("mtime", "1577934245.123456789"), ("atime", "1")]
        {
            metadata.user.insert(k.into(), v.into());
        }
        let attrs = StoredAttrs::from_metadata(&metadata);
        assert_eq!(attrs.mode, Some(0o100750));
        assert_eq!((attrs.uid, attrs.gid), (Some(12), Some(34)));
        assert_eq!(attrs.mtime, Some(UNIX_EPOCH + Duration::new(1_577_934_245, 123_456_789)));
    }

    #[test]
    fn unreadable_values_count_as_unset() {
        let mut metadata = Metadata::default();
        for (k, v) in [("mode", "rwx"), ("uid", "-1"), ("mtime", "yesterday")] {
            metadata.user.insert(k.into(), v.into());
        }
        assert_eq!(StoredAttrs::from_metadata(&metadata), StoredAttrs::default());
        metadata.user.insert("mtime".into(), "1600000000.5".into());
        let mtime = StoredAttrs::from_metadata(&metadata).mtime;
        assert_eq!(mtime, Some(UNIX_EPOCH + Duration::new(1_600_000_000, 500_000_000)));
    }

    proptest! {
        #[test]
        fn attributes_survive_a_round_trip(
            mode in proptest::option::of(any::<u32>()),
            uid in proptest::option::of(any::<u32>()),
            gid in proptest::option::of(any::<u32>()),
            mtime in proptest::option::of((0u64..1 << 40, 0u32..1_000_000_000)),
            other in "[a-z]{1,8}",
        ) {
            let attrs = StoredAttrs { mode, uid, gid, mtime: mtime.map(|(s, n)| UNIX_EPOCH + Duration::new(s, n)) };
            let mut metadata = Metadata::default();
            metadata.user.insert(format!("x{other}"), "kept".into());
            attrs.apply_to(&mut metadata);
            prop_assert_eq!(StoredAttrs::from_metadata(&metadata), attrs);
            prop_assert_eq!(metadata.user.get(&format!("x{other}")).map(String::as_str), Some("kept"));
        }
    }
}
