//! Parts of a staging file sent while the file is still being written.
//!
//! Under `--write-back` a file over one part is staged on local disk so that its `close`
//! can log it and return before its upload (see `fs::write_back`). Uploading it only
//! after `close` would leave the store idle while the program writes: here a task sends
//! each full part of the staging file as soon as the file has grown past it, as a
//! streamed upload would, and the commit after `close` sends only the rest and completes
//! the upload. The writes never wait for the store: they only move the line below which
//! the file is handed to the task ([`EarlyParts::written`]).
//!
//! Parts sent early are only good while the bytes under them stay as they were: a write
//! or truncation below that line *spoils* them, and so does a rename (the upload was
//! started for the old key). The commit then stores the file from the staging file as
//! usual. Whatever is not delivered to a commit (spoiled, failed, or the file dropped
//! unstored) is aborted by the task itself; a daemon killed meanwhile leaves it recorded
//! in the journal, for the next mount to abort (the write-back log stores the file).

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::stream::FuturesOrdered;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::journal::Journal;
use super::multipart::MultipartUpload;
/// Parts in flight at once: as many as a streamed file keeps going on a store next to the
/// machine (4 left it idle half the time there).
const PARTS_IN_FLIGHT: usize = 16;
use crate::memory::MemoryLimiter;
use bucketfs_client::store::{Metadata, ObjectStore};

/// How far the file is handed to the task, and whether it is final (the commit).
#[derive(Clone, Copy, Debug, Default)]
struct Ready {
    bytes: u64,
    last: bool,
}

/// What the task hands to the commit: the upload and its parts, covering `[0, end)`.
pub(super) struct Sent {
    pub upload: MultipartUpload,
    pub parts: Vec<(i32, String)>,
    pub end: u64,
    /// The metadata the upload was started with.
    pub metadata: Metadata,
}

/// The parts of one staging file sent early, and the task sending them.
pub(super) struct EarlyParts {
    ready: watch::Sender<Ready>,
    /// Bytes below this were handed to the task.
    handed: u64,
    spoiled: Arc<AtomicBool>,
    task: JoinHandle<Option<Sent>>,
}

/// Everything the task needs to send parts of one file.
pub(super) struct Source {
    pub store: Arc<dyn ObjectStore>,
    pub journal: Option<Arc<Journal>>,
    pub key: String,
    pub metadata: Metadata,
    /// A handle of the staging file.
    pub file: File,
    pub part_size: u64,
    pub memory: Arc<MemoryLimiter>,
}

impl EarlyParts {
    /// Starts the task; nothing is sent before the file is past one part.
    pub fn start(source: Source) -> Self {
        let (ready, receiver) = watch::channel(Ready::default());
        let spoiled = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(send_parts(source, receiver, spoiled.clone()));
        Self { ready, handed: 0, spoiled, task }
    }

    /// Bytes `[offset, offset + len)` were written and the file is now `size` bytes: a
    /// write below what was handed spoils the parts, else the file up to `size` is handed.
    pub fn written(&mut self, offset: u64, size: u64) {
        if offset < self.handed {
            self.spoil();
        } else if size > self.handed {
            self.handed = size;
            self.ready.send_replace(Ready { bytes: size, last: false });
        }
    }

    /// The file was cut or extended to `size`.
    pub fn truncated(&mut self, size: u64) {
        match size < self.handed {
            true => self.spoil(),
            false => self.written(size, size),
        }
    }

    /// The parts are no good (see the module documentation): the task aborts the upload.
    pub fn spoil(&mut self) {
        self.spoiled.store(true, Ordering::Release);
        self.ready.send_replace(Ready { bytes: self.handed, last: true });
    }

    /// The file is final at `size` bytes under `key`: the upload and the parts sent, all
    /// full parts below `size` included, for the commit to send the rest and complete.
    /// `None` where nothing usable was sent (then the task has aborted what it started).
    pub async fn finish(mut self, size: u64, key: &str) -> Option<Sent> {
        if size < self.handed {
            self.spoil();
        }
        let spoiled = self.spoiled.load(Ordering::Acquire);
        self.ready.send_replace(Ready { bytes: size, last: true });
        let sent = (&mut self.task).await.ok()??;
        if spoiled || sent.upload.key() != key {
            sent.upload.abort().await;
            return None;
        }
        Some(sent)
    }
}

impl Drop for EarlyParts {
    fn drop(&mut self) {
        // Not finished (the file was dropped unstored, or handed over): the task sees the
        // channel closed, and aborts.
        self.spoiled.store(true, Ordering::Release);
    }
}

/// The task: sends each full part below what is handed, up to [`PARTS_IN_FLIGHT`] at
/// once; at the last hand-over, waits for them and delivers the upload. Aborts it where
/// it cannot deliver it.
async fn send_parts(source: Source, mut ready: watch::Receiver<Ready>, spoiled: Arc<AtomicBool>) -> Option<Sent> {
    let mut upload: Option<MultipartUpload> = None;
    let mut in_flight = FuturesOrdered::new();
    let mut parts = Vec::new();
    let mut end = 0;
    let mut failed = false;
    loop {
        let Ready { bytes, last } = *ready.borrow_and_update();
        if spoiled.load(Ordering::Acquire) || failed {
            break;
        }
        while end + source.part_size <= bytes && in_flight.len() < PARTS_IN_FLIGHT {
            if upload.is_none() {
                let started =
                    MultipartUpload::start(&source.store, source.journal.as_deref(), &source.key, &source.metadata);
                match started.await {
                    Ok(started) => upload = Some(started),
                    Err(error) => {
                        tracing::debug!(key = source.key, "parts sent while written: {error}");
                        return None;
                    }
                }
            }
            let Some(started) = &upload else { break };
            let range = end..end + source.part_size;
            // Within the memory budget: more parts wait for these to come back; past it
            // only one (as a streamed file's buffer, when nothing else will free memory).
            let memory = match source.memory.try_reserve(source.part_size) {
                Some(memory) => memory,
                None if in_flight.is_empty() => source.memory.reserve(source.part_size),
                None => break,
            }
            .in_flight();
            let data = match super::staging::read_range(&source.file, range) {
                Ok(data) => data,
                Err(_) => {
                    failed = true;
                    break;
                }
            };
            let number = parts.len() as i32 + in_flight.len() as i32 + 1;
            let send = started.part_task(number, data);
            in_flight.push_back(async move {
                let result = send.await;
                drop(memory);
                result.map(|etag| (number, etag))
            });
            end += source.part_size;
        }
        if failed {
            break;
        }
        let more = end + source.part_size <= bytes;
        if last && !more && in_flight.is_empty() {
            let upload = upload?;
            return Some(Sent { upload, parts, end, metadata: source.metadata });
        }
        tokio::select! {
            Some(result) = in_flight.next(), if !in_flight.is_empty() => match result {
                Ok(part) => parts.push(part),
                Err(error) => {
                    tracing::debug!(key = source.key, "a part sent while written: {error}");
                    failed = true;
                }
            },
            changed = ready.changed(), if !last => {
                if changed.is_err() {
                    break; // the file was dropped unstored
                }
            }
            else => break,
        }
    }
    // Not delivered: nothing of it is wanted.
    while in_flight.next().await.is_some() {}
    if let Some(upload) = upload {
        upload.abort().await;
    }
    None
}
