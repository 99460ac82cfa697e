//! An in-memory [`ObjectStore`] for unit tests of the layers above `store`: the same
//! delimited, paged LIST semantics as S3 (keys and common prefixes counted together
//! against `max_keys`), HEAD, and ranged GET with If-Match. Integration tests never use
//! it; they run against MinIO.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use super::{ListPage, ObjectInfo, ObjectStore, StoreError};

#[derive(Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, (Bytes, u64)>>, // key -> (data, version)
    /// Ranged GETs served, with their lengths, to check what a reader costs.
    pub gets: Mutex<Vec<Range<u64>>>,
    /// LIST and HEAD requests served.
    pub lists: AtomicUsize,
    pub heads: AtomicUsize,
    versions: AtomicUsize,
    uploads: Mutex<BTreeMap<String, BTreeMap<i32, Bytes>>>,
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
        let version = self.versions.fetch_add(1, Ordering::Relaxed) as u64;
        self.objects.lock().insert(key.to_owned(), (Bytes::from(data), version));
    }

    /// Multipart uploads started and neither completed nor aborted.
    pub fn open_uploads(&self) -> usize {
        self.uploads.lock().len()
    }

    fn info(key: &str, data: &Bytes, version: u64) -> ObjectInfo {
        ObjectInfo {
            key: key.to_owned(),
            size: data.len() as u64,
            mtime: SystemTime::UNIX_EPOCH,
            etag: Some(format!("\"v{version}\"")),
        }
    }

    pub fn list_sync(&self, prefix: &str, token: Option<String>, max_keys: usize) -> ListPage {
        let objects = self.objects.lock();
        let mut page = ListPage::default();
        let mut count = 0;
        let mut last_item: Option<String> = None;
        for (key, (data, version)) in objects.range(prefix.to_owned()..) {
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
                    page.objects.push(Self::info(key, data, *version));
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
    async fn list(&self, prefix: &str, token: Option<String>, max_keys: Option<i32>) -> Result<ListPage, StoreError> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        Ok(self.list_sync(prefix, token, max_keys.unwrap_or(1000).max(1) as usize))
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        self.heads.fetch_add(1, Ordering::Relaxed);
        let objects = self.objects.lock();
        let (data, version) = objects.get(key).ok_or(StoreError::NotFound)?;
        Ok(Self::info(key, data, *version))
    }

    async fn get_range(&self, key: &str, range: Range<u64>, if_match: Option<&str>) -> Result<Bytes, StoreError> {
        let objects = self.objects.lock();
        let (data, version) = objects.get(key).ok_or(StoreError::NotFound)?;
        if let Some(etag) = if_match {
            if Self::info(key, data, *version).etag.as_deref() != Some(etag) {
                return Err(StoreError::Changed);
            }
        }
        self.gets.lock().push(range.clone());
        Ok(data.slice(range.start as usize..range.end as usize))
    }

    async fn put(&self, key: &str, data: Bytes, create_only: bool) -> Result<Option<String>, StoreError> {
        if create_only && self.objects.lock().contains_key(key) {
            return Err(StoreError::AlreadyExists);
        }
        self.put(key, data.to_vec());
        Ok(self.head(key).await?.etag)
    }

    async fn start_upload(&self, key: &str) -> Result<String, StoreError> {
        let id = format!("{key}#{}", self.versions.fetch_add(1, Ordering::Relaxed));
        self.uploads.lock().insert(id.clone(), BTreeMap::new());
        Ok(id)
    }

    async fn upload_part(&self, _key: &str, upload_id: &str, number: i32, data: Bytes) -> Result<String, StoreError> {
        let mut uploads = self.uploads.lock();
        let parts = uploads.get_mut(upload_id).ok_or(StoreError::NotFound)?;
        parts.insert(number, data);
        Ok(format!("\"part{number}\""))
    }

    async fn finish_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, String)>,
        create_only: bool,
    ) -> Result<Option<String>, StoreError> {
        if create_only && self.objects.lock().contains_key(key) {
            return Err(StoreError::AlreadyExists);
        }
        let uploaded = self.uploads.lock().remove(upload_id).ok_or(StoreError::NotFound)?;
        let mut data = Vec::new();
        for (number, _) in parts {
            data.extend_from_slice(uploaded.get(&number).ok_or(StoreError::NotFound)?);
        }
        self.put(key, data);
        Ok(self.head(key).await?.etag)
    }

    async fn abort_upload(&self, _key: &str, upload_id: &str) -> Result<(), StoreError> {
        self.uploads.lock().remove(upload_id);
        Ok(())
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.objects.lock().remove(key);
        Ok(())
    }
}
