//! Deletes that `--write-back` sends after `unlink` and `rmdir` have returned.
//!
//! Without it, `rm -rf` waits for one `DeleteObject` per file and per directory, one
//! after the other: a round trip each, minutes over a far store. With it, a delete is
//! recorded in the write-back log first (synced as a closed file's record is, so the
//! next mount sends it if this daemon dies), the name leaves the mount at once (lookups
//! and listings leave it out until the delete has ended), and the key joins its store's
//! queue. One task per store sends the queue as `DeleteObjects` requests of up to 1,000
//! keys, one request at a time: the first delete goes at once, those made while it runs
//! go together in the next.
//!
//! What the store must see after a delete waits for it ([`PendingDeletes::settle_at`]):
//! anything written at the key or below it (`create`, `mkdir`, `symlink`, `mknod`, the
//! target of a `rename`) and unmount ([`PendingDeletes::settle_all`]). `rmdir` asks the
//! store whether anything but keys being deleted is below the directory
//! ([`PendingDeletes::not_ended_under`]); its own delete follows theirs in the queue.
//!
//! A delete the store refuses shows the name again (the store still holds the object),
//! is said in the daemon's log, and stays in the write-back log as a refused record
//! (`bucketfs write-back list`, `retry`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use super::error::FsError;
use super::Fs;
use crate::namespace::{HeldRemoval, Ino};
use crate::write::write_back::{PendingFile, Recorded};
use bucketfs_client::store::{ObjectStore, MAX_DELETED_AT_ONCE};

/// Deletes not ended, all stores together, past which `unlink` waits for room: it bounds
/// the memory they hold and the names held out of listings.
const MOST_DELETES_WAITING: usize = 10_000;

/// The deletes not ended yet, by store (source index). Locks: `queues` before a
/// queue's `waiting`.
pub(super) struct PendingDeletes {
    queues: Mutex<HashMap<usize, Arc<DeleteQueue>>>,
    room: Arc<Semaphore>,
    /// Names whose delete the store refused, (parent, name): the kernel may keep a
    /// negative entry of each (it looked them up as gone), which the FUSE layer drops.
    names_back: mpsc::UnboundedSender<(Ino, String)>,
    names_back_to_tell: Mutex<Option<mpsc::UnboundedReceiver<(Ino, String)>>>,
}

impl Default for PendingDeletes {
    fn default() -> Self {
        let (names_back, to_tell) = mpsc::unbounded_channel();
        Self {
            queues: Mutex::default(),
            room: Arc::new(Semaphore::new(MOST_DELETES_WAITING)),
            names_back,
            names_back_to_tell: Mutex::new(Some(to_tell)),
        }
    }
}

/// A delete that `unlink` or `rmdir` returned before sending.
pub(super) struct Delete {
    pub key: String,
    /// Its record in the write-back log: done once deleted, failed if refused.
    pub recorded: Recorded,
    /// The name, out of the mount until the delete ended.
    pub held: HeldRemoval,
}

struct Queued {
    delete: Delete,
    /// Dropped when the delete has ended.
    ended: watch::Sender<()>,
    room: OwnedSemaphorePermit,
}

#[derive(Default)]
struct DeleteQueue {
    waiting: Mutex<Waiting>,
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Waiting {
    /// Not sent yet, in the order of the deletes.
    queued: Vec<Queued>,
    /// Every key not ended (queued or being sent), with what closes when each ends.
    not_ended: BTreeMap<String, Vec<watch::Receiver<()>>>,
}

impl PendingDeletes {
    /// Room for one more delete: waits while [`MOST_DELETES_WAITING`] have not ended.
    pub async fn room(&self) -> Option<OwnedSemaphorePermit> {
        self.room.clone().acquire_owned().await.ok()
    }

    /// Sends `delete` to `store` (source `source`) soon.
    pub fn send_soon(&self, source: usize, store: &Arc<dyn ObjectStore>, delete: Delete, room: OwnedSemaphorePermit) {
        let queue = {
            let mut queues = self.queues.lock();
            queues
                .entry(source)
                .or_insert_with(|| {
                    let queue = Arc::new(DeleteQueue::default());
                    tokio::spawn(send_queue(queue.clone(), store.clone(), self.names_back.clone()));
                    queue
                })
                .clone()
        };
        let (ended, ended_rx) = watch::channel(());
        {
            let mut waiting = queue.waiting.lock();
            waiting.not_ended.entry(delete.key.clone()).or_default().push(ended_rx);
            waiting.queued.push(Queued { delete, ended, room });
        }
        queue.wake.notify_one();
    }

    /// Waits until the deletes of `key` in `source`, and of every key below `key/`, have
    /// ended: what is written there next must reach the store after them.
    pub async fn settle_at(&self, source: usize, key: &str) {
        let Some(queue) = self.queues.lock().get(&source).cloned() else { return };
        let below = format!("{}/", key.trim_end_matches('/'));
        let ends: Vec<watch::Receiver<()>> = {
            let waiting = queue.waiting.lock();
            let exact = waiting.not_ended.get(key.trim_end_matches('/')).into_iter().flatten();
            let under = waiting.not_ended.range(below.clone()..).take_while(|(k, _)| k.starts_with(&below));
            exact.chain(under.flat_map(|(_, ends)| ends)).cloned().collect()
        };
        for mut ended in ends {
            while ended.changed().await.is_ok() {}
        }
    }

    /// The keys below `prefix` (ending in `/`) in `source` whose delete has not ended.
    pub fn not_ended_under(&self, source: usize, prefix: &str) -> HashSet<String> {
        let Some(queue) = self.queues.lock().get(&source).cloned() else { return HashSet::new() };
        let waiting = queue.waiting.lock();
        let under = waiting.not_ended.range(prefix.to_owned()..).take_while(|(key, _)| key.starts_with(prefix));
        under.map(|(key, _)| key.clone()).collect()
    }

    /// Waits until every delete made so far has ended (unmount).
    pub async fn settle_all(&self) {
        let queues: Vec<_> = self.queues.lock().values().cloned().collect();
        for queue in queues {
            let ends: Vec<_> = queue.waiting.lock().not_ended.values().flatten().cloned().collect();
            for mut ended in ends {
                while ended.changed().await.is_ok() {}
            }
        }
    }
}

/// Sends the deletes of one store for as long as the mount runs: all that are queued (up
/// to a request's worth) as soon as the previous request has been answered.
async fn send_queue(
    queue: Arc<DeleteQueue>,
    store: Arc<dyn ObjectStore>,
    names_back: mpsc::UnboundedSender<(Ino, String)>,
) {
    loop {
        let batch: Vec<Queued> = {
            let mut waiting = queue.waiting.lock();
            let taken = waiting.queued.len().min(MAX_DELETED_AT_ONCE);
            waiting.queued.drain(..taken).collect()
        };
        if batch.is_empty() {
            queue.wake.notified().await;
            continue;
        }
        let keys: Vec<String> = batch.iter().map(|queued| queued.delete.key.clone()).collect();
        let (mut refused, request_failed) = match store.delete_many(&keys).await {
            Ok(refused) => (refused.into_iter().collect::<HashMap<_, _>>(), None),
            Err(error) => (HashMap::new(), Some(error)), // after the request's own retries
        };
        for Queued { delete, ended, room } in batch {
            let outcome = match (&request_failed, refused.remove(&delete.key)) {
                (Some(error), _) => Err(error.clone()),
                (None, None) => Ok(()),
                // A key the store was too busy for, in an answer that came: that key again,
                // with the retries of a single delete.
                (None, Some(error)) if error.is_transient() => store.delete(&delete.key).await,
                (None, Some(error)) => Err(error),
            };
            if let Some(name_back) = delete.held.landed(outcome.is_ok()) {
                let _ = names_back.send(name_back); // none listens before the session starts
            }
            match outcome {
                Ok(()) => drop(delete.recorded),
                Err(error) => {
                    tracing::warn!(key = delete.key, "could not delete (after unlink or rmdir returned): {error}");
                    delete.recorded.fail(error.to_string()).await;
                }
            }
            drop((ended, room));
            let mut waiting = queue.waiting.lock();
            if let Some(ends) = waiting.not_ended.get_mut(&delete.key) {
                ends.retain(|end| end.has_changed().is_ok()); // an ended one's sender is gone
                if ends.is_empty() {
                    waiting.not_ended.remove(&delete.key);
                }
            }
        }
    }
}

impl Fs {
    /// The names whose delete the store refused after `unlink` or `rmdir` returned, as
    /// (parent, name), for the one caller that tells the kernel (`None` after the first
    /// call).
    pub fn names_back(&self) -> Option<mpsc::UnboundedReceiver<(Ino, String)>> {
        self.deletes.names_back_to_tell.lock().take()
    }

    /// Deletes `key` of `source`, the object of entry (parent, name) (of ETag `etag` if
    /// known): with `--write-back`, logged and sent soon (see the module documentation),
    /// else now. The name is gone from the mount when this returns `Ok`.
    pub(super) async fn delete_entry(
        &self,
        (parent, name): (Ino, &str),
        source: usize,
        key: &str,
        etag: Option<String>,
    ) -> Result<(), FsError> {
        let store = self.namespace.store(source);
        if self.config.write.write_back {
            if let Some(room) = self.deletes.room().await {
                let record = PendingFile::delete(key.to_owned(), etag);
                if let Some(recorded) = self.record_in_write_back_log(source, record).await {
                    let held = self.namespace.remove_entry_until_deleted(parent, name);
                    self.deletes.send_soon(source, store, Delete { key: key.to_owned(), recorded, held }, room);
                    return Ok(());
                }
            }
        }
        store.delete(key).await?;
        self.namespace.remove_entry(parent, name);
        Ok(())
    }

    /// The key of a new entry `name` in `parent`, once the deletes that a write there
    /// must follow have ended.
    pub(super) async fn new_entry_key(&self, parent: Ino, name: &str) -> Result<(usize, String), FsError> {
        let (source, key) = self.namespace.new_entry_key(parent, name).await?;
        self.deletes.settle_at(source, &key).await;
        Ok((source, key))
    }
}
