//! Walks of a tree against MinIO, with flat listings of subtrees (the default) and
//! without (`--no-flat-listing`): the same tree, the one ListObjectsV2 describes, for a
//! few LISTs instead of one per directory (docs/SEMANTICS.md, "Listings").

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;

/// A tree of 2,225 keys in 822 directories up to 6 deep, with directory markers, names
/// with spaces and non-ASCII letters, and names that sort between `s2` and `s2/`. (MinIO
/// stores neither keys that cannot be names nor a key that is both a file and a prefix:
/// those rules are checked against a model in `namespace::subtree`'s unit tests.)
fn tree_keys() -> Vec<String> {
    let mut keys = Vec::new();
    for top in 0..20 {
        for sub in 0..10 {
            for file in 0..10 {
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
fn model(bucket: &str) -> Vec<String> {
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
fn find_tree(m: &Mount) -> Vec<String> {
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
fn assert_same_tree(got: &[String], want: &[String], what: &str) {
    let missing: Vec<&String> = want.iter().filter(|e| !got.contains(e)).take(10).collect();
    let unexpected: Vec<&String> = got.iter().filter(|e| !want.contains(e)).take(10).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty() && got.len() == want.len(),
        "{what}: {} entries, {} expected; missing {missing:?}, unexpected {unexpected:?}",
        got.len(),
        want.len()
    );
}

fn lists(m: &Mount) -> usize {
    m.s3_requests().iter().filter(|r| r.op == "LIST").count()
}

#[test]
fn a_walk_shows_the_tree_listobjects_describes_for_a_few_lists() {
    let bucket = create_bucket("flat");
    let keys = tree_keys();
    put_many(&bucket, keys.iter().map(|k| (k.clone(), k.as_bytes().to_vec())).collect(), 32);
    let want = model(&bucket);
    let dirs = want.iter().filter(|e| e.ends_with('/')).count();
    assert!(dirs > 800, "the tree has {dirs} directories");

    let per_directory = MountBuilder::new().bucket(&bucket).request_log().arg("--no-flat-listing").mount();
    assert_same_tree(&find_tree(&per_directory), &want, "a walk listing each directory");
    let per_directory_lists = lists(&per_directory);
    assert!(per_directory_lists >= dirs, "{per_directory_lists} LISTs for {dirs} directories");
    drop(per_directory);

    let flat = MountBuilder::new().bucket(&bucket).request_log().mount();
    assert_same_tree(&find_tree(&flat), &want, "a walk with flat listings");
    let flat_lists = lists(&flat);
    eprintln!(
        "find over {} keys, {dirs} directories: {per_directory_lists} LISTs per directory, {flat_lists} flat",
        keys.len()
    );
    // One flat LIST per subtree a window covers (20 top-level directories here, with
    // 111 keys each), the LIST of each directory where a window starts, and the walk's
    // first two: far from one per directory.
    assert!(flat_lists <= 30, "{flat_lists} LISTs for {} keys in {dirs} directories", keys.len());
    // `%s` of each file costs its HEAD (stored attributes). A directory's costs one only
    // if a marker key was listed for it, or if it was looked up before a flat listing
    // reached it (at the start of a window): a few, not one per directory.
    let marker_heads: Vec<String> =
        flat.s3_requests().into_iter().filter(|r| r.op == "HEAD" && r.key.ends_with('/')).map(|r| r.key).collect();
    assert!(marker_heads.len() <= 10, "HEADs of {} directories: {marker_heads:?}", marker_heads.len());
}

/// Changes made through the mount show in a walk that follows: flat listings do not
/// bring back what was deleted or hide what was created.
#[test]
fn a_walk_after_changes_shows_them() {
    let bucket = create_bucket("flatchg");
    let keys = tree_keys();
    put_many(&bucket, keys.iter().map(|k| (k.clone(), k.as_bytes().to_vec())).collect(), 32);
    let m = MountBuilder::new().bucket(&bucket).mount();
    let before = find_tree(&m);
    std::fs::remove_file(m.join("t10/s3/f4.txt")).expect("rm");
    std::fs::write(m.join("t11/s4/new.txt"), b"new").expect("write");
    std::fs::create_dir(m.join("t12/made")).expect("mkdir");
    let after = find_tree(&m);
    assert!(before.contains(&"t10/s3/f4.txt 13".to_owned()));
    assert!(!after.contains(&"t10/s3/f4.txt 13".to_owned()), "deleted file still walked");
    assert!(after.contains(&"t11/s4/new.txt 3".to_owned()), "created file not walked");
    assert!(after.contains(&"t12/made/".to_owned()), "created directory not walked");
    assert_same_tree(&find_tree(&m), &model(&bucket), "the mount and the bucket agree");
}
