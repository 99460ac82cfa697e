//! The read-only view of a bucket's history (`--show-versions`): in every directory,
//! `.versions/NAME/` holds one file per stored version of `NAME`, named by the time it
//! was stored, readable as the object was then.
//!
//! - `.versions` is reached by name and never listed (as ZFS's hidden `.zfs`): `ls -a`,
//!   `find`, `du` or `rsync` of a tree do not walk into every version of it.
//! - Everything comes from `ListObjectVersions`: `.versions/` lists the names of the
//!   directory that have versions (also deleted files: their versions stay), and
//!   `.versions/NAME/` the versions of that key. Delete markers have no content and are
//!   not shown.
//! - A version is immutable: its file reads by `versionId`, pinned to its ETag, and may
//!   be cached like any object (same key and ETag, same bytes).
//! - Nothing here can be changed: every change is `EROFS` (see
//!   [`NamespaceError::ReadOnlyView`]).

use std::sync::Arc;

use super::inode::{Attributes, Ino, Location, Node};
use super::{names, Listed, Namespace, NamespaceError};
use bucketfs_client::store::VersionInfo;

/// The name of the view in each directory.
pub const VERSIONS_DIR: &str = ".versions";

/// Where in the view an inode stands (see [`Location::History`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum History {
    /// `DIR/.versions`, where `prefix` is DIR: a directory per name with versions.
    Names { source: usize, prefix: String },
    /// `DIR/.versions/NAME`: a file per version of `key`.
    Versions { source: usize, key: String },
    /// `DIR/.versions/NAME/WHEN`: version `id` of `key`.
    Version { source: usize, key: String, id: String },
}

/// The names of a key's versions (delete markers have none), oldest first: the time
/// each was stored (`2026-11-25T06:10:09.123Z`, as S3's Last-Modified, in UTC). Versions
/// stored within the same millisecond get `~2`, `~3`… counted from the oldest, so a
/// name never changes as newer versions are added.
pub fn version_names(versions: &[VersionInfo]) -> Vec<(String, &VersionInfo)> {
    // The store lists a key's versions newest first (also within one millisecond):
    // reversed, then sorted stably, the oldest comes first.
    let mut stored: Vec<&VersionInfo> = versions.iter().rev().filter(|v| !v.deleted).collect();
    stored.sort_by_key(|v| v.mtime);
    let mut named: Vec<(String, &VersionInfo)> = Vec::with_capacity(stored.len());
    let (mut previous, mut run) = (String::new(), 0);
    for version in stored {
        let time = humantime::format_rfc3339_millis(version.mtime).to_string();
        run = if time == previous { run + 1 } else { 1 };
        named.push((if run == 1 { time.clone() } else { format!("{time}~{run}") }, version));
        previous = time;
    }
    named
}

impl Namespace {
    /// `.versions` of directory `parent` (`prefix` of `source`), if the mount shows it.
    pub(super) fn versions_dir(&self, parent: Ino, source: usize, prefix: &str) -> Option<Node> {
        if !self.show_versions {
            return None;
        }
        let location = Location::History(History::Names { source, prefix: prefix.to_owned() });
        let attributes = Attributes::dir(self.mounted_at, Some(Arc::default()), None);
        Some(self.state.lock().enter_found(parent, VERSIONS_DIR, location, attributes))
    }

    /// `name` in the view's directory `parent`, from the store's versions.
    pub(super) async fn lookup_history(
        &self,
        parent: Ino,
        history: &History,
        name: &str,
    ) -> Result<Node, NamespaceError> {
        if names::check_component(name).is_err() {
            return Err(NamespaceError::NotFound);
        }
        let (source, key) = match history {
            History::Names { source, prefix } => (*source, format!("{prefix}{name}")),
            History::Versions { source, key } => (*source, key.clone()),
            History::Version { .. } => return Err(NamespaceError::NotDir),
        };
        let versions = self.store(source).list_versions(&key, true).await?;
        let entry = match history {
            History::Names { .. } => self.versions_entry(source, key, &versions),
            _ => version_names(&versions)
                .into_iter()
                .find(|(version_name, _)| version_name == name)
                .map(|(_, version)| self.version_entry(source, version)),
        };
        let (location, attributes) = entry.ok_or(NamespaceError::NotFound)?;
        Ok(self.state.lock().enter_found(parent, name, location, attributes))
    }

    /// Every entry of the view's directory `dir`, entered in the table.
    pub(super) async fn list_history(&self, dir: Ino, history: &History) -> Result<Vec<Listed>, NamespaceError> {
        let entries = match history {
            History::Names { source, prefix } => {
                let versions = self.store(*source).list_versions(prefix, false).await?;
                let mut entries = Vec::new();
                for key_versions in versions.chunk_by(|a, b| a.key == b.key) {
                    let key = &key_versions[0].key;
                    let name = key.strip_prefix(prefix.as_str()).unwrap_or_default();
                    if names::check_component(name).is_err() {
                        continue; // the directory's own marker, or a key no file can name
                    }
                    if let Some(entry) = self.versions_entry(*source, key.clone(), key_versions) {
                        entries.push((name.to_owned(), entry));
                    }
                }
                entries
            }
            History::Versions { source, key } => {
                let versions = self.store(*source).list_versions(key, true).await?;
                version_names(&versions)
                    .into_iter()
                    .map(|(name, version)| (name, self.version_entry(*source, version)))
                    .collect()
            }
            History::Version { .. } => return Err(NamespaceError::NotDir),
        };
        let mut state = self.state.lock();
        Ok(entries
            .into_iter()
            .map(|(name, (location, attributes))| {
                let node = state.enter_found(dir, &name, location, attributes);
                Listed { name, node }
            })
            .collect())
    }

    /// `.versions/NAME` for `key`, if it has a stored version: a directory as recent as
    /// the newest.
    fn versions_entry(&self, source: usize, key: String, versions: &[VersionInfo]) -> Option<(Location, Attributes)> {
        let newest = versions.iter().filter(|v| !v.deleted).map(|v| v.mtime).max()?;
        let attributes = Attributes::dir(newest, Some(Arc::default()), Some(self.valid_until()));
        Some((Location::History(History::Versions { source, key }), attributes))
    }

    fn version_entry(&self, source: usize, version: &VersionInfo) -> (Location, Attributes) {
        let location =
            Location::History(History::Version { source, key: version.key.clone(), id: version.version_id.clone() });
        let attributes = Attributes {
            size: version.size,
            mtime: version.mtime,
            etag: version.etag.clone(),
            metadata: Some(Arc::default()),
            valid_until: Some(self.valid_until()),
        };
        (location, attributes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn version(id: &str, millis: u64, deleted: bool) -> VersionInfo {
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_millis(millis);
        VersionInfo { key: "k".into(), version_id: id.into(), mtime, size: 1, etag: None, is_latest: false, deleted }
    }

    #[test]
    fn versions_are_named_by_time_and_a_name_never_changes() {
        // As the store lists them: newest first.
        let listed = [
            version("c", 2_000, false),
            version("m", 1_500, true),
            version("b", 1_000, false),
            version("a", 1_000, false),
        ];
        let named: Vec<(String, &str)> =
            version_names(&listed).into_iter().map(|(name, v)| (name, v.version_id.as_str())).collect();
        assert_eq!(
            named,
            [
                ("1970-01-01T00:00:01.000Z".to_owned(), "a"),
                ("1970-01-01T00:00:01.000Z~2".to_owned(), "b"),
                ("1970-01-01T00:00:02.000Z".to_owned(), "c"),
            ]
        );
    }
}
