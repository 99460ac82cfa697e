//! What one store has learnt about its server from its answers: whether it is MinIO
//! (which lists objects' metadata when asked, see `listing_metadata`), and whether it
//! does two things bucketfs relies on that not every S3 implementation does (see
//! docs/STORES.md): honour `x-amz-copy-source-if-match` on copies (moto ignores it) and
//! keep the user metadata of directory markers (SeaweedFS drops it). Each is learnt from
//! the first request that needs it, not assumed, and said once in the log when missing.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Whether the server does something: not known until a request has shown it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    Unknown,
    Works,
    Missing,
}

/// One [`Support`] learnt at run time, shared by the requests of a store.
#[derive(Debug, Default)]
struct Learnt(AtomicU8);

impl Learnt {
    fn get(&self) -> Support {
        match self.0.load(Ordering::Relaxed) {
            1 => Support::Works,
            2 => Support::Missing,
            _ => Support::Unknown,
        }
    }

    /// Records what a request showed; true the first time it showed the feature missing
    /// (so that exactly one caller says it).
    fn learn(&self, works: bool) -> bool {
        let value = if works { 1 } else { 2 };
        let before = self.0.swap(value, Ordering::Relaxed);
        !works && before != 2
    }
}

/// What one store has learnt about its server.
#[derive(Debug)]
pub struct ServerKind {
    /// Asking for listings with metadata is allowed at all (`--no-listing-metadata` turns
    /// it off).
    allowed: bool,
    /// An answer came from MinIO (its `Server` header).
    minio: AtomicBool,
    copy_conditions: Learnt,
    marker_metadata: Learnt,
}

impl ServerKind {
    pub fn new(allowed: bool) -> Self {
        Self {
            allowed,
            minio: AtomicBool::new(false),
            copy_conditions: Learnt::default(),
            marker_metadata: Learnt::default(),
        }
    }

    /// Whether the next listing should ask for metadata.
    pub fn lists_metadata(&self) -> bool {
        self.allowed && self.minio.load(Ordering::Relaxed)
    }

    /// An answer said it came from MinIO (the mount's first LIST does, at mount).
    pub fn note_minio(&self) {
        self.minio.store(true, Ordering::Relaxed);
    }

    /// Whether a copy's `x-amz-copy-source-if-match` is honoured (a copy of another
    /// version fails with 412). MinIO does.
    pub fn copy_conditions(&self) -> Support {
        self.known_to_minio(&self.copy_conditions)
    }

    /// A copy showed whether the store honours its conditions; true the first time it
    /// showed that it does not.
    pub fn learnt_copy_conditions(&self, honoured: bool) -> bool {
        self.copy_conditions.learn(honoured)
    }

    /// Whether a directory marker (`dir/`) keeps the user metadata it was written with.
    /// MinIO does.
    pub fn marker_metadata(&self) -> Support {
        self.known_to_minio(&self.marker_metadata)
    }

    /// A marker written and read back showed whether its metadata was kept; true the
    /// first time it was not.
    pub fn learnt_marker_metadata(&self, kept: bool) -> bool {
        self.marker_metadata.learn(kept)
    }

    fn known_to_minio(&self, learnt: &Learnt) -> Support {
        match learnt.get() {
            Support::Unknown if self.minio.load(Ordering::Relaxed) => Support::Works,
            support => support,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_feature_is_said_once_and_minio_has_both() {
        let server = ServerKind::new(true);
        assert_eq!(server.copy_conditions(), Support::Unknown);
        assert!(server.learnt_copy_conditions(false), "the first time it is missing");
        assert!(!server.learnt_copy_conditions(false), "said once");
        assert_eq!(server.copy_conditions(), Support::Missing);
        assert!(!server.learnt_marker_metadata(true));
        assert_eq!(server.marker_metadata(), Support::Works);

        let minio = ServerKind::new(false);
        assert_eq!(minio.marker_metadata(), Support::Unknown);
        minio.note_minio();
        assert_eq!((minio.copy_conditions(), minio.marker_metadata()), (Support::Works, Support::Works));
        assert!(!minio.lists_metadata(), "--no-listing-metadata");
    }
}
