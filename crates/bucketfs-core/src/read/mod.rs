//! Reads of one open file: range GETs, sequential detection and prefetch.
//!
//! A [`ReadHandle`] keeps a set of **segments**, byte ranges of the object that are fetched
//! or being fetched (each a spawned GET whose body several reads can wait on). A read
//! takes the bytes from the segments that cover it and fetches only the gaps, so no byte
//! is fetched twice while it is still held, whatever order the kernel's parallel
//! read-ahead requests arrive in. A segment's body is usable as it arrives
//! ([`RangeBody`]): a read waits for its own bytes, never for the rest of the segment.
//!
//! - **Random reads** (far from the previous one) fetch exactly the bytes asked for: a
//!   4 KiB read in an 8 GiB object is one 4 KiB ranged GET. The kernel hands a large read
//!   over in pieces (of at most the mount's read-ahead, 128 KiB unless raised), each
//!   following the last: a run of reads is taken for sequential only once it has read
//!   `initial_window` bytes, so the pieces of one random read start no read-ahead.
//! - **Sequential reads** (within the current window of the furthest byte read so far,
//!   once the run has read `initial_window` bytes, or from a first read of at least 64 KiB
//!   at offset 0) grow a **window**, doubling from `initial_window` with each read that
//!   finds its bytes not yet here though the store is sending them (a reader slower than
//!   the store, or readers queued behind the request window, keep a small window), up to
//!   `max_window` and the file's share of the read-ahead pool
//!   (`MemoryLimiter::read_ahead_share`). Read-ahead GETs are a part (`part_size`) long
//!   and **paced** (`RangeBody::paced`): each takes its bytes only as far as the window
//!   reaches, so a slow reader costs one GET per part, a fast one gets parts in
//!   parallel, and either holds only its window ahead. The first read is fetched
//!   exactly, which keeps the first byte fast.
//! - **Passed bytes go**: the segment being read gives back each 1 MiB chunk the reader
//!   has left behind (`release_behind`), so a part-long GET does not hold all it brought.
//! - **Strided reads** (runs of reads starting a fixed distance apart, forwards or
//!   backwards: every Nth record, fio's `rw=read:17m`) prefetch the next few runs once the
//!   same step has been seen twice: each is one GET of the last run's length, so the
//!   GETs of a strided scan overlap instead of waiting on each other.
//! - **Seeks keep data**: a segment is dropped only once it is well behind the reader
//!   (more than `part_size`; once the memory budget is spent, as soon as it is behind)
//!   or when the handle holds more than twice its window; so a short backward seek is
//!   served from memory.
//! - **Versions never mix**: every GET carries `If-Match` with the ETag seen at open; if
//!   the object changed, the read fails (EIO) instead of returning new bytes.
//! - **Memory**: read-ahead reserves from the [`MemoryLimiter`] and stops when the budget
//!   is spent; bytes a reader waits on are always fetched.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

use crate::datacache::BLOCK_SIZE;
use crate::memory::{MemoryLimiter, Reservation, SequentialReader};
use bucketfs_client::store::{ObjectStore, RangeBody, StoreError};

mod fetch;

pub use fetch::CacheLink;

/// Tuning of the read path; see the module doc.
#[derive(Clone, Debug)]
pub struct ReadConfig {
    pub part_size: u64,
    pub initial_window: u64,
    pub max_window: u64,
}

/// Smallest piece a sequential window is fetched in.
const MIN_PIECE: u64 = 1024 * 1024;
/// A first read at offset 0 starts read-ahead at once only if it is at least this large:
/// `cat` asks the kernel for 128 KiB and the kernel asks us for more, while a program
/// probing a header (or a time-to-first-byte probe: 1 byte, `O_DIRECT`) reads a little
/// and stops. Read-ahead on such a probe sent four 256 KiB GETs along with its 1-byte
/// GET, on every open (fio's `time_to_first_byte` job: 2.75 ms mean against 0.9 ms for
/// the direct GET).
const FIRST_READ_AHEAD_MIN: u64 = 64 * 1024;

/// How many runs of a strided scan are fetched ahead of the one being read.
const STRIDES_AHEAD: u64 = 4;

/// The step between the starts of consecutive runs of reads, how many times in a row it
/// repeated, and the length of the last run.
#[derive(Clone, Copy, Default)]
struct Stride {
    step: i64,
    len: u64,
    repeats: u32,
}

struct Segment {
    /// The bytes it holds (or will): from where its body begins, or from the first chunk
    /// not yet released once the reader has passed some (see `evict`).
    range: Range<u64>,
    /// The object offset of the body's first byte.
    body_start: u64,
    /// Which location of the object it was fetched from (see `ReadHandle::relocate`).
    generation: u64,
    body: Arc<RangeBody>,
    abort: tokio::task::AbortHandle,
    /// Whether a read took bytes from it (not only read-ahead): see `Drop for ReadHandle`.
    read_from: bool,
    /// Shared with the GET's task: the body's bytes count against the budget for as long
    /// as either holds them (a fetch that goes on after its file was closed, to fill the
    /// data cache, is still memory the mount spends). A paced body reserves what it was
    /// allowed so far (see [`ReadHandle::allow`]).
    memory: Arc<Mutex<Reservation>>,
}

struct State {
    /// Keyed by start offset; segments never overlap.
    segments: BTreeMap<u64, Segment>,
    /// End of the furthest byte read so far (of the current sequential run).
    frontier: u64,
    /// Bytes read in the current run of reads near the frontier, and where it began.
    run: u64,
    run_start: u64,
    /// The step between the starts of the last runs (see the module doc).
    stride: Stride,
    window: u64,
    reads: u64,
    /// How many times the object was relocated (see [`ReadHandle::relocate`]).
    generation: u64,
    /// Counted among the files read sequentially once a run was (see `read_ahead_share`).
    sequential_reader: Option<SequentialReader>,
}

pub struct ReadHandle {
    store: Arc<dyn ObjectStore>,
    /// The object read (key and pinned ETag); moves with a rename of the open file.
    object: parking_lot::RwLock<(Arc<str>, Option<Arc<str>>)>,
    size: u64,
    config: ReadConfig,
    memory: Arc<MemoryLimiter>,
    /// The data cache, where the mount has one: fetches are then whole blocks.
    cache: Option<Arc<CacheLink>>,
    /// An older version of the object to read (a `.versions` file), not the current one.
    version_id: Option<Arc<str>>,
    state: Mutex<State>,
}

impl ReadHandle {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        key: &str,
        etag: Option<&str>,
        size: u64,
        config: ReadConfig,
        memory: Arc<MemoryLimiter>,
    ) -> Self {
        let window = config.initial_window;
        Self {
            store,
            object: parking_lot::RwLock::new((key.into(), etag.map(Into::into))),
            size,
            config,
            memory,
            cache: None,
            version_id: None,
            state: Mutex::new(State {
                segments: BTreeMap::new(),
                frontier: 0,
                run: 0,
                run_start: 0,
                stride: Stride::default(),
                window,
                reads: 0,
                generation: 0,
                sequential_reader: None,
            }),
        }
    }

    /// Reads go through the data cache (`link` names this object's version).
    pub fn with_cache(mut self, link: CacheLink) -> Self {
        self.cache = Some(Arc::new(link));
        self
    }

    /// Reads version `id` of the object (a `.versions` file) instead of the current one.
    pub fn of_version(mut self, id: &str) -> Self {
        self.version_id = Some(id.into());
        self
    }

    /// The data cache's file holding this whole object, checked (see
    /// [`CacheLink::whole_file`]), for reads that bypass the handle (FUSE passthrough).
    pub fn cached_whole_file(&self) -> Option<std::fs::File> {
        self.cache.as_ref()?.whole_file()
    }

    /// The whole content of this object from the data cache, if it is a small object
    /// cached there (read at open and served from memory).
    pub fn cached_small_content(&self) -> Option<Bytes> {
        self.cache.as_ref()?.small_content()
    }

    /// The object's size at open.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads an older version of the object (a `.versions` file), not the current one.
    pub fn reads_an_older_version(&self) -> bool {
        self.version_id.is_some()
    }

    /// The key read and the ETag the reads are pinned to.
    pub fn object(&self) -> (Arc<str>, Option<Arc<str>>) {
        self.object.read().clone()
    }

    /// The object was copied (renamed, or rewritten onto itself with new metadata) while
    /// open: read the same bytes from the copy.
    ///
    /// GETs still running for the old key may fail once it is deleted: they are dropped
    /// from the plan (the same bytes are fetched again from the copy), and a read that
    /// was waiting on one tries again.
    pub fn relocate(&self, key: &str, etag: Option<&str>) {
        let mut state = self.state.lock();
        *self.object.write() = (key.into(), etag.map(Into::into));
        state.generation += 1;
        state.segments.retain(|_, segment| segment.body.is_complete());
    }

    /// Reads up to `len` bytes at `offset` (fewer only at the end of the object). Reading
    /// fails only as the store does: the error is the store's.
    pub async fn read(&self, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let mut attempts = 0;
        'attempt: loop {
            attempts += 1;
            let parts = self.plan(offset..end);
            let mut pieces = Vec::with_capacity(parts.len());
            for (range, body_start, generation, body) in parts {
                let within = offset.max(range.start) - body_start..end.min(range.end) - body_start;
                let from = within.start;
                match body.slice(within).await {
                    Ok(bytes) => pieces.push(bytes),
                    Err(error) => {
                        self.forget_failed(range.start);
                        if generation != self.state.lock().generation && attempts < 3 {
                            continue 'attempt; // fetched from where the object was before a rename
                        }
                        if body.released() > from && attempts < 3 {
                            continue 'attempt; // another read, further on, gave those bytes back
                        }
                        if matches!(error, StoreError::Changed) {
                            tracing::warn!(key = %self.object.read().0, "object changed while open; failing the read");
                        }
                        return Err(error);
                    }
                }
            }
            return Ok(concat(pieces));
        }
    }

    /// Decides what to fetch for a read of `wanted`, starts those GETs, and returns the
    /// segments that cover `wanted`, in order.
    fn plan(&self, wanted: Range<u64>) -> Vec<(Range<u64>, u64, u64, Arc<RangeBody>)> {
        let mut state = self.state.lock();
        let frontier_before = state.frontier;
        let near = self.is_near_frontier(&state, &wanted);
        let len = wanted.end - wanted.start;
        if state.reads == 0 || !near {
            if state.reads > 0 {
                Self::note_new_run(&mut state, wanted.start);
            }
            state.run_start = wanted.start;
        }
        state.run = if near && state.reads > 0 { state.run + len } else { len };
        // A run started at offset 0 by a large read is sequential from that read (`cat`);
        // any other once it has read a window's worth (not the pieces of one random read).
        let sequential =
            near && ((state.reads == 0 && len >= FIRST_READ_AHEAD_MIN) || state.run > self.config.initial_window);
        if sequential && state.sequential_reader.is_none() {
            state.sequential_reader = Some(self.memory.reading_sequentially());
        }
        // This file's share of the read-ahead the sequential readers share.
        let max_window = self.config.max_window.min(self.memory.read_ahead_share()).max(self.config.initial_window);
        if near {
            state.frontier = state.frontier.max(wanted.end);
            // The window grows only while the reader catches up with the bytes coming in:
            // a reader slower than the store (a program computing on what it reads, many
            // readers sharing the CPUs) finds its bytes there, and readers behind a full
            // request window find theirs queued; both keep a small window, so memory
            // follows what the readers can use rather than their number.
            if sequential && state.reads > 0 && Self::outran_the_window(&state.segments, &wanted) {
                state.window *= 2;
            }
            state.window = state.window.min(max_window);
        } else {
            state.window = self.config.initial_window;
            state.frontier = wanted.end;
        }
        state.reads += 1;

        let piece = if sequential {
            (state.window / 4).clamp(MIN_PIECE, self.config.part_size.max(MIN_PIECE))
        } else {
            u64::MAX // a random read is fetched as one exact range
        };
        let piece = if self.cache.is_some() { piece.max(BLOCK_SIZE) / BLOCK_SIZE * BLOCK_SIZE } else { piece };
        let missing = gaps(&state.segments, wanted.clone());
        bucketfs_client::metrics::read(missing.is_empty());
        for gap in missing {
            let gap = self.whole_blocks(&state, gap);
            // A hole behind a sequential reader's frontier (a kernel short of room for its
            // read-ahead reads it page by page) is filled up to the next piece: one GET,
            // not one per page. A read at the frontier is fetched as asked (read-ahead
            // follows it), which keeps a first read fast.
            let gap =
                if sequential && gap.start < frontier_before { self.to_whole_piece(&state, gap, piece) } else { gap };
            for range in split(gap, piece) {
                let memory = self.memory.reserve(range.end - range.start);
                self.start_fetch(&mut state, range, memory, None);
            }
        }
        let ahead = wanted.end..if sequential { (wanted.end + state.window).min(self.size) } else { wanted.end };
        let room_ahead = self.allow(&state, &wanted, ahead.end);
        if sequential && room_ahead {
            // Read-ahead GETs are long (a part) and paced: each takes its bytes only as
            // far as the window reaches, so a reader slower than the store costs one GET
            // per part, not one per window, and holds only its window ahead.
            let long = self.config.part_size.max(piece);
            let long = if self.cache.is_some() { long.div_ceil(BLOCK_SIZE) * BLOCK_SIZE } else { long };
            'prefetch: for gap in gaps(&state.segments, ahead.clone()) {
                // The window slides a little with every read; fetching just that sliver
                // would mean many tiny GETs, so the trailing gap is fetched in whole pieces.
                let gap = if gap.end == ahead.end { self.to_whole_piece(&state, gap, long) } else { gap };
                for range in split(gap, long) {
                    let allowed = ahead.end.min(range.end) - range.start;
                    let Some(memory) = self.memory.try_reserve(allowed) else {
                        break 'prefetch;
                    };
                    bucketfs_client::metrics::read_ahead(allowed);
                    self.start_fetch(&mut state, range, memory, Some(allowed));
                }
            }
        }
        if !near && state.stride.repeats >= 1 {
            self.prefetch_strides(&mut state, wanted.start);
        }
        self.evict(&mut state, &wanted, near);

        state
            .segments
            .range_mut(..wanted.end)
            .rev()
            .take_while(|(_, s)| s.range.end > wanted.start)
            .map(|(_, s)| {
                s.read_from = true;
                (s.range.clone(), s.body_start, s.generation, s.body.clone())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    }

    /// `gap` reaching on to the next multiple of `piece`, as far as the next segment and the
    /// object's end allow.
    fn to_whole_piece(&self, state: &State, gap: Range<u64>, piece: u64) -> Range<u64> {
        let next_segment = state.segments.range(gap.end..).next().map_or(self.size, |(&start, _)| start);
        gap.start..gap.end.div_ceil(piece).saturating_mul(piece).min(next_segment).min(self.size)
    }

    /// Lets the paced GETs of the segments under `wanted` take its bytes, whatever the
    /// memory budget says (a reader waits on them), and those up to `reach` (the window
    /// ahead) while the budget has room for them. `false` if it had not: bytes further
    /// ahead are not fetched before these.
    fn allow(&self, state: &State, wanted: &Range<u64>, reach: u64) -> bool {
        let first = state.segments.range(..=wanted.start).next_back().map_or(wanted.start, |(&start, _)| start);
        for segment in state.segments.range(first..reach.max(wanted.end)).map(|(_, segment)| segment) {
            if segment.range.end <= wanted.start {
                continue;
            }
            let allowed = segment.body.allowed();
            let start = segment.body_start;
            let must = wanted.end.min(segment.range.end).saturating_sub(start);
            let may = reach.min(segment.range.end).saturating_sub(start);
            if must.max(may) <= allowed {
                continue;
            }
            let mut memory = segment.memory.lock();
            if must > allowed {
                memory.absorb(self.memory.reserve(must - allowed));
                segment.body.allow(must);
            }
            let allowed = allowed.max(must);
            if may > allowed {
                if !memory.try_grow(may - allowed) {
                    return false;
                }
                bucketfs_client::metrics::read_ahead(may - allowed);
                segment.body.allow(may);
            }
        }
        true
    }

    /// Whether a read of `wanted` shows the window too small: some of its bytes were never
    /// asked for (the reader outran the read-ahead), or are still on their way from a GET
    /// the store is answering (more pieces in flight bring them sooner). Bytes all here, or
    /// waiting on GETs not answered yet (queued behind `--max-concurrent-requests`, or a
    /// slow store to start), call for no more read-ahead: it would only queue more.
    fn outran_the_window(segments: &BTreeMap<u64, Segment>, wanted: &Range<u64>) -> bool {
        let first = segments.range(..=wanted.start).next_back().map_or(wanted.start, |(&start, _)| start);
        let mut cursor = wanted.start;
        for segment in segments.range(first..wanted.end).map(|(_, segment)| segment) {
            if segment.range.end <= cursor {
                continue;
            }
            if segment.range.start > cursor {
                return true;
            }
            let here = segment.body_start + segment.body.received();
            if here < wanted.end.min(segment.range.end) && segment.body.answered() {
                return true;
            }
            cursor = segment.range.end;
            if cursor >= wanted.end {
                return false;
            }
        }
        cursor < wanted.end
    }

    /// A run of reads begins at `start`: the step from the last run's start repeats a
    /// stride, or starts a new one.
    fn note_new_run(state: &mut State, start: u64) {
        let step = start as i64 - state.run_start as i64;
        if step == state.stride.step && step.unsigned_abs() > state.run {
            state.stride.repeats += 1;
        } else {
            state.stride = Stride { step, len: 0, repeats: 0 };
        }
        state.stride.len = state.run;
    }

    /// Fetches the next runs of a strided scan that begins a run at `start`: as many as
    /// fit in a maximal window (at most [`STRIDES_AHEAD`]), each one GET of the last run's
    /// length (runs up to a maximal window long), while the memory budget allows.
    fn prefetch_strides(&self, state: &mut State, start: u64) {
        let Stride { step, len, .. } = state.stride;
        if len == 0 || len > self.config.max_window {
            return; // long runs: sequential read-ahead within each does the work
        }
        let ahead = (self.config.max_window / len).clamp(1, STRIDES_AHEAD);
        for i in 1..=ahead as i64 {
            let Some(from) = start.checked_add_signed(step * i).filter(|&from| from < self.size) else {
                break;
            };
            for gap in gaps(&state.segments, from..(from + len).min(self.size)) {
                let gap = self.whole_blocks(state, gap);
                let Some(memory) = self.memory.try_reserve(gap.end - gap.start) else {
                    return;
                };
                bucketfs_client::metrics::read_ahead(gap.end - gap.start);
                self.start_fetch(state, gap, memory, None);
            }
        }
    }

    /// Whether `wanted` continues the current run: a first read at offset 0, or a read
    /// within a window of the furthest byte read so far.
    fn is_near_frontier(&self, state: &State, wanted: &Range<u64>) -> bool {
        if state.reads == 0 {
            return wanted.start == 0;
        }
        let slack = state.window.max(self.config.initial_window);
        wanted.start + slack >= state.frontier && wanted.start <= state.frontier + slack
    }

    /// Starts the GET of `range`; a paced one takes its first `paced` bytes, and the next
    /// ones as the reader's window reaches them ([`ReadHandle::allow`]).
    fn start_fetch(&self, state: &mut State, range: Range<u64>, memory: Reservation, paced: Option<u64>) {
        let store = self.store.clone();
        let (key, etag) = self.object.read().clone();
        let body = RangeBody::new(range.end - range.start, etag.as_deref()).of_version(self.version_id.as_deref());
        let body = Arc::new(match paced {
            Some(allowed) => body.paced(allowed),
            None => body,
        });
        let fetching = Finishing(body.clone());
        let offset = range.start;
        let cache = self.cache.clone();
        let memory = Arc::new(Mutex::new(memory));
        let task_memory = memory.clone();
        let task = tokio::spawn(async move {
            fetch::fill(store, &key, offset, &fetching.0, cache.as_ref(), task_memory).await;
        });
        let abort = task.abort_handle();
        let generation = state.generation;
        let segment = Segment { body_start: range.start, range, generation, body, abort, read_from: false, memory };
        state.segments.insert(segment.range.start, segment);
    }

    /// With a data cache, `gap` widened to whole blocks, as far as the segments around it
    /// and the object's end allow: blocks are what the cache stores.
    fn whole_blocks(&self, state: &State, gap: Range<u64>) -> Range<u64> {
        if self.cache.is_none() {
            return gap;
        }
        let before = state.segments.range(..gap.start).next_back().map_or(0, |(_, s)| s.range.end);
        let after = state.segments.range(gap.end..).next().map_or(self.size, |(&start, _)| start);
        let start = (gap.start / BLOCK_SIZE * BLOCK_SIZE).max(before);
        let end = gap.end.div_ceil(BLOCK_SIZE).saturating_mul(BLOCK_SIZE).min(after).min(self.size);
        start..end
    }

    /// Drops what is well behind the reader (anything behind it once the memory budget is
    /// spent), then, while the handle holds more than twice its maximum window, whatever
    /// is farthest from the current read.
    fn evict(&self, state: &mut State, wanted: &Range<u64>, near: bool) {
        // Bytes behind the reader serve short seeks back (the page cache serves the rest);
        // they are worth keeping only while memory is free, and then only a window's
        // first size: a part behind each of many readers is a part each that read-ahead
        // cannot use (100 readers kept ~8 MiB each behind them).
        // A backward strided scan's next runs are behind it too (see `prefetch_strides`).
        let strides_behind = match state.stride {
            Stride { step, repeats: 1.., .. } if step < 0 => step.unsigned_abs() * (STRIDES_AHEAD + 1),
            _ => 0,
        };
        let keep_behind = if self.memory.is_spent() { 0 } else { self.config.initial_window.max(strides_behind) };
        let behind = wanted.start.saturating_sub(keep_behind);
        state.segments.retain(|_, s| s.range.end > behind);
        if near {
            self.release_behind(state, behind); // not what another stream of reads is in
        }
        let budget = 2 * self.config.max_window;
        let mut held: u64 = state.segments.values().map(Segment::held).sum();
        while held > budget {
            let distance = |s: &Segment| {
                if s.range.end <= wanted.start {
                    wanted.start - s.range.end
                } else {
                    s.range.start.saturating_sub(wanted.end)
                }
            };
            let Some((&start, farthest)) = state.segments.iter().max_by_key(|(_, s)| distance(s)) else {
                break;
            };
            if distance(farthest) == 0 {
                break; // everything left is needed by this read
            }
            held -= farthest.held();
            state.segments.remove(&start);
        }
    }

    /// The segment the reader is in gives back the chunks it has left `behind` (a long
    /// paced GET would otherwise hold all it brought until the reader leaves it). Not
    /// with a data cache: the blocks fetched are stored from the body once it is whole.
    fn release_behind(&self, state: &mut State, behind: u64) {
        if self.cache.is_some() {
            return;
        }
        let Some((&key, segment)) = state.segments.range(..behind).next_back() else { return };
        if segment.range.end <= behind {
            return;
        }
        let held_from = segment.body_start + segment.body.release_before(behind - segment.body_start);
        if held_from <= key {
            return;
        }
        let Some(mut segment) = state.segments.remove(&key) else { return };
        {
            let mut memory = segment.memory.lock();
            let left = memory.bytes().saturating_sub(held_from - key);
            memory.shrink_to(left);
        }
        segment.range.start = held_from;
        state.segments.insert(held_from, segment);
    }

    fn forget_failed(&self, start: u64) {
        let mut state = self.state.lock();
        if state.segments.get(&start).is_some_and(|s| s.body.has_failed()) {
            state.segments.remove(&start);
        }
    }
}

impl Drop for ReadHandle {
    fn drop(&mut self) {
        // A closed file needs no more read-ahead: stop the GETs still running. With a data
        // cache, those a program read from go on: their blocks are cached whole (a 4 KiB
        // read answered before the rest of its block arrived, then `close`).
        for segment in self.state.get_mut().segments.values() {
            if self.cache.is_some() && segment.read_from {
                segment.body.allow(segment.body.len()); // a paced one too: its blocks are cached whole
            } else {
                segment.abort.abort();
            }
        }
    }
}

impl Segment {
    /// Bytes it holds or may take: what its GET was allowed, less what was released.
    fn held(&self) -> u64 {
        self.body.allowed().saturating_sub(self.range.start - self.body_start)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // Dropped from its handle (evicted, or the file closed): a paced GET is allowed no
        // more, so it ends at what it may take (readers still waiting get those bytes)
        // rather than wait for a reader that is gone.
        self.body.abandon();
    }
}

/// Ends a segment's body if its GET task ends without doing so (aborted when the file
/// is closed, or panicked), so that no read waits on it for ever.
struct Finishing(Arc<RangeBody>);

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.finish(Err(StoreError::Other { message: "read task ended".into(), request_id: None }));
    }
}

/// The sub-ranges of `wanted` that no segment covers.
fn gaps(segments: &BTreeMap<u64, Segment>, wanted: Range<u64>) -> Vec<Range<u64>> {
    let mut gaps = Vec::new();
    let mut cursor = wanted.start;
    // The segment starting before `wanted` may reach into it.
    let first = segments.range(..=wanted.start).next_back().map(|(&k, _)| k).unwrap_or(wanted.start);
    for segment in segments.range(first..wanted.end).map(|(_, s)| s) {
        if segment.range.end <= cursor {
            continue;
        }
        if segment.range.start > cursor {
            gaps.push(cursor..segment.range.start);
        }
        cursor = cursor.max(segment.range.end);
        if cursor >= wanted.end {
            break;
        }
    }
    if cursor < wanted.end {
        gaps.push(cursor..wanted.end);
    }
    gaps
}

/// `range` cut at the multiples of `piece`: GETs of a sequential read start at the same
/// offsets whatever its first reads were, so with a shared cache each is one chunk of it
/// (`datacache::shared`), not the end of one and the start of the next.
fn split(range: Range<u64>, piece: u64) -> impl Iterator<Item = Range<u64>> {
    let end = range.end;
    let mut start = range.start;
    std::iter::from_fn(move || {
        if start >= end {
            return None;
        }
        let next = (start / piece.max(1)).saturating_add(1).saturating_mul(piece.max(1)).min(end);
        let cut = start..next;
        start = next;
        Some(cut)
    })
}

fn concat(pieces: Vec<Bytes>) -> Bytes {
    match pieces.len() {
        0 => Bytes::new(),
        1 => pieces.into_iter().next().unwrap_or_default(),
        _ => {
            let mut out = BytesMut::with_capacity(pieces.iter().map(Bytes::len).sum());
            for piece in pieces {
                out.extend_from_slice(&piece);
            }
            out.freeze()
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use bucketfs_client::store::memory::MemoryStore;
    use std::time::Duration;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// A store holding object `k` of `size` bytes of [`data`].
    fn store_of(size: u64) -> Arc<MemoryStore> {
        Arc::new(MemoryStore::with_keys([("k".to_owned(), data(size as usize))]))
    }

    fn handle(store: &Arc<MemoryStore>, size: u64, config: ReadConfig, memory: u64) -> ReadHandle {
        handle_with(store, size, config, MemoryLimiter::new(memory))
    }

    fn handle_with(store: &Arc<MemoryStore>, size: u64, config: ReadConfig, memory: Arc<MemoryLimiter>) -> ReadHandle {
        let etag = futures::executor::block_on(store.head("k")).ok().and_then(|i| i.etag);
        ReadHandle::new(store.clone(), "k", etag.as_deref(), size, config, memory)
    }

    /// `reader` reading through the data cache `cache` (object `k` of `size` bytes).
    fn through_cache(reader: ReadHandle, cache: &Arc<crate::datacache::DataCache>, size: u64) -> ReadHandle {
        let (_, etag) = reader.object();
        let id = crate::datacache::ObjectId {
            location: "memory".into(),
            key: "k".into(),
            etag: etag.as_deref().unwrap_or_default().to_owned(),
            size,
        };
        reader.with_cache(CacheLink::new(cache.clone(), id))
    }

    /// The ranges the handle holds or is fetching. Read-ahead GETs run in spawned tasks
    /// that may not have reached the store when a read returns, so the plan, not the
    /// store's record, is what a test of read-ahead decisions checks.
    fn planned(reader: &ReadHandle) -> Vec<Range<u64>> {
        // What each segment holds or its GET may take: a paced one, as far as it is allowed.
        let segments = &reader.state.lock().segments;
        segments.values().map(|s| s.range.start..(s.body_start + s.body.allowed()).min(s.range.end)).collect()
    }

    fn planned_bytes(reader: &ReadHandle) -> u64 {
        planned(reader).iter().map(|r| r.end - r.start).sum()
    }

    fn config() -> ReadConfig {
        ReadConfig { part_size: 2 * MIB, initial_window: 256 * KIB, max_window: 8 * MIB }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
    }

    #[test]
    fn small_random_read_in_big_object_is_one_small_get() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let reader = handle(&store, size, config(), 64 * MIB);
        let got = rt.block_on(reader.read(40 * MIB + 7, 4096)).expect("read");
        assert_eq!(&got[..], &data(size as usize)[(40 * MIB + 7) as usize..][..4096]);
        assert_eq!(*store.gets.lock(), vec![(40 * MIB + 7)..(40 * MIB + 7 + 4096)]);
    }

    #[test]
    fn sequential_reads_fetch_every_byte_once_and_prefetch_ahead() {
        let rt = runtime();
        let size = 20 * MIB + 123;
        let bytes = data(size as usize);
        let store = Arc::new(MemoryStore::with_keys([("k".to_owned(), bytes.clone())]));
        // A store slower than the reader: the reads catch up with the window, which grows.
        *store.chunk_pause.lock() = Duration::from_millis(1);
        let reader = handle(&store, size, config(), 64 * MIB);
        let mut out = Vec::new();
        let mut offset = 0;
        while offset < size {
            let chunk = rt.block_on(reader.read(offset, 128 * KIB)).expect("read");
            offset += chunk.len() as u64;
            out.extend_from_slice(&chunk);
        }
        assert_eq!(out, bytes);
        let mut gets = store.gets.lock().clone();
        gets.sort_by_key(|r| r.start);
        let fetched: u64 = gets.iter().map(|r| r.end - r.start).sum();
        assert_eq!(fetched, size, "each byte fetched exactly once");
        assert!(gets.iter().any(|r| r.end - r.start == 2 * MIB), "pieces grow to the part size: {gets:?}");
        assert!(gets.len() < 40, "few requests for a sequential read: {}", gets.len());
    }

    /// The window grows while reads find their bytes still on the way, and stays as it is
    /// for a reader slower than the store: read-ahead memory follows the readers' pace,
    /// not their number.
    #[test]
    fn the_window_grows_only_while_the_reader_waits_for_it() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let slow = handle(&store, size, config(), 64 * MIB);
        for i in 0..32 {
            rt.block_on(slow.read(i * 128 * KIB, 128 * KIB)).expect("read");
            // The reader computes on what it read: all asked for is here before it reads on.
            wait_for_what_was_allowed(&rt, &slow);
        }
        assert_eq!(slow.state.lock().window, config().initial_window, "a slow reader's window stays");
        let ahead: u64 = planned(&slow).iter().map(|r| r.end.saturating_sub(r.start.max(4 * MIB))).sum();
        assert!(ahead <= MIN_PIECE.max(config().initial_window), "fetched ahead of the reader: {:?}", planned(&slow));

        *store.chunk_pause.lock() = Duration::from_millis(1);
        let waiting = handle(&store, size, config(), 64 * MIB);
        for i in 0..32 {
            rt.block_on(waiting.read(i * 128 * KIB, 128 * KIB)).expect("read");
        }
        assert!(waiting.state.lock().window >= 4 * config().initial_window, "a waiting reader's window grows");
    }

    /// Waits until every segment of `reader` holds all its GET was allowed to take.
    fn wait_for_what_was_allowed(rt: &tokio::runtime::Runtime, reader: &ReadHandle) {
        let bodies: Vec<_> = reader.state.lock().segments.values().map(|s| s.body.clone()).collect();
        for body in bodies {
            rt.block_on(body.slice(body.released()..body.allowed())).expect("fetched");
        }
    }

    fn bodies_held(reader: &ReadHandle) -> u64 {
        reader.state.lock().segments.values().map(|s| s.body.received() - s.body.released()).sum()
    }

    /// Bytes given back behind the reader are read again, right, by a later read of them
    /// (a seek back, or a read that planned before another read released them).
    #[test]
    fn bytes_given_back_are_fetched_again_when_read() {
        let rt = runtime();
        let size = 8 * MIB;
        let store = store_of(size);
        let reader = handle(&store, size, config(), 64 * MIB);
        let bytes = data(size as usize);
        for offset in (0..4 * MIB + 256 * KIB).step_by(128 * KIB as usize) {
            rt.block_on(reader.read(offset, 128 * KIB)).expect("read");
        }
        reader.state.lock().window = 8 * MIB; // later reads count as the same run
        rt.block_on(reader.read(5 * MIB + 512 * KIB, 128 * KIB)).expect("read on");
        // Only bytes that have arrived are given back: let them, then read on once more.
        wait_for_what_was_allowed(&rt, &reader);
        rt.block_on(reader.read(5 * MIB + 640 * KIB, 128 * KIB)).expect("read on");
        let released = reader.state.lock().segments.values().any(|s| s.range.start > s.body_start);
        assert!(released, "the segment being read gave back what is behind the reader");
        let again = rt.block_on(reader.read(4 * MIB + 64 * KIB, 128 * KIB)).expect("read back");
        assert_eq!(&again[..], &bytes[(4 * MIB + 64 * KIB) as usize..(4 * MIB + 192 * KIB) as usize]);
    }

    /// A reader slower than the store costs one GET per part, not one per window, and
    /// holds only what is ahead of it (and a little behind): the parts' GETs are paced,
    /// and the chunks it has passed are given back.
    #[test]
    fn a_slow_reader_costs_one_get_per_part_and_holds_only_its_window() {
        let rt = runtime();
        let size = 32 * MIB;
        let store = store_of(size);
        let parts = ReadConfig { part_size: 8 * MIB, ..config() };
        let reader = handle(&store, size, parts.clone(), 64 * MIB);
        let bytes = data(size as usize);
        let mut most_held = 0;
        for offset in (0..size).step_by(128 * KIB as usize) {
            let got = rt.block_on(reader.read(offset, 128 * KIB)).expect("read");
            assert_eq!(&got[..], &bytes[offset as usize..(offset + 128 * KIB) as usize]);
            // The reader computes on what it read: what its GETs may take is here first.
            wait_for_what_was_allowed(&rt, &reader);
            // Bytes in memory, not only those reserved: what arrived and was not given back.
            let arrived: u64 = bodies_held(&reader);
            most_held = most_held.max(arrived).max(reader.memory.used());
        }
        let gets = store.gets.lock().len() as u64;
        assert!(gets <= size / parts.part_size + 2, "{gets} GETs for {} parts", size / parts.part_size);
        // The chunk holding the bytes kept behind (256 KiB), the read, the window (256
        // KiB): not the part.
        assert!(most_held <= 2 * MIB, "held {most_held} bytes");
    }

    /// What makes a window grow, segment by segment: bytes never asked for, or asked for
    /// and being sent; not bytes already here, nor bytes whose GET has no answer yet (queued
    /// behind the request window: more read-ahead would only queue more).
    #[test]
    fn a_window_grows_for_bytes_on_their_way_not_for_queued_ones() {
        let rt = runtime();
        let segment = |range: Range<u64>, answered: bool, received: u64| {
            let body = RangeBody::new(range.end - range.start, None);
            if answered {
                body.pin_etag(Some("\"e\""));
            }
            body.append(&vec![0; received as usize]);
            let memory = Arc::new(Mutex::new(MemoryLimiter::new(u64::MAX).reserve(0)));
            let abort = rt.spawn(async {}).abort_handle();
            let (body_start, body) = (range.start, Arc::new(body));
            (range.start, Segment { range, body_start, generation: 0, body, abort, read_from: false, memory })
        };
        let segments: BTreeMap<u64, Segment> = [
            segment(0..MIB, true, MIB),          // here
            segment(MIB..2 * MIB, true, 0),      // answered, on its way
            segment(2 * MIB..3 * MIB, false, 0), // queued: no answer yet
        ]
        .into_iter()
        .collect();
        let outran = |wanted: Range<u64>| ReadHandle::outran_the_window(&segments, &wanted);
        assert!(!outran(0..128 * KIB), "bytes here");
        assert!(outran(MIB..MIB + 128 * KIB), "bytes being sent");
        assert!(outran(MIB - 64 * KIB..MIB + 64 * KIB), "partly here, partly being sent");
        assert!(!outran(2 * MIB..2 * MIB + 128 * KIB), "bytes queued");
        assert!(outran(3 * MIB..3 * MIB + 128 * KIB), "bytes never asked for");
    }

    /// A small first read at offset 0 (a header probe, a time-to-first-byte probe) fetches
    /// its bytes only; a large one (`cat`) starts read-ahead at once.
    #[test]
    fn only_a_large_first_read_at_offset_zero_reads_ahead() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let probe = handle(&store, size, config(), 64 * MIB);
        rt.block_on(probe.read(0, 1)).expect("read");
        assert_eq!(planned(&probe), vec![0..1], "a 1-byte probe fetches one byte");
        let cat = handle(&store, size, config(), 64 * MIB);
        rt.block_on(cat.read(0, 128 * KIB)).expect("read");
        assert!(planned_bytes(&cat) > 128 * KIB, "a 128 KiB first read reads ahead: {:?}", planned(&cat));
    }

    /// A random read that the kernel hands over in pieces, each following the last,
    /// fetches its bytes only; a run that goes on past a window is sequential again.
    #[test]
    fn pieces_of_one_random_read_start_no_read_ahead() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let reader = handle(&store, size, config(), 64 * MIB);
        let start = 40 * MIB;
        for piece in 0..2 {
            rt.block_on(reader.read(start + piece * 128 * KIB, 128 * KIB)).expect("read");
        }
        assert_eq!(planned_bytes(&reader), 256 * KIB, "only the read's bytes: {:?}", planned(&reader));
        for piece in 2..4 {
            rt.block_on(reader.read(start + piece * 128 * KIB, 128 * KIB)).expect("read");
        }
        assert!(planned_bytes(&reader) > 512 * KIB, "a run past the window reads ahead: {:?}", planned(&reader));
    }

    /// Reads a fixed step apart (forwards or backwards) fetch the next few ahead once the
    /// step repeated; reads at uneven steps fetch only their own bytes (what is behind
    /// the reader is dropped, so the plan holds the last read only).
    #[test]
    fn strided_reads_prefetch_the_next_strides() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let read = |reader: &ReadHandle, at: u64| {
            let got = rt.block_on(reader.read(at, 64 * KIB)).expect("read");
            assert_eq!(&got[..], &data(size as usize)[at as usize..][..64 * KIB as usize]);
        };
        let forwards = handle(&store, size, config(), 64 * MIB);
        for at in [10 * MIB, 13 * MIB] {
            read(&forwards, at);
        }
        assert_eq!(planned(&forwards), vec![13 * MIB..13 * MIB + 64 * KIB], "one step is no stride");
        read(&forwards, 16 * MIB);
        let expected: Vec<_> = (0..5).map(|i| (16 + 3 * i) * MIB..(16 + 3 * i) * MIB + 64 * KIB).collect();
        assert!(
            expected.iter().all(|r| planned(&forwards).contains(r)),
            "the next four strides: {:?}",
            planned(&forwards)
        );
        for at in [19 * MIB, 22 * MIB] {
            read(&forwards, at); // served by the prefetch, which goes on ahead
        }
        assert!(planned(&forwards).contains(&(34 * MIB..34 * MIB + 64 * KIB)), "{:?}", planned(&forwards));

        let backwards = handle(&store, size, config(), 64 * MIB);
        for at in [40 * MIB, 38 * MIB, 36 * MIB] {
            read(&backwards, at);
        }
        assert!(planned(&backwards).contains(&(34 * MIB..34 * MIB + 64 * KIB)), "{:?}", planned(&backwards));

        let uneven = handle(&store, size, config(), 64 * MIB);
        for at in [10 * MIB, 13 * MIB, 17 * MIB, 20 * MIB, 25 * MIB] {
            read(&uneven, at);
        }
        assert_eq!(planned(&uneven), vec![25 * MIB..25 * MIB + 64 * KIB], "no stride");
    }

    /// With a data cache, fetches are whole blocks (what the cache stores): a 4 KiB read
    /// fetches its 1 MiB block, and a strided scan prefetches the blocks of its next runs.
    #[test]
    fn with_a_data_cache_reads_fetch_whole_blocks() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let dir = tempfile::tempdir().expect("cache dir");
        let cache = crate::datacache::DataCache::open(dir.path(), Some(256 * MIB)).expect("cache");
        let cached = || through_cache(handle(&store, size, config(), 64 * MIB), &cache, size);
        let random = cached();
        let got = rt.block_on(random.read(40 * MIB + 7, 4096)).expect("read");
        assert_eq!(&got[..], &data(size as usize)[(40 * MIB + 7) as usize..][..4096]);
        assert_eq!(planned(&random), vec![40 * MIB..41 * MIB]);

        let strided = cached();
        for at in [10 * MIB + 100, 13 * MIB + 100, 16 * MIB + 100] {
            rt.block_on(strided.read(at, 64 * KIB)).expect("read");
        }
        assert!(planned(&strided).contains(&(19 * MIB..20 * MIB)), "{:?}", planned(&strided));
    }

    /// A fetch that goes on after its file was closed (to fill the data cache) keeps its
    /// bytes counted against the memory budget until it ends.
    #[test]
    fn a_fetch_going_on_after_close_still_counts_against_the_budget() {
        let rt = runtime();
        let size = 4 * MIB;
        let store = store_of(size);
        *store.body_pause.lock() = Duration::from_millis(300);
        let dir = tempfile::tempdir().expect("cache dir");
        let cache = crate::datacache::DataCache::open(dir.path(), Some(256 * MIB)).expect("cache");
        let memory = MemoryLimiter::new(64 * MIB);
        let reader = through_cache(handle_with(&store, size, config(), memory.clone()), &cache, size);
        rt.block_on(reader.read(0, 4096)).expect("read");
        drop(reader);
        assert!(memory.used() >= MIB, "a block still being fetched counts {} bytes", memory.used());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while memory.used() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(memory.used(), 0, "the budget is given back when the fetch ends");
    }

    #[test]
    fn changed_object_fails_instead_of_mixing_versions() {
        let rt = runtime();
        let store = store_of(4 * MIB);
        let reader = handle(&store, 4 * MIB, config(), 64 * MIB);
        rt.block_on(reader.read(3 * MIB, 10)).expect("first read");
        store.put("k", vec![7; 4 * MIB as usize]);
        let error = rt.block_on(reader.read(0, 10)).expect_err("must fail");
        assert!(matches!(error, StoreError::Changed), "{error:?}");
    }

    #[test]
    fn prefetch_stops_at_the_memory_limit() {
        let rt = runtime();
        let size = 64 * MIB;
        let store = store_of(size);
        let reader = handle(&store, size, config(), MIB);
        for i in 0..8 {
            rt.block_on(reader.read(i * 128 * KIB, 128 * KIB)).expect("read");
        }
        assert!(reader.memory.used() <= MIB + 128 * KIB, "used {}", reader.memory.used());
    }

    /// Once the budget is spent, what the reader has consumed goes at once: a reader
    /// never holds more than the budget plus the read it waits on (100 readers each
    /// keeping a part behind them held ~1 GiB under a 512 MiB limit).
    #[test]
    fn consumed_bytes_are_dropped_when_the_budget_is_spent() {
        let rt = runtime();
        let size = 16 * MIB;
        let store = store_of(size);
        let reader = handle(&store, size, config(), MIB);
        let mut offset = 0;
        while offset < size {
            offset += rt.block_on(reader.read(offset, 128 * KIB)).expect("read").len() as u64;
            // A GET dropped by the read (its bytes passed) gives its memory back as its
            // task ends, just after: allow it that moment, not more.
            let settled = std::time::Instant::now();
            while reader.memory.used() > MIB + 128 * KIB && settled.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let used = reader.memory.used();
            assert!(used <= MIB + 128 * KIB, "{used} bytes held at offset {offset}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the order and size of reads, the bytes are the object's bytes.
        #[test]
        fn any_read_pattern_returns_the_right_bytes(
            reads in prop::collection::vec((0u64..3 * MIB, 1u64..600 * KIB), 1..30),
        ) {
            let rt = runtime();
            let size = 3 * MIB - 17;
            let bytes = data(size as usize);
            let store = Arc::new(MemoryStore::with_keys([("k".to_owned(), bytes.clone())]));
            let small = ReadConfig { part_size: 512 * KIB, initial_window: 64 * KIB, max_window: MIB };
            let reader = handle(&store, size, small, 4 * MIB);
            for (offset, len) in reads {
                let got = rt.block_on(reader.read(offset, len)).expect("read");
                let start = offset.min(size) as usize;
                let end = (offset + len).min(size) as usize;
                prop_assert_eq!(&got[..], &bytes[start..end]);
            }
        }
    }
}
