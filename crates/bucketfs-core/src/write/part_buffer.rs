//! The bytes of a streamed file's current part, not sent yet: in memory, or on disk.
//!
//! A part is sent only once it is full (S3 parts are at least 5 MiB), so every file being
//! written holds up to one part. When the memory budget is spent and no memory is on its
//! way back (no part in flight), the buffer **spills** to an unlinked file under the cache
//! directory instead of growing past `--memory-limit`: 100 files written at once with
//! 8 MiB parts would otherwise hold 800 MiB whatever the limit. The spilled bytes come back
//! to memory when the part is sent, which waits for memory like any other writer.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use super::staging::{local_error, temp_file, StagingConfig};
use super::WriteError;
use crate::memory::Reservation;

pub(super) enum PartBuffer {
    Memory(Vec<u8>),
    /// Bytes `[0, len)` of `file`; `_disk` counts them against `--staging-limit`.
    Disk {
        file: File,
        len: usize,
        _disk: Reservation,
    },
}

impl Default for PartBuffer {
    fn default() -> Self {
        PartBuffer::Memory(Vec::new())
    }
}

impl PartBuffer {
    pub fn len(&self) -> usize {
        match self {
            PartBuffer::Memory(bytes) => bytes.len(),
            PartBuffer::Disk { len, .. } => *len,
        }
    }

    pub fn is_spilled(&self) -> bool {
        matches!(self, PartBuffer::Disk { .. })
    }

    /// Room for `capacity` bytes in memory (the caller has reserved it).
    pub fn reserve_memory(&mut self, capacity: usize) {
        if let PartBuffer::Memory(bytes) = self {
            bytes.reserve_exact(capacity.saturating_sub(bytes.len()));
        }
    }

    /// Writes `data` at `position` (at most `len()`: holes are filled with
    /// [`PartBuffer::zero_fill_to`] first), overwriting and extending.
    pub fn write_at(&mut self, position: usize, data: &[u8]) -> Result<(), WriteError> {
        match self {
            PartBuffer::Memory(bytes) => {
                let overlap = bytes.len().min(position + data.len()) - position;
                bytes[position..position + overlap].copy_from_slice(&data[..overlap]);
                bytes.extend_from_slice(&data[overlap..]);
            }
            PartBuffer::Disk { file, len, .. } => {
                file.write_all_at(data, position as u64).map_err(local_error)?;
                *len = (*len).max(position + data.len());
            }
        }
        Ok(())
    }

    /// Extends the buffer with zeros to `end` (a hole the program skipped).
    pub fn zero_fill_to(&mut self, end: usize) -> Result<(), WriteError> {
        match self {
            PartBuffer::Memory(bytes) => bytes.resize(end.max(bytes.len()), 0),
            PartBuffer::Disk { file, len, .. } => {
                if end > *len {
                    // A sparse extension reads back as zeros.
                    file.set_len(end as u64).map_err(local_error)?;
                    *len = end;
                }
            }
        }
        Ok(())
    }

    /// A copy of bytes `range` (for a reader of the file being written).
    pub fn read(&self, range: Range<usize>) -> Result<Bytes, WriteError> {
        match self {
            PartBuffer::Memory(bytes) => Ok(Bytes::copy_from_slice(&bytes[range])),
            PartBuffer::Disk { file, .. } => {
                let mut out = vec![0; range.len()];
                file.read_exact_at(&mut out, range.start as u64).map_err(local_error)?;
                Ok(Bytes::from(out))
            }
        }
    }

    /// Takes out the first `len` bytes (a part to send); the rest stays, in memory.
    pub fn take_front(&mut self, len: usize) -> Result<Bytes, WriteError> {
        let mut bytes = match std::mem::take(self) {
            PartBuffer::Memory(bytes) => bytes,
            PartBuffer::Disk { file, len: spilled, .. } => {
                let mut bytes = vec![0; spilled];
                file.read_exact_at(&mut bytes, 0).map_err(local_error)?;
                bytes
            }
        };
        *self = PartBuffer::Memory(bytes.split_off(len.min(bytes.len())));
        Ok(Bytes::from(bytes))
    }

    /// Moves the bytes to an unlinked file under the staging directory, reserving
    /// `capacity` bytes of `--staging-limit`. `false` (nothing changed) if the staging
    /// limit is spent or the file cannot be made: the caller keeps the bytes in memory.
    pub fn spill(&mut self, staging: &StagingConfig, capacity: usize) -> bool {
        let PartBuffer::Memory(bytes) = self else { return true };
        let Some(disk) = Arc::clone(&staging.limit).try_reserve(capacity as u64) else { return false };
        let spilled = temp_file(&staging.dir).and_then(|file| {
            file.write_all_at(bytes, 0).map_err(local_error)?;
            Ok(file)
        });
        match spilled {
            Ok(file) => {
                *self = PartBuffer::Disk { file, len: bytes.len(), _disk: disk };
                true
            }
            Err(error) => {
                tracing::warn!("cannot spill a part buffer to disk, keeping it in memory: {error}");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryLimiter;

    fn staging(dir: &std::path::Path, limit: u64) -> StagingConfig {
        StagingConfig { dir: dir.to_owned(), limit: MemoryLimiter::new(limit), journal: None }
    }

    /// The same writes give the same bytes in memory and spilled part-way through.
    #[test]
    fn spilled_buffer_holds_the_same_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let staging = staging(dir.path(), 1 << 20);
        let mut memory = PartBuffer::default();
        let mut spilled = PartBuffer::default();
        for buffer in [&mut memory, &mut spilled] {
            buffer.write_at(0, b"hello world").expect("write");
        }
        assert!(spilled.spill(&staging, 64), "spills within the staging limit");
        assert_eq!(staging.limit.used(), 64);
        for buffer in [&mut memory, &mut spilled] {
            buffer.write_at(6, b"there, more").expect("overwrite and extend");
            buffer.zero_fill_to(20).expect("hole");
            buffer.write_at(20, b"!").expect("after the hole");
        }
        assert!(spilled.is_spilled());
        assert_eq!(spilled.len(), memory.len());
        assert_eq!(spilled.read(3..21).expect("read"), memory.read(3..21).expect("read"));
        let (a, b) = (memory.take_front(5).expect("take"), spilled.take_front(5).expect("take"));
        assert_eq!(a, b);
        assert_eq!(&a[..], b"hello");
        assert!(!spilled.is_spilled(), "back in memory once a part is taken out");
        assert_eq!(staging.limit.used(), 0, "disk given back");
        assert_eq!(spilled.read(0..spilled.len()).expect("rest"), memory.read(0..memory.len()).expect("rest"));
    }

    #[test]
    fn no_spill_past_the_staging_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let staging = staging(dir.path(), 10);
        let mut buffer = PartBuffer::default();
        buffer.write_at(0, b"abc").expect("write");
        assert!(!buffer.spill(&staging, 64));
        assert!(!buffer.is_spilled());
        assert_eq!(buffer.read(0..3).expect("read"), &b"abc"[..]);
    }
}
