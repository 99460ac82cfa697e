//! Uploads of files written through the mount.
//!
//! An [`Upload`] turns the writes of one open file into one object. Bytes are gathered in a
//! buffer; as soon as a part is full it is sent as a part of a multipart upload in the
//! background, so a large file streams to S3 while the program is still writing and memory
//! holds only the parts in flight. Part sizes grow (doubling every 1,000 parts from
//! `part_size`) so that any object up to S3's 5 TiB limit fits in 10,000 parts. A small file
//! is one `PutObject`.
//!
//! Nothing is visible in the bucket until [`Upload::commit`] (at `close`/`fsync`), which
//! returns only once the object is durable, or with the error the store gave. After a
//! commit of an empty file, writes from offset 0 start over (shells close a duplicate
//! descriptor before writing); other writes after a commit are refused
//! ([`Move::StagedFromStored`]), and the caller goes on in a staging file that starts as the
//! stored object (`Upload::stored`), so a write after `fsync` never shrinks the file. A
//! failed or discarded upload is aborted, so no multipart upload is left behind.
//!
//! Writes may land anywhere at or after the first byte not yet sent (programs that seek
//! back a little, or leave holes, work); a write over bytes already sent to S3 is refused
//! ([`Move::StoreThenStaged`]), on which the caller stores what was written and
//! goes on in a staging file (`Fs::store_then_staged`).
//!
//! The object's metadata (modes, owners, times set while the file is open, as `tar`
//! does with `fchmod`/`futimens` before `close`) goes with the upload; if it changes after
//! a multipart upload started, the finished object's metadata is rewritten in place.
//!
//! [`copy_object`] copies inside the store, for metadata changes and renames.

mod early_parts;
mod error;
pub mod journal;
pub mod liveness;
pub mod multipart;
mod part_buffer;
pub mod recovery;
pub mod staging;
pub mod write_back;

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::memory::{MemoryLimiter, Reservation};
use bucketfs_client::store::{Metadata, ObjectStore, StoreError, WriteCondition};
pub use error::WriteError;
use journal::Journal;
use multipart::MultipartUpload;
use part_buffer::PartBuffer;
use staging::StagingConfig;
use write_back::PendingFile;

/// S3's smallest part (except the last) and largest part.
pub const MIN_PART: u64 = 5 * 1024 * 1024;
const MAX_PART: u64 = 5 * 1024 * 1024 * 1024;
/// First size of a new file's buffer (see `Upload::grow_buffer`).
const FIRST_BUFFER: usize = 64 * 1024;
/// Parts per size step: part `n` (from 1) is `base << ((n - 1) / PARTS_PER_STEP)`.
const PARTS_PER_STEP: i32 = 1000;
const MAX_PARTS: u64 = 10_000;
/// Parts of a staging file uploaded at once.
const UPLOAD_CONCURRENCY: usize = 4;
/// Parts of a multipart copy (raised so that 10,000 of them hold the object), and how
/// many are copied at once. A copy request answers only once its bytes are copied (MinIO
/// sends nothing meanwhile), so each must be done well within `--read-timeout`: one
/// CopyObject of 4 GiB took 12-13 s on the development VM, past a 5 s read timeout. Parts
/// of 128 MiB, 8 at a time, keep each request to a few seconds there.
pub(crate) const COPY_PART: u64 = 128 * 1024 * 1024;
const COPY_CONCURRENCY: usize = 8;
/// Largest object copied with one CopyObject (S3 allows 5 GiB): a part's worth, for the
/// same reason.
const MAX_SINGLE_COPY: u64 = COPY_PART;

/// Size of part `number` (from 1) for a base part size.
pub fn part_size_for(base: u64, number: i32) -> u64 {
    let doublings = ((number.max(1) - 1) / PARTS_PER_STEP) as u32;
    base.max(MIN_PART).checked_shl(doublings).unwrap_or(MAX_PART).min(MAX_PART)
}

/// What a write did to a file's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Taken: the file's size now.
    Size(u64),
    /// Not taken: this kind of output cannot take it. The file moves on to another
    /// output, which can (`Fs::write` makes the move and writes again).
    Refused(Move),
}

impl Written {
    /// The size, for a write the caller knows the output takes (a fresh output fed in
    /// order); a refusal is then a broken rule, said as such.
    pub fn size(self) -> Result<u64, WriteError> {
        match self {
            Written::Size(size) => Ok(size),
            Written::Refused(change) => Err(WriteError::Local(format!("a fresh output refused a write: {change:?}"))),
        }
    }
}

/// Where a file open for writing goes on when its output refuses a write. Each move goes
/// forward (see `Fs::write`), and the write is tried again in the new output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// A streamed upload stored its object already (after `fsync`, or a close while
    /// another descriptor stays open): go on in a staging file that starts as that object.
    StagedFromStored,
    /// A write over bytes a streamed upload already sent as parts (which a multipart
    /// upload cannot take back): store what was written, then go on staged from it.
    StoreThenStaged,
    /// `--write-back`: a streamed file written past its first part goes on in a staging
    /// file, so that its close can log it whole.
    StagedPastOnePart,
    /// `--write-back`: a staging file written past half the log's limit goes on as a
    /// streamed upload, as without the option.
    StreamedPastLimit,
}

/// What a streamed upload holds of a range a reader asks for.
#[derive(Debug)]
pub enum HeldBytes {
    /// The bytes, still here.
    Here(Bytes),
    /// The upload stored its object: read that instead.
    Stored,
    /// Sent as parts already, which S3 gives back only once the upload completes.
    Sent,
}

struct Part {
    number: i32,
    /// Sends the part; holds its memory until the request ends.
    task: JoinHandle<Result<String, StoreError>>,
}

struct Multipart {
    /// Started for the key the file had then (it may have been renamed since).
    upload: MultipartUpload,
    in_flight: VecDeque<Part>,
    done: Vec<(i32, String)>,
    next_number: i32,
}

#[derive(Default)]
struct State {
    /// Bytes `[sent, sent + buffer.len())` of the file, not yet handed to S3.
    buffer: PartBuffer,
    /// The buffer's allocation in memory, counted against `--memory-limit`; handed to
    /// the part. `None` while the buffer is spilled to disk.
    buffer_memory: Option<Reservation>,
    sent: u64,
    multipart: Option<Multipart>,
    /// Set once committed (or failed): later commits return the same answer.
    outcome: Option<Result<Option<String>, StoreError>>,
    /// Size of the object stored by the commit.
    stored_size: u64,
    /// The file was unlinked while open: commit uploads nothing.
    discarded: bool,
    /// Write without If-None-Match: the key holds our own (empty) object, or the file was
    /// renamed over whatever holds it.
    replace: bool,
    /// The ETag of the object this file replaces (`O_TRUNC`, a rename over a stored file,
    /// our own empty object written again), for a write-back log replay.
    replaces: Option<String>,
    /// The metadata the object is to have.
    metadata: Metadata,
    /// The metadata the multipart upload was started with.
    started_with: Option<Metadata>,
    /// The bytes of a file stored in one PUT, kept where asked
    /// ([`Upload::keeping_stored_bytes`]) until taken.
    stored_bytes: Option<Bytes>,
    /// Its bytes go on in a staging file ([`Upload::hand_over_unsent`]).
    handed_over: bool,
}

/// What a rename did to a file being written (or closed and not stored yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renamed {
    /// It is stored already: the object must be moved.
    Stored,
    /// It will be stored at the new key. `old_key_holds`: an object this file replaces
    /// is at the old key and must go (a new file not stored yet leaves nothing there).
    Pending { old_key_holds: bool },
}

pub struct Upload {
    store: Arc<dyn ObjectStore>,
    /// Where the object goes (changed by a rename while open).
    key: parking_lot::Mutex<String>,
    /// Create-only (If-None-Match): a new file must not replace one another client created.
    create_only: bool,
    part_size: u64,
    memory: Arc<MemoryLimiter>,
    /// Where part buffers spill when memory is short, and where uploads are recorded.
    staging: StagingConfig,
    /// Keep the bytes of a file stored in one PUT for [`Upload::take_stored_bytes`].
    keep_stored_bytes: bool,
    /// Send no part: a write past the first part is refused ([`Move::StagedPastOnePart`])
    /// (`--write-back`, which stages such a file and uploads it after close).
    one_part_only: bool,
    /// Signalled when a hand-over to a staging file ends ([`Upload::handed_over`]).
    hand_over_ended: tokio::sync::Notify,
    state: Mutex<State>,
}

impl Upload {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        key: String,
        create_only: bool,
        part_size: u64,
        memory: Arc<MemoryLimiter>,
        staging: StagingConfig,
        metadata: Metadata,
    ) -> Self {
        let state = State { metadata, ..State::default() };
        let key = parking_lot::Mutex::new(key);
        let part_size = part_size.max(MIN_PART);
        let state = Mutex::new(state);
        Self {
            store,
            key,
            create_only,
            part_size,
            memory,
            staging,
            keep_stored_bytes: false,
            one_part_only: false,
            hand_over_ended: tokio::sync::Notify::new(),
            state,
        }
    }

    /// Sends no part (see [`Upload::one_part_only`]).
    pub fn one_part_only(mut self, only: bool) -> Self {
        self.one_part_only = only;
        self
    }

    /// The ETag of the object this file replaces, if any, and whether it must not replace
    /// another client's object (a new file): what a staging file going on from it needs.
    pub async fn replaced(&self) -> (bool, Option<String>) {
        let state = self.state.lock().await;
        let create_only = self.create_only && !state.replace;
        (create_only, if create_only { None } else { state.replaces.clone() })
    }

    /// Hands what was written over to the caller, who goes on in a staging file
    /// ([`Move::StagedPastOnePart`]): the bytes and the metadata. Until the caller says how
    /// that went ([`Upload::handed_over`]), writes are refused the same way (the caller
    /// holds them back). `None` if it stored or sent anything, or is being handed over.
    pub async fn hand_over_unsent(&self) -> Option<(Bytes, Metadata)> {
        let mut state = self.state.lock().await;
        if state.outcome.is_some() || state.multipart.is_some() || state.discarded || state.handed_over {
            return None;
        }
        let data = state.buffer.read(0..state.buffer.len()).ok()?;
        state.handed_over = true;
        Some((data, state.metadata.clone()))
    }

    /// After [`Upload::hand_over_unsent`]: the staging file took the bytes (`true`: this
    /// upload stores nothing, and its writes are refused), or could
    /// not (`false`: it goes on as before).
    pub async fn handed_over(&self, taken: bool) {
        let mut state = self.state.lock().await;
        state.handed_over = taken;
        state.discarded |= taken;
        self.hand_over_ended.notify_waiters();
    }

    /// Its bytes went on in a staging file: it stores nothing, and its commit is no news.
    pub async fn moved(&self) -> bool {
        self.state.lock().await.handed_over
    }

    /// Keeps the bytes of the file, if it is stored in one PUT, until
    /// [`Upload::take_stored_bytes`] (for the data cache): no copy, they are the PUT's.
    pub fn keeping_stored_bytes(mut self, keep: bool) -> Self {
        self.keep_stored_bytes = keep;
        self
    }

    /// The bytes of the file once stored in one PUT (see [`Upload::keeping_stored_bytes`]).
    pub async fn take_stored_bytes(&self) -> Option<Bytes> {
        let mut state = self.state.lock().await;
        let stored = matches!(state.outcome, Some(Ok(Some(_))));
        state.stored_bytes.take().filter(|_| stored)
    }

    /// The file replaces the object at ETag `etag` (`O_TRUNC` of an existing file).
    pub fn replacing(mut self, etag: Option<String>) -> Self {
        self.state.get_mut().replaces = etag;
        self
    }

    /// The whole file, if it is not stored yet and small enough to be one PUT (no part
    /// was sent): what `--write-back` records in its log at close.
    pub async fn pending_whole(&self) -> Option<PendingFile> {
        let state = self.state.lock().await;
        if state.outcome.is_some() || state.multipart.is_some() || state.discarded {
            return None;
        }
        let data = state.buffer.read(0..state.buffer.len()).ok()?;
        let create_only = self.create_only && !state.replace;
        let replaces = if create_only { None } else { state.replaces.clone() };
        Some(PendingFile {
            key: self.key(),
            data: write_back::Contents::Memory(data),
            metadata: state.metadata.clone(),
            create_only,
            replaces,
            delete: false,
        })
    }

    fn journal(&self) -> Option<&Journal> {
        self.staging.journal.as_deref()
    }

    /// The metadata the object will have (or has, once committed).
    pub async fn metadata(&self) -> Metadata {
        self.state.lock().await.metadata.clone()
    }

    /// Changes the metadata the object will have; `None` if it was already committed
    /// (a later change is the object's own business, see [`copy_object`]).
    pub async fn update_metadata(&self, change: impl FnOnce(&mut Metadata)) -> Option<Metadata> {
        let mut state = self.state.lock().await;
        if state.outcome.is_some() {
            return None;
        }
        change(&mut state.metadata);
        Some(state.metadata.clone())
    }

    /// Changes the metadata the object will have if that costs no request: before the
    /// commit, and before a multipart upload started (its metadata is fixed then, and a
    /// change would cost a copy at completion). `false` if nothing was changed.
    pub async fn update_metadata_if_free(&self, change: impl FnOnce(&mut Metadata)) -> bool {
        let mut state = self.state.lock().await;
        if state.outcome.is_some() || state.started_with.is_some() {
            return false;
        }
        change(&mut state.metadata);
        true
    }

    pub fn key(&self) -> String {
        self.key.lock().clone()
    }

    /// The file was renamed to `key` while open (or closed, not stored yet): the object
    /// goes there (replacing what is there, the object of ETag `replaces` if known),
    /// unless it was already committed: then it is in the store to move.
    pub async fn rename(&self, key: String, replaces: Option<String>) -> Renamed {
        let mut state = self.state.lock().await;
        if state.outcome.is_some() {
            return Renamed::Stored;
        }
        let old_key_holds = self.key_may_hold_object(&state);
        state.replace = true;
        // What the file replaced was at its old key.
        state.replaces = replaces;
        *self.key.lock() = key;
        Renamed::Pending { old_key_holds }
    }

    /// The object it stored was moved to `key`, where it has `etag` (a rename of a file
    /// stored while it stays open, by `fsync` or its opener's `flush`): what is written
    /// next, starting over or going on in a staging file from that object, goes there.
    pub async fn relocated(&self, key: String, etag: Option<String>) {
        let mut state = self.state.lock().await;
        if let Some(Ok(stored)) = &mut state.outcome {
            *stored = etag;
        }
        *self.key.lock() = key;
    }

    /// Whether the file's key may hold an object while the file is not stored: a new
    /// file holds nothing there; anything else (a replaced object, our own empty one, a
    /// name renamed over) leaves what a rename or unlink must delete.
    fn key_may_hold_object(&self, state: &State) -> bool {
        !self.create_only || state.replace
    }

    /// The file was unlinked before its upload started (closed with `--write-back`):
    /// nothing will be stored. `Some(old_key_holds)`, as for [`Upload::rename`]; `None` if
    /// it was committed already (the stored object is to be deleted).
    pub async fn discard_unstored(&self) -> Option<bool> {
        let mut state = self.state.lock().await;
        if state.outcome.is_some() {
            return None;
        }
        state.discarded = true;
        Some(self.key_may_hold_object(&state))
    }

    /// Accepts `data` at `offset`; returns the file size so far.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<Written, WriteError> {
        let mut state = self.state.lock().await;
        let end = offset + data.len() as u64;
        if state.handed_over || (self.one_part_only && end > self.part_size && state.outcome.is_none()) {
            return Ok(Written::Refused(Move::StagedPastOnePart));
        }
        if state.discarded {
            // Unlinked while open: nothing will be stored, the writes go nowhere (as on a
            // local disk, where they go to a file no name reaches).
            return Ok(Written::Size(end));
        }
        match &state.outcome {
            None => {}
            Some(Err(error)) => return Err(error.clone().into()),
            // Shells open a file, dup2() it and close the first descriptor before writing:
            // that close committed an empty object, which the writes now replace (the
            // version a write-back log replay must find there).
            Some(Ok(_)) if state.stored_size == 0 && offset == 0 => {
                state.replaces = state.outcome.take().and_then(Result::ok).flatten();
                state.replace = true;
            }
            // Anything else builds on the stored object, which only a staging file can do.
            Some(Ok(_)) => return Ok(Written::Refused(Move::StagedFromStored)),
        }
        if offset < state.sent {
            return Ok(Written::Refused(Move::StoreThenStaged));
        }
        let mut position = (offset - state.sent) as usize;
        let mut data = data;
        while !data.is_empty() || position > state.buffer.len() {
            // Fill up to the end of the current part, zero-filling a hole before `offset`.
            let part_end = self.current_part_size(&state) as usize;
            let needed = (position + data.len()).min(part_end);
            if !state.buffer.is_spilled() && reserved(&state) < needed {
                self.grow_buffer(&mut state, needed, part_end).await?;
            }
            if position > state.buffer.len() {
                state.buffer.zero_fill_to(position.min(part_end))?;
            } else {
                // `position < part_end` here: a full buffer is always sent below.
                let take = data.len().min(part_end - position);
                state.buffer.write_at(position, &data[..take])?;
                data = &data[take..];
                position += take;
            }
            // One part only: a file of exactly one part is one PUT at commit.
            if state.buffer.len() >= part_end && !self.one_part_only {
                self.send_part(&mut state, part_end).await?;
                position -= part_end;
            }
        }
        Ok(Written::Size(state.sent + state.buffer.len() as u64))
    }

    /// Makes the object durable in the bucket (or reports why it is not). Idempotent.
    pub async fn commit(&self) -> Result<Option<String>, WriteError> {
        // A close's upload that starts while the file moves to a staging file (a write on
        // another descriptor) waits for the move: the bytes handed over are stored by the
        // staging file, never here too.
        let mut state =
            lock_after_hand_over(&self.state, &self.hand_over_ended, |s| s.handed_over && !s.discarded).await;
        if let Some(outcome) = &state.outcome {
            return outcome.clone().map_err(Into::into);
        }
        if state.handed_over {
            return Ok(None); // moved: see `Upload::moved`
        }
        let size = state.sent + state.buffer.len() as u64;
        let outcome = if state.discarded {
            self.abort(&mut state).await;
            Ok(None)
        } else {
            self.finish(&mut state).await
        };
        if outcome.is_err() {
            self.abort(&mut state).await;
            state.stored_bytes = None;
        }
        state.stored_size = if outcome.is_ok() && !state.discarded { size } else { 0 };
        state.outcome = Some(outcome.clone());
        state.buffer_memory = None;
        outcome.map_err(Into::into)
    }

    /// Stores the file as a copy of `source` (version `etag`, `size` bytes) made inside
    /// the store, if nothing was written to it yet; `false` (nothing done) otherwise. The
    /// file is then stored, as after `fsync`: a later write goes on in a staging file
    /// that starts as the copy (see [`CopyInto`] for a new file's key).
    /// `changed` changes the metadata the copy gets (its times), once the copy is decided.
    pub async fn store_copy_of(
        &self,
        source: &str,
        etag: &str,
        size: u64,
        changed: impl FnOnce(&mut Metadata),
    ) -> Result<bool, WriteError> {
        let mut state = self.state.lock().await;
        let untouched = state.outcome.is_none()
            && state.sent == 0
            && state.buffer.len() == 0
            && state.multipart.is_none()
            && !state.discarded;
        if !untouched {
            return Ok(false);
        }
        changed(&mut state.metadata);
        let claim = self.create_only && !state.replace;
        let copy = CopyInto { key: &self.key(), metadata: &state.metadata, claim };
        let outcome = copy.of(&self.store, self.journal(), source, etag, size).await;
        state.replace = true;
        state.stored_size = if outcome.is_ok() { size } else { 0 };
        state.outcome = Some(outcome.clone());
        state.buffer_memory = None;
        outcome?;
        Ok(true)
    }

    /// Appends `len` bytes at `from` of `source` (version `etag`) to the file at `to`, as
    /// parts copied inside the store (UploadPartCopy), if `to` is where the file's next
    /// part starts (everything written so far was sent as parts, nothing is buffered) and
    /// `len` makes parts S3 takes (at least 5 MiB); `false` (nothing done) otherwise. The
    /// file goes on as before: later writes are the parts after the copied ones.
    pub async fn append_copy_of(
        &self,
        source: &str,
        etag: &str,
        from: u64,
        to: u64,
        len: u64,
    ) -> Result<bool, WriteError> {
        let mut state = self.state.lock().await;
        let next_part = state.multipart.as_ref().map_or(1, |m| m.next_number) as u64;
        let appends = to == state.sent && state.buffer.len() == 0 && state.outcome.is_none() && !state.discarded;
        if !appends || len < MIN_PART || next_part + len.div_ceil(COPY_PART) > MAX_PARTS + 1 {
            return Ok(false);
        }
        if let Err(error) = self.copy_parts(&mut state, source, etag, from..from + len).await {
            state.outcome = Some(Err(error.clone()));
            self.abort(&mut state).await;
            return Err(error.into());
        }
        state.sent += len;
        Ok(true)
    }

    /// Copies `range` of `source` as the next parts, once the parts in flight are done
    /// (parts complete in the order of their numbers).
    async fn copy_parts(
        &self,
        state: &mut State,
        source: &str,
        etag: &str,
        range: std::ops::Range<u64>,
    ) -> Result<(), StoreError> {
        self.start_multipart(state).await?;
        let Some(multipart) = state.multipart.as_mut() else { unreachable!("started above") };
        while let Some(part) = multipart.in_flight.pop_front() {
            multipart.done.push((part.number, join(part.task).await?));
        }
        // Parts of at most COPY_PART, as even as can be: each at least half of it, or
        // the whole range.
        let size = (range.end - range.start).div_ceil((range.end - range.start).div_ceil(COPY_PART));
        let first = multipart.next_number;
        let copied = copy_as_parts(&multipart.upload, source, Some(etag), range, size, first).await?;
        multipart.next_number = first + copied.len() as i32;
        multipart.done.extend(copied);
        Ok(())
    }

    /// The file's multipart upload, started (with the metadata it has now) if it was not.
    async fn start_multipart(&self, state: &mut State) -> Result<(), StoreError> {
        if state.multipart.is_none() {
            let upload = MultipartUpload::start(&self.store, self.journal(), &self.key(), &state.metadata).await?;
            state.started_with = Some(state.metadata.clone());
            state.multipart = Some(Multipart { upload, in_flight: VecDeque::new(), done: Vec::new(), next_number: 1 });
        }
        Ok(())
    }

    /// The object this upload stored, as (ETag, size); `None` until committed.
    pub async fn stored(&self) -> Option<(Option<String>, u64)> {
        let state = self.state.lock().await;
        match &state.outcome {
            Some(Ok(etag)) => Some((etag.clone(), state.stored_size)),
            _ => None,
        }
    }

    /// The file was unlinked while open for writing: upload nothing.
    pub async fn discard(&self) {
        self.state.lock().await.discarded = true;
    }

    /// Bytes of the file while they are still here, for readers of a file being written.
    pub async fn read(&self, offset: u64, len: u64) -> Result<HeldBytes, WriteError> {
        let state = self.state.lock().await;
        if state.outcome.is_some() {
            return Ok(HeldBytes::Stored);
        }
        let end = offset.saturating_add(len).min(state.sent + state.buffer.len() as u64);
        if offset >= end {
            return Ok(HeldBytes::Here(Bytes::new()));
        }
        if offset < state.sent {
            return Ok(HeldBytes::Sent);
        }
        Ok(HeldBytes::Here(state.buffer.read((offset - state.sent) as usize..(end - state.sent) as usize)?))
    }

    async fn finish(&self, state: &mut State) -> Result<Option<String>, StoreError> {
        let create_only = self.create_only && !state.replace;
        let key = self.key();
        let size = state.sent + state.buffer.len() as u64;
        let memory = self.memory_to_send(state).await;
        let buffer = state.buffer.take_front(size as usize).map_err(|error| StoreError::Other {
            message: format!("reading the part buffer spilled to disk: {error}"),
            request_id: None,
        })?;
        let Some(mut multipart) = state.multipart.take() else {
            if self.keep_stored_bytes {
                state.stored_bytes = Some(buffer.clone());
            }
            return self.store.put(&key, buffer, &state.metadata, &WriteCondition::absent_if(create_only)).await;
        };
        if !buffer.is_empty() {
            let number = multipart.next_number;
            let part = self.spawn_part(&multipart, number, buffer, memory);
            multipart.in_flight.push_back(part);
        }
        let result = async {
            while let Some(part) = multipart.in_flight.pop_front() {
                multipart.done.push((part.number, join(part.task).await?));
            }
            let parts = std::mem::take(&mut multipart.done);
            let started = multipart.upload.key().to_owned();
            let create_only = create_only && started == key;
            let etag = multipart.upload.complete(parts, &WriteCondition::absent_if(create_only)).await?;
            if started == key && state.started_with.as_ref() == Some(&state.metadata) {
                return Ok(etag);
            }
            // Renamed, or attributes changed, after the upload started: copy the object
            // to where it belongs, with the metadata it must have.
            let journal = self.journal();
            let etag =
                copy_object(&self.store, journal, &started, &key, size, etag.as_deref(), &state.metadata).await?;
            if started != key {
                self.store.delete(&started).await?;
            }
            Ok(etag)
        }
        .await;
        if result.is_err() {
            state.multipart = Some(multipart); // for `abort`
        }
        result
    }

    async fn abort(&self, state: &mut State) {
        if let Some(multipart) = state.multipart.take() {
            for part in &multipart.in_flight {
                part.task.abort();
            }
            multipart.upload.abort().await;
        }
    }

    fn current_part_size(&self, state: &State) -> u64 {
        let number = state.multipart.as_ref().map_or(1, |m| m.next_number);
        part_size_for(self.part_size, number)
    }

    /// Sends the first `len` buffered bytes as the next part (the buffer's reservation
    /// goes with it; the next buffer waits for memory in `grow_buffer`).
    async fn send_part(&self, state: &mut State, len: usize) -> Result<(), WriteError> {
        self.start_multipart(state).await?;
        // The part keeps the buffer's reservation until it is uploaded.
        let memory = self.memory_to_send(state).await;
        let data = state.buffer.take_front(len)?;
        let Some(multipart) = state.multipart.as_mut() else { unreachable!("started above") };
        let number = multipart.next_number;
        multipart.next_number += 1;
        let part = self.spawn_part(multipart, number, data, memory);
        multipart.in_flight.push_back(part);
        state.sent += len as u64;
        Ok(())
    }

    /// Makes room for `needed` bytes in the part buffer. The first part's buffer grows by
    /// doubling from [`FIRST_BUFFER`], so a small file holds and reserves little more than
    /// its size (an 8 MiB buffer per file would spend the memory budget on 1,000 open
    /// small files); once a file has sent a part, its buffers are whole parts.
    ///
    /// While the memory budget is spent, this waits for parts in flight (this file's or
    /// others') to come back, so fast writers slow down instead of growing. With none in
    /// flight, only the programs can free memory (their files' buffers fill as they
    /// write), so waiting could last forever: the buffer spills to disk instead
    /// (`part_buffer`). A part of this file that failed ends the upload here.
    async fn grow_buffer(&self, state: &mut State, needed: usize, part_end: usize) -> Result<(), WriteError> {
        let capacity = if state.multipart.is_some() {
            part_end
        } else {
            needed.next_power_of_two().max(2 * reserved(state)).clamp(FIRST_BUFFER, part_end)
        };
        self.reap_finished_parts(state).await?;
        let more = match self.memory.reserve_writing((capacity - reserved(state)) as u64).await {
            Some(more) => more,
            None if state.buffer.spill(&self.staging, part_end) => {
                // Nothing in flight will free memory: the part fills on disk instead.
                state.buffer_memory = None;
                return Ok(());
            }
            // No disk either: hold it in memory past the budget rather than fail a write.
            None => self.memory.reserve((capacity - reserved(state)) as u64),
        };
        match &mut state.buffer_memory {
            Some(held) => held.absorb(more),
            None => state.buffer_memory = Some(more),
        }
        state.buffer.reserve_memory(capacity);
        Ok(())
    }

    /// The reservation that goes with the buffer's bytes when they are sent: the
    /// buffer's own, or, for a buffer spilled to disk, memory to read it back into
    /// (waiting for parts in flight like any writer; past the budget if none are).
    async fn memory_to_send(&self, state: &mut State) -> Reservation {
        if let Some(memory) = state.buffer_memory.take() {
            return memory;
        }
        let len = state.buffer.len() as u64;
        if len == 0 {
            return self.memory.reserve(0);
        }
        match self.memory.reserve_writing(len).await {
            Some(memory) => memory,
            None => self.memory.reserve(len),
        }
    }

    /// Collects this file's parts that are done; the first failure aborts the upload.
    async fn reap_finished_parts(&self, state: &mut State) -> Result<(), WriteError> {
        while let Some(multipart) = state.multipart.as_mut() {
            if !multipart.in_flight.front().is_some_and(|part| part.task.is_finished()) {
                break;
            }
            let Some(part) = multipart.in_flight.pop_front() else { break };
            match join(part.task).await {
                Ok(etag) => multipart.done.push((part.number, etag)),
                Err(error) => {
                    state.outcome = Some(Err(error.clone()));
                    self.abort(state).await;
                    return Err(error.into());
                }
            }
        }
        Ok(())
    }

    fn spawn_part(&self, multipart: &Multipart, number: i32, data: Bytes, memory: Reservation) -> Part {
        let send = multipart.upload.part_task(number, data);
        // The part's memory comes back when its request ends, not when this file next
        // looks at it: other writers wait for exactly that.
        let memory = memory.in_flight();
        let task = tokio::spawn(async move {
            let result = send.await;
            drop(memory);
            result
        });
        Part { number, task }
    }
}

/// Locks `state` once no move of its file to another output is under way (`moving` says
/// whether one is; `ended` is signalled when one ends): a commit then never stores bytes
/// being handed over (`Upload::commit`, `Staged::commit`).
pub(super) async fn lock_after_hand_over<'a, S>(
    state: &'a Mutex<S>,
    ended: &tokio::sync::Notify,
    moving: impl Fn(&S) -> bool,
) -> tokio::sync::MutexGuard<'a, S> {
    loop {
        // Registered before the check, so an end between the check and the wait is not missed.
        let ended = ended.notified();
        let guard = state.lock().await;
        if !moving(&guard) {
            return guard;
        }
        drop(guard);
        ended.await;
    }
}

/// Bytes of the part buffer counted against the memory budget.
fn reserved(state: &State) -> usize {
    state.buffer_memory.as_ref().map_or(0, |r| r.bytes() as usize)
}

/// What a file open for writing writes into: a streamed upload (new or truncated files
/// written front to back) or a staging file (changes in place, `O_RDWR`).
// One per open file, inside the writer's `Arc`: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Output {
    Streamed(Upload),
    Staged(staging::Staged),
}

impl Output {
    /// Accepts `data` at `offset` (the file's size after it), or refuses it for another
    /// kind of output to take.
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<Written, WriteError> {
        match self {
            Output::Streamed(upload) => upload.write(offset, data).await,
            Output::Staged(staged) => staged.write(offset, data).await,
        }
    }

    pub fn is_staged(&self) -> bool {
        matches!(self, Output::Staged(_))
    }

    /// Its bytes went on in another output (`--write-back`: a file past one part staged,
    /// or past the limit streamed again): it stores nothing itself.
    pub async fn moved(&self) -> bool {
        match self {
            Output::Streamed(upload) => upload.moved().await,
            Output::Staged(staged) => staged.moved().await,
        }
    }

    /// See [`Upload::take_stored_bytes`]; `None` for a staging file.
    pub async fn take_stored_bytes(&self) -> Option<Bytes> {
        match self {
            Output::Streamed(upload) => upload.take_stored_bytes().await,
            Output::Staged(_) => None,
        }
    }

    /// See [`Upload::pending_whole`] and [`Staged::pending_whole`] (a new staging file).
    pub async fn pending_whole(&self) -> Option<PendingFile> {
        match self {
            Output::Streamed(upload) => upload.pending_whole().await,
            Output::Staged(staged) => staged.pending_whole().await,
        }
    }

    /// Stores what was written; `Some(etag)` when an object was stored (a streamed upload
    /// answers the same again after its one commit), `None` when nothing had changed.
    pub async fn commit(&self) -> Result<Option<Option<String>>, WriteError> {
        match self {
            Output::Streamed(upload) => upload.commit().await.map(Some),
            Output::Staged(staged) => staged.commit().await,
        }
    }

    pub async fn metadata(&self) -> Metadata {
        match self {
            Output::Streamed(upload) => upload.metadata().await,
            Output::Staged(staged) => staged.metadata().await,
        }
    }

    /// Changes the metadata the object will have; `None` if this output can no longer
    /// carry it (a streamed upload already committed).
    pub async fn update_metadata(&self, change: impl FnOnce(&mut Metadata)) -> Option<Metadata> {
        match self {
            Output::Streamed(upload) => upload.update_metadata(change).await,
            Output::Staged(staged) => Some(staged.update_metadata(change).await),
        }
    }

    /// Changes the metadata of a file closed with `--write-back` whose upload has not
    /// started; `None` once it started (the stored object is then to be changed). A
    /// staging file would take the change for a next commit that never comes.
    pub async fn update_metadata_unstored(&self, change: impl FnOnce(&mut Metadata)) -> Option<Metadata> {
        match self {
            Output::Streamed(upload) => upload.update_metadata(change).await,
            Output::Staged(staged) => staged.update_metadata_unstored(change).await,
        }
    }

    /// Changes the metadata that the next commit stores if it goes with an upload that
    /// is made anyway (see `Upload::update_metadata_if_free`, `Staged::update_metadata_if_free`).
    pub async fn update_metadata_if_free(&self, change: impl FnOnce(&mut Metadata)) -> bool {
        match self {
            Output::Streamed(upload) => upload.update_metadata_if_free(change).await,
            Output::Staged(staged) => staged.update_metadata_if_free(change).await,
        }
    }

    /// The file was renamed to `key`, where the object of ETag `replaces` is (`None`:
    /// nothing, or not known). Pending if the output takes care of it (nothing of it is
    /// in the store yet); stored if the stored object must be moved by the caller, who
    /// then calls [`Output::relocated`].
    pub async fn rename(&self, key: String, replaces: Option<String>) -> Renamed {
        match self {
            Output::Streamed(upload) => upload.rename(key, replaces).await,
            Output::Staged(staged) => staged.rename_unstored(key, replaces).await,
        }
    }

    /// The stored object was moved to `key`, where it has `etag`.
    pub async fn relocated(&self, key: String, etag: Option<String>) {
        match self {
            Output::Streamed(upload) => upload.relocated(key, etag).await,
            Output::Staged(staged) => staged.relocated(key, etag).await,
        }
    }

    /// See [`Upload::discard_unstored`] and [`Staged::discard_unstored`].
    pub async fn discard_unstored(&self) -> Option<bool> {
        match self {
            Output::Streamed(upload) => upload.discard_unstored().await,
            Output::Staged(staged) => staged.discard_unstored().await,
        }
    }

    pub async fn discard(&self) {
        match self {
            Output::Streamed(upload) => upload.discard().await,
            Output::Staged(staged) => staged.discard().await,
        }
    }

    pub fn key(&self) -> String {
        match self {
            Output::Streamed(upload) => upload.key(),
            Output::Staged(staged) => staged.key(),
        }
    }
}

/// A whole object copied inside the store into a file open for writing (`copy_file_range`
/// of a whole file into an empty one: `Upload::store_copy_of`, `Staged::store_copy_of`).
pub(crate) struct CopyInto<'a> {
    pub key: &'a str,
    pub metadata: &'a Metadata,
    /// A new file: its key is first claimed with an empty object (If-None-Match, as its own
    /// PUT would be), since a copy cannot be told to fail where another client created the
    /// key meanwhile; a failed copy removes the claim.
    pub claim: bool,
}

impl CopyInto<'_> {
    /// Copies `source` (version `etag`, `size` bytes); the copy's ETag.
    pub async fn of(
        &self,
        store: &Arc<dyn ObjectStore>,
        journal: Option<&Journal>,
        source: &str,
        etag: &str,
        size: u64,
    ) -> Result<Option<String>, StoreError> {
        if self.claim {
            store.put(self.key, Bytes::new(), self.metadata, &WriteCondition::Absent).await?;
        }
        let copied = copy_object(store, journal, source, self.key, size, Some(etag), self.metadata).await;
        if copied.is_err() && self.claim {
            let _ = store.delete(self.key).await; // best effort: the error is what matters
        }
        copied
    }
}

/// Copies `source` (at version `etag`, `size` bytes) to `key` with `metadata`, inside the
/// store: one CopyObject up to [`MAX_SINGLE_COPY`], a multipart copy (recorded in `journal`) above.
/// `source` may be `key`.
pub async fn copy_object(
    store: &Arc<dyn ObjectStore>,
    journal: Option<&Journal>,
    source: &str,
    key: &str,
    size: u64,
    etag: Option<&str>,
    metadata: &Metadata,
) -> Result<Option<String>, StoreError> {
    copy_object_in_parts_above(single_copy_limit(), store, journal, source, key, size, etag, metadata).await
}

/// Largest object copied with one CopyObject: [`MAX_SINGLE_COPY`], or less where a test says so
/// (`BUCKETFS_TEST_SINGLE_COPY_LIMIT`, bytes), so that multipart copies can be tested
/// without large objects.
fn single_copy_limit() -> u64 {
    static LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::env::var("BUCKETFS_TEST_SINGLE_COPY_LIMIT").ok().and_then(|v| v.parse().ok()).unwrap_or(MAX_SINGLE_COPY)
    })
}

#[allow(clippy::too_many_arguments)]
async fn copy_object_in_parts_above(
    single_copy_limit: u64,
    store: &Arc<dyn ObjectStore>,
    journal: Option<&Journal>,
    source: &str,
    key: &str,
    size: u64,
    etag: Option<&str>,
    metadata: &Metadata,
) -> Result<Option<String>, StoreError> {
    if size <= single_copy_limit {
        return store.copy(source, key, etag, metadata).await;
    }
    let part_size = COPY_PART.min(single_copy_limit).max(size.div_ceil(MAX_PARTS)).max(1);
    // A copy in parts is a new upload: the source's tags go with it only if it is told.
    let mut metadata = metadata.clone();
    metadata.tagging = match store.tagging(source).await {
        Ok(tagging) => tagging,
        Err(error) => {
            tracing::warn!(source, key, "the tags of the object are not copied: {error}");
            None
        }
    };
    let upload = MultipartUpload::start(store, journal, key, &metadata).await?;
    let parts = copy_as_parts(&upload, source, etag, 0..size, part_size, 1).await;
    upload.finish_with(async { parts }, &WriteCondition::Any).await
}

/// Copies `range` of `source` (at version `etag`) inside the store as parts `first`,
/// `first + 1`, … of `upload`, `part_size` bytes each (the last one the rest),
/// [`COPY_CONCURRENCY`] at a time; their numbers and ETags, in order.
async fn copy_as_parts(
    upload: &MultipartUpload,
    source: &str,
    etag: Option<&str>,
    range: std::ops::Range<u64>,
    part_size: u64,
    first: i32,
) -> Result<Vec<(i32, String)>, StoreError> {
    let parts = (range.end - range.start).div_ceil(part_size);
    let copies = (0..parts).map(|index| {
        let start = range.start + index * part_size;
        let part = start..(start + part_size).min(range.end);
        let number = first + index as i32;
        async move { Ok::<_, StoreError>((number, upload.copy_part(number, source, part, etag).await?)) }
    });
    futures::stream::iter(copies).buffered(COPY_CONCURRENCY).try_collect().await
}

async fn join(task: JoinHandle<Result<String, StoreError>>) -> Result<String, StoreError> {
    task.await.unwrap_or_else(|join| {
        Err(StoreError::Other { message: format!("upload task ended: {join}"), request_id: None })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bucketfs_client::store::memory::MemoryStore;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn part_sizes_fit_five_tebibytes_in_ten_thousand_parts() {
        let base = 8 * MIB;
        let total: u64 = (1..=10_000).map(|n| part_size_for(base, n)).sum();
        assert!(total >= 5 * 1024 * 1024 * MIB, "10,000 parts hold only {total} bytes");
        assert_eq!(part_size_for(base, 1), base);
        assert_eq!(part_size_for(base, 1000), base);
        assert_eq!(part_size_for(base, 1001), 2 * base);
        assert_eq!(part_size_for(MIB, 1), MIN_PART, "parts below S3's minimum are raised");
        assert!(part_size_for(base, 10_000) <= MAX_PART);
    }

    /// An upload of key `k` with the smallest parts and no journal.
    fn new_upload(store: Arc<MemoryStore>, create_only: bool, memory: Arc<MemoryLimiter>) -> Upload {
        new_upload_of(store, "k", create_only, memory)
    }

    fn new_upload_of(store: Arc<MemoryStore>, key: &str, create_only: bool, memory: Arc<MemoryLimiter>) -> Upload {
        let staging = StagingConfig { dir: std::env::temp_dir(), limit: MemoryLimiter::new(u64::MAX), journal: None };
        Upload::new(store, key.into(), create_only, MIN_PART, memory, staging, Metadata::default())
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
    }

    #[test]
    fn streamed_writes_with_holes_become_the_same_object() {
        let rt = runtime();
        let store = Arc::new(MemoryStore::default());
        let upload = new_upload(store.clone(), true, MemoryLimiter::new(64 * MIB));
        let mut expected = Vec::new();
        rt.block_on(async {
            let mut offset = 0u64;
            for i in 0..40u64 {
                let chunk = vec![(i % 251) as u8; 300_000];
                if i == 20 {
                    offset += 1_000_000; // a hole
                    expected.resize(offset as usize, 0);
                }
                upload.write(offset, &chunk).await.expect("write");
                expected.extend_from_slice(&chunk);
                offset += chunk.len() as u64;
            }
            upload.commit().await.expect("commit");
        });
        let stored = rt.block_on(store.get_range("k", 0..expected.len() as u64, None)).expect("get");
        assert_eq!(stored.len(), expected.len());
        assert!(stored[..] == expected[..], "content differs");
        assert_eq!(store.open_uploads(), 0);
    }

    #[test]
    fn failed_create_is_reported_at_commit_and_aborted() {
        let rt = runtime();
        let store = Arc::new(MemoryStore::with_keys([("k".to_owned(), b"theirs".to_vec())]));
        let upload = new_upload(store.clone(), true, MemoryLimiter::new(64 * MIB));
        rt.block_on(async {
            upload.write(0, &vec![1; 12 * MIB as usize]).await.expect("write");
            let error = upload.commit().await.expect_err("key exists");
            assert!(matches!(error, WriteError::Store(StoreError::AlreadyExists)), "{error:?}");
            let again = upload.commit().await.expect_err("same answer");
            assert!(matches!(again, WriteError::Store(StoreError::AlreadyExists)), "{again:?}");
        });
        assert_eq!(rt.block_on(store.get_range("k", 0..6, None)).expect("get"), &b"theirs"[..]);
        assert_eq!(store.open_uploads(), 0, "the multipart upload was aborted");
    }

    #[test]
    fn large_copies_go_in_parts_with_the_new_metadata() {
        let rt = runtime();
        let data: Vec<u8> = (0..20 * MIB as usize).map(|i| (i % 253) as u8).collect();
        let memory_store = Arc::new(MemoryStore::with_keys([("src".to_owned(), data.clone())]));
        let store: Arc<dyn ObjectStore> = memory_store.clone();
        let mut metadata = Metadata::default();
        metadata.user.insert("mode".into(), "33188".into());
        rt.block_on(async {
            let etag = store.head("src").await.expect("head").etag;
            let limit = 6 * MIB; // parts of 6 MiB: 6 + 6 + 6 + 2
            copy_object_in_parts_above(
                limit,
                &store,
                None,
                "src",
                "dst",
                data.len() as u64,
                etag.as_deref(),
                &metadata,
            )
            .await
            .expect("copy");
            let copied = store.get_range("dst", 0..data.len() as u64, None).await.expect("get");
            assert!(copied[..] == data[..], "copy differs");
            let stale = copy_object_in_parts_above(
                limit,
                &store,
                None,
                "src",
                "dst",
                data.len() as u64,
                Some("\"old\""),
                &metadata,
            );
            assert!(matches!(stale.await, Err(StoreError::Changed)), "copies are pinned to the ETag");
        });
        assert_eq!(memory_store.metadata("dst").expect("dst"), metadata);
        assert_eq!(memory_store.open_uploads(), 0, "the failed copy was aborted");
    }

    /// Ranges copied inside the store become the file's next parts, between parts written:
    /// the object is the written bytes and the copied ranges in the order given. A copy
    /// that does not start where the next part does (bytes still buffered), or is smaller
    /// than a part may be, is refused and leaves the file as it was.
    #[test]
    fn copied_ranges_are_parts_between_written_ones() {
        let rt = runtime();
        let source: Vec<u8> = (0..20 * MIB as usize).map(|i| (i % 251) as u8).collect();
        let store = Arc::new(MemoryStore::with_keys([("src".to_owned(), source.clone())]));
        let upload = new_upload(store.clone(), true, MemoryLimiter::new(64 * MIB));
        let part = MIN_PART as usize; // the test upload's part size
        let written = vec![7u8; part];
        rt.block_on(async {
            let etag = store.head("src").await.expect("head").etag.expect("etag");
            upload.write(0, &written).await.expect("write one part");
            let (from, len) = (MIB, 12 * MIB);
            assert!(upload.append_copy_of("src", &etag, from, part as u64, len).await.expect("copy"));
            let end = part as u64 + len;
            upload.write(end, b"tail").await.expect("write after the copy");
            let refused = upload.append_copy_of("src", &etag, 0, end + 4, 6 * MIB).await.expect("refused copy");
            assert!(!refused, "bytes are buffered: no part starts there");
            assert!(!upload.append_copy_of("src", &etag, 0, end, MIB).await.expect("small"), "below a part's size");
            upload.commit().await.expect("commit");
        });
        let mut expected = written;
        expected.extend_from_slice(&source[MIB as usize..13 * MIB as usize]);
        expected.extend_from_slice(b"tail");
        assert_eq!(rt.block_on(store.head("k")).expect("head").size, expected.len() as u64);
        let stored = rt.block_on(store.get_range("k", 0..expected.len() as u64, None)).expect("get");
        assert!(stored[..] == expected[..], "content differs");
        assert_eq!(store.open_uploads(), 0);
    }

    #[test]
    fn part_buffers_count_against_the_memory_budget() {
        let rt = runtime();
        let store = Arc::new(MemoryStore::default());
        let memory = MemoryLimiter::new(64 * MIB);
        let upload = new_upload(store, true, memory.clone());
        rt.block_on(async {
            upload.write(0, &[1; 1000]).await.expect("write");
            assert_eq!(memory.used(), FIRST_BUFFER as u64, "a small file reserves a small buffer");
            upload.write(1000, &vec![2; 300_000]).await.expect("write");
            assert_eq!(memory.used(), 512 * 1024, "the buffer grows by doubling");
            upload.write(301_000, &vec![3; MIN_PART as usize]).await.expect("write");
            assert!(memory.used() >= MIN_PART, "sent part and the next buffer are reserved");
            upload.commit().await.expect("commit");
        });
        assert_eq!(memory.used(), 0, "given back once committed");
    }

    /// One program writing 20 files in turns under a budget of three parts: nothing in
    /// flight can free memory while every file fills its first part, so buffers spill to
    /// disk instead of waiting forever or growing past the budget; every file is stored
    /// whole, and memory never exceeds the budget by more than one part being read back.
    #[test]
    fn files_written_in_turns_spill_instead_of_overdrawing() {
        let rt = runtime();
        let store = Arc::new(MemoryStore::default());
        let limit = 3 * MIN_PART;
        let memory = MemoryLimiter::new(limit);
        let uploads: Vec<_> =
            (0..20).map(|i| new_upload_of(store.clone(), &format!("f{i}"), true, memory.clone())).collect();
        let size = 2 * MIN_PART as usize + 12_345;
        let content = |i: usize| (0..size).map(|at| ((at * 7 + i) % 251) as u8).collect::<Vec<u8>>();
        let mut peak = 0;
        rt.block_on(async {
            let chunk = 256 * 1024;
            for offset in (0..size).step_by(chunk) {
                for (i, upload) in uploads.iter().enumerate() {
                    let end = (offset + chunk).min(size);
                    upload.write(offset as u64, &content(i)[offset..end]).await.expect("write");
                    peak = peak.max(memory.used());
                }
            }
            for upload in &uploads {
                upload.commit().await.expect("commit");
            }
        });
        for i in 0..20 {
            let stored = rt.block_on(store.get_range(&format!("f{i}"), 0..size as u64, None)).expect("get");
            assert!(stored[..] == content(i)[..], "file {i} differs");
        }
        assert!(peak <= limit + MIN_PART, "peak {peak} bytes reserved for a budget of {limit}");
        assert_eq!(memory.used(), 0);
        assert_eq!(store.open_uploads(), 0);
    }

    #[test]
    fn rewriting_sent_bytes_is_refused() {
        let rt = runtime();
        let store = Arc::new(MemoryStore::default());
        let upload = new_upload(store, false, MemoryLimiter::new(64 * MIB));
        rt.block_on(async {
            upload.write(0, &vec![1; 6 * MIB as usize]).await.expect("write");
            let refused = upload.write(10, b"x").await.expect("write");
            assert_eq!(refused, Written::Refused(Move::StoreThenStaged), "already sent");
        });
    }
}
