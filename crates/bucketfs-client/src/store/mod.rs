//! `store` is the only code that speaks S3.
//!
//! It exposes one trait, [`ObjectStore`], with the handful of calls the filesystem needs
//! (list one directory level, head, ranged get), and one implementation on top of
//! aws-sdk-s3 ([`s3::S3Store`]). Everything the SDK can fail with is folded here into
//! [`StoreError`], a small enum the upper layers can reason about (not found, changed
//! under us, denied, unreachable…); `fs::error` turns it into an errno in one place.
//!
//! The store knows nothing about inodes or file names: keys in, bytes and listings out.

mod body;
pub mod buffer_pool;
mod direct;
pub mod endpoints;
mod etag;
mod listing_metadata;
#[cfg(any(test, feature = "memory-store"))]
pub mod memory;
pub mod request_options;
pub mod request_window;
pub mod s3;
mod server_kind;

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;

pub use body::{BodySink, RangeBody};

/// A multipart upload open in the store, and when it was started (by the store's clock,
/// where it says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenUpload {
    pub id: String,
    pub initiated: Option<SystemTime>,
}

/// Metadata of one object, as returned by LIST or HEAD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub mtime: SystemTime,
    /// Entity tag, quotes included, exactly as the server sent it.
    pub etag: Option<String>,
    /// What HEAD returns beyond LIST; `None` when the info came from a listing that did
    /// not carry it (see `listing_metadata`).
    pub metadata: Option<Arc<Metadata>>,
}

/// An object's user metadata (`x-amz-meta-NAME`, stored under `NAME` in lower case),
/// content type and the other standard headers of [`KEPT_HEADERS`]: what is kept when
/// bucketfs rewrites an object's metadata (`chmod`, `touch`, a rename's copy), since a
/// bucket that also serves a website or a CDN depends on them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Metadata {
    pub user: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// Headers of [`KEPT_HEADERS`] the object has, by lower-case name.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Read from a listing, which may leave some of [`KEPT_HEADERS`] out (MinIO lists no
    /// `Expires`): a rewrite asks the object's HEAD first.
    #[serde(default)]
    pub listed: bool,
    /// The object's tags as a query (`a=b&c=d`), where a write must set them itself: a
    /// copy in parts (a single CopyObject keeps the source's tags without being told).
    /// Set for that request only, never kept.
    #[serde(skip)]
    pub tagging: Option<String>,
}

/// Standard headers stored with an object that a rewrite of its metadata keeps, by
/// lower-case name (`Content-Type` is [`Metadata::content_type`]).
pub const KEPT_HEADERS: [&str; 5] =
    ["cache-control", "content-disposition", "content-encoding", "content-language", "expires"];

impl Metadata {
    /// The value of header `name` (one of [`KEPT_HEADERS`]), if the object has it.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).cloned()
    }
}

/// Gives equal [`Metadata`] one shared copy: objects written by other tools mostly carry
/// nothing but a content type, and every listed entry kept (a page of a listing, the
/// kernel's inodes, the listing index) holds its metadata. Keeps at most
/// [`SharedMetadata::MOST`] values, so that entries that all differ cost no large table.
#[derive(Default)]
pub struct SharedMetadata {
    seen: HashSet<Arc<Metadata>>,
}

impl SharedMetadata {
    const MOST: usize = 4096;

    /// The copy of `metadata` kept already, else `metadata` itself (kept from now on
    /// while there is room).
    pub fn share(&mut self, metadata: Arc<Metadata>) -> Arc<Metadata> {
        if let Some(copy) = self.seen.get(&metadata) {
            return copy.clone();
        }
        if self.seen.len() < Self::MOST {
            self.seen.insert(metadata.clone());
        }
        metadata
    }
}

/// One version of an object, or a delete marker, as `ListObjectVersions` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionInfo {
    pub key: String,
    pub version_id: String,
    pub mtime: SystemTime,
    pub size: u64,
    pub etag: Option<String>,
    /// The current version (or delete marker) of the key.
    pub is_latest: bool,
    /// A delete marker: the key was deleted at `mtime`; there is no content.
    pub deleted: bool,
}

/// The most versions one [`ObjectStore::list_versions`] returns: what a `.versions`
/// view holds in memory at once.
pub const MAX_VERSIONS_LISTED: usize = 100_000;

/// The version of a key that an undelete makes current again: the newest that is not a
/// delete marker, if the current one is a delete marker. `versions` are the key's.
pub fn version_to_restore(versions: &[VersionInfo]) -> Result<&VersionInfo, StoreError> {
    if versions.iter().any(|v| v.is_latest && !v.deleted) {
        return Err(StoreError::AlreadyExists);
    }
    // Newest first as listed: on equal times (stores that keep whole seconds) the first
    // listed is the newer, so it wins the tie (`max_by_key` would keep the last).
    versions
        .iter()
        .filter(|v| !v.deleted)
        .reduce(|newest, v| if v.mtime > newest.mtime { v } else { newest })
        .ok_or(StoreError::NotFound)
}

/// One page of a delimited listing (`delimiter = "/"`).
#[derive(Clone, Debug, Default)]
pub struct ListPage {
    /// Objects directly under the prefix, in key order.
    pub objects: Vec<ObjectInfo>,
    /// Common prefixes ("sub-directories"), each ending in `/`, in key order.
    pub prefixes: Vec<String>,
    /// Continuation token for the next page; `None` on the last page.
    pub next_token: Option<String>,
}

/// Most keys one `DeleteObjects` request may name (S3's limit).
pub const MAX_DELETED_AT_ONCE: usize = 1000;

/// Why a store call failed, in the terms the filesystem cares about.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no such key")]
    NotFound,
    #[error("bucket \"{0}\" does not exist")]
    NoSuchBucket(String),
    #[error("access denied{}", request_suffix(.0))]
    AccessDenied(Option<String>),
    #[error("credentials rejected by the server ({0})")]
    BadCredentials(String),
    /// No credentials to sign with: none in the environment, the config files, SSO or
    /// instance metadata (or their configuration is wrong). Asking again does not help.
    #[error("no credentials: {0}")]
    NoCredentials(String),
    /// The object no longer has the ETag we pinned at open (If-Match failed).
    #[error("object changed since it was opened")]
    Changed,
    /// A create-only write (If-None-Match: *) found the key already taken.
    #[error("object already exists")]
    AlreadyExists,
    #[error("cannot reach {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    #[error("request timed out: {0}")]
    Timeout(String),
    /// The server answered 5xx (other than 503): it failed this time.
    #[error("server unavailable: {message}{}", request_suffix(.request_id))]
    Unavailable { message: String, request_id: Option<String> },
    /// The server asked us to slow down: HTTP 429 or 503, or a throttling code
    /// (`SlowDown`, `TooManyRequests`, `RequestLimitExceeded`…). `message` names the answer.
    #[error("the store is throttling requests: {message}{}", request_suffix(.request_id))]
    Throttled { message: String, request_id: Option<String> },
    /// The connection broke while a body was being received (reset, truncated).
    #[error("transfer interrupted: {0}")]
    Interrupted(String),
    /// The multipart upload is gone: aborted by another client or a lifecycle rule.
    #[error("the multipart upload was aborted by someone else (NoSuchUpload)")]
    UploadGone,
    /// The object would exceed what the store accepts (EntityTooLarge).
    #[error("object too large for the store (EntityTooLarge)")]
    TooLarge,
    /// The store refuses the key as too long: over 1024 bytes (S3's and MinIO's
    /// `KeyTooLongError`), or, on MinIO, with a path component over 255 bytes.
    #[error("key too long for the store")]
    KeyTooLong,
    #[error("S3 error: {message}{}", request_suffix(.request_id))]
    Other { message: String, request_id: Option<String> },
}

impl StoreError {
    /// The variant's name: a metrics label, and what docs/SEMANTICS.md's error table
    /// calls it (`Store(NotFound)`).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::NotFound => "NotFound",
            StoreError::NoSuchBucket(_) => "NoSuchBucket",
            StoreError::AccessDenied(_) => "AccessDenied",
            StoreError::BadCredentials(_) => "BadCredentials",
            StoreError::NoCredentials(_) => "NoCredentials",
            StoreError::Changed => "Changed",
            StoreError::AlreadyExists => "AlreadyExists",
            StoreError::Unreachable { .. } => "Unreachable",
            StoreError::Timeout(_) => "Timeout",
            StoreError::Unavailable { .. } => "Unavailable",
            StoreError::Throttled { .. } => "Throttled",
            StoreError::Interrupted(_) => "Interrupted",
            StoreError::UploadGone => "UploadGone",
            StoreError::TooLarge => "TooLarge",
            StoreError::KeyTooLong => "KeyTooLong",
            StoreError::Other { .. } => "Other",
        }
    }

    /// The connection failed, not the store: another of its endpoints may answer.
    pub fn is_connection_failure(&self) -> bool {
        matches!(self, StoreError::Unreachable { .. } | StoreError::Timeout(_) | StoreError::Interrupted(_))
    }

    /// Worth another try: the store may answer after a moment (a restarting server, a
    /// dropped connection, a 5xx, a request to slow down).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unreachable { .. }
                | StoreError::Timeout(_)
                | StoreError::Unavailable { .. }
                | StoreError::Throttled { .. }
                | StoreError::Interrupted(_)
        )
    }
}

fn request_suffix(request_id: &Option<String>) -> String {
    match request_id {
        Some(id) => format!(" (request id {id})"),
        None => String::new(),
    }
}

/// The calls the filesystem makes against one bucket.
///
/// Keys are full keys inside the bucket; a source's prefix is applied by the caller.
/// What a write asks of the object at its key, checked by the store at the moment it
/// writes, so that another client's write just before it is never overwritten unseen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WriteCondition {
    /// Whatever is there.
    #[default]
    Any,
    /// Only where there is no object (`If-None-Match: *`), else `AlreadyExists`.
    Absent,
    /// Only over this version (`If-Match: ETAG`), else `Changed`.
    Replaces(String),
}

impl WriteCondition {
    /// `Absent` where `create_only`, else `Any`.
    pub fn absent_if(create_only: bool) -> Self {
        if create_only {
            Self::Absent
        } else {
            Self::Any
        }
    }
}

#[async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// Which bucket of which service this is, e.g. `http://host:9000/bucket`.
    fn location(&self) -> String;

    /// How many requests may be in flight now and how much the store has throttled
    /// (see `request_window`); `None` for a store without a window.
    fn request_window(&self) -> Option<request_window::WindowReport> {
        None
    }

    /// The store's URLs and which are left out now, when it has several (see `endpoints`).
    fn endpoints(&self) -> Vec<endpoints::EndpointReport> {
        Vec::new()
    }

    /// One page of `ListObjectsV2(prefix, delimiter="/")`. With `with_metadata`, objects
    /// carry their metadata where the server can list it (MinIO; see `listing_metadata`),
    /// which costs the server more than a bare listing and far less than a HEAD each.
    async fn list(
        &self,
        prefix: &str,
        continuation: Option<String>,
        max_keys: Option<i32>,
        with_metadata: bool,
    ) -> Result<ListPage, StoreError>;

    /// One page of `ListObjectsV2(prefix)` without a delimiter: every key below `prefix`.
    async fn list_recursive(
        &self,
        prefix: &str,
        continuation: Option<String>,
        with_metadata: bool,
    ) -> Result<ListPage, StoreError>;

    /// One delimited page of `prefix`, from the first key after `start_after`, with each
    /// object's metadata: a HEAD of up to 1,000 objects at once. `Ok(None)` where the
    /// server lists no metadata (all but MinIO).
    async fn list_metadata_after(
        &self,
        _prefix: &str,
        _start_after: Option<&str>,
    ) -> Result<Option<ListPage>, StoreError> {
        Ok(None)
    }

    /// `HeadObject(key)`; `Err(NotFound)` when there is no such object.
    async fn head(&self, key: &str) -> Result<ObjectInfo, StoreError>;

    /// What [`ObjectStore::head`] says, from a `GetObject` of the first `limit` bytes
    /// (`limit > 0`), which also returns those bytes: the whole object if it is no
    /// larger. For small objects this costs what a HEAD costs.
    async fn head_with_body(&self, key: &str, limit: u64) -> Result<(ObjectInfo, Bytes), StoreError>;

    /// The bytes `range` of `key`. With `if_match`, fails with `Changed` instead of
    /// returning bytes of another version of the object.
    async fn get_range(&self, key: &str, range: Range<u64>, if_match: Option<&str>) -> Result<Bytes, StoreError> {
        let body = RangeBody::new(range.end - range.start, if_match);
        body.finish(self.get_range_into(key, range.start, &body, body.len()).await);
        body.slice(0..body.len()).await
    }

    /// Fetches the bytes of `body`, which holds `key` from `origin` on, from what it has
    /// received up to `until` (an offset in the body), appending them as they arrive,
    /// from the version `body.etag()` (`Changed` if the object is no longer that version;
    /// with no ETag, the first answer's version is pinned). The caller calls
    /// [`RangeBody::finish`] once the body is whole. A sink that stops taking bytes
    /// ([`BodySink::append`] returns `false`) ends the GET with an error. A paced body
    /// is filled as its reader allows; an abandoned one may be left short, with `Ok`.
    async fn get_range_into(&self, key: &str, origin: u64, body: &dyn BodySink, until: u64) -> Result<(), StoreError>;

    /// `PutObject`, where `condition` holds at the moment of the write. Returns the new
    /// ETag.
    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: &Metadata,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError>;

    /// `CreateMultipartUpload`; returns the upload id.
    async fn start_upload(&self, key: &str, metadata: &Metadata) -> Result<String, StoreError>;

    /// The tags of `key` as a query (`a=b&c=d`, see [`Metadata::tagging`]); `None` where
    /// it has none, or the store keeps none.
    async fn tagging(&self, _key: &str) -> Result<Option<String>, StoreError> {
        Ok(None)
    }

    /// `CopyObject` (server side, up to 5 GiB) of `source` to `key` with `metadata` in
    /// place of the source's; `source` may be `key` itself. With `if_match`, fails with
    /// `Changed` if the source is no longer that version. Returns the new ETag.
    async fn copy(
        &self,
        source: &str,
        key: &str,
        if_match: Option<&str>,
        metadata: &Metadata,
    ) -> Result<Option<String>, StoreError>;

    /// `UploadPartCopy`: bytes `range` of `source` (at version `if_match`) become part
    /// `number` of the upload. Returns the part's ETag.
    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        source: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<String, StoreError>;

    /// `UploadPart` (numbers start at 1); returns the part's ETag.
    async fn upload_part(&self, key: &str, upload_id: &str, number: i32, data: Bytes) -> Result<String, StoreError>;

    /// `CompleteMultipartUpload` with `(number, etag)` parts in order, where `condition`
    /// holds at the moment of the write; returns the ETag.
    async fn finish_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, String)>,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError>;

    /// `AbortMultipartUpload`: frees the parts so no unfinished upload is left behind.
    async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), StoreError>;

    /// The multipart uploads open for `key` itself (`ListMultipartUploads`, first page).
    async fn open_uploads_of(&self, key: &str) -> Result<Vec<OpenUpload>, StoreError>;

    /// `DeleteObject` (succeeds when the key does not exist).
    async fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// `DeleteObject` with `If-Match`: deletes `key` only while it is version `etag`,
    /// else `Changed` (succeeds when the key does not exist). A store that ignores the
    /// condition deletes whatever is there; the caller checks the version first.
    async fn delete_if_match(&self, key: &str, etag: &str) -> Result<(), StoreError>;

    /// Deletes up to [`MAX_DELETED_AT_ONCE`] keys in one request (`DeleteObjects`); returns
    /// the keys the store refused, each with its answer. `Err` when the request itself
    /// failed (then no key may be taken as deleted). Here: one `delete` after the other.
    async fn delete_many(&self, keys: &[String]) -> Result<Vec<(String, StoreError)>, StoreError> {
        let mut refused = Vec::new();
        for key in keys {
            match self.delete(key).await {
                Ok(()) => {}
                Err(error) if error.is_transient() => return Err(error),
                Err(error) => refused.push((key.clone(), error)),
            }
        }
        Ok(refused)
    }

    /// The versions and delete markers of the keys directly under `prefix` (delimiter
    /// `/`), in key order and newest first for each key; with `exact`, of the key
    /// `prefix` alone. At most [`MAX_VERSIONS_LISTED`] (the oldest keys' first).
    async fn list_versions(&self, prefix: &str, exact: bool) -> Result<Vec<VersionInfo>, StoreError> {
        let _ = (prefix, exact);
        Err(no_versions())
    }

    /// On a versioned bucket, makes the newest version of `key` that is not a delete
    /// marker current again (an undelete; see [`version_to_restore`]): `NotFound` if
    /// there is none, `AlreadyExists` if the current version is not a delete marker.
    /// Returns what `key` is now.
    async fn restore_latest_version(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        let _ = key;
        Err(no_versions())
    }
}

fn no_versions() -> StoreError {
    StoreError::Other { message: "this store keeps no versions".into(), request_id: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn version(id: &str, second: u64, is_latest: bool, deleted: bool) -> VersionInfo {
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(second);
        VersionInfo { key: "k".into(), version_id: id.into(), mtime, size: 1, etag: None, is_latest, deleted }
    }

    #[test]
    fn the_newest_version_before_the_delete_is_restored() {
        let deleted = [version("m", 30, true, true), version("v2", 20, false, false), version("v1", 10, false, false)];
        assert_eq!(version_to_restore(&deleted).map(|v| v.version_id.as_str()).ok(), Some("v2"));
        let live = [version("v2", 20, true, false), version("v1", 10, false, false)];
        assert!(matches!(version_to_restore(&live), Err(StoreError::AlreadyExists)));
        assert!(matches!(version_to_restore(&[version("m", 30, true, true)]), Err(StoreError::NotFound)));
        assert!(matches!(version_to_restore(&[]), Err(StoreError::NotFound)));
    }

    #[test]
    fn of_versions_stored_in_one_second_the_first_listed_is_restored() {
        // SeaweedFS, moto and AWS S3 list whole seconds; listings put the newest first.
        let deleted = [version("m", 30, true, true), version("v2", 20, false, false), version("v1", 20, false, false)];
        assert_eq!(version_to_restore(&deleted).map(|v| v.version_id.as_str()).ok(), Some("v2"));
    }
}
