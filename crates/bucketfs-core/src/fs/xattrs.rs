//! Extended attributes: `user.NAME` is the object's user metadata `NAME`
//! (`x-amz-meta-NAME`), so metadata set by other S3 tools shows as xattrs and xattrs set
//! here are plain S3 metadata. Not every xattr fits: S3 metadata names are lower-case
//! header names and values are header text, and the names that hold modes, owners and
//! times (s3fs's format, see `attrs`) are not xattrs.

use super::error::FsError;
use bucketfs_client::store::Metadata;

const PREFIX: &str = "user.";
/// On the mount's root, outside `user.*` (so never object metadata): reading
/// `bucketfs.refresh` lists the indexed sources again and answers once the new index is
/// in use (`bucketfs refresh`; a read, so that it works on a read-only mount too), with
/// what reading `bucketfs.index` tells: each source's index size and age.
pub const INDEX_REFRESH: &str = "bucketfs.refresh";
pub const INDEX_STATUS: &str = "bucketfs.index";
/// Metadata names with another meaning (s3fs's attributes and its xattr blob).
const RESERVED: [&str; 7] = ["mode", "uid", "gid", "mtime", "atime", "ctime", "xattr"];

/// The metadata name behind xattr `name`, if it can be one.
pub fn metadata_key(name: &str) -> Option<&str> {
    let key = name.strip_prefix(PREFIX)?;
    let valid = !key.is_empty()
        && !RESERVED.contains(&key)
        && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    valid.then_some(key)
}

/// Like [`metadata_key`], with the reason why not for `setxattr`.
pub fn settable_key(name: &str) -> Result<&str, FsError> {
    if !name.starts_with(PREFIX) {
        return Err(FsError::XattrUnsupported("only user.* attributes are stored"));
    }
    metadata_key(name).ok_or(FsError::XattrUnsupported("user.* names must be lower-case letters, digits, - _ . (S3 metadata names), and not mode/uid/gid/mtime/atime/ctime/xattr"))
}

/// The value as metadata text: printable ASCII only (HTTP header values).
pub fn settable_value(value: &[u8]) -> Result<String, FsError> {
    match std::str::from_utf8(value) {
        Ok(text) if text.bytes().all(|b| (0x20..0x7f).contains(&b)) => Ok(text.to_owned()),
        _ => Err(FsError::XattrUnsupported("values must be printable ASCII (S3 metadata)")),
    }
}

/// The `listxattr` answer: NUL-terminated names.
pub fn list(metadata: &Metadata) -> Vec<u8> {
    let mut out = Vec::new();
    for key in metadata.user.keys().filter(|key| metadata_key(&format!("{PREFIX}{key}")).is_some()) {
        out.extend_from_slice(PREFIX.as_bytes());
        out.extend_from_slice(key.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_metadata_except_attributes() {
        assert_eq!(metadata_key("user.origin"), Some("origin"));
        assert_eq!(metadata_key("user.mode"), None);
        assert_eq!(metadata_key("user.Origin"), None);
        assert_eq!(metadata_key("security.selinux"), None);
        assert!(settable_value(b"caf\xc3\xa9").is_err());
        let mut metadata = Metadata::default();
        for (k, v) in [("origin", "camera"), ("mode", "33188"), ("a-b", "x")] {
            metadata.user.insert(k.into(), v.into());
        }
        assert_eq!(list(&metadata), b"user.a-b\0user.origin\0");
    }
}
