//! What writing a file can fail with. `fs::error` turns it into an `FsError` (and so an
//! errno); the write layer itself knows nothing of `fs`.

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A write to a streamed upload that has stored its object: the caller goes on in a
    /// staging file that starts as the stored object (see the module documentation).
    #[error("write after the file was committed by close or fsync")]
    Committed,
    /// A write before the end of what a streamed upload already sent as parts: a multipart
    /// upload cannot take those bytes back. The caller stores what was written and goes on
    /// in a staging file.
    #[error("a streamed upload cannot rewrite bytes it already sent")]
    RewriteOfSentBytes,
    /// A read of bytes a streamed upload already sent as parts, which S3 cannot give back
    /// before the upload completes. The caller stores what was written and goes on in a
    /// staging file, which reads back whole.
    #[error("a streamed upload cannot read back bytes it already sent")]
    ReadOfSentBytes,
    /// A write past the first part of an upload that sends no part (`--write-back`): the
    /// caller goes on in a staging file, uploaded after close.
    #[error("a file past one part is staged under --write-back")]
    PastOnePart,
    /// A write past the write-back limit to a file staged under `--write-back`: it could
    /// not wait in the log, so the caller streams it from here, as without the option.
    #[error("a file past the write-back limit is streamed")]
    TooLargeToStage,
    /// `--staging-limit` is spent, or the staging disk is full.
    #[error("no space left for staging files")]
    NoSpace,
    /// A staging file (or a part buffer spilled to disk) could not be made, read or written.
    #[error("local file error: {0}")]
    Local(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}
