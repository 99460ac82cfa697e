//! Changes to what an entry is rather than what it holds: `chmod`, `chown`, `utimens`
//! and `truncate` (`setattr`), and `user.*` extended attributes. Modes, owners, times and
//! xattrs live in object metadata: carried by the upload of a file open for writing,
//! else rewritten in the store at once. Each change stores the time it was made as the
//! ctime, in the same request.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use fuser::{FileAttr, FileType};

use super::attrs::StoredAttrs;
use super::error::FsError;
use super::{
    without_set_id_bits, xattrs, AttrChange, Fs, Writer, DIRECTORY_CONTENT_TYPE, S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO,
    S_IFLNK, S_IFREG, S_IFSOCK,
};
use crate::namespace::{Copied, Ino, Location, NamespaceError, Node, ROOT_INO};
use crate::write::staging::Base;
use crate::write::write_back::Amendment;
use crate::write::{copy_object, Output};
use bucketfs_client::store::{Metadata, StoreError, WriteCondition};

impl Fs {
    /// `getxattr()`: extended attribute `user.NAME` is the object's metadata `NAME`
    /// (`x-amz-meta-NAME`), except the names that hold modes, owners and times.
    pub async fn getxattr(&self, ino: Ino, name: &str) -> Result<Vec<u8>, FsError> {
        if ino == ROOT_INO && (name == xattrs::INDEX_STATUS || name == xattrs::INDEX_REFRESH) {
            let indexes = self.namespace.indexes().ok_or(FsError::NoAttribute)?;
            if name == xattrs::INDEX_REFRESH {
                // `bucketfs refresh MOUNTPOINT`: answered once the sources are listed again.
                let done = indexes.refresh().await.map_err(NamespaceError::from)?;
                tracing::info!(
                    files = done.files,
                    dirs = done.dirs,
                    "index refreshed on request in {:.2?}",
                    done.elapsed
                );
            }
            return Ok(indexes.status().into_bytes());
        }
        let Some(key) = xattrs::metadata_key(name) else { return Err(FsError::NoAttribute) };
        let node = self.namespace.with_metadata(self.namespace.getattr(ino).await?).await?;
        let value = node.metadata.as_deref().and_then(|m| m.user.get(key)).ok_or(FsError::NoAttribute)?;
        Ok(value.clone().into_bytes())
    }

    /// `listxattr()`: `user.NAME` for each metadata entry that is not an attribute.
    pub async fn listxattr(&self, ino: Ino) -> Result<Vec<u8>, FsError> {
        let node = self.namespace.with_metadata(self.namespace.getattr(ino).await?).await?;
        Ok(node.metadata.as_deref().map(xattrs::list).unwrap_or_default())
    }

    /// `setxattr()` / `removexattr()` (`value` `None`): stored like `chmod`.
    pub async fn setxattr(&self, ino: Ino, name: &str, value: Option<&[u8]>, flags: i32) -> Result<(), FsError> {
        let key = xattrs::settable_key(name)?;
        let value = value.map(xattrs::settable_value).transpose()?;
        let node = self.namespace.with_metadata(self.namespace.getattr(ino).await?).await?;
        Self::check_changeable(&node)?;
        let exists = node.metadata.as_deref().is_some_and(|m| m.user.contains_key(key));
        match (value.is_some(), exists) {
            (true, true) if flags & libc::XATTR_CREATE != 0 => return Err(FsError::Exists),
            (true, false) if flags & libc::XATTR_REPLACE != 0 => return Err(FsError::NoAttribute),
            (false, false) => return Err(FsError::NoAttribute),
            _ => {}
        }
        let changed = StoredAttrs { ctime: Some(SystemTime::now()), ..StoredAttrs::default() };
        self.change_metadata(ino, |metadata| {
            match &value {
                Some(value) => metadata.user.insert(key.to_owned(), value.clone()),
                None => metadata.user.remove(key),
            };
            changed.apply_to(metadata);
        })
        .await
    }

    /// `chmod`, `chown`, `utimens`, `truncate`. Modes, owners and times are stored in
    /// the object's metadata, with the time of the change as ctime: carried by the upload
    /// while the file is open for writing (as `tar` sets them before `close`), else
    /// rewritten in place with a server-side copy, which returns only once stored.
    /// Asking for what is already shown costs nothing.
    pub async fn setattr(&self, ino: Ino, change: AttrChange) -> Result<FileAttr, FsError> {
        // A new size builds on what is stored. Other changes go with an upload not
        // started yet, or wait for it (`change_metadata`).
        if change.size.is_some() {
            self.settle(ino).await;
        }
        // No name reaches the file any more: the namespace no longer has it, and nothing
        // of it will be stored.
        if self.handles.unlinked.lock().contains_key(&ino) {
            return self.change_unlinked(ino, change).await;
        }
        Self::check_changeable(&self.namespace.node(ino)?)?;
        let mut current = self.getattr(ino).await?;
        if let Some(size) = change.size {
            current = self.truncate(ino, size, change.handle).await?;
        }
        let type_bits = match current.kind {
            FileType::Directory => S_IFDIR,
            FileType::Symlink => S_IFLNK,
            FileType::NamedPipe => S_IFIFO,
            FileType::Socket => S_IFSOCK,
            FileType::CharDevice => S_IFCHR,
            FileType::BlockDevice => S_IFBLK,
            _ => S_IFREG,
        };
        let mode = if change.drop_set_id && current.kind != FileType::Directory {
            Some(without_set_id_bits(change.mode.unwrap_or(current.perm)))
        } else {
            change.mode
        };
        let mut wanted = StoredAttrs {
            mode: mode.filter(|&mode| mode != current.perm).map(|mode| type_bits | u32::from(mode)),
            uid: change.uid.filter(|&uid| uid != current.uid),
            gid: change.gid.filter(|&gid| gid != current.gid),
            mtime: change.mtime.filter(|&mtime| mtime != current.mtime),
            atime: change.atime.filter(|&atime| atime != current.atime),
            ..StoredAttrs::default()
        };
        if wanted == StoredAttrs::default() {
            return Ok(current);
        }
        wanted.ctime = Some(SystemTime::now());
        self.change_metadata(ino, |metadata| wanted.apply_to(metadata)).await?;
        Ok(self.attr(&self.namespace.node(ino)?))
    }

    /// `setattr` through a descriptor of a file unlinked (or renamed over) while open: it
    /// succeeds, as on a local disk. Only the descriptors still open see the change: a new
    /// size cuts or extends the file's staging file (a streamed one stores nothing and
    /// keeps no bytes to read), and what `fstat` shows changes.
    async fn change_unlinked(&self, ino: Ino, change: AttrChange) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        if let Some(size) = change.size {
            let through = change.handle.and_then(|handle| self.writers.get(handle)).filter(|w| w.ino == ino);
            if let Some(Output::Staged(staged)) =
                through.or_else(|| self.writers.current(ino)).as_ref().map(|w| &w.output)
            {
                staged.truncate(size).await?;
            }
        }
        let now = SystemTime::now();
        let mut unlinked = self.handles.unlinked.lock();
        let attr = unlinked.get_mut(&ino).ok_or(FsError::NotFound)?;
        if let Some(size) = change.size {
            (attr.size, attr.blocks, attr.mtime) = (size, size.div_ceil(512), now);
        }
        let perm =
            if change.drop_set_id { Some(without_set_id_bits(change.mode.unwrap_or(attr.perm))) } else { change.mode };
        attr.perm = perm.unwrap_or(attr.perm);
        attr.uid = change.uid.unwrap_or(attr.uid);
        attr.gid = change.gid.unwrap_or(attr.gid);
        attr.mtime = change.mtime.unwrap_or(attr.mtime);
        attr.atime = change.atime.unwrap_or(attr.atime);
        attr.ctime = now;
        Ok(*attr)
    }

    /// A write by a caller without CAP_FSETID, or an `open(O_TRUNC)` by one: the file
    /// loses its set-ID bits ([`without_set_id_bits`]). The kernel does it itself for
    /// writes through the page cache unless it leaves it to the daemon (as for writes
    /// sent straight through, and for all of them once it was told at init that the
    /// daemon handles it). Costs nothing when the file has no such bit, as nearly every
    /// file.
    pub async fn drop_set_id_bits(&self, ino: Ino) -> Result<(), FsError> {
        let perm = self.attr(&self.namespace.node(ino)?).perm;
        if without_set_id_bits(perm) != perm {
            self.setattr(ino, AttrChange { drop_set_id: true, ..AttrChange::default() }).await?;
        }
        Ok(())
    }

    /// Cuts or extends the staging file of `writer` to `size` (stored at close).
    pub(super) async fn truncate_writer(&self, writer: &Writer, size: u64) -> Result<(), FsError> {
        let Output::Staged(staged) = &writer.output else { return Err(FsError::Committed) };
        staged.truncate(size).await?;
        self.content_changed(writer).await;
        self.namespace.set_pending_size(writer.ino, size);
        Ok(())
    }

    /// Changes the metadata of `ino`: in its upload if that has not started (a file open
    /// for writing, stored at close, or closed with `--write-back` and not sent yet: the
    /// change is noted in the write-back log too), else in the store right away, once an
    /// upload running in the background has ended.
    async fn change_metadata(&self, ino: Ino, change: impl Fn(&mut Metadata)) -> Result<(), FsError> {
        self.check_writable()?;
        for writer in self.writers.of(ino) {
            let updated = if writer.is_handed_off() {
                writer.output.update_metadata_unstored(&change).await
            } else {
                writer.output.update_metadata(&change).await
            };
            if let Some(metadata) = updated {
                if let Some(record) = writer.record() {
                    record.amend(Amendment { metadata: Some(metadata.clone()), ..Amendment::default() });
                }
                self.namespace.set_metadata(ino, Arc::new(metadata), None);
                writer.touched.notify_one();
                // The times set now hold until the next write (see `Fs::write`).
                writer.times_kept.store(true, Ordering::Release);
                return Ok(());
            }
        }
        self.settle(ino).await;
        self.rewrite_metadata(ino, change).await
    }

    /// Applies `change` to the metadata of the object (or directory marker) behind `ino`.
    async fn rewrite_metadata(&self, ino: Ino, change: impl Fn(&mut Metadata)) -> Result<(), FsError> {
        let node = self.namespace.getattr(ino).await?;
        match &node.location {
            Location::File { source, key } => {
                let store = self.namespace.store(*source);
                let mut node = node.clone();
                // Copy from the version we know; if another client changed it meanwhile,
                // read it again once (its content and metadata are what we must keep).
                for attempt in 0..2 {
                    let mut metadata = self.stored_metadata(node.clone()).await?;
                    change(&mut metadata);
                    match copy_object(store, self.journal(), key, key, node.size, node.etag.as_deref(), &metadata).await
                    {
                        Ok(etag) => {
                            // Same bytes, new ETag: open readers and the kernel's cached
                            // pages of this version stay valid.
                            let copy = Copied {
                                from: key.clone(),
                                from_etag: node.etag.clone(),
                                to: key.clone(),
                                etag: etag.clone(),
                            };
                            self.follow_copies(std::slice::from_ref(&copy));
                            self.same_content(ino, node.etag.as_deref(), etag.as_deref());
                            self.namespace.set_metadata(ino, Arc::new(metadata), Some(etag));
                            return Ok(());
                        }
                        Err(StoreError::Changed) if attempt == 0 => {
                            self.namespace.expire(ino);
                            node = self.namespace.getattr(ino).await?;
                        }
                        Err(error) => return Err(error.into()),
                    }
                }
                Err(StoreError::Changed.into())
            }
            Location::Dir { source, prefix } if !prefix.is_empty() => {
                // A marker is empty: writing it again with the new metadata is the update
                // (and turns an implicit directory into an explicit one). The times its
                // entries' changes set in memory are stored with it.
                let mut metadata = self.stored_metadata(node.clone()).await?;
                let touched = node.touched;
                if let Some(time) = touched {
                    let times = StoredAttrs { mtime: Some(time), ctime: Some(time), ..StoredAttrs::default() };
                    times.apply_to(&mut metadata);
                }
                change(&mut metadata);
                metadata.content_type.get_or_insert_with(|| DIRECTORY_CONTENT_TYPE.into());
                self.write_marker(*source, prefix, metadata, false, |metadata| {
                    self.namespace.set_marker_metadata(ino, metadata, touched);
                    (ino, ())
                })
                .await
            }
            // The bucket root (or the root of a multiplexed mount) has no object to keep
            // attributes in: they are kept in memory until unmount, so that `tar x` and
            // `rsync -a` of a tree rooted at "." work (SEMANTICS.md says so).
            _ => {
                let mut metadata = node.metadata.as_deref().cloned().unwrap_or_default();
                if let Some(time) = node.touched {
                    let times = StoredAttrs { mtime: Some(time), ctime: Some(time), ..StoredAttrs::default() };
                    times.apply_to(&mut metadata);
                }
                change(&mut metadata);
                self.namespace.set_marker_metadata(ino, Arc::new(metadata), node.touched);
                Ok(())
            }
        }
    }

    /// The metadata stored for `node`, whole (fetched if only a listing is known), for a
    /// rewrite that must keep all of it.
    pub(super) async fn stored_metadata(&self, node: Node) -> Result<Metadata, FsError> {
        let node = self.namespace.with_whole_metadata(node).await?;
        Ok(node.metadata.as_deref().cloned().unwrap_or_default())
    }

    /// `truncate()`/`ftruncate()`. A file open with a staging file changes there (stored
    /// at close); one being streamed stores what was written and goes on in a staging
    /// file (`Fs::store_then_staged`). Without an open handle the
    /// object is replaced at once: by an empty one, or through a staging file that keeps
    /// the unchanged part by server-side copy.
    async fn truncate(&self, ino: Ino, size: u64, through: Option<u64>) -> Result<FileAttr, FsError> {
        self.check_writable()?;
        let node = self.namespace.getattr(ino).await?;
        let Location::File { source, key } = &node.location else {
            return Err(FsError::IsDir);
        };
        if size == node.size {
            return Ok(self.attr(&node));
        }
        // The descriptors of a file open for writing share its writer: `ftruncate` cuts
        // that; `truncate` by name the file's current one if it is still being written,
        // not one whose upload `--write-back` runs after its close (kept until released).
        let through = through.filter(|&handle| self.writers.get(handle).is_some_and(|w| w.ino == ino));
        let writer = match through {
            Some(handle) => Some((handle, self.writer_to_change(handle).await?)),
            None => self
                .writers
                .current(ino)
                .filter(|w| !w.is_handed_off())
                .and_then(|w| Some((self.writers.handle_of(&w)?, w))),
        };
        if let Some((handle, mut writer)) = writer {
            if let Output::Streamed(_) = &writer.output {
                // A multipart upload cannot be cut or extended behind what it sent.
                writer = self.store_then_staged(handle, &writer).await?;
            }
            self.truncate_writer(&writer, size).await?;
            return Ok(self.attr(&self.namespace.node(ino)?));
        }
        let mut metadata = self.stored_metadata(node.clone()).await?;
        StoredAttrs::forget_content_times(&mut metadata);
        StoredAttrs::stamp_content_times(&mut metadata, SystemTime::now());
        let etag = if size == 0 {
            self.namespace.store(*source).put(key, Bytes::new(), &metadata, &WriteCondition::Any).await?
        } else {
            let base = Base { etag: node.etag.clone(), size: node.size };
            let staged = self.new_staged(*source, key.clone(), Some(base), metadata.clone())?;
            staged.truncate(size).await?;
            staged.commit().await?.flatten()
        };
        self.namespace.set_pending_size(ino, size);
        self.namespace.upload_done(ino, etag, Arc::new(metadata));
        // Writers closed with --write-back whose descriptors a duplicate keeps open hold
        // the content from before the cut: reads go to the object, and a write through
        // such a descriptor goes on from it (see `Fs::writer_to_change`).
        self.writers.supersede_all(ino);
        Ok(self.attr(&self.namespace.node(ino)?))
    }
}
