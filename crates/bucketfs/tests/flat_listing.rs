//! Walks of a tree against MinIO, with flat listings of subtrees (the default) and
//! without (`--no-flat-listing`): the same tree, the one ListObjectsV2 describes, for a
//! few LISTs instead of one per directory (docs/SEMANTICS.md, "Listings").

mod common;

use common::*;

/// Fills `bucket` with the test tree (20 top-level directories of 10 with 10 files each,
/// plus odd names and markers); returns its keys.
fn fill_tree(bucket: &str) -> Vec<String> {
    let keys = tree_keys(20, 10, 10);
    put_many(bucket, keys.iter().map(|k| (k.clone(), k.as_bytes().to_vec())).collect(), 32);
    keys
}

/// LISTs that list directories: not those that fetch files' stored attributes on MinIO
/// (delimited, with metadata: a lookup's, or a batch of `stat`s, see SEMANTICS).
fn lists(m: &Mount) -> usize {
    let log = m.log_text();
    let lists = log.lines().filter(|l| l.contains(" s3 LIST"));
    lists.filter(|l| !(l.contains("recursive=false") && l.contains("metadata=true"))).count()
}

#[test]
fn a_walk_shows_the_tree_listobjects_describes_for_a_few_lists() {
    let bucket = create_bucket("flat");
    let keys = fill_tree(&bucket);
    let want = model(&bucket);
    let dirs = want.iter().filter(|e| e.ends_with('/')).count();
    assert!(dirs > 800, "the tree has {dirs} directories");

    let per_directory = MountBuilder::new().bucket(&bucket).request_log().arg("--no-flat-listing").mount();
    assert_same_tree(&find_tree(&per_directory), &want, "a walk listing each directory");
    let per_directory_lists = lists(&per_directory);
    assert!(per_directory_lists >= dirs, "{per_directory_lists} LISTs for {dirs} directories");
    drop(per_directory);

    // A subtree's flat listing serves the walk for --metadata-ttl: on a slow store (moto,
    // without listing metadata, a HEAD per file) the walk through the first window took
    // longer than the default 5 s, and the directories after it were listed one by one.
    // What is counted here is the walk's plan, not the store's speed.
    let flat = MountBuilder::new().bucket(&bucket).request_log().args(["--metadata-ttl", "120"]).mount();
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
    fill_tree(&bucket);
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

/// Flat LISTs of a mount's log: (without objects' metadata, with it).
fn flat_lists(m: &Mount) -> (usize, usize) {
    let log = m.log_text();
    let flat: Vec<&str> = log.lines().filter(|l| l.contains(" s3 LIST") && l.contains("recursive=true")).collect();
    let with_metadata = flat.iter().filter(|l| l.contains("metadata=true")).count();
    (flat.len() - with_metadata, with_metadata)
}

/// MinIO lists objects' metadata when asked; a walk's flat listings ask only while
/// programs want files' stored attributes. `find -name` gets the bare listing (which costs
/// MinIO 2.5x less); a walk that stats every file gets them with the listings of the
/// windows that start once it has stat'ed its first files (here, the three top-level
/// directories after the first window's 17), not with a HEAD per file.
#[test]
fn a_walk_lists_metadata_only_while_files_attributes_are_wanted() {
    require_minio!("counts listings with MinIO's metadata=true extension, which bucketfs sends only to MinIO");
    let bucket = create_bucket("flatmeta");
    fill_tree(&bucket);
    let want = model(&bucket);

    let names_only = MountBuilder::new().bucket(&bucket).request_log().mount();
    let out =
        std::process::Command::new("find").arg(names_only.path()).args(["-name", "f1.txt"]).output().expect("find");
    assert!(out.status.success());
    assert_eq!(out.stdout.iter().filter(|b| **b == b'\n').count(), 200);
    let (bare, with_metadata) = flat_lists(&names_only);
    assert!(bare > 0 && with_metadata == 0, "find -name: {bare} bare flat LISTs, {with_metadata} with metadata");
    drop(names_only);

    let stats = MountBuilder::new().bucket(&bucket).request_log().mount();
    assert_same_tree(&find_tree(&stats), &want, "find -printf %s");
    let (bare, with_metadata) = flat_lists(&stats);
    assert!(bare > 0 && with_metadata > 0, "find -printf: {bare} bare flat LISTs, {with_metadata} with metadata");
    let late_heads: Vec<String> = stats
        .s3_requests()
        .into_iter()
        .filter(|r| r.op == "HEAD" && !r.key.ends_with('/')) // files, not directories' markers
        .filter(|r| ["t17/", "t18/", "t19/"].iter().any(|top| r.key.starts_with(top)))
        .map(|r| r.key)
        .collect();
    assert!(late_heads.is_empty(), "files listed with their metadata were HEADed: {late_heads:?}");
}

/// A walk through a subtree larger than what a flat listing lists ahead of it (8 pages)
/// gets the whole subtree from the one listing that follows the walk: no directory below
/// is listed on its own; and a walk that stops costs those 8 pages at most.
#[test]
fn a_walk_through_a_large_subtree_is_served_by_one_flat_listing() {
    let bucket = create_bucket("flat-large");
    let keys: Vec<String> = (0..10)
        .flat_map(|d| (0..1000).map(move |f| format!("top/big/d{d}/f{f:04}")))
        .chain(["top/f".to_owned()])
        .collect();
    put_many(&bucket, keys.iter().map(|k| (k.clone(), Vec::new())).collect(), 64);
    let m = MountBuilder::new().bucket(&bucket).request_log().mount();
    let out = std::process::Command::new("find").arg(m.path()).output().expect("find");
    assert!(out.status.success(), "find: {}", String::from_utf8_lossy(&out.stderr));
    // The files, 10 directories, big/, top/ and the mount point.
    assert_eq!(out.stdout.iter().filter(|b| **b == b'\n').count(), keys.len() + 13);
    let log = m.log_text();
    let own: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" s3 LIST") && l.contains("recursive=false") && l.contains("top/big/"))
        .collect();
    assert!(own.is_empty(), "{} directories below top/big/ listed on their own: {own:?}", own.len());
    drop(m);

    // A window no walk goes on into (`ls top; ls top/big`) lists 8 pages of it at most.
    let m = MountBuilder::new().bucket(&bucket).request_log().mount();
    for dir in ["top", "top/big"] {
        assert!(std::process::Command::new("ls").arg(m.join(dir)).output().expect("ls").status.success());
    }
    std::thread::sleep(std::time::Duration::from_secs(2));
    let flat = m.log_text().lines().filter(|l| l.contains(" s3 LIST") && l.contains("recursive=true")).count();
    assert!((1..=8).contains(&flat), "{flat} pages of flat listing for a walk that stopped");
}
