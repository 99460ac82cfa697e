//! POSIX attributes kept in object metadata, in the format s3fs uses, so that files
//! written by either tool look the same in both:
//!
//! | metadata key       | value                                              |
//! |--------------------|----------------------------------------------------|
//! | `x-amz-meta-mode`  | the whole `st_mode` in decimal (type and permission bits) |
//! | `x-amz-meta-uid`   | decimal uid                                        |
//! | `x-amz-meta-gid`   | decimal gid                                        |
//! | `x-amz-meta-mtime` | seconds since the epoch, optionally `.nanoseconds` |
//! | `x-amz-meta-ctime` | the same, for the last change of content or attributes |
//! | `x-amz-meta-atime` | the same, for the access time a program set (`touch -a`) |
//! | `x-amz-meta-rdev`  | decimal device number of a block or character device |
//!
//! A key that is missing (or unreadable) means "not set": the mount's defaults apply
//! (mode and owner from the mount options, mtime from the object's Last-Modified, ctime
//! and atime from the mtime, rdev 0). s3fs writes whole seconds; the fraction is ours,
//! so that changes within one second show (s3fs reads the whole seconds before the dot).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bucketfs_client::store::Metadata;

const MODE: &str = "mode";
const UID: &str = "uid";
const GID: &str = "gid";
const MTIME: &str = "mtime";
const CTIME: &str = "ctime";
const ATIME: &str = "atime";
const RDEV: &str = "rdev";

/// The attributes an object's metadata sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoredAttrs {
    /// Full `st_mode` (file type bits included, as s3fs writes it).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mtime: Option<SystemTime>,
    pub ctime: Option<SystemTime>,
    pub atime: Option<SystemTime>,
    /// Device number of a block or character device (`st_rdev`).
    pub rdev: Option<u32>,
}

impl StoredAttrs {
    pub fn from_metadata(metadata: &Metadata) -> Self {
        let number = |name: &str| metadata.user.get(name).and_then(|v| v.trim().parse::<u32>().ok());
        let time = |name: &str| metadata.user.get(name).and_then(|v| parse_time(v));
        Self {
            mode: number(MODE),
            uid: number(UID),
            gid: number(GID),
            mtime: time(MTIME),
            ctime: time(CTIME),
            atime: time(ATIME),
            rdev: number(RDEV),
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
        for (name, time) in [(MTIME, self.mtime), (CTIME, self.ctime), (ATIME, self.atime)] {
            if let Some(time) = time {
                user.insert(name.into(), format_time(time));
            }
        }
        if let Some(rdev) = self.rdev {
            user.insert(RDEV.into(), rdev.to_string());
        }
    }

    /// Forgets the stored content times (mtime and ctime): new content is being written,
    /// and its commit stamps the time of the last write (see [`StoredAttrs::stamp_content_times`]).
    pub fn forget_content_times(metadata: &mut Metadata) {
        metadata.user.remove(MTIME);
        metadata.user.remove(CTIME);
    }

    /// Stores `time` as mtime and ctime where they are not set: the time of new content,
    /// unless a program set the mtime (`tar`, `touch -d`) or changed attributes (ctime)
    /// after its last write.
    pub fn stamp_content_times(metadata: &mut Metadata, time: SystemTime) {
        for name in [MTIME, CTIME] {
            metadata.user.entry(name.into()).or_insert_with(|| format_time(time));
        }
    }

    /// Whether `metadata` sets an mtime or ctime (set since the content was last written).
    pub fn has_content_times(metadata: &Metadata) -> bool {
        metadata.user.contains_key(MTIME) || metadata.user.contains_key(CTIME)
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
        assert_eq!(attrs.atime, Some(UNIX_EPOCH + Duration::from_secs(1)));
        assert_eq!(attrs.ctime, None);
    }

    #[test]
    fn reads_an_s3fs_device_node() {
        // As s3fs stores `mknod c 1 3` (S_IFCHR | 0644, rdev makedev(1, 3)) and a FIFO.
        let mut metadata = Metadata::default();
        for (k, v) in [("mode", "8612"), ("rdev", "259"), ("ctime", "1700000000")] {
            metadata.user.insert(k.into(), v.into());
        }
        let attrs = StoredAttrs::from_metadata(&metadata);
        assert_eq!(attrs.mode, Some(libc::S_IFCHR | 0o644));
        assert_eq!(attrs.rdev, Some(259));
        assert_eq!(attrs.ctime, Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
    }

    #[test]
    fn content_times_are_stamped_only_where_not_set() {
        let mut metadata = Metadata::default();
        let set = UNIX_EPOCH + Duration::from_secs(1000);
        StoredAttrs { mtime: Some(set), ..StoredAttrs::default() }.apply_to(&mut metadata);
        let now = UNIX_EPOCH + Duration::new(2000, 5);
        StoredAttrs::stamp_content_times(&mut metadata, now);
        let attrs = StoredAttrs::from_metadata(&metadata);
        assert_eq!((attrs.mtime, attrs.ctime), (Some(set), Some(now)));
        StoredAttrs::forget_content_times(&mut metadata);
        assert!(!StoredAttrs::has_content_times(&metadata));
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
            ctime in proptest::option::of((0u64..1 << 40, 0u32..1_000_000_000)),
            atime in proptest::option::of((0u64..1 << 40, 0u32..1_000_000_000)),
            rdev in proptest::option::of(any::<u32>()),
            other in "[a-z]{1,8}",
        ) {
            let time = |t: Option<(u64, u32)>| t.map(|(s, n)| UNIX_EPOCH + Duration::new(s, n));
            let attrs = StoredAttrs { mode, uid, gid, mtime: time(mtime), ctime: time(ctime), atime: time(atime), rdev };
            let mut metadata = Metadata::default();
            metadata.user.insert(format!("x{other}"), "kept".into());
            attrs.apply_to(&mut metadata);
            prop_assert_eq!(StoredAttrs::from_metadata(&metadata), attrs);
            prop_assert_eq!(metadata.user.get(&format!("x{other}")).map(String::as_str), Some("kept"));
        }
    }
}
