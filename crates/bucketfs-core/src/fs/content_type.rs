//! The Content-Type a file written through the mount is stored with: the one its name's
//! extension calls for (`mime_guess`'s table, as s3fs, rclone and geesefs do), so that a
//! web server, a browser or a CDN in front of the bucket serves it right. Unknown
//! extensions store none (S3 then answers `binary/octet-stream`, MinIO
//! `application/octet-stream`). `--no-content-type-from-name` turns it off.

use bucketfs_client::store::Metadata;

/// The type for a file named `name`, if its extension is a known one.
pub fn for_name(name: &str) -> Option<String> {
    mime_guess::from_path(name).first_raw().map(str::to_owned)
}

/// After a rename from `from` to `to`: a type that was the old name's guess (or none, or
/// the store's default) becomes the new name's; a type set some other way (by another tool) is kept.
/// Returns whether it changed.
pub fn follow_rename(metadata: &mut Metadata, from: &str, to: &str) -> bool {
    let guessed = match metadata.content_type.as_deref() {
        None => true,
        // What stores answer for an object stored without a type.
        Some("binary/octet-stream" | "application/octet-stream") => true,
        Some(stored) => for_name(from).as_deref() == Some(stored),
    };
    if !guessed {
        return false;
    }
    let renamed = for_name(to);
    let changed = metadata.content_type != renamed;
    metadata.content_type = renamed;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_come_from_the_extension() {
        assert_eq!(for_name("index.html").as_deref(), Some("text/html"));
        assert_eq!(for_name("photo.JPG").as_deref(), Some("image/jpeg"));
        assert_eq!(for_name("notes.txt").as_deref(), Some("text/plain"));
        assert_eq!(for_name("data.unknownext"), None);
        assert_eq!(for_name("Makefile"), None);
    }

    #[test]
    fn a_rename_changes_only_a_guessed_type() {
        let mut guessed = Metadata { content_type: for_name("a.tmp"), ..Metadata::default() };
        assert!(follow_rename(&mut guessed, "a.tmp", "a.json"));
        assert_eq!(guessed.content_type.as_deref(), Some("application/json"));
        let mut none = Metadata::default();
        assert!(follow_rename(&mut none, "a", "a.css"));
        assert_eq!(none.content_type.as_deref(), Some("text/css"));
        let mut default = Metadata { content_type: Some("binary/octet-stream".into()), ..Metadata::default() };
        assert!(follow_rename(&mut default, "a.tmp", "a.svg"));
        assert_eq!(default.content_type.as_deref(), Some("image/svg+xml"));
        let mut chosen = Metadata { content_type: Some("application/x-custom".into()), ..Metadata::default() };
        assert!(!follow_rename(&mut chosen, "a.txt", "a.html"));
        assert_eq!(chosen.content_type.as_deref(), Some("application/x-custom"));
        let mut to_unknown = Metadata { content_type: for_name("a.txt"), ..Metadata::default() };
        assert!(follow_rename(&mut to_unknown, "a.txt", "a"));
        assert_eq!(to_unknown.content_type, None);
    }
}
