//! Walks of a mounted tree: what `find` shows, and the model of it that ListObjectsV2
//! of the bucket describes.

use std::collections::BTreeMap;
use std::process::Command;

use super::{list_objects, Mount};

/// A tree of `tops` top directories of `subs` subdirectories of `files` files and one
/// leaf 4 levels deeper (6 deep), plus directory markers, names with spaces and
/// non-ASCII letters, and names that sort between `s2` and `s2/`. (MinIO stores neither
/// keys that cannot be names nor a key that is both a file and a prefix: those rules are
/// checked against a model in the namespace's unit tests.)
pub fn tree_keys(tops: usize, subs: usize, files: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for top in 0..tops {
        for sub in 0..subs {
            for file in 0..files {
                keys.push(format!("t{top:02}/s{sub}/f{file}.txt"));
            }
            keys.push(format!("t{top:02}/s{sub}/deep/a/b/leaf"));
        }
    }
    keys.extend(["t03/", "t03/s1/", "t04/s2/deep/"].map(String::from)); // markers
    keys.extend(["t05/name with space", "t06/ü-umlaut/x"].map(String::from));
    keys.extend(["t07/s2.txt", "t07/s2-x/y"].map(String::from)); // between `s2` and `s2/`
    keys
}

/// What a walk must show, from ListObjectsV2: `path size` of every file and `path/` of
/// every directory, sorted. A name with an empty component is not shown, nor anything
/// below it; a name that is a prefix too is a directory.
pub fn model(bucket: &str) -> Vec<String> {
    let listed = list_objects(bucket, "");
    let mut entries: BTreeMap<String, Option<u64>> = BTreeMap::new(); // path -> size (None: dir)
    for object in &listed {
        let parts: Vec<&str> = object.key.split('/').collect();
        let (dirs, file) = parts.split_at(parts.len() - 1);
        if dirs.iter().any(|d| d.is_empty()) {
            continue;
        }
        for depth in 1..=dirs.len() {
            entries.insert(dirs[..depth].join("/"), None);
        }
        if !file[0].is_empty() {
            entries.entry(object.key.clone()).or_insert(Some(object.size));
        }
    }
    entries
        .into_iter()
        .map(|(path, size)| match size {
            Some(size) => format!("{path} {size}"),
            None => format!("{path}/"),
        })
        .collect()
}

/// `find` over the mount: the same shape as [`model`].
pub fn find_tree(m: &Mount) -> Vec<String> {
    let out =
        Command::new("find").arg(m.path()).args(["-mindepth", "1", "-printf", "%P %s %y\n"]).output().expect("find");
    assert!(out.status.success(), "find failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut lines: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|line| {
            let (rest, kind) = line.rsplit_once(' ').expect("kind");
            let (path, size) = rest.rsplit_once(' ').expect("size");
            if kind == "d" {
                format!("{path}/")
            } else {
                format!("{path} {size}")
            }
        })
        .collect();
    lines.sort();
    lines
}

/// Asserts that two walks agree, naming what differs (a whole walk is too long to print).
#[track_caller]
pub fn assert_same_tree(got: &[String], want: &[String], what: &str) {
    let missing: Vec<&String> = want.iter().filter(|e| !got.contains(e)).take(10).collect();
    let unexpected: Vec<&String> = got.iter().filter(|e| !want.contains(e)).take(10).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty() && got.len() == want.len(),
        "{what}: {} entries, {} expected; missing {missing:?}, unexpected {unexpected:?}",
        got.len(),
        want.len()
    );
}
