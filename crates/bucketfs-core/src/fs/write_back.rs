//! `--write-back` at the file system's level: a closed file handed to the background
//! once the write-back log (`write::write_back`) holds it, a file written past one part
//! moved to a staging file so that its close can do the same (and back to a streamed
//! upload past the log's limit), and what an operator does with the files the store
//! refused (`bucketfs write-back`, through the root's attribute [`WRITE_BACK`]).

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::error::FsError;
use super::writers::Writer;
use super::{Fs, Heard};
use crate::namespace::Location;
use crate::write::write_back::{FailedFile, PendingFile, Recorded};
use crate::write::Output;

/// Bytes copied at a time from a staging file into the streamed upload that goes on from it.
const STREAM_CHUNK: u64 = 1 << 20;

/// How long after `close()`, or after the last use of the file since (a change of its
/// attributes, an open to read it), a file's upload starts under `--write-back` (see
/// [`Fs::hand_off`]). rsync renames its temporary file about a millisecond after
/// closing it; a close-to-upload delay costs nothing in throughput (uploads overlap), only
/// this much more before the last file is stored. 200 ms, not less: on a busy 2-core
/// machine a program's next step after its `close` came more than 50 ms later.
pub const UPLOAD_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// The longest a file used again and again after `close()` waits for its upload.
const LONGEST_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// On the mount's root: reading it lists the files closed with `--write-back` that the
/// store refused; setting it to `retry`, or to `discard` (then keys, one per line; none
/// for all), acts on them.
pub const WRITE_BACK: &str = "bucketfs.write-back";

impl Fs {
    /// `close()` with `--write-back`: returns once the whole file is in the write-back
    /// log on local disk (so the next mount stores it if this daemon dies), and stores it
    /// in the background, at most `uploads` at once; a close does not wait for an upload
    /// to end (the log's limit bounds what waits). A file that streamed parts (past half
    /// the log's limit), a staging file that starts from a stored object, or one the log
    /// has no room for is stored before it returns.
    ///
    /// The upload starts [`UPLOAD_GRACE`] after the close or the file's last use since
    /// (at most [`LONGEST_GRACE`] after the close), or at once when someone waits for it
    /// (`Fs::settle`: an open to write, unmount). Programs that write a file under a
    /// temporary name, then set its times and mode and rename it (rsync, editors, package
    /// managers) do so step by step within the grace: the upload takes the changes and goes
    /// to the final name, where each would otherwise cost a copy of the stored object. The
    /// grace counts from each step, not from the close, so that a busy machine that
    /// stretches the whole sequence past it still does not split it.
    pub(super) async fn hand_off(
        self: &Arc<Self>,
        writer: Arc<Writer>,
        uploads: Arc<Semaphore>,
    ) -> Result<(), FsError> {
        let Some(recorded) = self.record_write_back(&writer).await else {
            return self.commit(&writer, Heard::ByCaller).await;
        };
        let running = writer.hand_off(recorded).await;
        let fs = self.clone();
        tokio::spawn(async move {
            let longest = tokio::time::sleep(LONGEST_GRACE);
            tokio::pin!(longest);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(UPLOAD_GRACE) => break,
                    () = writer.hurry.notified() => break,
                    () = &mut longest => break,
                    () = writer.touched.notified() => {}
                }
            }
            let room = uploads.acquire_owned().await;
            let Some(recorded) = writer.start_upload() else {
                return; // taken back: written again, and logged again at its next close
            };
            let mut failed = None;
            if let Err(FsError::Store(error)) = fs.commit(&writer, Heard::ByNobody).await {
                // Refused after the store's own retries: kept and reported until stored
                // (`bucketfs write-back retry`, or the next mount) or discarded.
                failed = Some(error.to_string());
                recorded.fail(error.to_string()).await;
            }
            writer.end_upload(failed);
            drop((running, room));
        });
        Ok(())
    }

    /// A streamed file written past its first part under `--write-back` (its upload sends
    /// no part, see `Upload::one_part_only`): it goes on, under the same handles, in a
    /// staging file that holds what was written, so that its close logs it whole and
    /// returns before its upload, up to half the write-back limit; its full parts are sent
    /// meanwhile (`write::early_parts`), so the upload after close sends only the rest.
    /// Past that limit it streams again ([`Fs::streamed_past_limit`]).
    pub(super) async fn staged_past_one_part(&self, handle: u64, writer: &Arc<Writer>) -> Result<Arc<Writer>, FsError> {
        let _moving = self.writers.moving().await;
        if let Some(moved) = self.writers.moved_already(handle, writer)? {
            return Ok(moved);
        }
        let Output::Streamed(upload) = &writer.output else { return Ok(writer.clone()) };
        let source = self.source_of(writer.ino).ok_or(FsError::NotFound)?;
        let (create_only, replaces) = upload.replaced().await;
        let Some((written, metadata)) = upload.hand_over_unsent().await else {
            // Committed meanwhile (the upload of a close that came first, as a shell's
            // `dup2` then `close` of the first descriptor): the write now goes on from
            // the stored object.
            return Ok(writer.clone());
        };
        let staged = async {
            let mut staged = self.new_staged(source, upload.key(), None, metadata)?;
            if let Some(most) = self.staged_at_most() {
                staged = staged.staging_at_most(most);
                // Parts sized so that the largest staged file fits in S3's 10,000.
                staged.send_parts_early(self.config.write.part_size.max(most.div_ceil(9_000))).await?;
            }
            if !create_only {
                staged.replacing(replaces).await;
            }
            staged.write(0, &written).await?.size()?;
            Ok::<_, FsError>(staged)
        }
        .await;
        upload.handed_over(staged.is_ok()).await;
        Ok(self.move_output(writer, Output::Staged(staged?)))
    }

    /// A file staged under `--write-back` written past the write-back limit, which it
    /// could not wait in: it goes on, under the same handles, as a streamed upload fed
    /// with what was written (this write waits for those parts to go, as writes of a
    /// streamed file do), and is stored as without the option, its close waiting for the
    /// last parts.
    pub(super) async fn streamed_past_limit(&self, handle: u64, writer: &Arc<Writer>) -> Result<Arc<Writer>, FsError> {
        let _moving = self.writers.moving().await;
        if let Some(moved) = self.writers.moved_already(handle, writer)? {
            return Ok(moved);
        }
        let Output::Staged(staged) = &writer.output else { return Ok(writer.clone()) };
        let source = self.source_of(writer.ino).ok_or(FsError::NotFound)?;
        let Some((create_only, replaces, metadata, size)) = staged.hand_over_to_stream().await else {
            return Ok(writer.clone()); // stored meanwhile: the write goes on from the object
        };
        tracing::debug!(key = staged.key(), size, "past the write-back limit: streamed from here");
        let upload =
            self.new_upload(source, staged.key(), create_only, metadata).replacing(replaces).one_part_only(false);
        let fed = async {
            let mut offset = 0;
            while offset < size {
                let bytes = staged.read(offset, STREAM_CHUNK).await?;
                upload.write(offset, &bytes).await?.size()?;
                offset += bytes.len() as u64;
            }
            Ok::<_, FsError>(())
        }
        .await;
        staged.handed_over(fed.is_ok()).await;
        if let Err(error) = fed {
            upload.discard().await;
            let _ = upload.commit().await; // aborts the parts it sent
            return Err(error);
        }
        Ok(self.move_output(writer, Output::Streamed(upload)))
    }

    /// How large a file staged under `--write-back` may grow before it streams: half the
    /// log's limit (a file filling it alone would make every other close wait for its
    /// upload), and no more than staging files may hold (past that a write fails, ENOSPC).
    /// `None` without a write-back log.
    pub(super) fn staged_at_most(&self) -> Option<u64> {
        let (_, limit) = self.write_back_usage()?;
        Some((limit / 2).min(self.config.write.staging.limit.limit()))
    }

    /// Every handle of `writer` goes on with `output` instead.
    fn move_output(&self, writer: &Arc<Writer>, output: Output) -> Arc<Writer> {
        let next = Arc::new(writer.moved_to(output));
        self.writers.move_on(writer, &next);
        next
    }

    /// The write-back log's record of `writer`'s whole file, if nothing of it is stored or
    /// sent yet and the log could take it.
    async fn record_write_back(&self, writer: &Writer) -> Option<Recorded> {
        let pending = writer.output.pending_whole().await?;
        let source = match self.namespace.node(writer.ino).ok()?.location {
            Location::File { source, .. } => source,
            _ => return None,
        };
        self.record_in_write_back_log(source, pending).await
    }

    /// `file`, to be stored in `source`, appended to the write-back log and synced.
    pub(super) async fn record_in_write_back_log(&self, source: usize, file: PendingFile) -> Option<Recorded> {
        let log = self.config.write.write_back_log.as_ref()?;
        log.record(self.namespace.store(source).location(), file).await
    }

    /// Files closed with `--write-back` that the store refused, kept in the log.
    pub fn write_back_failed(&self) -> Vec<FailedFile> {
        self.config.write.write_back_log.as_ref().map(|log| log.failed()).unwrap_or_default()
    }

    /// Where the write-back log is.
    pub fn write_back_dir(&self) -> Option<&std::path::Path> {
        self.config.write.write_back_log.as_ref().map(|log| log.dir())
    }

    /// `--write-back`: close() returns before the upload.
    pub fn write_back_on(&self) -> bool {
        self.config.write.write_back
    }

    /// The write-back log's bytes not stored yet (failed ones included), and its limit.
    pub fn write_back_usage(&self) -> Option<(u64, u64)> {
        self.config.write.write_back_log.as_ref().map(|log| log.usage())
    }

    /// Reading [`WRITE_BACK`]: a line per failed file, `KEY (BYTES bytes): ERROR` (control
    /// characters of the key escaped, so that a line is a file).
    pub fn write_back_report(&self) -> String {
        self.write_back_failed()
            .iter()
            .map(|failed| match failed.delete {
                true => format!("{} (delete): {}\n", printable(&failed.key), failed.error),
                false => format!("{} ({} bytes): {}\n", printable(&failed.key), failed.bytes, failed.error),
            })
            .collect()
    }

    /// Setting [`WRITE_BACK`]: `retry` stores the failed files where nothing changed since
    /// (see `write::write_back`), `discard` drops those of the keys that follow, one per
    /// line (every one without keys).
    pub async fn write_back_command(&self, command: &str) -> Result<(), FsError> {
        let log = self.config.write.write_back_log.as_ref().ok_or(FsError::ReadOnly)?;
        let mut lines = command.lines();
        let gone = match lines.next().map(str::trim) {
            Some("retry") => {
                let (stored, left) = log.retry_failed(&self.namespace.stores()).await;
                tracing::info!("write-back retry: {} files stored, {left} still failed", stored.len());
                stored
            }
            Some("discard") => {
                let keys: Vec<String> = lines.map(str::to_owned).collect();
                let discarded = log.discard_failed(&keys);
                tracing::warn!("write-back: {} failed files discarded on request", discarded.len());
                discarded
            }
            _ => return Err(FsError::Invalid("write-back command: retry, or discard [keys]")),
        };
        // Stored or dropped: no longer reported at exit.
        for key in gone {
            self.writers.no_longer_unstored(&key);
        }
        Ok(())
    }
}

/// `key` with its control characters (a newline, a tab) escaped, the rest as it is.
fn printable(key: &str) -> String {
    key.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}
