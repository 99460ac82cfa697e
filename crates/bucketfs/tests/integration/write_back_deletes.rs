//! `--write-back` deletes: `unlink` and `rmdir` return before the store deletes the key;
//! the deletes go in batches (`DeleteObjects`), are in the write-back log until done (a
//! killed daemon's are sent by the next mount), and one the store refuses brings the
//! name back and is kept as a refused record.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// Objects `d{0..dirs}/f{0..files}` in `bucket` (and the markers `d{n}/`), put directly.
fn put_tree(bucket: &str, dirs: usize, files: usize) -> Vec<String> {
    let mut objects = Vec::new();
    for d in 0..dirs {
        objects.push((format!("top/d{d}/"), Vec::new()));
        for f in 0..files {
            objects.push((format!("top/d{d}/f{f:03}"), gen_data((d * 1000 + f) as u64, 100 + f)));
        }
    }
    objects.push(("top/".to_owned(), Vec::new()));
    let keys = objects.iter().map(|(key, _)| key.clone()).collect();
    put_many(bucket, objects, 16);
    keys
}

/// `rm -rf` of a tree sends no `DeleteObject` per file: the deletes go in `DeleteObjects`
/// requests, fewer than the keys, and the bucket is empty once the mount has settled
/// (here: unmounted). Nothing of the tree shows in the mount after `rm` returned.
#[test]
fn rm_r_deletes_in_batches() {
    let b = create_bucket("wbd-rm-r");
    let keys = put_tree(&b, 4, 60);
    let m = MountBuilder::new().bucket(&b).args(["--write-back"]).request_log().mount();
    let removed = Command::new("rm").arg("-rf").arg(m.join("top")).status().expect("rm -rf");
    assert!(removed.success());
    assert!(std::fs::metadata(m.join("top")).is_err(), "gone from the mount");
    assert_eq!(std::fs::read_dir(m.path()).expect("ls").count(), 0, "not listed");
    // `rm` returned before the last deletes were sent.
    wait_until(Duration::from_secs(10), || m.deleted_keys().len() >= keys.len());
    let requests: Vec<String> = m.s3_requests().into_iter().map(|r| r.op).collect();
    drop(m);
    assert_eq!(list_keys(&b, ""), Vec::<String>::new(), "every key deleted");
    let single = requests.iter().filter(|op| *op == "DELETE").count();
    assert_eq!(single, 0, "no DeleteObject one by one: {requests:?}");
    let batched = requests.iter().filter(|op| *op == "DELETE-OBJECTS").count();
    assert_eq!(batched, keys.len(), "every key in a DeleteObjects request");
}

/// Deletes the daemon had not sent when it was killed are sent by the next mount, where
/// the key still holds the object the mount deleted; an object another client wrote there
/// meanwhile stays.
#[test]
fn deletes_not_sent_before_a_kill_are_sent_by_the_next_mount() {
    require_minio!("stops and restarts a MinIO of its own (OwnMinio), not the store under test");
    let mut own = OwnMinio::start();
    let b = "wbd-killed";
    own.create_bucket(b);
    for name in ["a", "b", "c", "replaced-later"] {
        own.put(b, &format!("dir/{name}"), name);
    }
    let (_cache, cache_dir) = temp_cache_dir();
    let args = ["--write-back", "--retry-window", "30", "--metadata-ttl", "60", "--cache-dir", &cache_dir];
    let m = MountBuilder::new().bucket(b).endpoint(&own.server.endpoint).args(args).request_log().mount();
    // Listed and looked up (attributes) while the store answers: kept for the TTL.
    assert_eq!(std::fs::read_dir(m.join("dir")).expect("ls").count(), 4);
    for name in ["a", "b", "c", "replaced-later"] {
        std::fs::metadata(m.join("dir").join(name)).expect("known before the store stops");
    }
    own.stop();
    for name in ["a", "b", "c", "replaced-later"] {
        let removed = std::fs::remove_file(m.join("dir").join(name));
        removed.unwrap_or_else(|e| panic!("unlink returns while the store is away: {e}\n{}", m.diagnostics()));
    }
    let listed: Vec<_> = std::fs::read_dir(m.join("dir")).expect("ls").map(|e| e.expect("entry").file_name()).collect();
    assert!(listed.is_empty(), "gone from the mount at once: {listed:?}");
    kill_daemon(m);

    own.start_again();
    assert_eq!(own.keys(b).len(), 4, "nothing was deleted before the kill");
    own.put(b, "dir/replaced-later", "another client's");
    let again = MountBuilder::new().bucket(b).endpoint(&own.server.endpoint).args(["--cache-dir", &cache_dir]).mount();
    assert_eq!(own.keys(b), ["dir/replaced-later"], "deleted by the next mount, except the newer object");
    assert_eq!(std::fs::read(again.join("dir/replaced-later")).expect("read"), b"another client's");
}

/// A delete the store refuses after `unlink` returned: the file shows again (the store
/// still holds it), the daemon's log says so, and it is a refused record that `bucketfs
/// write-back list` names.
#[test]
fn a_refused_delete_brings_the_file_back_and_is_kept() {
    require_minio!("the read-only identity that refuses the delete comes from MinIO's STS (AssumeRole)");
    let b = create_bucket("wbd-refused");
    put(&b, "kept", b"data".to_vec());
    let creds = read_only_credentials(&b);
    // A long TTL: the name shows again because the delete was refused, not because the
    // mount forgot it had removed it.
    // Its own cache dir: the refused record it leaves must not stay in the machine's
    // default write-back log.
    let (_cache, cache_dir) = temp_cache_dir();
    let args = ["--write-back", "--metadata-ttl", "60", "--cache-dir", &cache_dir];
    let m = MountBuilder::new().bucket(&b).args(args).credentials(&creds).mount();
    std::fs::remove_file(m.join("kept")).expect("unlink returns before the delete");
    let back = wait_until(Duration::from_secs(10), || std::fs::metadata(m.join("kept")).is_ok());
    assert!(back, "the file the store kept shows again\n{}", m.diagnostics());
    assert!(m.stderr().contains("could not delete"), "the refusal is logged\n{}", m.diagnostics());
    let mountpoint = m.path().to_str().expect("UTF-8");
    // The refusal is recorded as the name comes back: listed within moments.
    let mut listed = String::new();
    let recorded = wait_until(Duration::from_secs(10), || {
        listed = run_bucketfs(&["write-back", "list", mountpoint], Duration::from_secs(10)).1;
        listed.starts_with("kept (delete): access denied")
    });
    assert!(recorded, "{listed}");
    assert_eq!(std::fs::read(m.join("kept")).expect("read"), b"data");
    drop(m);
    assert_eq!(list_keys(&b, ""), ["kept"]);
}

/// `rmdir` right after `unlink` does not wait for the deletes, yet a directory holding
/// anything not being deleted is not empty: `ENOTEMPTY`, and its files stay.
#[test]
fn rmdir_counts_only_what_is_not_being_deleted() {
    let b = create_bucket("wbd-rmdir");
    for name in ["d/a", "d/b", "d/sub/c"] {
        put(&b, name, name.as_bytes().to_vec());
    }
    put(&b, "d/sub/", Vec::new()); // a marker: `sub` stays when emptied
    let m = MountBuilder::new().bucket(&b).args(["--write-back"]).mount();
    std::fs::remove_file(m.join("d/a")).expect("unlink a");
    assert_errno(std::fs::remove_dir(m.join("d")), libc::ENOTEMPTY, "b and sub are left");
    std::fs::remove_file(m.join("d/b")).expect("unlink b");
    assert_errno(std::fs::remove_dir(m.join("d")), libc::ENOTEMPTY, "sub is left");
    std::fs::remove_file(m.join("d/sub/c")).expect("unlink c");
    assert_errno(std::fs::remove_dir(m.join("d")), libc::ENOTEMPTY, "sub is left, empty");
    std::fs::remove_dir(m.join("d/sub")).expect("rmdir sub");
    std::fs::remove_dir(m.join("d")).expect("rmdir d: nothing but deletes under it");
    assert!(std::fs::metadata(m.join("d")).is_err());
    drop(m);
    assert_eq!(list_keys(&b, ""), Vec::<String>::new());
}

/// A file created at a key whose delete is not sent yet waits for that delete: were the
/// two to go in either order, the late delete could remove the new file. With the store
/// away, the delete cannot go, so the create does not return until the store is back;
/// then the new file is what the key holds.
#[test]
fn a_new_file_at_a_key_being_deleted_waits_for_the_delete() {
    require_minio!("stops and restarts a MinIO of its own (OwnMinio), not the store under test");
    let mut own = OwnMinio::start();
    let b = "wbd-recreated";
    own.create_bucket(b);
    own.put(b, "dir/f", "old");
    let args = ["--write-back", "--retry-window", "30", "--metadata-ttl", "60"];
    let m = MountBuilder::new().bucket(b).endpoint(&own.server.endpoint).args(args).mount();
    assert_eq!(std::fs::read(m.join("dir/f")).expect("read"), b"old");

    own.stop();
    std::fs::remove_file(m.join("dir/f")).expect("unlink returns while the store is away");
    let path = m.join("dir/f");
    let create = std::thread::spawn(move || std::fs::write(path, "new"));
    std::thread::sleep(Duration::from_millis(1500));
    let waited = !create.is_finished();
    own.start_again();
    let created = create.join().expect("create thread");
    assert!(waited, "the create returned before the delete of its key was sent\n{}", m.diagnostics());
    created.unwrap_or_else(|e| panic!("create once the delete went: {e}\n{}", m.diagnostics()));
    drop(m);
    assert_eq!(own.get(b, "dir/f"), b"new", "the new file is what the key holds");
}
