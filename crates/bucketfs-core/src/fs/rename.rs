//! `rename()`: S3 has none, so a file is copied inside the store and the old key deleted,
//! and a directory is moved key by key (not atomic; see SEMANTICS.md).

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::dir_markers::store_marker;
use super::error::FsError;
use super::{content_type, Fs, Reader, RENAME_CONCURRENCY};
use crate::namespace::{Copied, Ino, Location, NamespaceError, Node};
use crate::write::write_back::{Amendment, RenamedOver};
use crate::write::{copy_object, Renamed};

impl Fs {
    /// `rename()`: a server-side copy to the new key, then a delete of the old one (S3
    /// has no rename). A directory is moved key by key: every copy first, then the
    /// deletes, so a failure part-way leaves the source whole (not atomic: SEMANTICS.md).
    /// Open files move with it: readers read the new key, writers upload there.
    pub async fn rename(&self, from: (Ino, &str), to: (Ino, &str), no_replace: bool) -> Result<(), FsError> {
        self.check_writable()?;
        let node = self.namespace.lookup(from.0, from.1).await?;
        let (to_source, to_key) = self.namespace.entry_key(to.0, to.1)?;
        self.deletes.settle_at(to_source, &to_key).await; // the copies must land after them
        let target = match self.namespace.lookup(to.0, to.1).await {
            Ok(target) => Some(target),
            Err(NamespaceError::NotFound) => None,
            Err(error) => return Err(error.into()),
        };
        if target.as_ref().is_some_and(|t| t.ino == node.ino) {
            return Ok(()); // a name onto itself
        }
        if no_replace && target.is_some() {
            return Err(FsError::Exists);
        }
        if let Some(target) = &target {
            Self::check_changeable(target)?; // not onto the view of versions
        }
        // Uploads left running by close() (--write-back) must land before they are moved,
        // and must not land on the target after the move. (A file's own upload not
        // started yet is sent to the new name instead: `rename_file`.)
        if node.location.is_dir() {
            self.settle_all().await;
        } else if let Some(target) = &target {
            self.settle(target.ino).await;
        }
        match (&node.location, target.as_ref().map(|t| t.location.is_dir())) {
            (Location::File { source, .. } | Location::Dir { source, .. }, _) if *source != to_source => {
                Err(FsError::CrossDevice("a different bucket or prefix"))
            }
            (Location::File { .. }, Some(true)) => Err(FsError::IsDir),
            (Location::File { key, .. }, _) => self.rename_file(&node, key, from, to, to_key, target.as_ref()).await,
            (Location::Dir { .. }, Some(false)) => Err(FsError::NotDir),
            (Location::Dir { prefix, .. }, _) => {
                if let Some(target) = &target {
                    self.check_empty_dir(target).await?;
                }
                self.rename_dir(&node, prefix, from, to, format!("{to_key}/"), target.is_some()).await
            }
            (Location::SourceList, _) => Err(FsError::NotPermitted),
            (Location::History(_), _) => Err(FsError::ReadOnly),
        }
    }

    async fn rename_file(
        &self,
        node: &Node,
        key: &str,
        from: (Ino, &str),
        to: (Ino, &str),
        to_key: String,
        replaced: Option<&Node>,
    ) -> Result<(), FsError> {
        let writers = self.writers.of(node.ino);
        // What a replay after a crash finds at the new name if the rename is all that
        // happened: the object replaced (stored: `rename` settled it), or nothing.
        // (An ETag not known leaves it unsaid: a replay then makes a conflict copy.)
        let over = match replaced {
            None => Some(RenamedOver::Nothing),
            Some(target) => {
                let etag = self.namespace.node(target.ino).map_or_else(|_| target.etag.clone(), |now| now.etag);
                etag.map(RenamedOver::Object)
            }
        };
        // Some(old key holds an object to delete) if the file is not stored yet.
        let mut pending: Option<bool> = None;
        let replaces = match &over {
            Some(RenamedOver::Object(etag)) => Some(etag.clone()),
            Some(RenamedOver::Nothing) | None => None,
        };
        for writer in &writers {
            if let Renamed::Pending { old_key_holds } = writer.output.rename(to_key.clone(), replaces.clone()).await {
                pending = Some(pending.unwrap_or(false) | old_key_holds);
                // Closed with --write-back, its upload not started: a replay after a
                // crash must store it under the new name too, in place of what is there.
                if let Some(record) = writer.record() {
                    record.amend(Amendment::renamed(to_key.clone(), over.clone()));
                }
            }
        }
        let Location::File { source, .. } = node.location else { return Err(FsError::IsDir) };
        let store = self.namespace.store(source);
        if let Some(old_key_holds) = pending {
            self.namespace.set_pending_replaces(node.ino, replaces);
            // The new content goes to the new key at close (or in the background, after
            // one); an object the file is replacing (O_TRUNC) must not stay behind under
            // the old name. A new file holds nothing there: no request (rsync's temporary
            // names, renamed at once).
            if old_key_holds {
                store.delete(key).await?;
            }
        } else {
            // Stored, or being stored right now by close()'s upload (--write-back): the
            // copy starts from what that upload stored.
            if writers.iter().any(|w| w.is_handed_off()) {
                self.settle(node.ino).await;
            }
            let node = &self.namespace.node(node.ino)?;
            let mut metadata = self.stored_metadata(node.clone()).await?;
            if self.config.write.content_type_from_name {
                content_type::follow_rename(&mut metadata, from.1, to.1);
            }
            let etag =
                copy_object(store, self.journal(), key, &to_key, node.size, node.etag.as_deref(), &metadata).await?;
            // Readers move before the original goes, so fewer of their GETs hit a deleted key.
            self.follow_copies(&[Copied {
                from: key.to_owned(),
                from_etag: node.etag.clone(),
                to: to_key.clone(),
                etag: etag.clone(),
            }]);
            store.delete(key).await?;
            for writer in &writers {
                writer.output.relocated(to_key.clone(), etag.clone()).await;
            }
            self.same_content(node.ino, node.etag.as_deref(), etag.as_deref());
            self.namespace.set_metadata(node.ino, Arc::new(metadata), Some(etag));
        }
        if let Some(replaced) = replaced {
            self.discard_replaced(replaced).await;
        }
        self.namespace.rename_entry(from, to, key, &to_key);
        Ok(())
    }

    /// `replaced` was renamed over, as good as unlinked: what is still being written to
    /// it goes nowhere (its close must neither store it over the file renamed there nor
    /// fail), and `fstat` of a descriptor still open shows it with no link, as `unlink`
    /// leaves it.
    async fn discard_replaced(&self, replaced: &Node) {
        for writer in &self.writers.of(replaced.ino) {
            writer.output.discard().await;
        }
        if let Some(attr) = self.attr_once_unlinked(replaced) {
            self.handles.unlinked.lock().insert(replaced.ino, attr);
        }
    }

    async fn rename_dir(
        &self,
        node: &Node,
        prefix: &str,
        from: (Ino, &str),
        to: (Ino, &str),
        to_prefix: String,
        replacing: bool,
    ) -> Result<(), FsError> {
        let Location::Dir { source, .. } = node.location else { return Err(FsError::NotDir) };
        if to_prefix.starts_with(prefix) {
            return Err(FsError::Invalid("moving a directory into itself"));
        }
        // Open files below move with the directory. An upload not stored yet is pointed
        // at its new key first (waiting for a commit in progress), so it cannot land
        // under the old prefix after the listing below; one already stored is in that
        // listing, copied with the rest, and told where it went.
        let below = self.writers.all_where(|w| w.output.key().starts_with(prefix));
        let mut stored_writers = Vec::new();
        let mut redirected = Vec::new();
        for writer in below {
            let old_key = writer.output.key();
            let new_key = format!("{to_prefix}{}", &old_key[prefix.len()..]);
            // The new prefix is empty (or an empty directory replaced).
            if matches!(writer.output.rename(new_key.clone(), None).await, Renamed::Pending { .. }) {
                redirected.push((writer, old_key));
            } else {
                stored_writers.push((writer, old_key));
            }
        }
        let moved = self.move_keys(source, prefix, &to_prefix, replacing).await;
        let copied = match moved {
            Ok(copied) => copied,
            Err(error) => {
                // The directory stays where it was: so do its files being written.
                for (writer, old_key) in redirected {
                    writer.output.rename(old_key, None).await; // what it replaced there is not known any more
                }
                return Err(error);
            }
        };
        for (writer, old_key) in stored_writers {
            if let Some(copy) = copied.iter().find(|c| c.from == old_key) {
                writer.output.relocated(copy.to.clone(), copy.etag.clone()).await;
            }
        }
        self.namespace.rename_entry(from, to, prefix, &to_prefix);
        // The files below are the copies now, whose ETags may differ from the originals'
        // (a multipart object's copy has a plain MD5 ETag): an open() pinned to the old
        // ETag would fail its first read that reaches the store.
        for (ino, copy) in self.namespace.follow_copies(source, &copied) {
            self.same_content(ino, copy.from_etag.as_deref(), copy.etag.as_deref());
        }
        Ok(())
    }

    /// Copies every key below `prefix` to `to_prefix`, moves open readers to the copies,
    /// then deletes the originals (and, when `replacing` an empty directory, its marker).
    /// Returns what was copied.
    async fn move_keys(
        &self,
        source: usize,
        prefix: &str,
        to_prefix: &str,
        replacing: bool,
    ) -> Result<Vec<Copied>, FsError> {
        let store = self.namespace.store(source).clone();
        let mut listed = Vec::new();
        let mut token = None;
        loop {
            // Bare: each object's HEAD below gives its whole metadata, which a listing
            // with metadata does not (MinIO's has no Expires: see `Metadata::listed`).
            let page = store.list_recursive(prefix, token, false).await?;
            listed.extend(page.objects);
            token = page.next_token;
            if token.is_none() {
                break;
            }
        }
        let keys: Vec<String> = listed.iter().map(|object| object.key.clone()).collect();
        // Each object's metadata is read as it is copied, unless the listing carried all of it.
        let journal = self.journal();
        let copies: Vec<_> = listed
            .into_iter()
            .map(|object| {
                let store = store.clone();
                let to_key = format!("{to_prefix}{}", &object.key[prefix.len()..]);
                async move {
                    let key = object.key.clone();
                    let info = match &object.metadata {
                        Some(metadata) if !metadata.listed => object,
                        _ => store.head(&key).await?,
                    };
                    let metadata = info.metadata.as_deref().cloned().unwrap_or_default();
                    let etag = if key.ends_with('/') && info.size == 0 {
                        // A marker is written anew, as markers are (SeaweedFS cannot copy one).
                        store_marker(&store, &to_key, &metadata, false).await?
                    } else {
                        copy_object(&store, journal, &key, &to_key, info.size, info.etag.as_deref(), &metadata).await?
                    };
                    Ok::<_, FsError>(Copied { from: key, from_etag: info.etag, to: to_key, etag })
                }
            })
            .collect();
        let copied = futures::stream::iter(copies).buffer_unordered(RENAME_CONCURRENCY).try_collect::<Vec<_>>().await?;
        // Readers move before the originals go, so fewer of their GETs hit a deleted key.
        self.follow_copies(&copied);
        if replacing && !keys.iter().any(|key| key == prefix) {
            // The replaced empty directory's marker would lend it its attributes.
            store.delete(to_prefix).await?;
        }
        let deletes: Vec<_> = keys
            .into_iter()
            .map(|key| {
                let store = store.clone();
                async move { store.delete(&key).await }
            })
            .collect();
        futures::stream::iter(deletes).buffer_unordered(RENAME_CONCURRENCY).try_collect::<Vec<_>>().await?;
        Ok(copied)
    }

    /// Open readers follow objects this mount copied (a rename, or a metadata change that
    /// rewrote the object onto itself): a reader of the version copied reads the same
    /// bytes from the copy, under its key and new ETag, instead of failing when the
    /// original is gone or its ETag changed. A reader of another version stays pinned.
    pub(super) fn follow_copies(&self, copied: &[Copied]) {
        let readers: Vec<_> = self
            .handles
            .files
            .lock()
            .values()
            .filter_map(|(_, reader)| match reader {
                Reader::Object(reader) => Some(reader.clone()),
                _ => None,
            })
            .collect();
        for reader in readers {
            let (key, etag) = reader.object();
            if let Some(copy) = copied.iter().find(|c| *c.from == *key && c.from_etag.as_deref() == etag.as_deref()) {
                reader.relocate(&copy.to, copy.etag.as_deref());
            }
        }
    }

    /// `Ok` if the directory `node` holds nothing (its own marker aside).
    pub(super) async fn check_empty_dir(&self, node: &Node) -> Result<(), FsError> {
        let Location::Dir { source, prefix } = &node.location else { return Err(FsError::NotDir) };
        if self.namespace.has_children_made_here(node.ino) {
            return Err(FsError::NotEmpty);
        }
        if self.namespace.listed_empty(node.ino) {
            return Ok(());
        }
        let store = self.namespace.store(*source);
        // Keys whose delete is on its way (`--write-back`, `rm -r`) are still listed: a page
        // of every key below tells whether anything else is there, without waiting for them.
        let deleting = self.deletes.not_ended_under(*source, prefix);
        if !deleting.is_empty() {
            let page = store.list_recursive(prefix, None, false).await?;
            if page.objects.iter().any(|o| o.key != *prefix && !deleting.contains(&o.key)) {
                return Err(FsError::NotEmpty);
            }
            if page.next_token.is_none() {
                return Ok(());
            }
            self.deletes.settle_at(*source, prefix).await; // a page of them: wait, then ask again
        }
        // Two keys are usually enough to tell: the marker `dir/` itself, and anything else.
        // Names this mount removed do not count: a listing that lags still shows them.
        let mut page = store.list(prefix, None, Some(2), false).await?;
        loop {
            let objects = page.objects.iter().map(|o| o.key.as_str()).filter(|key| key != prefix);
            let mut names = objects.chain(page.prefixes.iter().map(String::as_str)).map(|key| {
                let below = key.strip_prefix(prefix.as_str()).unwrap_or(key);
                below.strip_suffix('/').unwrap_or(below)
            });
            if names.any(|name| !self.namespace.removed_here(node.ino, name)) {
                return Err(FsError::NotEmpty);
            }
            // Only names removed here so far: the rest is asked for in whole pages.
            let Some(token) = page.next_token else { return Ok(()) };
            page = store.list(prefix, Some(token), None, false).await?;
        }
    }
}
