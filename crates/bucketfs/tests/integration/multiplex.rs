//! Sources: several buckets multiplexed as top-level directories, and prefix sources.

use crate::common::*;

#[test]
fn two_sources_as_top_level_directories() {
    let b1 = create_bucket("mux-one");
    let b2 = create_bucket("mux-two");
    put(&b1, "x", b"from b1".to_vec());
    put(&b1, "dir/z", b"z in b1".to_vec());
    put(&b2, "some/prefix/y", b"from b2".to_vec());
    put(&b2, "some/prefix/sub/w", b"w in b2".to_vec());
    // keys of B2 outside the prefix, including ones sharing its string prefix
    put(&b2, "some/prefixy", b"no".to_vec());
    put(&b2, "some/prefix2/w", b"no".to_vec());
    put(&b2, "some/other", b"no".to_vec());
    put(&b2, "top", b"no".to_vec());
    put(&b2, "x", b"no: x of b2".to_vec());

    let m = MountBuilder::new().source(format!("s3://{b1}=one")).source(format!("s3://{b2}/some/prefix=two")).mount();
    assert_eq!(ls(m.path()), ["one", "two"]);
    assert!(std::fs::metadata(m.join("one")).unwrap().is_dir());
    assert!(std::fs::metadata(m.join("two")).unwrap().is_dir());
    assert_eq!(ls(&m.join("one")), ["dir", "x"]);
    assert_eq!(ls(&m.join("two")), ["sub", "y"]);
    assert_eq!(std::fs::read(m.join("one/x")).unwrap(), b"from b1");
    assert_eq!(std::fs::read(m.join("one/dir/z")).unwrap(), b"z in b1");
    assert_eq!(std::fs::read(m.join("two/y")).unwrap(), b"from b2");
    assert_eq!(std::fs::read(m.join("two/sub/w")).unwrap(), b"w in b2");
    for rel in ["x", "three", "two/x", "two/prefixy", "two/some", "one/y"] {
        assert_errno(std::fs::metadata(m.join(rel)), libc::ENOENT, &format!("stat {rel}"));
    }
    let (files, _) = walk(m.path());
    assert_eq!(files.into_iter().collect::<Vec<_>>(), ["one/dir/z", "one/x", "two/sub/w", "two/y"]);
}

#[test]
fn prefix_source_at_root() {
    let b = create_bucket("prefix-root");
    put(&b, "pre/a", b"A".to_vec());
    put(&b, "pre/d/b", b"B".to_vec());
    // not under "pre/"
    put(&b, "prefix/x", b"no".to_vec());
    put(&b, "pre.txt", b"no".to_vec());
    put(&b, "pre-other/y", b"no".to_vec());
    put(&b, "top", b"no".to_vec());
    let m = MountBuilder::new().source(format!("s3://{b}/pre")).mount();
    assert_eq!(ls(m.path()), ["a", "d"]);
    assert_eq!(ls(&m.join("d")), ["b"]);
    assert_eq!(std::fs::read(m.join("a")).unwrap(), b"A");
    assert_eq!(std::fs::read(m.join("d/b")).unwrap(), b"B");
    for rel in ["top", "x", "pre", "prefix", "pre.txt", "pre/a"] {
        assert_errno(std::fs::metadata(m.join(rel)), libc::ENOENT, &format!("stat {rel}"));
    }
}

/// A multi-level prefix in a multiplexed source whose bucket also has a marker for it.
#[test]
fn prefix_with_marker_object() {
    let b = create_bucket("prefix-marker");
    put(&b, "deep/er/", Vec::new());
    put(&b, "deep/er/file", b"F".to_vec());
    put(&b, "deep/er/dir/", Vec::new());
    let m = MountBuilder::new().source(format!("s3://{b}/deep/er=d")).mount();
    assert_eq!(ls(m.path()), ["d"]);
    assert_eq!(ls(&m.join("d")), ["dir", "file"], "the prefix marker must not appear as an entry");
    assert!(std::fs::metadata(m.join("d/dir")).unwrap().is_dir());
    assert_eq!(std::fs::read(m.join("d/file")).unwrap(), b"F");
}
