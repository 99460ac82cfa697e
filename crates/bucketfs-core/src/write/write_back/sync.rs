//! When the write-back log reaches the disk itself: the segments written since their
//! last `fdatasync`, and the thread that syncs them.
//!
//! A close returns once its record is written (in the page cache: a `kill -9` of the
//! daemon loses nothing closed, the kernel still holds it). The disk gets it within the
//! sync interval (`--write-back-sync`): the first record written after a sync starts the
//! interval, and one `fdatasync` per segment then covers every record written during it.
//! So a power cut loses at most the files closed during the last interval that were not
//! stored yet, and `tar x` of thousands of files costs a sync every interval rather than
//! one per file. An interval of zero syncs each record before its close returns (the
//! caller does it, see `WriteBackLog::record_now`).

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Segments written and not synced, and the thread syncing them.
#[derive(Debug)]
pub(super) struct Syncer {
    interval: Duration,
    state: Arc<(Mutex<Unsynced>, Condvar)>,
}

#[derive(Debug, Default)]
struct Unsynced {
    /// A handle of each segment written since its last sync, by sequence number.
    segments: BTreeMap<u64, File>,
    /// Data files (and the directory that names them) written since the last sync:
    /// synced before the segments.
    data: Vec<File>,
    /// When the first of those writes happened: the interval runs from there.
    since: Option<Instant>,
    /// Set when the log is dropped: the thread syncs what is left and ends.
    closing: bool,
}

impl Syncer {
    /// Syncs every `interval`; none syncs in the background for zero (each record is
    /// synced by its writer).
    pub(super) fn new(interval: Duration) -> Self {
        let state = Arc::new((Mutex::new(Unsynced::default()), Condvar::new()));
        if !interval.is_zero() {
            let thread_state = state.clone();
            let spawned = std::thread::Builder::new()
                .name("bucketfs-wb-sync".into())
                .spawn(move || sync_loop(&thread_state, interval));
            if let Err(error) = spawned {
                // Without the thread, `note` syncs inline: slower, never less safe.
                tracing::warn!("write-back log: no sync thread ({error}); each close syncs its record");
                return Self { interval: Duration::ZERO, state };
            }
        }
        Self { interval, state }
    }

    /// Segment `seq` was written through `file` (a handle of its own): synced now with a
    /// zero interval (each record before its close returns), else within the interval.
    pub(super) fn written(&self, seq: u64, file: File) -> std::io::Result<()> {
        if self.interval.is_zero() {
            return file.sync_data();
        }
        self.note(seq, file);
        Ok(())
    }

    /// A data file (or the directory) was written through `file`: synced now with a zero
    /// interval, else with the segments, before them.
    pub(super) fn written_data(&self, file: File) -> std::io::Result<()> {
        if self.interval.is_zero() {
            return file.sync_data();
        }
        let (lock, wake) = &*self.state;
        let mut unsynced = lock.lock();
        unsynced.data.push(file);
        if unsynced.since.is_none() {
            unsynced.since = Some(Instant::now());
            wake.notify_one();
        }
        Ok(())
    }

    fn note(&self, seq: u64, file: File) {
        let (lock, wake) = &*self.state;
        let mut unsynced = lock.lock();
        unsynced.segments.entry(seq).or_insert(file);
        if unsynced.since.is_none() {
            unsynced.since = Some(Instant::now());
            wake.notify_one();
        }
    }

    /// Whether every record written is synced (tests).
    #[cfg(test)]
    pub(super) fn is_idle(&self) -> bool {
        let unsynced = self.state.0.lock();
        unsynced.segments.is_empty() && unsynced.data.is_empty()
    }

    /// Syncs every segment written so far, now (unmount, tests).
    pub(super) fn sync_now(&self) {
        let batch = {
            let mut unsynced = self.state.0.lock();
            unsynced.since = None;
            (std::mem::take(&mut unsynced.data), std::mem::take(&mut unsynced.segments))
        };
        sync_all(batch);
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        let (lock, wake) = &*self.state;
        lock.lock().closing = true;
        wake.notify_one();
    }
}

fn sync_loop(state: &(Mutex<Unsynced>, Condvar), interval: Duration) {
    let (lock, wake) = state;
    loop {
        let segments = {
            let mut unsynced = lock.lock();
            loop {
                if unsynced.closing {
                    break;
                }
                match unsynced.since {
                    None => wake.wait(&mut unsynced),
                    Some(since) if since.elapsed() >= interval => break,
                    Some(since) => {
                        let _ = wake.wait_until(&mut unsynced, since + interval);
                    }
                }
            }
            unsynced.since = None;
            let batch = (std::mem::take(&mut unsynced.data), std::mem::take(&mut unsynced.segments));
            (batch, unsynced.closing)
        };
        let (batch, closing) = segments;
        sync_all(batch);
        if closing {
            return;
        }
    }
}

fn sync_all((data, segments): (Vec<File>, BTreeMap<u64, File>)) {
    for file in data {
        if let Err(error) = file.sync_data() {
            tracing::warn!("write-back log: syncing a data file failed: {error}");
        }
    }
    for (seq, file) in segments {
        if let Err(error) = file.sync_data() {
            // The records stay in the page cache: a kill of the daemon still loses none.
            tracing::warn!("write-back log: syncing segment {seq} failed: {error}");
        }
    }
}
