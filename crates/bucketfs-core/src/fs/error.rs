//! The filesystem's error type and the one mapping from errors to errno.
//!
//! Each layer below `fs` has an error type of its own (`StoreError`, `NamespaceError`,
//! `WriteError`) and knows nothing of this one; the `From` impls here turn them into
//! `FsError`, so `?` works in `fs`. Every errno a program can see from bucketfs comes out
//! of [`FsError::errno`]; the table in `docs/SEMANTICS.md` lists them.

use fuser::Errno;

use crate::namespace::NamespaceError;
use crate::write::WriteError;
use bucketfs_client::store::StoreError;

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
    #[error("bad file handle (not open, or already released)")]
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
    /// The file is open with its reads passed through by the kernel to the data cache's
    /// copy, and the kernel lets no other kind of open of it in meanwhile.
    #[error("the file is open for reading from the data cache (FUSE passthrough)")]
    PassedThrough,
    #[error("crosses sources: {0}")]
    CrossDevice(&'static str),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("not supported yet: {0}")]
    Unsupported(&'static str),
    /// A write to a streamed upload that has stored its object: the file goes on in a
    /// staging file (see `Fs::write`); seen by a program only if that cannot be made.
    #[error("write after the file was committed by close or fsync")]
    Committed,
    /// A `copy_file_range` the store cannot make (not a whole object into an empty file):
    /// the kernel then copies the bytes itself, and the program never sees this.
    #[error("not a copy inside the store: the kernel copies the bytes")]
    CopiedByTheKernel,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<NamespaceError> for FsError {
    fn from(error: NamespaceError) -> Self {
        match error {
            NamespaceError::NotFound => FsError::NotFound,
            NamespaceError::NotDir => FsError::NotDir,
            NamespaceError::Exists => FsError::Exists,
            NamespaceError::NameTooLong => FsError::NameTooLong,
            NamespaceError::InvalidName => FsError::Invalid("file name"),
            NamespaceError::ReadOnlyView => FsError::ReadOnly,
            NamespaceError::Store(store) => FsError::Store(store),
        }
    }
}

impl From<WriteError> for FsError {
    fn from(error: WriteError) -> Self {
        match error {
            WriteError::NoSpace => FsError::NoSpace,
            WriteError::Local(detail) => FsError::Local(detail),
            WriteError::Store(store) => FsError::Store(store),
        }
    }
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
            FsError::PassedThrough => Errno::ETXTBSY,
            FsError::NoSpace => Errno::ENOSPC,
            FsError::NoAttribute => Errno::ENODATA,
            FsError::XattrUnsupported(_) => Errno::EOPNOTSUPP,
            FsError::Local(_) => Errno::EIO,
            FsError::CrossDevice(_) => Errno::EXDEV,
            FsError::Invalid(_) => Errno::EINVAL,
            FsError::Unsupported(_) => Errno::EOPNOTSUPP,
            FsError::Committed => Errno::EINVAL,
            FsError::CopiedByTheKernel => Errno::EOPNOTSUPP,
            FsError::Store(store) => match store {
                StoreError::NotFound | StoreError::NoSuchBucket(_) => Errno::ENOENT,
                StoreError::AccessDenied(_) | StoreError::BadCredentials(_) | StoreError::NoCredentials(_) => {
                    Errno::EACCES
                }
                StoreError::Timeout(_) => Errno::ETIMEDOUT,
                // The object changed under an open handle: the read fails rather than mix
                // two versions of the object. NFS and mountpoint-s3 say so with ESTALE.
                StoreError::Changed => Errno::ESTALE,
                StoreError::AlreadyExists => Errno::EEXIST,
                StoreError::UploadGone => Errno::ECANCELED,
                StoreError::TooLarge => Errno::EFBIG,
                StoreError::KeyTooLong => Errno::ENAMETOOLONG,
                StoreError::Unreachable { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Throttled { .. }
                | StoreError::Interrupted(_)
                | StoreError::Other { .. } => Errno::EIO,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One example of every error, with the name docs/SEMANTICS.md gives it. The match in
    /// `name` is exhaustive: a new variant does not compile until it is named here, and
    /// then the test asks for its row in the table.
    fn examples() -> Vec<FsError> {
        let store = [
            StoreError::NotFound,
            StoreError::NoSuchBucket("b".into()),
            StoreError::AccessDenied(None),
            StoreError::BadCredentials("ExpiredToken".into()),
            StoreError::NoCredentials("none found".into()),
            StoreError::Changed,
            StoreError::AlreadyExists,
            StoreError::Unreachable { endpoint: "e".into(), detail: "d".into() },
            StoreError::Timeout("e".into()),
            StoreError::Unavailable { message: "InternalError".into(), request_id: None },
            StoreError::Throttled { message: "SlowDown".into(), request_id: None },
            StoreError::Interrupted("reset".into()),
            StoreError::UploadGone,
            StoreError::TooLarge,
            StoreError::KeyTooLong,
            StoreError::Other { message: "m".into(), request_id: None },
        ];
        let mut all = vec![
            FsError::NotFound,
            FsError::NotDir,
            FsError::IsDir,
            FsError::ReadOnly,
            FsError::BadHandle,
            FsError::NameTooLong,
            FsError::Exists,
            FsError::NotPermitted,
            FsError::NotEmpty,
            FsError::NoAttribute,
            FsError::XattrUnsupported("x"),
            FsError::NoSpace,
            FsError::Local("l".into()),
            FsError::Busy("b"),
            FsError::PassedThrough,
            FsError::CrossDevice("c"),
            FsError::Invalid("i"),
            FsError::Unsupported("u"),
            FsError::Committed,
            FsError::CopiedByTheKernel,
        ];
        all.extend(store.into_iter().map(FsError::Store));
        all
    }

    fn name(error: &FsError) -> String {
        match error {
            FsError::NotFound => "NotFound".into(),
            FsError::NotDir => "NotDir".into(),
            FsError::IsDir => "IsDir".into(),
            FsError::ReadOnly => "ReadOnly".into(),
            FsError::BadHandle => "BadHandle".into(),
            FsError::NameTooLong => "NameTooLong".into(),
            FsError::Exists => "Exists".into(),
            FsError::NotPermitted => "NotPermitted".into(),
            FsError::NotEmpty => "NotEmpty".into(),
            FsError::NoAttribute => "NoAttribute".into(),
            FsError::XattrUnsupported(_) => "XattrUnsupported".into(),
            FsError::NoSpace => "NoSpace".into(),
            FsError::Local(_) => "Local".into(),
            FsError::Busy(_) => "Busy".into(),
            FsError::PassedThrough => "PassedThrough".into(),
            FsError::CrossDevice(_) => "CrossDevice".into(),
            FsError::Invalid(_) => "Invalid".into(),
            FsError::Unsupported(_) => "Unsupported".into(),
            FsError::Committed => "Committed".into(),
            FsError::CopiedByTheKernel => "CopiedByTheKernel".into(),
            FsError::Store(inner) => format!("Store({})", inner.kind()),
        }
    }

    fn errno_named(name: &str) -> Option<i32> {
        Some(match name {
            "ENOENT" => libc::ENOENT,
            "ENOTDIR" => libc::ENOTDIR,
            "EISDIR" => libc::EISDIR,
            "EROFS" => libc::EROFS,
            "EBADF" => libc::EBADF,
            "ENAMETOOLONG" => libc::ENAMETOOLONG,
            "EEXIST" => libc::EEXIST,
            "EPERM" => libc::EPERM,
            "ENOTEMPTY" => libc::ENOTEMPTY,
            "ENODATA" => libc::ENODATA,
            "EOPNOTSUPP" => libc::EOPNOTSUPP,
            "ENOSPC" => libc::ENOSPC,
            "EIO" => libc::EIO,
            "EBUSY" => libc::EBUSY,
            "ETXTBSY" => libc::ETXTBSY,
            "EXDEV" => libc::EXDEV,
            "EINVAL" => libc::EINVAL,
            "EACCES" => libc::EACCES,
            "ESTALE" => libc::ESTALE,
            "ETIMEDOUT" => libc::ETIMEDOUT,
            "ECANCELED" => libc::ECANCELED,
            "EFBIG" => libc::EFBIG,
            _ => return None,
        })
    }

    /// Each error of a lower layer becomes the `FsError` that layer built itself before it
    /// had its own type, so programs see the same errno, and `fs` still finds `NotFound`
    /// (a negative entry, a file unlinked while open) where it looks for it.
    #[test]
    fn layer_errors_become_the_fs_errors_they_were() {
        let cases: Vec<(FsError, &str)> = vec![
            (NamespaceError::NotFound.into(), "NotFound"),
            (NamespaceError::NotDir.into(), "NotDir"),
            (NamespaceError::Exists.into(), "Exists"),
            (NamespaceError::NameTooLong.into(), "NameTooLong"),
            (NamespaceError::InvalidName.into(), "Invalid"),
            (NamespaceError::ReadOnlyView.into(), "ReadOnly"),
            (NamespaceError::Store(StoreError::NotFound).into(), "Store(NotFound)"),
            (WriteError::NoSpace.into(), "NoSpace"),
            (WriteError::Local("l".into()).into(), "Local"),
            (WriteError::Store(StoreError::AlreadyExists).into(), "Store(AlreadyExists)"),
        ];
        for (error, expected) in cases {
            assert_eq!(name(&error), expected, "{error:?}");
        }
    }

    /// docs/SEMANTICS.md's "Errors" table says what `FsError::errno` returns, row for row.
    #[test]
    fn semantics_errors_table_matches_the_code() {
        let doc = include_str!("../../../../docs/SEMANTICS.md");
        let table = doc.split("\n## Errors\n").nth(1).expect("SEMANTICS.md has an Errors section");
        let rows: std::collections::HashMap<String, String> = table
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let errno = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((name.to_owned(), errno.to_owned()))
            })
            .collect();
        let examples = examples();
        assert_eq!(rows.len(), examples.len(), "one row per error: {rows:?}");
        for error in examples {
            let name = name(&error);
            let documented =
                rows.get(&name).unwrap_or_else(|| panic!("no row for {name} in SEMANTICS.md's Errors table"));
            let code = errno_named(documented).unwrap_or_else(|| panic!("unknown errno {documented} for {name}"));
            assert_eq!(error.errno().code(), code, "{name}: SEMANTICS.md says {documented}");
        }
    }
}
