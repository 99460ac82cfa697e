//! Directory structure derived from keys: implicit directories, `dir/` markers, sizes, mtimes,
//! modes and ownership, recursive walks, and a directory larger than one LIST page.

use std::collections::{BTreeSet, HashSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, SystemTime};

use crate::common::*;

#[test]
fn nested_implicit_directories() {
    let b = create_bucket("nested");
    put(&b, "a/b/c.txt", b"abc".to_vec());
    put(&b, "a/top.txt", b"top!".to_vec());
    put(&b, "root.txt", b"r".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();

    assert_eq!(ls(m.path()), ["a", "root.txt"]);
    assert!(std::fs::metadata(m.join("a")).unwrap().is_dir());
    assert_eq!(ls(&m.join("a")), ["b", "top.txt"]);
    assert!(std::fs::metadata(m.join("a/b")).unwrap().is_dir());
    assert_eq!(ls(&m.join("a/b")), ["c.txt"]);
    let md = std::fs::metadata(m.join("a/b/c.txt")).unwrap();
    assert!(md.is_file());
    assert_eq!(md.len(), 3);
    assert_eq!(std::fs::read(m.join("a/b/c.txt")).unwrap(), b"abc");
    assert_eq!(std::fs::read(m.join("a/top.txt")).unwrap(), b"top!");
    assert_eq!(std::fs::read(m.join("root.txt")).unwrap(), b"r");

    assert_errno(std::fs::metadata(m.join("a/nope")), libc::ENOENT, "stat a/nope");
    assert_errno(std::fs::metadata(m.join("nope/deeper")), libc::ENOENT, "stat nope/deeper");
    // "a/b" is a prefix of "a/b/c.txt" but "a/b/c" is not a key nor a prefix
    assert_errno(std::fs::metadata(m.join("a/b/c")), libc::ENOENT, "stat a/b/c");
    assert_errno(std::fs::metadata(m.join("a/b/c.txt/x")), libc::ENOTDIR, "stat through a file");
    // a second listing gives the same answer (cached or not)
    assert_eq!(ls(&m.join("a")), ["b", "top.txt"]);
}

#[test]
fn directory_markers() {
    let b = create_bucket("markers");
    put(&b, "empty/", Vec::new());
    put(&b, "m/", Vec::new());
    put(&b, "m/child.txt", b"child".to_vec());
    put(&b, "outer/inner/", Vec::new());
    put(&b, "file.txt", b"f".to_vec());
    let m = MountBuilder::new().bucket(&b).mount();

    assert_eq!(ls(m.path()), ["empty", "file.txt", "m", "outer"]);
    let e = std::fs::metadata(m.join("empty")).unwrap();
    assert!(e.is_dir(), "the marker empty/ must be a directory");
    assert_eq!(ls(&m.join("empty")), Vec::<String>::new(), "empty/ has no entries");
    assert!(std::fs::metadata(m.join("m")).unwrap().is_dir());
    assert_eq!(ls(&m.join("m")), ["child.txt"], "the marker itself must not show up as an entry");
    assert_eq!(std::fs::read(m.join("m/child.txt")).unwrap(), b"child");
    assert!(std::fs::metadata(m.join("outer")).unwrap().is_dir());
    assert_eq!(ls(&m.join("outer")), ["inner"]);
    assert!(std::fs::metadata(m.join("outer/inner")).unwrap().is_dir());
    assert_eq!(ls(&m.join("outer/inner")), Vec::<String>::new());
    // the directories can be entered and walked
    let (files, dirs) = walk(m.path());
    assert_eq!(files, ["file.txt", "m/child.txt"].iter().map(|s| s.to_string()).collect());
    assert_eq!(dirs, ["empty", "m", "outer", "outer/inner"].iter().map(|s| s.to_string()).collect());
}

#[test]
fn sizes_and_mtimes() {
    let b = create_bucket("sizes");
    let sizes = [0usize, 1, 1000, 65_536, 3 * MIB + 5];
    for (i, s) in sizes.iter().enumerate() {
        put(&b, &format!("d/f{i}"), gen_data(i as u64, *s));
    }
    let m = MountBuilder::new().bucket(&b).mount();
    for (i, s) in sizes.iter().enumerate() {
        let key = format!("d/f{i}");
        let md = std::fs::metadata(m.join(&key)).unwrap();
        assert!(md.is_file());
        assert_eq!(md.len(), *s as u64, "size of {key}");
        let lm = head(&b, &key).last_modified;
        let mt = md.modified().unwrap();
        let diff = match mt.duration_since(lm) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        assert!(diff <= Duration::from_secs(2), "mtime of {key} is {mt:?}, LastModified is {lm:?} (diff {diff:?})");
        // not the epoch, not "now" by accident: the object was written moments ago
        assert!(SystemTime::now().duration_since(mt).unwrap_or_default() < Duration::from_secs(300));
    }
    // sizes through the listing path too (readdir + stat of each entry)
    for e in std::fs::read_dir(m.join("d")).unwrap() {
        let e = e.unwrap();
        let i: usize = e.file_name().to_str().unwrap()[1..].parse().unwrap();
        assert_eq!(e.metadata().unwrap().len(), sizes[i] as u64);
    }
}

#[test]
fn modes_and_ownership_from_options() {
    let b = create_bucket("modes");
    put(&b, "file.txt", b"x".to_vec());
    put(&b, "implicit/inner.txt", b"y".to_vec());
    put(&b, "marker/", Vec::new());
    let m = MountBuilder::new()
        .bucket(&b)
        .args(["--uid", "1234", "--gid", "2345", "--file-mode", "0640", "--dir-mode", "0750"])
        .mount();
    for f in ["file.txt", "implicit/inner.txt"] {
        let md = std::fs::metadata(m.join(f)).unwrap();
        assert!(md.is_file(), "{f}");
        assert_eq!(md.permissions().mode() & 0o7777, 0o640, "mode of {f}: {:o}", md.mode());
        assert_eq!(md.uid(), 1234, "uid of {f}");
        assert_eq!(md.gid(), 2345, "gid of {f}");
    }
    for d in ["", "implicit", "marker"] {
        let md = std::fs::metadata(m.join(d)).unwrap();
        assert!(md.is_dir(), "{d:?}");
        assert_eq!(md.permissions().mode() & 0o7777, 0o750, "mode of dir {d:?}: {:o}", md.mode());
        assert_eq!(md.uid(), 1234, "uid of dir {d:?}");
        assert_eq!(md.gid(), 2345, "gid of dir {d:?}");
    }
}

#[test]
fn recursive_walk_equals_key_set() {
    let b = create_bucket("walk");
    let mut keys = Vec::new();
    for i in 0..6 {
        keys.push(format!("top{i}.bin"));
        for j in 0..4 {
            keys.push(format!("d{i}/f{j}"));
            if i % 2 == 0 {
                keys.push(format!("d{i}/s{j}/deep/leaf{j}.txt"));
            }
        }
    }
    keys.push("x/y/z/w/v/u/very-deep".into());
    put_many(&b, keys.iter().map(|k| (k.clone(), k.as_bytes().to_vec())).collect(), 16);
    let m = MountBuilder::new().bucket(&b).mount();
    let (files, dirs) = walk(m.path());
    let want_files: BTreeSet<String> = keys.iter().cloned().collect();
    assert_eq!(files, want_files);
    let mut want_dirs = BTreeSet::new();
    for k in &keys {
        let mut p = k.as_str();
        while let Some((parent, _)) = p.rsplit_once('/') {
            want_dirs.insert(parent.to_string());
            p = parent;
        }
    }
    assert_eq!(dirs, want_dirs);
    for k in keys.iter().step_by(7) {
        assert_eq!(std::fs::read(m.join(k)).unwrap(), k.as_bytes(), "content of {k}");
    }
}

/// 2,500 entries need three LIST pages of 1,000: all of them, once each.
#[test]
fn large_directory_lists_completely() {
    let b = create_bucket("large");
    let n = 2500;
    let mut objs: Vec<(String, Vec<u8>)> =
        (0..n).map(|i| (format!("big/f-{i:05}"), format!("{i}").into_bytes())).collect();
    // sub-directories whose prefixes fall in the middle of a page and at the very end
    objs.push(("big/f-01234-dir/x".into(), b"x".to_vec()));
    objs.push(("big/zz-sub/inner".into(), b"z".to_vec()));
    // neighbours that share the string prefix "big"
    objs.push(("big2/other".into(), b"o".to_vec()));
    objs.push(("bigfile".into(), b"o".to_vec()));
    let t = std::time::Instant::now();
    put_many(&b, objs, 48);
    eprintln!("created {} objects in {:?}", n + 4, t.elapsed());

    let m = MountBuilder::new().bucket(&b).mount();
    assert_eq!(ls(m.path()), ["big", "big2", "bigfile"]);
    let names = ls_unsorted(&m.join("big"));
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "duplicate entries in a {}-entry listing", names.len());
    let mut want: Vec<String> = (0..n).map(|i| format!("f-{i:05}")).collect();
    want.push("f-01234-dir".into());
    want.push("zz-sub".into());
    want.sort();
    let mut got = names.clone();
    got.sort();
    if got != want {
        let g: BTreeSet<_> = got.iter().collect();
        let w: BTreeSet<_> = want.iter().collect();
        panic!(
            "listing of big/ has {} entries, expected {}; missing {:?}..., unexpected {:?}...",
            got.len(),
            want.len(),
            w.difference(&g).take(10).collect::<Vec<_>>(),
            g.difference(&w).take(10).collect::<Vec<_>>()
        );
    }
    assert!(std::fs::metadata(m.join("big/f-01234-dir")).unwrap().is_dir());
    assert!(std::fs::metadata(m.join("big/zz-sub")).unwrap().is_dir());
    assert_eq!(std::fs::read(m.join("big/f-02499")).unwrap(), b"2499");
    assert_eq!(std::fs::read(m.join("big/f-00000")).unwrap(), b"0");
    assert_eq!(std::fs::metadata(m.join("big/f-01000")).unwrap().len(), 4);
    // listing again (from cache or not) is still complete
    assert_eq!(ls(&m.join("big")).len(), want.len());
}
