//! Keys that are awkward as file names.
//!
//! The rule under test:
//! * names with spaces, unicode, `%`, `+`, `#`, `?`, `&`, ... are shown exactly as the key spells
//!   them (no decoding, `100%25` stays `100%25`) and read the right content;
//! * a key that is both an object and a prefix (`both` + `both/inner`) is a DIRECTORY; the
//!   object is hidden;
//! * keys with an empty component (`x//y`, `/lead`), a `.` or `..` component, or a component
//!   longer than 255 bytes are hidden (not listed, lookups give ENOENT), their siblings are not
//!   affected, and the mount keeps working.
//!
//! MinIO refuses to store the hidden kinds (and leaves `both/inner` out of its listings), so
//! those rules are tested against a reference model in the unit tests of
//! `namespace::listing` and `namespace` (integration tests use only real S3 servers).

use crate::common::*;

#[test]
fn special_characters_are_shown_verbatim() {
    let b = create_bucket("odd-chars");
    let keys = [
        "with space.txt",
        "é.txt",
        "日本",
        "日本語/ファイル.txt",
        "50%.txt",
        "a+b.txt",
        "100%25",
        "hash#tag",
        "what?",
        "a&b",
        "semi;colon=eq",
        "tilde~star*",
        "quote'dq\"",
        "dir with space/inner file",
        "plus+dir/x+y",
    ];
    put_many(&b, keys.iter().map(|k| (k.to_string(), k.as_bytes().to_vec())).collect(), 8);
    let m = MountBuilder::new().bucket(&b).mount();

    let mut want_root: Vec<String> = keys.iter().map(|k| k.split('/').next().unwrap().to_string()).collect();
    want_root.sort();
    want_root.dedup();
    assert_eq!(ls(m.path()), want_root);
    assert_eq!(ls(&m.join("日本語")), ["ファイル.txt"]);
    assert_eq!(ls(&m.join("dir with space")), ["inner file"]);
    assert_eq!(ls(&m.join("plus+dir")), ["x+y"]);
    for k in keys {
        let p = m.join(k);
        let data = std::fs::read(&p).unwrap_or_else(|e| panic!("read {k:?}: {e}\n{}", m.diagnostics()));
        assert_eq!(data, k.as_bytes(), "content of {k:?}");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), k.len() as u64, "size of {k:?}");
    }
    // no decoding / re-encoding aliases
    for alias in ["100%", "with+space.txt", "with%20space.txt", "a b.txt", "a%2Bb.txt", "%C3%A9.txt"] {
        assert_errno(std::fs::metadata(m.join(alias)), libc::ENOENT, &format!("stat {alias:?}"));
    }
}

/// Names of 255 bytes (and of 127 two-byte characters) work. MinIO refuses keys with a
/// longer component, so none exists: in a directory whose listing is known, looking one up
/// is ENOENT like any absent name, and the mount stays alive. (Looking one up where no
/// listing is kept asks MinIO, whose refusal gives ENAMETOOLONG: tests/integration/posix.rs.)
#[test]
fn names_of_255_bytes_work_and_longer_ones_are_absent() {
    let bucket = create_bucket("long");
    let ok255 = "n".repeat(255);
    let uni254 = "é".repeat(127);
    put(&bucket, &format!("l/{ok255}"), ok255.clone());
    put(&bucket, &format!("l/{uni254}"), uni254.clone());
    let mut m = MountBuilder::new().bucket(&bucket).mount();
    let mut want = vec![ok255.clone(), uni254.clone()];
    want.sort();
    assert_eq!(ls(&m.join("l")), want, "{}", m.diagnostics());
    assert_eq!(std::fs::read(m.join("l").join(&ok255)).unwrap(), ok255.as_bytes());
    for long in ["m".repeat(256), "é".repeat(128)] {
        assert_errno(std::fs::metadata(m.join("l").join(&long)), libc::ENOENT, "stat of a 256-byte name");
    }
    m.assert_alive();
}
