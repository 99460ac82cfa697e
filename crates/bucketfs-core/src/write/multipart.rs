//! The one lifecycle of a multipart upload: start (and record it in the journal),
//! parts, complete, abort. Streamed files, staging files and multipart copies all go
//! through [`MultipartUpload`], so none of them can leave an upload behind unrecorded:
//! the journal record is written (and synced) before the upload is asked for, and removed
//! only once the upload is completed or aborted. An upload whose abort failed, or whose
//! guard is dropped unfinished, keeps its record, and the next mount of the bucket
//! aborts it.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::journal::{Entry, Journal};
use bucketfs_client::store::{Metadata, ObjectStore, StoreError, WriteCondition};

pub struct MultipartUpload {
    store: Arc<dyn ObjectStore>,
    key: String,
    upload_id: String,
    record: Option<Entry>,
    /// Completed or aborted: nothing is left in the store.
    finished: bool,
}

impl MultipartUpload {
    /// `CreateMultipartUpload` of `key`, recorded in `journal`.
    pub async fn start(
        store: &Arc<dyn ObjectStore>,
        journal: Option<&Journal>,
        key: &str,
        metadata: &Metadata,
    ) -> Result<Self, StoreError> {
        let mut record = journal.and_then(|journal| journal.intend(store.as_ref(), key));
        let upload_id = match store.start_upload(key, metadata).await {
            Ok(id) => id,
            Err(error) => {
                // An answer lost on the way may hide an upload the store did start.
                if let (Some(record), true) = (record, error.is_transient()) {
                    record.keep();
                }
                return Err(error);
            }
        };
        if let Some(record) = &mut record {
            record.started(&upload_id);
        }
        Ok(Self { store: store.clone(), key: key.to_owned(), upload_id, record, finished: false })
    }

    /// The key the upload was started for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A task uploading part `number` (from 1), for running in the background.
    pub fn part_task(
        &self,
        number: i32,
        data: Bytes,
    ) -> impl std::future::Future<Output = Result<String, StoreError>> + Send + 'static {
        let (store, key, upload_id) = (self.store.clone(), self.key.clone(), self.upload_id.clone());
        async move { store.upload_part(&key, &upload_id, number, data).await }
    }

    /// `UploadPart` of part `number`; returns its ETag.
    pub async fn upload_part(&self, number: i32, data: Bytes) -> Result<String, StoreError> {
        self.store.upload_part(&self.key, &self.upload_id, number, data).await
    }

    /// `UploadPartCopy`: bytes `range` of `source` (at version `if_match`) as part `number`.
    pub async fn copy_part(
        &self,
        number: i32,
        source: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<String, StoreError> {
        self.store.upload_part_copy(&self.key, &self.upload_id, number, source, range, if_match).await
    }

    /// `CompleteMultipartUpload` with `(number, etag)` parts in order; returns the ETag.
    /// After a failure the upload is still open: [`MultipartUpload::abort`] it.
    pub async fn complete(
        &mut self,
        parts: Vec<(i32, String)>,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        let etag = self.store.finish_upload(&self.key, &self.upload_id, parts, condition).await?;
        self.finished = true;
        self.record = None;
        Ok(etag)
    }

    /// `AbortMultipartUpload`. If the store refuses, the journal keeps the record, so the
    /// next mount of the bucket tries again.
    pub async fn abort(mut self) {
        if self.finished {
            return;
        }
        match self.store.abort_upload(&self.key, &self.upload_id).await {
            Ok(()) => {
                self.finished = true;
                self.record = None;
            }
            Err(error) => {
                tracing::warn!(key = %self.key, "could not abort multipart upload {} (the next mount retries): {error}", self.upload_id);
            }
        }
    }

    /// Runs `parts` (which upload the parts) and completes the upload, or aborts it if
    /// anything failed: the whole life of an upload whose parts are all known up front.
    pub async fn finish_with<F>(mut self, parts: F, condition: &WriteCondition) -> Result<Option<String>, StoreError>
    where
        F: std::future::Future<Output = Result<Vec<(i32, String)>, StoreError>>,
    {
        let result = match parts.await {
            Ok(parts) => self.complete(parts, condition).await,
            Err(error) => Err(error),
        };
        if result.is_err() {
            self.abort().await;
        }
        result
    }
}

impl Drop for MultipartUpload {
    fn drop(&mut self) {
        if !self.finished {
            // Aborting needs the store (async); the record stays for the next mount.
            if let Some(record) = self.record.take() {
                record.keep();
            }
            tracing::debug!(key = %self.key, "multipart upload {} left open, recorded for the next mount", self.upload_id);
        }
    }
}
