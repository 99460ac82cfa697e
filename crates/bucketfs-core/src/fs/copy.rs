//! `copy_file_range()` between two files of the mount, made inside the store where the
//! store can: so `cp`, Go's `io.Copy` between files and Java's `Files.copy` inside a
//! mount move no bytes through this machine.
//!
//! * A whole object into a write-only file that holds nothing yet (new, or opened with
//!   `O_TRUNC`): one CopyObject, in parts above `write::COPY_PART` (`Upload::store_copy_of`).
//! * A range of at least 5 MiB appended where such a file's next part starts (everything
//!   written before was sent as parts): parts copied inside the store (UploadPartCopy,
//!   `Upload::append_copy_of`): the calls `cp` makes for objects over 4 GiB.
//! * From offset 0 into an empty file open for reading too (Go's `os.Create`): the whole
//!   object is copied, and the staging file shows as much of it as was asked for, then
//!   the next ranges as they are asked for (`Staged::store_copy_of`, `show_more_of_copy`;
//!   Go asks for 2 GiB − 4 KiB a call).
//!
//! Any other copy (a small or unaligned range, into a file with bytes still buffered, from
//! a file being written, across sources) is the kernel's: answered `EOPNOTSUPP`, which
//! the kernel takes as "copy it yourself" for that call, reading and writing through the
//! daemon as for any program.

use super::attrs::StoredAttrs;
use super::error::FsError;
use super::handles::Reader;
use super::Fs;
use crate::namespace::Location;
use crate::write::Output;

/// The most one reply can count: FUSE says how much was copied in 32 bits. Larger copies
/// go on in the next call (`cp` asks again from where this one ended).
const MOST_PER_CALL: u64 = (u32::MAX as u64) & !4095;

/// A first call from offset 0 asking for at least this much of a larger object is taken
/// as the first of the rounds of a whole copy (Go asks for 2 GiB − 4 KiB a call), and the
/// whole object is copied at once: a smaller part (a header) is not worth copying all.
const FIRST_OF_MANY_ROUNDS: u64 = 1 << 30;

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
        let Some((from_ino, Reader::Object(reader))) = self.handles.files.lock().get(&from).cloned() else {
            return Err(kernels);
        };
        let Ok(writer) = self.writer_to_change(to).await else { return Err(kernels) };
        let (key, etag) = reader.object();
        let Some(etag) = etag.filter(|_| !reader.reads_an_older_version()) else { return Err(kernels) };
        let size = reader.size();
        let same_source = self.source_of(from_ino);
        if same_source.is_none() || same_source != self.source_of(writer.ino) || from_offset >= size {
            return Err(kernels);
        }
        // The copy is the file's content change: its times are the copy's (stored with
        // it, with nanoseconds, as a commit stores those of the last write), not times set
        // while the file was open.
        self.content_changed(&writer).await;
        let len = len.min(size - from_offset).min(MOST_PER_CALL);
        let at_start = from_offset == 0 && to_offset == 0;
        let now = std::time::SystemTime::now();
        let stamp = |m: &mut _| StoredAttrs::stamp_content_times(m, now);
        let copied = match &writer.output {
            Output::Streamed(upload) if at_start && len == size => {
                upload.store_copy_of(&key, &etag, size, stamp).await?
            }
            Output::Streamed(upload) => upload.append_copy_of(&key, &etag, from_offset, to_offset, len).await?,
            Output::Staged(staged) if at_start && (len == size || len >= FIRST_OF_MANY_ROUNDS) => {
                staged.store_copy_of(&key, &etag, size, len, stamp).await?
            }
            Output::Staged(staged) if from_offset == to_offset => {
                staged.show_more_of_copy(&key, &etag, from_offset, len).await?
            }
            Output::Staged(_) => false,
        };
        if !copied {
            return Err(kernels);
        }
        tracing::debug!(from = &*key, to = writer.output.key(), from_offset, to_offset, len, "copied inside the store");
        self.namespace.set_pending_size(writer.ino, to_offset + len);
        Ok(len)
    }

    /// The source holding file `ino`.
    pub(super) fn source_of(&self, ino: u64) -> Option<usize> {
        match self.namespace.node(ino).ok()?.location {
            Location::File { source, .. } => Some(source),
            _ => None,
        }
    }
}
