//! Staging files: files changed in place (append, random writes, `truncate`, `O_RDWR`)
//! are edited in a local, already-unlinked temporary file and uploaded whole at
//! `close`/`fsync`.
//!
//! The existing object (the *base*) is not downloaded up front: bytes are fetched into
//! the staging file only when read or when the upload needs them, pinned to the base's
//! ETag. At commit the file is cut into chunks of a part's size; runs of chunks that
//! nothing changed are copied server side from the base (`UploadPartCopy`), and only
//! the chunks holding a change are uploaded from the file (fetching the rest of their
//! bytes first): appending to a large object, or rewriting its header, costs a part or
//! two, not the object (see [`plan_parts`]). Staging files count against
//! `--staging-limit` (writes past it fail with ENOSPC).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use rangemap::RangeSet;
use tokio::sync::Mutex;

use super::early_parts::{self, EarlyParts, Sent};
use super::journal::Journal;
use super::multipart::MultipartUpload;
use super::write_back::Contents;
use super::{Move, WriteError, Written, COPY_PART, MAX_PARTS, MIN_PART, UPLOAD_CONCURRENCY};
use crate::memory::{MemoryLimiter, Reservation};
use bucketfs_client::store::{Metadata, ObjectStore, StoreError, WriteCondition};

/// The object a staging file started from.
#[derive(Clone, Debug)]
pub struct Base {
    pub etag: Option<String>,
    pub size: u64,
}

struct State {
    file: File,
    size: u64,
    base: Option<Base>,
    /// Bytes `[0, base_end)` of the file are those of the base unless written; beyond,
    /// the file holds them (zeros where nothing was written).
    base_end: u64,
    /// Ranges below `base_end` already in the file.
    local: RangeSet<u64>,
    /// Bytes written since the last commit.
    dirty: RangeSet<u64>,
    /// Whether the content changed since the last commit (a write, a truncation, or a new
    /// file, which is stored at its first commit even if nothing is written).
    changed: bool,
    metadata: Metadata,
    metadata_changed: bool,
    /// A new file: the first commit must not replace another client's object.
    create_only: bool,
    /// The ETag of the object the first commit replaces (`O_TRUNC` of an existing file,
    /// continued here past one part under `--write-back`), for a write-back log replay.
    replaces: Option<String>,
    discarded: bool,
    /// The file's size, counted against the staging limit.
    disk: Reservation,
    /// The source (key, ETag) the base is a whole copy of, while only a part of it may be
    /// shown (see [`Staged::store_copy_of`]).
    copy_of: Option<(String, String)>,
    /// Its bytes go on in a streamed upload ([`Staged::hand_over_to_stream`]).
    handed_over: bool,
    /// Its parts sent while it is written (`--write-back`, see [`Staged::send_parts_early`]).
    early: Option<EarlyParts>,
}

pub struct Staged {
    store: Arc<dyn ObjectStore>,
    journal: Option<Arc<Journal>>,
    key: parking_lot::Mutex<String>,
    part_size: u64,
    memory: Arc<MemoryLimiter>,
    /// A new file staged under `--write-back` may not grow past this (half the write-back
    /// limit, see `Fs::staged_at_most`): a write past it is refused ([`Move::StreamedPastLimit`]).
    stage_at_most: Option<u64>,
    /// Signalled when a hand-over to a streamed upload ends ([`Staged::handed_over`]).
    hand_over_ended: tokio::sync::Notify,
    state: Mutex<State>,
}

/// Where staging files live and how much they may hold.
#[derive(Clone, Debug)]
pub struct StagingConfig {
    pub dir: std::path::PathBuf,
    pub limit: Arc<MemoryLimiter>,
    /// Where the multipart uploads of commits are recorded.
    pub journal: Option<Arc<Journal>>,
}

impl Staged {
    /// A staging file for `key`, starting from the object `base` (or empty).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        key: String,
        base: Option<Base>,
        metadata: Metadata,
        part_size: u64,
        staging: &StagingConfig,
        memory: Arc<MemoryLimiter>,
    ) -> Result<Self, WriteError> {
        let file = temp_file(&staging.dir)?;
        let base_end = base.as_ref().map_or(0, |b| b.size);
        file.set_len(base_end).map_err(local_error)?;
        let disk = staging.limit.try_reserve(base_end).ok_or(WriteError::NoSpace)?;
        let state = State {
            file,
            size: base_end,
            create_only: base.is_none(),
            replaces: None,
            dirty: RangeSet::new(),
            changed: base.is_none(),
            base,
            base_end,
            local: RangeSet::new(),
            metadata,
            metadata_changed: false,
            discarded: false,
            disk,
            copy_of: None,
            handed_over: false,
            early: None,
        };
        Ok(Self {
            store,
            journal: staging.journal.clone(),
            key: parking_lot::Mutex::new(key),
            part_size: part_size.max(MIN_PART),
            memory,
            stage_at_most: None,
            hand_over_ended: tokio::sync::Notify::new(),
            state: Mutex::new(state),
        })
    }

    /// Sends each full part of `part_size` bytes while the file is written, for its commit
    /// to complete (see `write::early_parts`): a new file (or `O_TRUNC`) staged under
    /// `--write-back`, whose upload would otherwise start only after `close`.
    pub async fn send_parts_early(&self, part_size: u64) -> Result<(), WriteError> {
        let mut state = self.state.lock().await;
        if state.base.is_some() {
            return Ok(());
        }
        let source = early_parts::Source {
            store: self.store.clone(),
            journal: self.journal.clone(),
            key: self.key(),
            metadata: state.metadata.clone(),
            file: state.file.try_clone().map_err(local_error)?,
            part_size: part_size.max(MIN_PART),
            memory: self.memory.clone(),
        };
        let mut early = EarlyParts::start(source);
        early.written(0, state.size);
        state.early = Some(early);
        Ok(())
    }

    /// See [`Staged::stage_at_most`].
    pub fn staging_at_most(mut self, bytes: u64) -> Self {
        self.stage_at_most = Some(bytes);
        self
    }

    /// Hands the file over to a streamed upload that goes on from it
    /// ([`Move::StreamedPastLimit`]): whether it is a new file, the ETag it replaces,
    /// its metadata and size; the caller reads its bytes ([`Staged::read`]) and then says
    /// how that went ([`Staged::handed_over`]); meanwhile writes are refused the same way
    /// (the caller holds them back). `None` if it is being handed
    /// over, or is not a file starting from nothing.
    pub async fn hand_over_to_stream(&self) -> Option<(bool, Option<String>, Metadata, u64)> {
        let mut state = self.state.lock().await;
        if state.handed_over || state.discarded || state.base.is_some() {
            return None;
        }
        state.handed_over = true;
        Some((state.create_only, state.replaces.clone(), state.metadata.clone(), state.size))
    }

    /// After [`Staged::hand_over_to_stream`]: the stream took the bytes (`true`: nothing
    /// of this file is stored, its writes keep failing) or could not (`false`: it goes on).
    pub async fn handed_over(&self, taken: bool) {
        let mut state = self.state.lock().await;
        state.handed_over = taken;
        state.discarded |= taken;
        if taken {
            state.early = None; // the stream sends its own parts
        }
        self.hand_over_ended.notify_waiters();
    }

    /// Its bytes went on in a streamed upload: it stores nothing, and its commit is no news.
    pub async fn moved(&self) -> bool {
        self.state.lock().await.handed_over
    }

    pub fn key(&self) -> String {
        self.key.lock().clone()
    }

    /// Renamed to `key` while nothing of it is stored yet: pending, the first commit goes
    /// there (replacing what is there, the object of ETag `replaces` if known). Stored if
    /// an object is stored (to be moved).
    pub async fn rename_unstored(&self, key: String, replaces: Option<String>) -> super::Renamed {
        let mut state = self.state.lock().await;
        if state.base.is_some() {
            return super::Renamed::Stored;
        }
        let old_key_holds = !state.create_only;
        state.create_only = false;
        state.replaces = replaces; // what it replaced before was at the old key
        if let Some(early) = &mut state.early {
            early.spoil(); // started for the old key
        }
        *self.key.lock() = key;
        super::Renamed::Pending { old_key_holds }
    }

    /// The stored object was moved to `key`, where it has `etag`.
    pub async fn relocated(&self, key: String, etag: Option<String>) {
        let mut state = self.state.lock().await;
        if let Some(base) = &mut state.base {
            base.etag = etag;
        }
        *self.key.lock() = key;
    }

    /// Replaces whatever is at the key at the first commit (`O_TRUNC` of an existing file).
    pub async fn allow_replace(&self) {
        self.state.lock().await.create_only = false;
    }

    /// Replaces the object of ETag `etag` at the first commit (see [`State::replaces`]).
    pub async fn replacing(&self, etag: Option<String>) {
        let mut state = self.state.lock().await;
        state.create_only = false;
        state.replaces = etag;
    }

    pub async fn metadata(&self) -> Metadata {
        self.state.lock().await.metadata.clone()
    }

    pub async fn update_metadata(&self, change: impl FnOnce(&mut Metadata)) -> Metadata {
        let mut state = self.state.lock().await;
        change(&mut state.metadata);
        state.metadata_changed = true;
        state.metadata.clone()
    }

    pub async fn discard(&self) {
        self.state.lock().await.discarded = true;
    }

    /// Unlinked while nothing of it is stored: nothing will be. `Some(old_key_holds)` (an
    /// object this file replaces is at its key); `None` if it was stored (to be deleted).
    pub async fn discard_unstored(&self) -> Option<bool> {
        let mut state = self.state.lock().await;
        if state.base.is_some() {
            return None;
        }
        state.discarded = true;
        Some(!state.create_only)
    }

    /// Changes the metadata only if the next commit stores something anyway (changed
    /// content or metadata), so that the change costs no request; `false` if not.
    pub async fn update_metadata_if_free(&self, change: impl FnOnce(&mut Metadata)) -> bool {
        let mut state = self.state.lock().await;
        // Parts sent early went with the metadata of their upload's start: a change would
        // cost a copy of the object at completion.
        if state.discarded || (!state.changed && !state.metadata_changed) || state.early.is_some() {
            return false;
        }
        change(&mut state.metadata);
        true
    }

    /// Writes `data` at `offset` (the file's size after it), or refuses it past the
    /// write-back limit.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<Written, WriteError> {
        let mut state = self.state.lock().await;
        let end = offset + data.len() as u64;
        let too_large = self.stage_at_most.is_some_and(|most| end > most && state.base.is_none() && !state.discarded);
        if state.handed_over || too_large {
            return Ok(Written::Refused(Move::StreamedPastLimit));
        }
        self.grow_to(&mut state, end)?;
        state.file.write_all_at(data, offset).map_err(local_error)?;
        let base_end = state.base_end;
        if offset < base_end {
            state.local.insert(offset..end.min(base_end));
        }
        if offset < end {
            state.dirty.insert(offset..end);
        }
        let size = state.size;
        if let Some(early) = &mut state.early {
            early.written(offset, size);
        }
        state.changed = true;
        Ok(Written::Size(state.size))
    }

    /// The whole file, if it is a file not stored yet that starts from nothing (nothing
    /// to fetch): new, or replacing an object (`O_TRUNC`): what `--write-back` records in
    /// its log at close (rsync writes its temporary files with `O_RDWR`). Its bytes as a
    /// buffer up to one part, as a handle of this file above (the log copies them).
    pub async fn pending_whole(&self) -> Option<super::write_back::PendingFile> {
        let state = self.state.lock().await;
        if state.discarded || state.base.is_some() || !(state.create_only || state.replaces.is_some()) {
            return None;
        }
        let data = match state.size > self.part_size {
            true => Contents::File { file: Arc::new(state.file.try_clone().ok()?), len: state.size },
            false => Contents::Memory(read_range(&state.file, 0..state.size).ok()?),
        };
        Some(super::write_back::PendingFile {
            key: self.key(),
            data,
            metadata: state.metadata.clone(),
            create_only: state.create_only,
            replaces: state.replaces.clone(),
            ..super::write_back::PendingFile::default()
        })
    }

    /// Changes the metadata the first commit stores, if the file is not stored yet (a
    /// new file closed with `--write-back`, its upload not started); `None` otherwise.
    pub async fn update_metadata_unstored(&self, change: impl FnOnce(&mut Metadata)) -> Option<Metadata> {
        let mut state = self.state.lock().await;
        if state.base.is_some() || state.discarded {
            return None;
        }
        change(&mut state.metadata);
        state.metadata_changed = true;
        Some(state.metadata.clone())
    }

    /// Up to `len` bytes at `offset` of the file as it is now.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, WriteError> {
        let mut state = self.state.lock().await;
        let end = offset.saturating_add(len).min(state.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        self.fetch_base(&mut state, offset..end).await?;
        let mut buffer = vec![0; (end - offset) as usize];
        state.file.read_exact_at(&mut buffer, offset).map_err(local_error)?;
        Ok(Bytes::from(buffer))
    }

    /// Makes the file a copy of `source` (version `etag`, `size` bytes) made inside the
    /// store, showing its first `shown` bytes, if the file is empty and nothing was
    /// written to it (a new file, or one opened with `O_TRUNC`, for reading too); `false`
    /// (nothing done) otherwise. The file then starts from the copy, as from any stored
    /// object: reads fetch its bytes, a later commit uploads only what changed, and
    /// [`Staged::show_more_of_copy`] shows the rest as the program asks for it (Go copies
    /// 2 GiB a call). `changed` changes the metadata the copy gets (its times).
    pub async fn store_copy_of(
        &self,
        source: &str,
        etag: &str,
        size: u64,
        shown: u64,
        changed: impl FnOnce(&mut Metadata),
    ) -> Result<bool, WriteError> {
        let mut state = self.state.lock().await;
        if state.size != 0 || state.discarded || shown > size || !state.disk.try_grow(shown) {
            return Ok(false);
        }
        if let Err(error) = state.file.set_len(shown) {
            state.disk.shrink_to(0);
            return Err(local_error(error));
        }
        changed(&mut state.metadata);
        let key = self.key();
        let copy = super::CopyInto { key: &key, metadata: &state.metadata, claim: state.create_only };
        let copied = match copy.of(&self.store, self.journal.as_deref(), source, etag, size).await {
            Ok(copied) => copied,
            Err(error) => {
                let _ = state.file.set_len(0);
                state.disk.shrink_to(0);
                return Err(error.into());
            }
        };
        state.size = shown;
        state.base = Some(Base { etag: copied, size });
        state.early = None; // a copy, not parts
        state.base_end = shown;
        state.local = RangeSet::new();
        state.dirty = RangeSet::new();
        // Stored already, unless only a part of the copy is shown (then the commit cuts it).
        state.changed = shown != size;
        state.metadata_changed = false;
        state.create_only = false;
        state.copy_of = Some((source.to_owned(), etag.to_owned()));
        Ok(true)
    }

    /// Shows `len` more bytes of the copy [`Staged::store_copy_of`] made, at `at`, the
    /// file's end, if the program asks for the next bytes of the same source and nothing
    /// else changed the file since; `false` (nothing done) otherwise.
    pub async fn show_more_of_copy(&self, source: &str, etag: &str, at: u64, len: u64) -> Result<bool, WriteError> {
        let mut state = self.state.lock().await;
        let of_copy = state.copy_of.as_ref().is_some_and(|(s, e)| s == source && e == etag);
        let whole = state.base.as_ref().map_or(0, |base| base.size);
        let untouched = state.base_end == state.size && state.dirty.is_empty() && !state.discarded;
        if !of_copy || !untouched || at != state.size || at + len > whole || !state.disk.try_grow(len) {
            return Ok(false);
        }
        state.file.set_len(at + len).map_err(local_error)?;
        state.size = at + len;
        state.base_end = at + len;
        state.changed = state.size != whole;
        Ok(true)
    }

    /// `truncate`/`ftruncate` to `size`.
    pub async fn truncate(&self, size: u64) -> Result<(), WriteError> {
        let mut state = self.state.lock().await;
        if size == state.size {
            return Ok(());
        }
        if size < state.size {
            state.file.set_len(size).map_err(local_error)?;
            state.size = size;
            state.disk.shrink_to(size);
            // Bytes past the new end are gone, also if the file grows again.
            state.base_end = state.base_end.min(size);
            let base_end = state.base_end;
            state.local.remove(base_end..u64::MAX);
            state.dirty.remove(size..u64::MAX);
        } else {
            // The new bytes lie past the base's end: uploaded from the file.
            self.grow_to(&mut state, size)?;
        }
        if let Some(early) = &mut state.early {
            early.truncated(size);
        }
        state.changed = true;
        Ok(())
    }

    /// Uploads the file if it changed since the last commit; the file stays open for more
    /// changes. Returns the object's ETag when something was stored.
    pub async fn commit(&self) -> Result<Option<Option<String>>, WriteError> {
        // As `Upload::commit`: a commit during a move to a streamed upload waits for it.
        let mut state =
            super::lock_after_hand_over(&self.state, &self.hand_over_ended, |s| s.handed_over && !s.discarded).await;
        if state.discarded {
            return Ok(None);
        }
        let key = self.key();
        let etag = match state.changed {
            true => self.upload(&mut state, &key).await?,
            false if state.metadata_changed => match &state.base {
                Some(base) => {
                    let etag = base.etag.clone();
                    let journal = self.journal.as_deref();
                    super::copy_object(&self.store, journal, &key, &key, base.size, etag.as_deref(), &state.metadata)
                        .await?
                }
                None => self.upload(&mut state, &key).await?,
            },
            false => return Ok(None),
        };
        // The file now holds the new object's bytes wherever it held bytes before, and
        // all past the old base's end.
        let (old_end, size) = (state.base_end, state.size);
        if old_end < size {
            state.local.insert(old_end..size);
        }
        state.base = Some(Base { etag: etag.clone(), size });
        state.base_end = size;
        state.dirty = RangeSet::new();
        state.changed = false;
        state.metadata_changed = false;
        state.create_only = false;
        state.copy_of = None; // the base is now what was stored
        Ok(Some(etag))
    }

    fn grow_to(&self, state: &mut State, end: u64) -> Result<(), WriteError> {
        if end > state.size {
            if !state.disk.try_grow(end - state.size) {
                return Err(WriteError::NoSpace);
            }
            state.file.set_len(end).map_err(local_error)?;
            state.size = end;
        }
        Ok(())
    }

    /// Makes `range` (clamped to the base) present in the file, fetching missing pieces.
    async fn fetch_base(&self, state: &mut State, range: Range<u64>) -> Result<(), WriteError> {
        let range = range.start..range.end.min(state.base_end);
        if range.is_empty() {
            return Ok(());
        }
        let etag = state.base.as_ref().and_then(|b| b.etag.clone());
        let key = self.key();
        let gaps: Vec<Range<u64>> = state.local.gaps(&range).collect();
        for gap in gaps {
            let bytes = self.store.get_range(&key, gap.clone(), etag.as_deref()).await?;
            state.file.write_all_at(&bytes, gap.start).map_err(local_error)?;
            state.local.insert(gap);
        }
        Ok(())
    }

    /// Stores the file as the object `key`: chunks nothing changed copied from the base,
    /// the others uploaded from the file (see [`plan_parts`]); a file of one part with
    /// nothing to copy is one PUT.
    async fn upload(&self, state: &mut State, key: &str) -> Result<Option<String>, WriteError> {
        if let Some(early) = state.early.take() {
            if let (None, Some(sent)) = (&state.base, early.finish(state.size, key).await) {
                return Ok(self.complete_early(state, key, sent).await?);
            }
        }
        let size = state.size;
        let copyable = match &state.base {
            Some(_) => state.base_end,
            None => 0,
        };
        // Two pieces more than chunks at most (the cut at the base's end): within 10,000.
        let chunk = self.part_size.max(size.div_ceil(MAX_PARTS - 2));
        let pieces = plan_parts(size, chunk, copyable, &state.dirty);
        for piece in pieces.iter().filter(|piece| !piece.copied) {
            self.fetch_base(state, piece.range.clone()).await?;
        }
        let base_etag = state.base.as_ref().and_then(|b| b.etag.clone());
        let target = Target { store: &self.store, journal: self.journal.as_deref(), key, metadata: &state.metadata };
        let condition = WriteCondition::absent_if(state.create_only);
        Ok(target.store_pieces(&state.file, pieces, base_etag, &condition, &self.memory).await?)
    }
}

impl Staged {
    /// Completes the upload of parts sent while the file was written: the bytes past them
    /// are its last part; metadata changed since the upload started (a `chmod` or
    /// `utimensat` after `close`, as `tar` does) is written over the object in place.
    async fn complete_early(&self, state: &State, key: &str, sent: Sent) -> Result<Option<String>, StoreError> {
        let Sent { upload, mut parts, end, metadata } = sent;
        if end < state.size {
            let _memory = self.memory.reserve(state.size - end);
            let tail = match read_range(&state.file, end..state.size) {
                Ok(tail) => upload.upload_part(parts.len() as i32 + 1, tail).await,
                Err(error) => Err(reading_error(error)),
            };
            match tail {
                Ok(etag) => parts.push((parts.len() as i32 + 1, etag)),
                Err(error) => {
                    upload.abort().await;
                    return Err(error);
                }
            }
        }
        let etag = upload.finish_with(async { Ok(parts) }, &WriteCondition::absent_if(state.create_only)).await?;
        if metadata == state.metadata {
            return Ok(etag);
        }
        let journal = self.journal.as_deref();
        super::copy_object(&self.store, journal, key, key, state.size, etag.as_deref(), &state.metadata).await
    }
}

/// Where [`store_file`] and a staging file's commit store their bytes.
struct Target<'a> {
    store: &'a Arc<dyn ObjectStore>,
    journal: Option<&'a Journal>,
    key: &'a str,
    metadata: &'a Metadata,
}

impl Target<'_> {
    /// Stores `pieces` of `file` as the object: one PUT for a single piece uploaded from
    /// the file, else a multipart upload (copied pieces come from the object at version
    /// `base_etag`).
    async fn store_pieces(
        &self,
        file: &File,
        pieces: Vec<Piece>,
        base_etag: Option<String>,
        condition: &WriteCondition,
        memory: &Arc<MemoryLimiter>,
    ) -> Result<Option<String>, StoreError> {
        if let [Piece { copied: false, .. }] | [] = pieces.as_slice() {
            let size = pieces.first().map_or(0, |piece| piece.range.end);
            let data = read_range(file, 0..size).map_err(reading_error)?;
            return self.store.put(self.key, data, self.metadata, condition).await;
        }
        let upload = MultipartUpload::start(self.store, self.journal, self.key, self.metadata).await?;
        let parts = pieces.into_iter().enumerate().map(|(index, Piece { range, copied })| {
            let number = index as i32 + 1;
            let (upload, base_etag) = (&upload, base_etag.clone());
            async move {
                let etag = if copied {
                    upload.copy_part(number, upload.key(), range, base_etag.as_deref()).await?
                } else {
                    let _memory = memory.reserve(range.end - range.start);
                    upload.upload_part(number, read_range(file, range).map_err(reading_error)?).await?
                };
                Ok::<_, StoreError>((number, etag))
            }
        });
        let parts = futures::stream::iter(parts).buffered(UPLOAD_CONCURRENCY).try_collect().await;
        upload.finish_with(async { parts }, condition).await
    }
}

/// Stores the first `size` bytes of `file` as the object `key` (one PUT up to S3's
/// smallest part, else parts of that size or more), through the one multipart lifecycle
/// (recorded in `journal`): what a write-back log replay does with a file over one part.
#[allow(clippy::too_many_arguments)]
pub async fn store_file(
    store: &Arc<dyn ObjectStore>,
    journal: Option<&Journal>,
    key: &str,
    file: &File,
    size: u64,
    metadata: &Metadata,
    condition: &WriteCondition,
    memory: &Arc<MemoryLimiter>,
) -> Result<Option<String>, StoreError> {
    let chunk = MIN_PART.max(size.div_ceil(MAX_PARTS - 2));
    let pieces = plan_parts(size, chunk, 0, &RangeSet::new());
    let target = Target { store, journal, key, metadata };
    target.store_pieces(file, pieces, None, condition, memory).await
}

fn reading_error(error: WriteError) -> StoreError {
    StoreError::Other { message: format!("reading the staging file: {error}"), request_id: None }
}

/// One part of a commit: bytes `range` of the file, copied from the base (same offsets)
/// or uploaded from the file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Piece {
    range: Range<u64>,
    copied: bool,
}

/// The parts that store a file of `size` bytes whose bytes below `copyable` are the
/// base's except where `dirty`. Below `copyable` the file is cut into chunks of `chunk`
/// bytes (at least S3's smallest part), the last one ending at `copyable`: a chunk with
/// a change is uploaded, runs of the others are copied (up to [`COPY_PART`] per part).
/// Past `copyable` the file is uploaded, chunk by chunk. A piece shorter than S3's
/// smallest part goes with the next one unless it is the last. Copies keep their
/// offsets, so an append costs only its bytes and a rewritten header one chunk.
fn plan_parts(size: u64, chunk: u64, copyable: u64, dirty: &RangeSet<u64>) -> Vec<Piece> {
    let copyable = copyable.min(size);
    let mut pieces: Vec<Piece> = Vec::new();
    let mut offset = 0;
    while offset < size {
        let limit = if offset < copyable { copyable } else { size };
        let range = offset..(offset + chunk).min(limit);
        let copied = range.end <= copyable && !dirty.overlaps(&range);
        match pieces.last_mut() {
            Some(last) if copied && last.copied && range.end - last.range.start <= COPY_PART => {
                last.range.end = range.end;
            }
            _ => pieces.push(Piece { range: range.clone(), copied }),
        }
        offset = range.end;
    }
    let mut index = 0;
    while index + 1 < pieces.len() {
        if pieces[index].range.end - pieces[index].range.start < MIN_PART {
            let short = pieces.remove(index);
            pieces[index] = Piece { range: short.range.start..pieces[index].range.end, copied: false };
        } else {
            index += 1;
        }
    }
    pieces
}

pub(super) fn read_range(file: &File, range: Range<u64>) -> Result<Bytes, WriteError> {
    let mut buffer = vec![0; (range.end - range.start) as usize];
    file.read_exact_at(&mut buffer, range.start).map_err(local_error)?;
    Ok(Bytes::from(buffer))
}

pub(super) fn temp_file(dir: &Path) -> Result<File, WriteError> {
    tempfile::tempfile_in(dir).map_err(|error| {
        tracing::error!("cannot create a staging file in {}: {error}", dir.display());
        local_error(error)
    })
}

pub(super) fn local_error(error: std::io::Error) -> WriteError {
    match error.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => WriteError::NoSpace,
        _ => WriteError::Local(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;

    const MIB: usize = 1024 * 1024;

    fn staged(store: &Arc<MemoryStore>, base: Option<Base>) -> Staged {
        let staging = StagingConfig { dir: std::env::temp_dir(), limit: MemoryLimiter::new(1 << 30), journal: None };
        let store: Arc<dyn ObjectStore> = store.clone();
        Staged::new(store, "k".into(), base, Metadata::default(), MIN_PART, &staging, MemoryLimiter::new(1 << 30))
            .expect("staging file")
    }

    /// A store holding `original` at `k`, and a staging file that starts as it.
    async fn staged_over(original: &[u8]) -> (Arc<MemoryStore>, Staged) {
        let store = Arc::new(MemoryStore::with_keys([("k".to_owned(), original.to_vec())]));
        let info = store.head("k").await.expect("head");
        let file = staged(&store, Some(Base { etag: info.etag, size: info.size }));
        (store, file)
    }

    /// A copy asked for in rounds from offset 0 (Go: 2 GiB a call) is one copy inside the
    /// store, shown round by round: when every round was asked for the file is the copy
    /// and its commit stores nothing more; stopped after a part, the commit cuts the copy
    /// to what was asked for. A round not where the file ends, or after a write, is refused.
    #[tokio::test]
    async fn a_copy_in_rounds_is_one_copy_shown_round_by_round() {
        let source: Vec<u8> = (0..20 * MIB).map(|i| (i % 241) as u8).collect();
        let store = Arc::new(MemoryStore::with_keys([("src".to_owned(), source.clone())]));
        let etag = store.head("src").await.expect("head").etag.expect("etag");
        let size = source.len() as u64;
        let round = 8 * MIB as u64;

        let file = staged(&store, None);
        assert!(file.store_copy_of("src", &etag, size, round, |_| {}).await.expect("first round"));
        assert_eq!(file.read(round - 4, 100).await.expect("read").len(), 4, "only the first round shows");
        assert!(!file.show_more_of_copy("src", &etag, round + 1, round).await.expect("gap"), "not at the end");
        assert!(file.show_more_of_copy("src", &etag, round, round).await.expect("second round"));
        assert!(file.show_more_of_copy("src", &etag, 2 * round, size - 2 * round).await.expect("last round"));
        assert_eq!(file.commit().await.expect("commit"), None, "the copy is the file: nothing to store");
        assert_eq!(store.get_range("k", 0..size, None).await.expect("get")[..], source[..]);

        store.delete("k").await.expect("delete"); // a new file again (its copy claims the key)
        let partial = staged(&store, None);
        assert!(partial.store_copy_of("src", &etag, size, round, |_| {}).await.expect("first round"));
        partial.write(10, b"x").await.expect("write");
        assert!(!partial.show_more_of_copy("src", &etag, round, round).await.expect("after a write"));
        partial.commit().await.expect("commit");
        let mut expected = source[..round as usize].to_vec();
        expected[10] = b'x';
        assert_eq!(store.head("k").await.expect("head").size, round, "cut to what was asked for");
        assert_eq!(store.get_range("k", 0..round, None).await.expect("get")[..], expected[..]);
    }

    #[tokio::test]
    async fn append_and_shrink_keep_the_prefix_server_side() {
        let original: Vec<u8> = (0..12 * MIB).map(|i| (i % 251) as u8).collect();
        let (store, file) = staged_over(&original).await;
        file.write(original.len() as u64, b"tail").await.expect("append");
        file.commit().await.expect("commit");
        assert!(store.gets.lock().is_empty(), "nothing downloaded to append: {:?}", store.gets.lock());
        let mut expected = original.clone();
        expected.extend_from_slice(b"tail");
        let stored = store.get_range("k", 0..expected.len() as u64, None).await.expect("get");
        assert!(stored[..] == expected[..], "appended object differs");

        store.gets.lock().clear();
        file.truncate(6 * MIB as u64).await.expect("shrink");
        file.commit().await.expect("commit");
        assert!(store.gets.lock().is_empty(), "nothing downloaded to shrink: {:?}", store.gets.lock());
        assert_eq!(store.head("k").await.expect("head").size, 6 * MIB as u64);
        assert_eq!(store.open_uploads(), 0);
    }

    /// A header rewritten and a few bytes changed in the middle of a 24 MiB object cost
    /// the two chunks holding them (fetched, then uploaded); the rest is copied.
    #[tokio::test]
    async fn changes_inside_a_large_object_cost_their_chunks_only() {
        let original: Vec<u8> = (0..24 * MIB).map(|i| (i % 253) as u8).collect();
        let (store, file) = staged_over(&original).await;
        file.write(0, b"HEAD").await.expect("header");
        file.write(12 * MIB as u64, b"mid").await.expect("middle");
        file.commit().await.expect("commit");
        let fetched: u64 = store.gets.lock().iter().map(|r| r.end - r.start).sum();
        assert!(fetched <= 2 * MIN_PART, "fetched {fetched} bytes: more than the two chunks changed");
        let mut expected = original;
        expected[..4].copy_from_slice(b"HEAD");
        expected[12 * MIB..12 * MIB + 3].copy_from_slice(b"mid");
        let stored = store.get_range("k", 0..expected.len() as u64, None).await.expect("get");
        assert!(stored[..] == expected[..], "stored object differs");
        assert_eq!(store.open_uploads(), 0);
    }

    #[test]
    fn parts_copy_unchanged_runs_and_upload_changed_chunks() {
        const M: u64 = MIB as u64;
        let pieces = |size: u64, copyable: u64, dirty: Option<Range<u64>>| {
            let dirty: RangeSet<u64> = dirty.into_iter().collect();
            plan_parts(size * M, 10 * M, copyable * M, &dirty)
                .into_iter()
                .map(|p| (p.range.start / M, p.range.end / M, p.copied))
                .collect::<Vec<_>>()
        };
        assert_eq!(pieces(35, 35, None), [(0, 35, true)], "unchanged: one copy");
        assert_eq!(pieces(35, 35, Some(0..1)), [(0, 10, false), (10, 35, true)], "header rewritten");
        assert_eq!(pieces(35, 35, Some(12 * M..13 * M)), [(0, 10, true), (10, 20, false), (20, 35, true)]);
        assert_eq!(pieces(40, 32, None), [(0, 32, true), (32, 40, false)], "appended: only the new bytes");
        assert_eq!(pieces(40, 22, Some(0..1)), [(0, 10, false), (10, 22, true), (22, 32, false), (32, 40, false)]);
        assert_eq!(
            pieces(40, 32, Some(25 * M..26 * M)),
            [(0, 20, true), (20, 30, false), (30, 40, false)],
            "2 MiB copy joins"
        );
        assert_eq!(pieces(25, 0, None), [(0, 10, false), (10, 20, false), (20, 25, false)], "a new file");
        assert_eq!(pieces(0, 0, None), []);
    }

    proptest::proptest! {
        /// Whatever the file, the plan is one S3 accepts and stores the file's bytes:
        /// parts cover it in order, all but the last at least 5 MiB, at most 5 GiB, at
        /// most two more than its chunks, and a copied part holds only unchanged bytes
        /// of the base.
        #[test]
        fn every_plan_is_a_valid_upload_of_the_file(
            size in 0u64..400 * MIB as u64,
            chunk in MIN_PART..20 * MIB as u64,
            copyable_share in 0.0f64..=1.0,
            dirty in proptest::collection::vec((0u64..400 * MIB as u64, 1u64..8 * MIB as u64), 0..5),
        ) {
            let copyable = (size as f64 * copyable_share) as u64;
            let dirty: RangeSet<u64> = dirty.into_iter().map(|(start, len)| start..start + len).collect();
            let pieces = plan_parts(size, chunk, copyable, &dirty);
            let mut offset = 0;
            for (index, piece) in pieces.iter().enumerate() {
                let len = piece.range.end - piece.range.start;
                proptest::prop_assert_eq!(piece.range.start, offset, "contiguous");
                proptest::prop_assert!(len >= MIN_PART || index + 1 == pieces.len(), "{:?}", pieces);
                proptest::prop_assert!(len <= 5 << 30);
                if piece.copied {
                    proptest::prop_assert!(piece.range.end <= copyable && !dirty.overlaps(&piece.range));
                }
                offset = piece.range.end;
            }
            proptest::prop_assert_eq!(offset, size, "covers the file");
            proptest::prop_assert!(pieces.len() as u64 <= size.div_ceil(chunk) + 2);
        }
    }

    #[tokio::test]
    async fn reads_fetch_the_base_lazily_and_see_writes() {
        let (store, file) = staged_over(b"0123456789").await;
        file.write(4, b"ab").await.expect("write");
        assert!(store.gets.lock().is_empty(), "nothing fetched before a read");
        assert_eq!(&file.read(2, 6).await.expect("read")[..], b"23ab67");
        file.truncate(12).await.expect("grow");
        assert_eq!(&file.read(8, 10).await.expect("read")[..], b"89\0\0");
        assert!(file.commit().await.expect("commit").is_some(), "the change was stored");
        assert_eq!(&store.get_range("k", 0..12, None).await.expect("get")[..], b"0123ab6789\0\0");
        assert_eq!(file.commit().await.expect("again"), None, "nothing changed since");
    }
}
