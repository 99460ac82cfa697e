//! The listings of indexed directories the kernel keeps (FOPEN_CACHE_DIR), across index
//! refreshes: after each refresh the kernel is told to drop every one it holds, and a
//! refresh asked for by `bucketfs refresh` is answered only once they are dropped, so a
//! walk started after the command returns sees the new tree.

use std::sync::{Arc, OnceLock};

use fuser::INodeNo;
use tokio::runtime::Handle;
use tokio::sync::watch;

use bucketfs_core::fs::Fs;

/// How far the kernel's kept listings have caught up with the index refreshes.
pub struct KeptListings {
    /// The number of refreshes swapped in so far.
    refreshes: watch::Receiver<u64>,
    /// The number of refreshes after which the kept listings have been dropped.
    dropped: watch::Receiver<u64>,
}

impl KeptListings {
    /// Starts the task that drops the kept listings after each refresh, for the mount's
    /// life.
    pub fn drop_after_refreshes(
        fs: Arc<Fs>,
        notifier: Arc<OnceLock<fuser::Notifier>>,
        refreshes: watch::Receiver<u64>,
        runtime: &Handle,
    ) -> Self {
        let (dropped_to, dropped) = watch::channel(*refreshes.borrow());
        runtime.spawn(drop_after_each_refresh(fs, notifier, refreshes.clone(), dropped_to));
        Self { refreshes, dropped }
    }

    /// Waits until the listings kept before the latest refresh are dropped.
    pub async fn caught_up(&self) {
        let latest = *self.refreshes.borrow();
        let mut dropped = self.dropped.clone();
        // An error means the task ended with the runtime: nothing is kept any more.
        let _ = dropped.wait_for(|count| *count >= latest).await;
    }
}

/// Drops every listing the kernel keeps of indexed directories after each refresh (every
/// one it holds: a refresh is rare, and telling which changed would cost a comparison of
/// every listing), then says up to which refresh it did.
async fn drop_after_each_refresh(
    fs: Arc<Fs>,
    notifier: Arc<OnceLock<fuser::Notifier>>,
    mut refreshes: watch::Receiver<u64>,
    dropped_to: watch::Sender<u64>,
) {
    while refreshes.changed().await.is_ok() {
        let refreshed = *refreshes.borrow_and_update();
        // Without a notifier the session has not started: the kernel keeps nothing yet.
        if let Some(notifier) = notifier.get().cloned() {
            let fs = fs.clone();
            // A walk of the whole inode table, then one write to /dev/fuse per directory:
            // off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || {
                for dir in fs.held_indexed_dirs() {
                    // ENOENT: the kernel forgot it meanwhile; nothing to drop.
                    let _ = notifier.inval_inode(INodeNo(dir), 0, 0);
                }
            })
            .await;
        }
        dropped_to.send_replace(refreshed);
    }
}
