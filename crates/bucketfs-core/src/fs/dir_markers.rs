//! Directory markers that `--write-back` stores after the change has returned.
//!
//! A directory is its marker object (`DIR/`), written by `mkdir` and written again by
//! each `chmod`, `chown`, `utimens` and `user.*` xattr change of the directory, which
//! used to cost a PUT before it returned: `tar -x` makes each directory, fills it, then
//! sets its owner, mode and times, three or four PUTs per directory, waited for one by
//! one. With `--write-back` the change is recorded in the write-back log (synced before
//! it returns, as a closed file is, so the next mount stores it if this daemon dies)
//! and shown at once; the marker is written a moment after the last change
//! ([`COALESCE`], at most [`LONGEST_COALESCE`] after the first), once for all the
//! changes of that directory made meanwhile. So `tar` into a new directory also
//! goes on while the store is away: names in a directory just made are known to be
//! free without asking it.
//!
//! Until it is written, the mount shows the directory as it was told (its existence,
//! its attributes) whatever the store says ([`crate::namespace::Namespace::hold_dir`]).
//!
//! What would be overtaken by that write waits for it: `rmdir` of the directory (the
//! write must not bring it back), `rename` of any directory (its markers move key by key)
//! and unmount ([`PendingMarkers::settle`], [`PendingMarkers::settle_all`]). Two writes
//! of one marker run in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use super::error::FsError;
use super::Fs;
use crate::namespace::{HeldDir, Ino};
use crate::write::write_back::{PendingFile, Recorded};
use bucketfs_client::store::{Metadata, ObjectStore, StoreError, WriteCondition};

/// How long a marker write waits for more changes of its directory after the last one:
/// `tar` and `rsync` set a directory's owner, mode and times within a millisecond of
/// each other (more on a loaded machine, as each change is synced to the log first).
pub(super) const COALESCE: Duration = Duration::from_millis(50);
/// Longest a marker write waits for changes that keep coming.
const LONGEST_COALESCE: Duration = Duration::from_secs(1);

impl Fs {
    /// Writes directory marker `prefix` of `source` with `metadata` (`create_only`: a new
    /// directory), and has `show` enter it in the namespace (it gives the directory's
    /// inode and what to return). With `--write-back` it is logged, shown and stored just
    /// after; else stored, then shown.
    pub(super) async fn write_marker<T>(
        &self,
        source: usize,
        prefix: &str,
        metadata: Metadata,
        create_only: bool,
        show: impl FnOnce(Arc<Metadata>) -> (Ino, T),
    ) -> Result<T, FsError> {
        let store = self.namespace.store(source).clone();
        if self.config.write.write_back {
            let marker = PendingFile::marker(prefix.to_owned(), metadata.clone());
            if let Some(recorded) = self.record_in_write_back_log(source, marker).await {
                let metadata = Arc::new(metadata);
                let (dir, shown) = show(metadata.clone());
                let held = self.namespace.hold_dir(dir);
                self.markers.store_soon(dir, store, prefix.to_owned(), metadata, recorded, held);
                return Ok(shown);
            }
        }
        store_marker(&store, prefix, &metadata, create_only).await?;
        Ok(show(Arc::new(metadata)).1)
    }
}

/// Writes directory marker `prefix` with `metadata`: the one request that writes a
/// marker, for `mkdir`, a directory's attribute changes, and a directory's `rename`,
/// which writes the markers below it anew rather than copying them (a marker is empty,
/// so a PUT costs what a copy does, and SeaweedFS cannot copy one: `404 NoSuchKey`).
/// Returns the marker's ETag.
pub(super) async fn store_marker(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    metadata: &Metadata,
    create_only: bool,
) -> Result<Option<String>, StoreError> {
    store.put(prefix, Bytes::new(), metadata, &WriteCondition::absent_if(create_only)).await
}

/// The marker writes not finished yet, by directory. Locks: `by_dir` before a
/// `PendingMarker::latest`, and neither is held while the namespace's is taken.
#[derive(Default)]
pub(super) struct PendingMarkers {
    by_dir: Arc<Mutex<HashMap<Ino, Arc<PendingMarker>>>>,
}

struct PendingMarker {
    /// What to store and its record in the log, until the write takes them.
    latest: Mutex<Option<(Arc<Metadata>, Recorded)>>,
    /// Closed (its sender dropped) when the write has ended.
    ended: watch::Receiver<()>,
    /// Cuts the wait for more changes short: somebody waits for the write.
    hurry: Notify,
    /// Another change was taken in: the wait for more starts again.
    changed: Notify,
}

impl PendingMarker {
    async fn ended(&self) {
        let mut ended = self.ended.clone();
        while ended.changed().await.is_ok() {}
    }
}

impl PendingMarkers {
    /// Stores `metadata` as the marker `prefix` of directory `dir` in `store` soon; a
    /// write of `dir` still waiting takes it instead (its earlier record is done then).
    pub fn store_soon(
        &self,
        dir: Ino,
        store: Arc<dyn ObjectStore>,
        prefix: String,
        metadata: Arc<Metadata>,
        recorded: Recorded,
        held: HeldDir,
    ) {
        let mut by_dir = self.by_dir.lock();
        let before = by_dir.get(&dir).cloned();
        if let Some(waiting) = &before {
            let mut latest = waiting.latest.lock();
            if latest.is_some() {
                *latest = Some((metadata, recorded));
                waiting.changed.notify_one();
                return; // `held` is the same hold as that write's
            }
        }
        let (end, ended) = watch::channel(());
        let pending = Arc::new(PendingMarker {
            latest: Mutex::new(Some((metadata, recorded))),
            ended,
            hurry: Notify::new(),
            changed: Notify::new(),
        });
        by_dir.insert(dir, pending.clone());
        let by_dir = self.by_dir.clone();
        tokio::spawn(async move {
            if let Some(before) = before {
                before.ended().await; // the same key: in the order of the changes
            }
            let waiting_since = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(COALESCE) => break,
                    _ = pending.hurry.notified() => break,
                    _ = pending.changed.notified() => {
                        if waiting_since.elapsed() >= LONGEST_COALESCE {
                            break;
                        }
                    }
                }
            }
            let taken = pending.latest.lock().take();
            if let Some((metadata, recorded)) = taken {
                match store_marker(&store, &prefix, &metadata, false).await {
                    Ok(_) => drop(recorded),
                    Err(error) => {
                        tracing::warn!(key = prefix, "could not store a directory's marker: {error}");
                        recorded.fail(error.to_string()).await;
                    }
                }
            }
            let last = {
                let mut by_dir = by_dir.lock();
                let last = by_dir.get(&dir).is_some_and(|current| Arc::ptr_eq(current, &pending));
                if last {
                    by_dir.remove(&dir);
                }
                last
            };
            if last {
                held.release(); // else a later write of the directory holds it still
            }
            drop(end);
        });
    }

    /// Waits until the marker of `dir` holds every change made so far.
    pub async fn settle(&self, dir: Ino) {
        let pending = self.by_dir.lock().get(&dir).cloned();
        if let Some(pending) = pending {
            pending.hurry.notify_one();
            pending.ended().await;
        }
    }

    /// [`PendingMarkers::settle`] for every directory.
    pub async fn settle_all(&self) {
        let pending: Vec<_> = self.by_dir.lock().values().cloned().collect();
        for pending in &pending {
            pending.hurry.notify_one();
        }
        for pending in pending {
            pending.ended().await;
        }
    }
}
