//! An in-memory [`ObjectStore`] for unit tests of the layers above `store`: the same
//! delimited, paged LIST semantics as S3 (keys and common prefixes counted together
//! against `max_keys`), HEAD, and ranged GET with If-Match. Integration tests never use
//! it; they run against MinIO.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use super::{BodySink, ListPage, Metadata, ObjectInfo, ObjectStore, OpenUpload, StoreError, WriteCondition};

/// Size of the pieces a GET's body is handed over in.
const BODY_CHUNK: usize = 64 * 1024;

/// What another client does to the store (see [`MemoryStore::after_head`]).
pub type AnotherClientsWrite = Box<dyn FnOnce(&MemoryStore) + Send>;

#[derive(Clone)]
struct Stored {
    data: Bytes,
    version: u64,
    metadata: Arc<Metadata>,
}

/// An unfinished multipart upload: the metadata it was started with, and its parts.
/// Its metadata, its parts, when it was started.
type Upload = (Metadata, BTreeMap<i32, Bytes>, SystemTime);

#[derive(Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, Stored>>,
    /// Ranged GETs served, with their lengths, to check what a reader costs.
    pub gets: Mutex<Vec<Range<u64>>>,
    /// LIST requests served.
    pub lists: AtomicUsize,
    /// How long each delimited LIST takes (a slow store, for tests of timing).
    pub list_latency: Mutex<Duration>,
    /// How long a GET's body pauses after its first piece (a slow transfer, for tests of
    /// what goes on after a read returned).
    pub body_pause: Mutex<Duration>,
    /// How long a GET's body pauses after each piece (a store slower than its readers).
    pub chunk_pause: Mutex<Duration>,
    /// Requests for metadata served: HEADs, and GETs of small objects with their metadata.
    pub heads: AtomicUsize,
    versions: AtomicUsize,
    uploads: Mutex<BTreeMap<String, Upload>>,
    /// The store does not answer: HEAD and PUT fail as a stopped server's would.
    pub away: std::sync::atomic::AtomicBool,
    /// LISTs (of either kind) that are still to time out, one each, before LISTs answer.
    pub lists_timing_out: AtomicUsize,
    /// While set, LISTs answer from this copy of the objects, taken by
    /// [`MemoryStore::freeze_listings`]: a store whose listings lag behind its writes and
    /// deletes (as SeaweedFS's do), or a LIST sent before the changes made while it was
    /// on its way.
    frozen_listing: Mutex<Option<Arc<BTreeMap<String, Stored>>>>,
    /// Run once, right after the next HEAD has answered: another client's write between
    /// a HEAD and the request that follows it.
    pub after_head: Mutex<Option<AnotherClientsWrite>>,
}

impl MemoryStore {
    pub fn with_keys(keys: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        let store = Self::default();
        for (key, data) in keys {
            store.put(&key, data);
        }
        store
    }

    pub fn put(&self, key: &str, data: Vec<u8>) {
        self.store(key, Bytes::from(data), Metadata::default());
    }

    fn store(&self, key: &str, data: Bytes, metadata: Metadata) -> Option<String> {
        let version = self.versions.fetch_add(1, Ordering::Relaxed) as u64;
        let stored = Stored { data, version, metadata: Arc::new(metadata) };
        let etag = Self::info(key, &stored).etag;
        self.objects.lock().insert(key.to_owned(), stored);
        etag
    }

    /// Every key stored now, in order.
    pub fn list_keys(&self) -> Vec<String> {
        self.objects.lock().keys().cloned().collect()
    }

    /// The metadata `key` was last written with.
    pub fn metadata(&self, key: &str) -> Option<Metadata> {
        self.objects.lock().get(key).map(|s| (*s.metadata).clone())
    }

    fn answering(&self) -> Result<(), StoreError> {
        match self.away.load(Ordering::Relaxed) {
            true => Err(StoreError::Unreachable { endpoint: "memory".into(), detail: "away".into() }),
            false => Ok(()),
        }
    }

    /// Multipart uploads started and neither completed nor aborted.
    pub fn open_uploads(&self) -> usize {
        self.uploads.lock().len()
    }

    fn info(key: &str, stored: &Stored) -> ObjectInfo {
        ObjectInfo {
            key: key.to_owned(),
            size: stored.data.len() as u64,
            mtime: SystemTime::UNIX_EPOCH,
            etag: Some(format!("\"v{}\"", stored.version)),
            metadata: Some(stored.metadata.clone()),
        }
    }

    /// Whether a write to `key` may go ahead on `condition`.
    fn check(&self, key: &str, condition: &WriteCondition) -> Result<(), StoreError> {
        let objects = self.objects.lock();
        let current = objects.get(key).map(|stored| Self::info(key, stored).etag);
        match (condition, current) {
            (WriteCondition::Absent, Some(_)) => Err(StoreError::AlreadyExists),
            (WriteCondition::Replaces(_), None) => Err(StoreError::NotFound),
            (WriteCondition::Replaces(etag), Some(current)) if current.as_deref() != Some(etag) => {
                Err(StoreError::Changed)
            }
            _ => Ok(()),
        }
    }

    /// The object `key`, if it is (still) version `if_match`.
    fn current(&self, key: &str, if_match: Option<&str>) -> Result<Stored, StoreError> {
        let stored = self.objects.lock().get(key).cloned().ok_or(StoreError::NotFound)?;
        match if_match {
            Some(etag) if Self::info(key, &stored).etag.as_deref() != Some(etag) => Err(StoreError::Changed),
            _ => Ok(stored),
        }
    }

    /// A LIST times out while `lists_timing_out` counts down.
    fn list_answering(&self) -> Result<(), StoreError> {
        match self.lists_timing_out.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) {
            Ok(_) => Err(StoreError::Timeout("memory".into())),
            Err(_) => Ok(()),
        }
    }

    /// From now on LISTs show the objects as they are now, until [`Self::thaw_listings`].
    pub fn freeze_listings(&self) {
        let now = Arc::new(self.objects.lock().clone());
        *self.frozen_listing.lock() = Some(now);
    }

    /// LISTs show the objects as they are again.
    pub fn thaw_listings(&self) {
        *self.frozen_listing.lock() = None;
    }

    /// `list` over what LISTs show: the objects, or the copy frozen earlier.
    fn with_listed<R>(&self, list: impl FnOnce(&BTreeMap<String, Stored>) -> R) -> R {
        let frozen = self.frozen_listing.lock().clone();
        match frozen {
            Some(frozen) => list(&frozen),
            None => list(&self.objects.lock()),
        }
    }

    pub fn list_sync(&self, prefix: &str, token: Option<String>, max_keys: usize) -> ListPage {
        self.with_listed(|objects| Self::list_delimited(objects, prefix, token, max_keys))
    }

    fn list_delimited(
        objects: &BTreeMap<String, Stored>,
        prefix: &str,
        token: Option<String>,
        max_keys: usize,
    ) -> ListPage {
        let mut page = ListPage::default();
        let mut count = 0;
        let mut last_item: Option<String> = None;
        for (key, stored) in objects.range(prefix.to_owned()..) {
            if !key.starts_with(prefix) {
                break;
            }
            // Tokens are "k:<last key>" or "p:<last common prefix>".
            match token.as_deref().and_then(|t| t.split_at_checked(2)) {
                Some(("k:", last)) if key.as_str() <= last => continue,
                Some(("p:", last)) if key.as_str() <= last || key.starts_with(last) => continue,
                _ => {}
            }
            let rest = &key[prefix.len()..];
            let item = match rest.find('/') {
                Some(slash) => {
                    let common = format!("{prefix}{}", &rest[..=slash]);
                    if page.prefixes.last() == Some(&common) {
                        continue;
                    }
                    if count == max_keys {
                        page.next_token = last_item;
                        return page;
                    }
                    page.prefixes.push(common.clone());
                    format!("p:{common}")
                }
                None => {
                    if count == max_keys {
                        page.next_token = last_item;
                        return page;
                    }
                    page.objects.push(ObjectInfo { metadata: None, ..Self::info(key, stored) });
                    format!("k:{key}")
                }
            };
            count += 1;
            last_item = Some(item);
        }
        page
    }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    fn location(&self) -> String {
        "memory".into()
    }

    // Like a server other than MinIO, this store lists no metadata.
    async fn list(
        &self,
        prefix: &str,
        token: Option<String>,
        max_keys: Option<i32>,
        _with_metadata: bool,
    ) -> Result<ListPage, StoreError> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.list_answering()?;
        let latency = *self.list_latency.lock();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        Ok(self.list_sync(prefix, token, max_keys.unwrap_or(1000).max(1) as usize))
    }

    async fn list_recursive(
        &self,
        prefix: &str,
        token: Option<String>,
        _with_metadata: bool,
    ) -> Result<ListPage, StoreError> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        self.list_answering()?;
        const PAGE: usize = 1000;
        let after = token.unwrap_or_default();
        Ok(self.with_listed(|objects| {
            let mut page = ListPage::default();
            for (key, stored) in objects.range(prefix.to_owned()..).filter(|(k, _)| k.as_str() > after.as_str()) {
                if !key.starts_with(prefix) {
                    break;
                }
                if page.objects.len() == PAGE {
                    page.next_token = page.objects.last().map(|o| o.key.clone());
                    break;
                }
                page.objects.push(ObjectInfo { metadata: None, ..Self::info(key, stored) });
            }
            page
        }))
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        self.answering()?;
        self.heads.fetch_add(1, Ordering::Relaxed);
        let info = Self::info(key, &self.current(key, None)?);
        if let Some(write) = self.after_head.lock().take() {
            write(self);
        }
        Ok(info)
    }

    async fn head_with_body(&self, key: &str, limit: u64) -> Result<(ObjectInfo, Bytes), StoreError> {
        let stored = self.current(key, None)?;
        self.heads.fetch_add(1, Ordering::Relaxed);
        let body = stored.data.slice(..(limit as usize).min(stored.data.len()));
        Ok((Self::info(key, &stored), body))
    }

    async fn get_range_into(&self, key: &str, origin: u64, body: &dyn BodySink, until: u64) -> Result<(), StoreError> {
        let stored = self.current(key, body.etag().as_deref())?;
        body.pin_etag(Self::info(key, &stored).etag.as_deref());
        let range = origin + body.received()..origin + until;
        self.gets.lock().push(range.clone());
        // In pieces, as a network delivers a body, so readers of a part see it first.
        let (pause, chunk_pause) = (*self.body_pause.lock(), *self.chunk_pause.lock());
        for (piece, at) in (range.start..range.end).step_by(BODY_CHUNK).enumerate() {
            body.room().await; // a paced body: as its reader allows
            if !body.has_room() {
                return Ok(()); // abandoned
            }
            if !body.append(&stored.data[at as usize..(at + BODY_CHUNK as u64).min(range.end) as usize]) {
                return Err(StoreError::Other {
                    message: format!("reading {key}: the body took no more"),
                    request_id: None,
                });
            }
            match piece == 0 && !pause.is_zero() {
                true => tokio::time::sleep(pause).await,
                false if !chunk_pause.is_zero() => tokio::time::sleep(chunk_pause).await,
                false => tokio::task::yield_now().await,
            }
        }
        Ok(())
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: &Metadata,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        self.answering()?;
        self.check(key, condition)?;
        Ok(self.store(key, data, metadata.clone()))
    }

    async fn start_upload(&self, key: &str, metadata: &Metadata) -> Result<String, StoreError> {
        let id = format!("{key}#{}", self.versions.fetch_add(1, Ordering::Relaxed));
        self.uploads.lock().insert(id.clone(), (metadata.clone(), BTreeMap::new(), SystemTime::now()));
        Ok(id)
    }

    async fn copy(
        &self,
        source: &str,
        key: &str,
        if_match: Option<&str>,
        metadata: &Metadata,
    ) -> Result<Option<String>, StoreError> {
        let stored = self.current(source, if_match)?;
        Ok(self.store(key, stored.data, metadata.clone()))
    }

    async fn upload_part_copy(
        &self,
        _key: &str,
        upload_id: &str,
        number: i32,
        source: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<String, StoreError> {
        let stored = self.current(source, if_match)?;
        let data = stored.data.slice(range.start as usize..range.end as usize);
        let mut uploads = self.uploads.lock();
        uploads.get_mut(upload_id).ok_or(StoreError::NotFound)?.1.insert(number, data);
        Ok(format!("\"part{number}\""))
    }

    async fn upload_part(&self, _key: &str, upload_id: &str, number: i32, data: Bytes) -> Result<String, StoreError> {
        let mut uploads = self.uploads.lock();
        let (_, parts, _) = uploads.get_mut(upload_id).ok_or(StoreError::NotFound)?;
        parts.insert(number, data);
        Ok(format!("\"part{number}\""))
    }

    async fn finish_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, String)>,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        self.answering()?;
        self.check(key, condition)?;
        let (metadata, uploaded, _) = self.uploads.lock().remove(upload_id).ok_or(StoreError::NotFound)?;
        let mut data = Vec::new();
        for (number, _) in parts {
            data.extend_from_slice(uploaded.get(&number).ok_or(StoreError::NotFound)?);
        }
        Ok(self.store(key, Bytes::from(data), metadata))
    }

    async fn abort_upload(&self, _key: &str, upload_id: &str) -> Result<(), StoreError> {
        self.uploads.lock().remove(upload_id);
        Ok(())
    }

    async fn open_uploads_of(&self, key: &str) -> Result<Vec<OpenUpload>, StoreError> {
        let uploads = self.uploads.lock();
        // Upload ids are `KEY#N` (see `start_upload`).
        let of_key = uploads.iter().filter(|(id, _)| id.rsplit_once('#').is_some_and(|(of, _)| of == key));
        Ok(of_key.map(|(id, upload)| OpenUpload { id: id.clone(), initiated: Some(upload.2) }).collect())
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.objects.lock().remove(key);
        Ok(())
    }

    async fn delete_if_match(&self, key: &str, etag: &str) -> Result<(), StoreError> {
        let mut objects = self.objects.lock();
        match objects.get(key) {
            Some(stored) if Self::info(key, stored).etag.as_deref() != Some(etag) => Err(StoreError::Changed),
            _ => {
                objects.remove(key);
                Ok(())
            }
        }
    }
}
