//! The filesystem's error type and the one mapping from errors to errno.
//!
//! Every errno a program can see from bucketfs comes out of [`FsError::errno`]; the
//! table in `docs/SEMANTICS.md` lists them.

use fuser::Errno;

use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("read-only file system")]
    ReadOnly,
    #[error("stale file handle")]
    BadHandle,
    #[error("name too long")]
    NameTooLong,
    #[error("file exists")]
    Exists,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no such extended attribute")]
    NoAttribute,
    #[error("extended attribute not supported: {0}")]
    XattrUnsupported(&'static str),
    #[error("no space left for staging files")]
    NoSpace,
    #[error("local file error: {0}")]
    Local(String),
    #[error("busy: {0}")]
    Busy(&'static str),
    #[error("crosses sources: {0}")]
    CrossDevice(&'static str),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("not supported yet: {0}")]
    Unsupported(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FsError {
    pub fn errno(&self) -> Errno {
        match self {
            FsError::NotFound => Errno::ENOENT,
            FsError::NotDir => Errno::ENOTDIR,
            FsError::IsDir => Errno::EISDIR,
            FsError::ReadOnly => Errno::EROFS,
            FsError::BadHandle => Errno::EBADF,
            FsError::NameTooLong => Errno::ENAMETOOLONG,
            FsError::Exists => Errno::EEXIST,
            FsError::NotPermitted => Errno::EPERM,
            FsError::NotEmpty => Errno::ENOTEMPTY,
            FsError::Busy(_) => Errno::EBUSY,
            FsError::NoSpace => Errno::ENOSPC,
            FsError::NoAttribute => Errno::ENODATA,
            FsError::XattrUnsupported(_) => Errno::EOPNOTSUPP,
            FsError::Local(_) => Errno::EIO,
            FsError::CrossDevice(_) => Errno::EXDEV,
            FsError::Invalid(_) => Errno::EINVAL,
            FsError::Unsupported(_) => Errno::EOPNOTSUPP,
            FsError::Store(store) => match store {
                StoreError::NotFound | StoreError::NoSuchBucket(_) => Errno::ENOENT,
                StoreError::AccessDenied(_) | StoreError::BadCredentials(_) => Errno::EACCES,
                StoreError::Timeout(_) => Errno::ETIMEDOUT,
                // The object changed under an open handle: the read fails rather than mix
                // two versions of the object.
                StoreError::Changed => Errno::EIO,
                StoreError::AlreadyExists => Errno::EEXIST,
                StoreError::Unreachable { .. } | StoreError::Other { .. } => Errno::EIO,
            },
        }
    }
}
