//! [`RangeBody`]: the body of one ranged GET as it arrives, shared between the request
//! that fills it and the readers that wait on it.
//!
//! A read that falls in a range still being fetched (read-ahead) waits only until its own
//! bytes have arrived, not for the rest of the range: the GET appends the response's
//! chunks as the network hands them over, and each waiter wakes when the body has grown
//! past what it needs, or when the GET failed.
//!
//! The bytes go into buffers of [`CHUNK`] bytes (the last one shorter), each allocated
//! at its first write: what the reader budget reserved for the range is what it holds
//! (the network's own chunks can pin buffers larger than their bytes), and a read inside
//! one chunk is handed over without a copy ([`Bytes`] that share the buffer). Bytes
//! below `received` never change again; only the request writes, and only above it (see
//! [`Buffer`]). Chunks the reader has passed are given back ([`RangeBody::release_before`]),
//! so a long GET holds what is ahead of its reader, not all it has brought.
//!
//! The body also carries what makes a cut-short GET resumable: how much has arrived and
//! the ETag of the version it came from (see `S3Store::get_range_once`).
//!
//! A **paced** body ([`RangeBody::paced`]) takes its bytes only as far as its reader
//! allows ([`RangeBody::allow`]): one long GET then streams at the reader's pace, held
//! back by TCP's flow control, instead of one short GET per window. Each GET costs the
//! store a request (a MinIO sharing two cores with its readers spent about 1.8 ms of
//! CPU on each), and memory follows the reader, not the GET's length.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::watch;

use super::buffer_pool::POOL;
use super::StoreError;

/// Where a GET puts the bytes of its answer as they arrive: a [`RangeBody`], or a sink
/// that sorts them on their way (the shared cache's frames: each block's bytes into a
/// read's body once its checksum holds, the checksums aside).
pub trait BodySink: Send + Sync {
    /// Bytes taken so far: a GET cut short asks for the rest from there.
    fn received(&self) -> u64;
    /// The version the bytes must come from (`If-Match`), once known.
    fn etag(&self) -> Option<String>;
    /// Pins the version of the first answer, if none was asked for.
    fn pin_etag(&self, etag: Option<&str>);
    /// A version of a versioned bucket to read instead of the current one (`versionId`).
    fn version_id(&self) -> Option<&str>;
    /// Takes the next bytes. `false` means it takes no more (more came than the range
    /// holds, or the sink stopped): the GET ends there.
    fn append(&self, chunk: &[u8]) -> bool;
    /// Whether the sink wants more bytes now. A paced body that has what its reader
    /// allowed says no: the GET stops taking its answer until [`BodySink::room`].
    fn has_room(&self) -> bool {
        true
    }
    /// Resolves once the sink wants more bytes, has ended, or was abandoned: a GET
    /// that then finds no room ([`BodySink::has_room`]) ends there, short of its range.
    fn room(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

impl BodySink for RangeBody {
    fn received(&self) -> u64 {
        RangeBody::received(self)
    }
    fn etag(&self) -> Option<String> {
        RangeBody::etag(self)
    }
    fn pin_etag(&self, etag: Option<&str>) {
        RangeBody::pin_etag(self, etag)
    }
    fn version_id(&self) -> Option<&str> {
        RangeBody::version_id(self)
    }
    fn append(&self, chunk: &[u8]) -> bool {
        RangeBody::append(self, chunk)
    }
    fn has_room(&self) -> bool {
        RangeBody::has_room(self)
    }
    fn room(&self) -> BoxFuture<'_, ()> {
        Box::pin(RangeBody::room(self))
    }
}

/// The size of the buffers a body's bytes are kept in (see the module doc).
pub const CHUNK: u64 = 1 << 20;

pub struct RangeBody {
    buffer: Chunks,
    state: watch::Sender<Arrived>,
    /// A version of a versioned bucket to read instead of the current one (`versionId`).
    version_id: Option<String>,
}

struct Arrived {
    /// Bytes `0..received` of the buffer are written, and final.
    received: u64,
    /// The version the bytes come from: the pin asked for, or the first answer's ETag.
    etag: Option<String>,
    /// Set once, by [`RangeBody::finish`]; `Ok` only if every byte arrived.
    outcome: Option<Result<(), StoreError>>,
    /// A store answered the GET (its bytes are on the way), as opposed to a GET still
    /// waiting for its turn or its answer.
    answered: bool,
    /// Bytes the GET may take before it waits for the reader: the whole body unless
    /// paced. Only rises.
    allowed: u64,
    /// Nobody will allow more ([`RangeBody::abandon`]).
    abandoned: bool,
}

impl RangeBody {
    /// An empty body of `len` bytes, to be fetched from the version `etag` (any version
    /// if `None`: the first answer's is then pinned for the rest).
    pub fn new(len: u64, etag: Option<&str>) -> Self {
        let arrived = Arrived {
            received: 0,
            etag: etag.map(str::to_owned),
            outcome: None,
            answered: false,
            allowed: len,
            abandoned: false,
        };
        Self { buffer: Chunks::new(len as usize), state: watch::Sender::new(arrived), version_id: None }
    }

    /// The same body, fetched from version `id` of the object (a `.versions` file).
    pub fn of_version(self, id: Option<&str>) -> Self {
        Self { version_id: id.map(str::to_owned), ..self }
    }

    pub fn version_id(&self) -> Option<&str> {
        self.version_id.as_deref()
    }

    /// The same body, paced: its GET takes the first `allowed` bytes, then the next ones
    /// only as [`RangeBody::allow`] lets it.
    pub fn paced(self, allowed: u64) -> Self {
        self.state.send_modify(|state| state.allowed = allowed.min(self.buffer.len as u64));
        self
    }

    /// Lets the GET take the body's bytes up to `up_to` (a no-op below what it already may).
    pub fn allow(&self, up_to: u64) {
        let up_to = up_to.min(self.len());
        self.state.send_if_modified(|state| {
            let raised = up_to > state.allowed;
            state.allowed = state.allowed.max(up_to);
            raised
        });
    }

    /// Bytes the GET may take so far.
    pub fn allowed(&self) -> u64 {
        self.state.borrow().allowed
    }

    /// Whether the GET may take more bytes now: some are allowed and not yet here (or the
    /// body has ended, and the GET only runs to its end).
    pub fn has_room(&self) -> bool {
        let state = self.state.borrow();
        state.allowed > state.received || state.outcome.is_some()
    }

    /// Resolves once the GET may take more bytes, or the body has ended or was abandoned.
    pub async fn room(&self) {
        let mut arrivals = self.state.subscribe();
        let _ = arrivals
            .wait_for(|state| state.allowed > state.received || state.outcome.is_some() || state.abandoned)
            .await;
    }

    /// Nobody will allow the GET more than it may take now (its reader dropped the
    /// segment): a paced GET ends once it has that, instead of waiting for ever.
    pub fn abandon(&self) {
        self.state.send_if_modified(|state| {
            let newly = !state.abandoned;
            state.abandoned = true;
            newly
        });
    }

    pub fn len(&self) -> u64 {
        self.buffer.len as u64
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.len == 0
    }

    /// Bytes arrived so far (from offset 0 of the body).
    pub fn received(&self) -> u64 {
        self.state.borrow().received
    }

    pub fn etag(&self) -> Option<String> {
        self.state.borrow().etag.clone()
    }

    /// Whether a store answered the GET filling it (see [`RangeBody::pin_etag`]), or it is
    /// already whole.
    pub fn answered(&self) -> bool {
        let state = self.state.borrow();
        state.answered || state.outcome.is_some()
    }

    /// An answer came: pins the body to the version it came from, if nothing pinned it yet.
    pub fn pin_etag(&self, etag: Option<&str>) {
        self.state.send_if_modified(|state| {
            if state.etag.is_none() {
                state.etag = etag.map(str::to_owned);
            }
            state.answered = true;
            false
        });
    }

    /// Appends the next bytes of the body. Returns `false` (keeping only what fits) if the
    /// server sent more than the range.
    pub fn append(&self, chunk: &[u8]) -> bool {
        let mut fits = true;
        self.state.send_if_modified(|state| {
            if state.outcome.is_some() {
                return false; // ended (a task aborted mid-body): the buffer is final
            }
            let at = state.received as usize;
            let room = self.buffer.len - at;
            let chunk = if chunk.len() > room {
                fits = false;
                &chunk[..room]
            } else {
                chunk
            };
            if chunk.is_empty() {
                return false;
            }
            // Under the state's write lock: readers see the new length only after the
            // bytes are in, and nobody else writes.
            self.buffer.write(at, chunk);
            state.received += chunk.len() as u64;
            true
        });
        fits
    }

    /// Writes `bytes` after the `staged` bytes already written past what arrived, without
    /// handing them to readers: they are theirs once [`RangeBody::publish`]ed (a reader
    /// of the shared cache checks a block before its readers see it). Returns `false`,
    /// writing nothing, if they do not fit or the body has ended.
    pub fn stage(&self, staged: u64, bytes: &[u8]) -> bool {
        let mut written = false;
        self.state.send_if_modified(|state| {
            let at = (state.received + staged) as usize;
            if state.outcome.is_some() || at + bytes.len() > self.buffer.len {
                return false;
            }
            // Under the state's write lock, above `received`: no reader slices these bytes
            // until `publish` moves `received` past them, and nobody else writes.
            self.buffer.write(at, bytes);
            written = true;
            false // nothing new for readers yet
        });
        written
    }

    /// Hands the first `len` staged bytes to readers, as if appended.
    pub fn publish(&self, len: u64) {
        self.state.send_if_modified(|state| {
            if state.outcome.is_some() || len == 0 {
                return false;
            }
            assert!(state.received + len <= self.len(), "publishing past the body");
            state.received += len;
            true
        });
    }

    /// Ends the body with the GET's outcome; a success that left bytes missing is an
    /// interrupted transfer. Only the first call counts.
    pub fn finish(&self, result: Result<(), StoreError>) {
        self.state.send_if_modified(|state| {
            if state.outcome.is_some() {
                return false;
            }
            state.outcome = Some(match result {
                Ok(()) if state.received < self.len() => {
                    Err(StoreError::Interrupted(format!("body ended after {} of {} bytes", state.received, self.len())))
                }
                other => other,
            });
            true
        });
    }

    /// Every byte arrived.
    pub fn is_complete(&self) -> bool {
        matches!(self.state.borrow().outcome, Some(Ok(())))
    }

    /// The GET ended without every byte.
    pub fn has_failed(&self) -> bool {
        matches!(self.state.borrow().outcome, Some(Err(_)))
    }

    /// Bytes `range` of the body (offsets within it), as soon as they have arrived; the
    /// GET's error if it ended before them.
    pub async fn slice(&self, range: Range<u64>) -> Result<Bytes, StoreError> {
        debug_assert!(range.end <= self.len(), "slice {range:?} of a body of {}", self.len());
        let mut arrivals = self.state.subscribe();
        let state = arrivals
            .wait_for(|state| state.received >= range.end || state.outcome.is_some())
            .await
            .map_err(|_| StoreError::Other { message: "read body dropped".into(), request_id: None })?;
        if state.received < range.end {
            return Err(match &state.outcome {
                Some(Err(error)) => error.clone(),
                _ => StoreError::Interrupted("body ended early".into()),
            });
        }
        drop(state);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        self.buffer.slice(range.start as usize..range.end as usize).ok_or_else(|| StoreError::Other {
            message: format!("bytes {range:?} of a body were read after they were released"),
            request_id: None,
        })
    }

    /// Gives back the chunks that lie wholly below `offset` and have arrived: the reader
    /// has passed them. Returns where the bytes still held begin (a chunk boundary); a
    /// slice below it fails.
    pub fn release_before(&self, offset: u64) -> u64 {
        let state = self.state.borrow();
        let below = offset.min(state.received) / CHUNK * CHUNK;
        // Under the state's read lock: `append` writes no chunk below `received`.
        self.buffer.release_before(below as usize) as u64
    }

    /// Where the bytes still held begin (see [`RangeBody::release_before`]).
    pub fn released(&self) -> u64 {
        self.buffer.released() as u64
    }
}

/// A body's bytes, in buffers of [`CHUNK`] bytes: each allocated at its first write, and
/// dropped once released (a reader's slice keeps its buffer alive until it is done).
struct Chunks {
    len: usize,
    slots: parking_lot::Mutex<ChunkSlots>,
}

struct ChunkSlots {
    buffers: Vec<Option<Arc<Buffer>>>,
    /// Chunks below this index were released.
    released: usize,
}

impl Chunks {
    fn new(len: usize) -> Self {
        let count = len.div_ceil(CHUNK as usize);
        Self { len, slots: parking_lot::Mutex::new(ChunkSlots { buffers: vec![None; count], released: 0 }) }
    }

    fn chunk_len(&self, index: usize) -> usize {
        (self.len - index * CHUNK as usize).min(CHUNK as usize)
    }

    /// Writes `bytes` at `at`. Caller: the only writer, and nobody reads `at..` yet.
    fn write(&self, mut at: usize, mut bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len, "write past the body");
        while !bytes.is_empty() {
            let (index, within) = (at / CHUNK as usize, at % CHUNK as usize);
            let buffer = {
                let mut slots = self.slots.lock();
                if index < slots.released {
                    return; // released before it arrived: nobody reads it any more
                }
                let chunk_len = self.chunk_len(index);
                slots.buffers[index].get_or_insert_with(|| Arc::new(Buffer::new(chunk_len))).clone()
            };
            let part = bytes.len().min(buffer.len - within);
            buffer.write(within, &bytes[..part]);
            (at, bytes) = (at + part, &bytes[part..]);
        }
    }

    /// Bytes `range`, written; `None` if some were released. One chunk's bytes share its
    /// buffer; a range across chunks is copied.
    fn slice(&self, range: Range<usize>) -> Option<Bytes> {
        if range.is_empty() {
            return Some(Bytes::new());
        }
        let chunk = CHUNK as usize;
        let (first, last) = (range.start / chunk, (range.end - 1) / chunk);
        let buffers: Vec<Arc<Buffer>> = {
            let slots = self.slots.lock();
            (first..=last).map(|index| slots.buffers[index].clone()).collect::<Option<_>>()?
        };
        let piece = |index: usize, buffer: Arc<Buffer>| {
            let base = index * chunk;
            let within = range.start.max(base) - base..range.end.min(base + chunk) - base;
            Written { buffer, range: within }
        };
        if first == last {
            return buffers.into_iter().next().map(|buffer| Bytes::from_owner(piece(first, buffer)));
        }
        let mut joined = bytes::BytesMut::with_capacity(range.len());
        for (index, buffer) in (first..=last).zip(buffers) {
            joined.extend_from_slice(piece(index, buffer).as_ref());
        }
        Some(joined.freeze())
    }

    /// Drops the chunks wholly below `offset` (a chunk boundary, all written); returns
    /// where the chunks still held begin.
    fn release_before(&self, offset: usize) -> usize {
        let mut slots = self.slots.lock();
        let upto = (offset / CHUNK as usize).min(slots.buffers.len());
        for index in slots.released..upto {
            slots.buffers[index] = None;
        }
        slots.released = slots.released.max(upto);
        (slots.released * CHUNK as usize).min(self.len)
    }

    fn released(&self) -> usize {
        (self.slots.lock().released * CHUNK as usize).min(self.len)
    }
}

/// A buffer written once, front to back, while readers read what is already written.
///
/// Safety rests on two rules that [`RangeBody`] keeps: only `append` writes, under the
/// state's write lock, and only at `received` and above; readers make slices only of
/// bytes below a `received` they read under that lock, which are never written again.
/// No reference ever covers bytes still to be written.
struct Buffer {
    start: *mut u8,
    len: usize,
    capacity: usize,
}

// SAFETY: the buffer is plain bytes; concurrent access follows the rules above.
unsafe impl Send for Buffer {}
// SAFETY: as above: writes and reads never touch the same bytes at the same time.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(len: usize) -> Self {
        // Uninitialised (or a pooled buffer's old bytes): a byte is read only once written.
        let mut memory = std::mem::ManuallyDrop::new(POOL.take(len));
        Self { start: memory.as_mut_ptr(), len, capacity: memory.capacity() }
    }

    /// Writes `bytes` at `at`. Caller: the only writer, and nobody reads `at..` yet.
    fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len, "write past the buffer");
        // SAFETY: in bounds (checked above); no reference covers these bytes (see the
        // type's rules), and `bytes` is another allocation.
        unsafe { self.start.add(at).copy_from_nonoverlapping(bytes.as_ptr(), bytes.len()) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the allocation `new` took, with its capacity; u8 needs no drop. No
        // reader holds a slice: each holds the `Arc` this is dropped from.
        POOL.give_back(unsafe { Vec::from_raw_parts(self.start, 0, self.capacity) })
    }
}

/// Written bytes of a buffer, kept alive by the [`Bytes`] handed to a reader.
struct Written {
    buffer: Arc<Buffer>,
    range: Range<usize>,
}

impl AsRef<[u8]> for Written {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `range` was below `received` when made, so written and final.
        unsafe { std::slice::from_raw_parts(self.buffer.start.add(self.range.start), self.range.len()) }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    #[tokio::test]
    async fn a_waiter_wakes_once_its_bytes_arrived_not_the_whole_body() {
        let body = Arc::new(RangeBody::new(10, None));
        let waiter = tokio::spawn({
            let body = body.clone();
            async move { body.slice(2..4).await }
        });
        body.append(b"ab");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "bytes 2..4 have not arrived");
        body.append(b"cde");
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken").expect("task");
        assert_eq!(got.expect("bytes"), Bytes::from_static(b"cd"));
        assert!(!body.is_complete());
    }

    #[tokio::test]
    async fn a_failed_body_fails_waiters_past_what_arrived_only() {
        let body = RangeBody::new(10, Some("\"v1\""));
        body.append(b"abcd");
        body.finish(Err(StoreError::Changed));
        assert_eq!(body.slice(0..4).await.expect("arrived"), Bytes::from_static(b"abcd"));
        assert!(matches!(body.slice(3..5).await, Err(StoreError::Changed)));
        assert!(body.has_failed());
        assert_eq!(body.etag().as_deref(), Some("\"v1\""));
    }

    #[tokio::test]
    async fn a_success_short_of_the_length_is_an_interruption() {
        let body = RangeBody::new(4, None);
        body.append(b"ab");
        body.finish(Ok(()));
        assert!(matches!(body.slice(0..4).await, Err(StoreError::Interrupted(_))));
    }

    #[tokio::test]
    async fn bytes_past_the_range_are_refused() {
        let body = RangeBody::new(4, None);
        assert!(body.append(b"ab"));
        assert!(!body.append(b"cdef"), "more than the range is refused");
        assert_eq!(body.slice(0..4).await.expect("arrived"), Bytes::from_static(b"abcd"));
    }

    #[tokio::test]
    async fn staged_bytes_reach_readers_only_once_published() {
        let body = Arc::new(RangeBody::new(8, None));
        body.append(b"ab");
        assert!(body.stage(0, b"cd") && body.stage(2, b"ef"));
        assert_eq!(body.received(), 2, "staged bytes have not arrived");
        let waiter = tokio::spawn({
            let body = body.clone();
            async move { body.slice(0..4).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "bytes 2..4 are only staged");
        body.publish(3);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woken").expect("task");
        assert_eq!(got.expect("bytes"), Bytes::from_static(b"abcd"));
        // What was staged and not published is written over by the next append.
        assert!(body.append(b"XYZ"));
        assert_eq!(body.slice(0..8).await.expect("arrived"), Bytes::from_static(b"abcdeXYZ"));
        assert!(!body.stage(0, b"!"), "a full body takes no more");
    }

    /// Readers slicing while the body is written get the written bytes, every time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_during_writes_see_the_bytes_written() {
        let whole: Vec<u8> = (0..1_000_000).map(|i| (i * 13 % 251) as u8).collect();
        let body = Arc::new(RangeBody::new(whole.len() as u64, None));
        let readers: Vec<_> = (0..8u64)
            .map(|reader| {
                let (body, whole) = (body.clone(), whole.clone());
                tokio::spawn(async move {
                    for step in 0..200u64 {
                        let start = (reader * 7_919 + step * 4_993) % 990_000;
                        let got = body.slice(start..start + 10_000).await.expect("bytes");
                        assert_eq!(&got[..], &whole[start as usize..start as usize + 10_000]);
                    }
                })
            })
            .collect();
        for chunk in whole.chunks(1_000) {
            body.append(chunk);
            tokio::task::yield_now().await;
        }
        body.finish(Ok(()));
        for reader in readers {
            reader.await.expect("reader");
        }
        assert!(body.is_complete());
    }

    /// A paced body's GET takes what its reader allowed, waits, goes on as it allows
    /// more, all in one GET; abandoned, it ends where it is.
    #[tokio::test]
    async fn a_paced_get_takes_what_its_reader_allows_in_one_request() {
        use crate::store::memory::MemoryStore;
        use crate::store::ObjectStore;
        let whole: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let store = Arc::new(MemoryStore::with_keys([("k".to_owned(), whole.clone())]));
        let body = Arc::new(RangeBody::new(whole.len() as u64, None).paced(100_000));
        let get = tokio::spawn({
            let (store, body) = (store.clone(), body.clone());
            async move { store.get_range_into("k", 0, &*body, body.len()).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let paused_at = body.received();
        assert!((100_000..200_000).contains(&paused_at), "took {paused_at} bytes of 100,000 allowed");
        assert!(!get.is_finished());
        body.allow(2_000_000);
        assert_eq!(&body.slice(1_000_000..2_000_000).await.expect("bytes")[..], &whole[1_000_000..2_000_000]);
        body.abandon();
        let ended = tokio::time::timeout(Duration::from_secs(5), get).await.expect("ended").expect("task");
        assert!(ended.is_ok(), "an abandoned GET ends without an error");
        assert!(body.received() < whole.len() as u64, "and short of its range");
        assert_eq!(store.gets.lock().len(), 1, "one GET");
    }

    /// Chunks below the reader are given back: slices of them fail, the rest stay.
    #[tokio::test]
    async fn released_chunks_are_gone_and_the_rest_stays() {
        let len = 3 * CHUNK + 10;
        let whole: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let body = RangeBody::new(len, None);
        body.append(&whole[..(2 * CHUNK + 5) as usize]);
        assert_eq!(body.release_before(CHUNK + 7), CHUNK, "whole chunks only");
        assert_eq!(body.release_before(len), 2 * CHUNK, "not past what arrived");
        assert!(body.slice(CHUNK..CHUNK + 1).await.is_err());
        body.append(&whole[(2 * CHUNK + 5) as usize..]);
        let across = body.slice(2 * CHUNK..len).await.expect("held");
        assert_eq!(&across[..], &whole[(2 * CHUNK) as usize..]);
    }

    proptest! {
        /// Any slice of a body cut into any chunks is those bytes of the whole.
        #[test]
        fn slices_across_chunks_are_the_bytes(
            cuts in proptest::collection::vec(1usize..50, 1..20),
            from in 0usize..1000,
            len in 0usize..1000,
        ) {
            let total: usize = cuts.iter().sum();
            let whole: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
            let body = RangeBody::new(total as u64, None);
            let mut at = 0;
            for cut in cuts {
                prop_assert!(body.append(&whole[at..at + cut]));
                at += cut;
            }
            let start = from.min(total);
            let end = (start + len).min(total);
            let got = futures::executor::block_on(body.slice(start as u64..end as u64)).expect("arrived");
            prop_assert_eq!(&got[..], &whole[start..end]);
        }
    }
}
