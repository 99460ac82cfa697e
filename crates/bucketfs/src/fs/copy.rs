//! `copy_file_range()` between two files of the mount. A whole object copied into a file
//! open for writing that holds nothing yet (a new file, or one opened with `O_TRUNC`) is
//! copied inside the store (CopyObject), so `cp`, Go's `io.Copy` between files and
//! Java's `Files.copy` inside a mount move no bytes through this machine. Any other copy
//! (a part of a file, into a file already written to, from a file being written, across
//! sources) is the kernel's: answered `EOPNOTSUPP`, which the kernel takes as "copy it
//! yourself" for that call, reading and writing through the daemon as for any program.

use super::attrs::StoredAttrs;
use super::error::FsError;
use super::handles::Reader;
use super::Fs;
use crate::namespace::Location;
use crate::write::Output;

impl Fs {
    /// Copies `len` bytes at `from_offset` of open file `from` to `to_offset` of open
    /// file `to`; returns the bytes copied.
    pub async fn copy_file_range(
        &self,
        from: u64,
        from_offset: u64,
        to: u64,
        to_offset: u64,
        len: u64,
    ) -> Result<u64, FsError> {
        let kernels = FsError::CopiedByTheKernel;
        let Some((from_ino, Reader::Object(reader))) = self.files.lock().get(&from).cloned() else {
            return Err(kernels);
        };
        let Some(writer) = self.writers.lock().get(&to).cloned() else { return Err(kernels) };
        let Output::Streamed(upload) = &writer.output else { return Err(kernels) };
        let (key, etag) = reader.object();
        let size = reader.size();
        // The reply counts bytes in 32 bits: a larger object goes the kernel's way.
        let whole = from_offset == 0 && to_offset == 0 && len >= size && size > 0 && size <= u64::from(u32::MAX);
        let (Some(etag), false, true) = (etag, reader.reads_an_older_version(), whole) else { return Err(kernels) };
        if self.source_of(from_ino) != self.source_of(writer.ino) || self.source_of(from_ino).is_none() {
            return Err(kernels);
        }
        // The copy is the file's content change: its times are the copy's (stored with
        // it, with nanoseconds, as a commit stores those of the last write), not times set
        // while the file was open.
        self.content_changed(&writer).await;
        self.namespace.set_pending_size(writer.ino, size);
        if let Ok(node) = self.namespace.node(writer.ino) {
            upload.update_metadata_if_free(|m| StoredAttrs::stamp_content_times(m, node.mtime)).await;
        }
        if !upload.store_copy_of(&key, &etag, size).await? {
            return Err(kernels);
        }
        tracing::debug!(from = &*key, to = upload.key(), size, "copied inside the store");
        Ok(size)
    }

    /// The source holding file `ino`.
    fn source_of(&self, ino: u64) -> Option<usize> {
        match self.namespace.node(ino).ok()?.location {
            Location::File { source, .. } => Some(source),
            _ => None,
        }
    }
}
