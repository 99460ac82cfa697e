//! What writing a file can fail with. `fs::error` turns it into an `FsError` (and so an
//! errno); the write layer itself knows nothing of `fs`. A write an output does not take
//! is no error: it answers [`super::Written::Refused`], and the file moves on.

use bucketfs_client::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// `--staging-limit` is spent, or the staging disk is full.
    #[error("no space left for staging files")]
    NoSpace,
    /// A staging file (or a part buffer spilled to disk) could not be made, read or written.
    #[error("local file error: {0}")]
    Local(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}
