//! What stopped daemons left in the cache directory: uploads they had started (the
//! journal: aborted) and files they closed with `--write-back` and had not stored (the
//! log: stored). Dealt with at every mount before it answers, and again whenever a
//! daemon that was running then (or started since) stops while this one runs: a daemon
//! killed just before a restart may still be exiting when the new one starts, and what
//! it left must not wait for some later mount.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::journal::{this_daemon, Journal};
use super::write_back::WriteBackLog;
use bucketfs_client::store::ObjectStore;

/// How often the watcher looks for daemons that stopped.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// What a recovery did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Unfinished uploads aborted.
    pub aborted: usize,
    /// Files closed with `--write-back` stored.
    pub stored: usize,
}

/// Aborts the uploads and stores the files of every daemon no longer running, in these
/// stores (records of other buckets stay for their mounts).
pub async fn recover(journal: &Journal, log: &Arc<WriteBackLog>, stores: &[Arc<dyn ObjectStore>]) -> Recovered {
    let aborted = journal.recover(stores).await;
    let stored = log.replay(stores).await;
    let mut named = journal.daemons();
    named.extend(log.daemons());
    journal.liveness().sweep(&named);
    Recovered { aborted, stored }
}

/// The other daemons with records here that are running now.
pub fn running_daemons(journal: &Journal, log: &WriteBackLog) -> HashSet<String> {
    let me = this_daemon();
    let mut names = journal.daemons();
    names.extend(log.daemons());
    names.retain(|name| *name != me && journal.liveness().runs(name));
    names
}

/// Runs for as long as the mount: each time one of the daemons `running` (from
/// [`running_daemons`] before the mount's own recovery), or one seen running since,
/// has stopped, recovers what it left.
pub async fn watch(
    journal: Arc<Journal>,
    log: Arc<WriteBackLog>,
    stores: Vec<Arc<dyn ObjectStore>>,
    mut running: HashSet<String>,
) {
    loop {
        tokio::time::sleep(WATCH_EVERY).await;
        let now = running_daemons(&journal, &log);
        let stopped: Vec<String> = running.difference(&now).cloned().collect();
        running = now;
        if stopped.is_empty() {
            continue;
        }
        let recovered = recover(&journal, &log, &stores).await;
        if recovered != Recovered::default() {
            tracing::info!(
                "daemon {} stopped: stored {} files it closed with --write-back, aborted {} of its uploads",
                stopped.join(", "),
                recovered.stored,
                recovered.aborted
            );
        }
    }
}
