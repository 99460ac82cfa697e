//! What the namespace can fail with. `fs::error` turns it into an `FsError` (and so an
//! errno); the namespace itself knows nothing of `fs`.

use bucketfs_client::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// No such inode, or no such name in a directory. (A store's NOTFOUND that is not an
    /// answer about a name stays `Store(NotFound)`.)
    #[error("no such file or directory")]
    NotFound,
    /// A file where a directory is needed.
    #[error("not a directory")]
    NotDir,
    /// A name to create that exists.
    #[error("file exists")]
    Exists,
    /// A name longer than a component may be, or whose key would be too long.
    #[error("name too long")]
    NameTooLong,
    /// A name to create that no file can have: empty, `.`, `..`, or holding NUL.
    #[error("invalid argument: file name")]
    InvalidName,
    /// A change in a directory that only shows what is there: the root of a multiplexed
    /// mount (it holds the sources), or the view of versions (`.versions`).
    #[error("read-only file system")]
    ReadOnlyView,
    #[error(transparent)]
    Store(#[from] StoreError),
}
