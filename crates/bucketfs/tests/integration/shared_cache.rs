//! The shared cache (`--shared-cache`) as two machines see it: mounts with separate
//! local caches and separate daemons, the source in this process's MinIO, the shared
//! cache in a second MinIO (the near store). What one machine fetched from the source,
//! the next reads from the near store without a GET of the object from the source; a
//! corrupt block there is fetched from the source again; a near store that is gone
//! fails no read; the near store holds no plaintext, even of an encrypted source. See
//! docs/CONFIGURATION.md, "Shared cache", and docs/SECURITY.md.

use std::time::Duration;

use crate::common::*;

/// The key every machine of these tests shares the cache with.
const TIER_KEY: &[u8] = b"the shared cache key of the integration tests\n";

/// A key file holding `key`, in a directory that lives as long as what is returned.
fn key_file(key: &[u8]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("key dir");
    let path = dir.path().join("tier.key");
    std::fs::write(&path, key).expect("key file");
    (dir, path.to_str().expect("UTF-8").to_owned())
}

/// A mount of `bucket` with a local cache of its own (a "machine") and the shared
/// cache `s3://near/cache` on `near`, with `builder`'s settings.
fn machine_with(builder: MountBuilder, near: &OwnMinio) -> (Mount, [tempfile::TempDir; 2]) {
    let local = tempfile::tempdir_in("/var/tmp").expect("local cache dir");
    let (key_dir, key) = key_file(TIER_KEY);
    let mount = builder
        .args(["--cache", local.path().to_str().expect("UTF-8")])
        .args(["--shared-cache", "s3://near/cache", "--shared-cache-endpoint-url", &near.server.endpoint])
        .args(["--shared-cache-key-file", &key])
        .request_log()
        .mount();
    (mount, [local, key_dir])
}

fn machine(bucket: &str, near: &OwnMinio) -> (Mount, [tempfile::TempDir; 2]) {
    machine_with(MountBuilder::new().bucket(bucket), near)
}

/// The GETs of `key` the mount sent to the source (the shared cache's keys are hashes).
fn source_gets(m: &Mount, key: &str) -> Vec<Option<(u64, u64)>> {
    m.s3_requests().into_iter().filter(|r| r.op == "GET" && r.key == key).map(|r| r.range).collect()
}

/// Bytes after each block in the shared cache (its tag and nonce).
const SEAL_LEN: usize = 28;

#[test]
fn a_second_machine_reads_from_the_shared_cache_what_the_first_fetched() {
    let bucket = create_bucket("shared-cache");
    let big = gen_data(31, 6 * MIB + 12_345);
    put(&bucket, "big.bin", big.clone());
    put(&bucket, "small.txt", b"a small object".to_vec());
    let near = OwnMinio::start();
    near.create_bucket("near");

    let (first, _first_cache) = machine(&bucket, &near);
    assert_same_bytes(&std::fs::read(first.join("big.bin")).expect("read"), &big, "first machine");
    assert_eq!(std::fs::read(first.join("small.txt")).expect("read"), b"a small object");
    assert!(!source_gets(&first, "big.bin").is_empty(), "the first machine reads the source");
    // The 7 blocks of big.bin as one chunk, and the small object's one, written in the
    // background.
    let written = wait_until(Duration::from_secs(20), || near.keys("near").len() == 2);
    assert!(written, "blocks in the shared cache: {:?}", near.keys("near"));
    drop(first);

    let (second, _second_cache) = machine(&bucket, &near);
    assert_same_bytes(&std::fs::read(second.join("big.bin")).expect("read"), &big, "second machine");
    assert_eq!(std::fs::read(second.join("small.txt")).expect("read"), b"a small object");
    assert_eq!(source_gets(&second, "big.bin"), [], "no GET of big.bin from the source");
    assert_eq!(source_gets(&second, "small.txt"), [], "no GET of small.txt from the source");
    drop(second);

    // A block damaged in the shared cache is a miss: that block comes from the source.
    let chunk = near.keys("near").into_iter().find(|key| near.get("near", key).len() > MIB).expect("big.bin's chunk");
    let mut damaged = near.get("near", &chunk);
    damaged[3 * (MIB + SEAL_LEN) + 100] ^= 0xff;
    near.put("near", &chunk, damaged);
    let (third, _third_cache) = machine(&bucket, &near);
    assert_same_bytes(&std::fs::read(third.join("big.bin")).expect("read"), &big, "third machine");
    let gets = source_gets(&third, "big.bin");
    assert!(
        !gets.is_empty() && gets.iter().all(|range| range.is_some_and(|(start, _)| start >= 3 * MIB as u64)),
        "only from the damaged block on: {gets:?}"
    );
    drop(third);

    // The near store gone: reads go to the source, right.
    near.stop();
    let (fourth, _fourth_cache) = machine(&bucket, &near);
    assert_same_bytes(&std::fs::read(fourth.join("big.bin")).expect("read"), &big, "with the near store down");
    assert!(fourth.log_text().contains("shared cache:"), "said in the log: {}", fourth.log_text());
}

/// A block read alone (its chunk never fills up) is shared too, as an object of its own,
/// once the chunk has waited for the rest of its blocks.
#[test]
fn a_block_read_alone_is_shared_too() {
    let bucket = create_bucket("shared-cache-alone");
    let data = gen_data(33, 20 * MIB);
    put(&bucket, "data.bin", data.clone());
    let near = OwnMinio::start();
    near.create_bucket("near");
    let read_block_5 = |m: &Mount| {
        use std::os::unix::fs::FileExt as _;
        let mut block = vec![0u8; 4096];
        let file = std::fs::File::open(m.join("data.bin")).expect("open");
        file.read_exact_at(&mut block, 5 * MIB as u64 + 100).expect("read");
        assert_same_bytes(&block, &data[5 * MIB + 100..5 * MIB + 4196], "block 5");
    };
    let (first, _first_cache) = machine(&bucket, &near);
    read_block_5(&first);
    let written = wait_until(Duration::from_secs(20), || near.keys("near").len() == 1);
    assert!(written, "block 5 in the shared cache: {:?} {}", near.keys("near"), first.log_text());
    let key = near.keys("near").remove(0);
    assert!(key.ends_with("/5"), "an object of its own: {key}");
    drop(first);

    let (second, _second_cache) = machine(&bucket, &near);
    read_block_5(&second);
    assert_eq!(source_gets(&second, "data.bin"), [], "no GET of data.bin from the source");
}

#[test]
fn the_cache_command_shows_and_clears_a_shared_cache() {
    let bucket = create_bucket("shared-cache-cmd");
    let data = gen_data(32, 3 * MIB + 5);
    put(&bucket, "data.bin", data.clone());
    let near = OwnMinio::start();
    near.create_bucket("near");
    // Under the prefix but not named as a block: not the cache's, left alone.
    near.put("near", "cache/README", b"not a block".to_vec());
    near.put("near", "cache/old-run/1", b"not a block either".to_vec());
    let (first, _first_cache) = machine(&bucket, &near);
    assert_same_bytes(&std::fs::read(first.join("data.bin")).expect("read"), &data, "first machine");
    // Unmounted at once: the daemon writes the blocks to the shared cache before it exits.
    drop(first);
    assert_eq!(near.keys("near").len(), 3, "4 blocks in the shared cache, one chunk: {:?}", near.keys("near"));

    let cache = |action: &str| {
        let endpoint = near.server.endpoint.as_str();
        let line = ["cache", action, "s3://near/cache", "--endpoint-url", endpoint, "--force-path-style"];
        let (status, out, err) = run_bucketfs(&line, Duration::from_secs(30));
        assert!(status.success(), "bucketfs cache {action}: {err}");
        out
    };
    let status = cache("status");
    // 4 blocks of the object, each sealed.
    let bytes = data.len() + 4 * SEAL_LEN;
    assert!(status.contains(&format!(": 1 objects, 4 blocks, {bytes} bytes, oldest block written 20")), "{status}");
    assert!(status.contains("2 other keys under the prefix"), "{status}");
    assert!(cache("clear").contains("cleared (4 blocks deleted)"));
    assert_eq!(near.keys("near"), ["cache/README", "cache/old-run/1"]);
    assert!(cache("status").contains(": 0 objects, 0 blocks, 0 bytes"));

    // Cleared: the next machine fetches from the source, and fills the cache again.
    let (second, _second_cache) = machine(&bucket, &near);
    assert_same_bytes(&std::fs::read(second.join("data.bin")).expect("read"), &data, "second machine");
    assert!(!source_gets(&second, "data.bin").is_empty(), "read from the source after the clear");
    assert!(wait_until(Duration::from_secs(20), || near.keys("near").len() == 3), "filled again");

    // Options that only a shared cache takes are refused for a directory.
    let dir = tempfile::tempdir().expect("dir");
    let line = ["cache", "status", dir.path().to_str().expect("UTF-8"), "--endpoint-url", "http://127.0.0.1:1"];
    let (status, _, err) = run_bucketfs(&line, Duration::from_secs(30));
    assert!(!status.success() && err.contains("are for a shared cache"), "{err}");
}

/// A shared cache whose bucket does not exist is a mistake in the command line: the
/// mount fails and says so (one that does not answer is only logged: the test above
/// mounts with the near store stopped).
#[test]
fn a_shared_cache_bucket_that_does_not_exist_fails_the_mount() {
    let bucket = create_bucket("shared-cache-missing");
    let near = OwnMinio::start();
    let local = tempfile::tempdir_in("/var/tmp").expect("local cache dir");
    let (_key_dir, key) = key_file(TIER_KEY);
    let failure = MountBuilder::new()
        .bucket(&bucket)
        .background()
        .args(["--cache", local.path().to_str().expect("UTF-8")])
        .args(["--shared-cache", "s3://no-such-near/cache", "--shared-cache-endpoint-url", &near.server.endpoint])
        .args(["--shared-cache-key-file", &key])
        .expect_failure();
    failure.assert_error("--shared-cache s3://no-such-near/cache: cannot list it");
}

/// Without a key, or with one too short, there is no shared cache: the mount fails and
/// says why (whoever can write the cache bucket could otherwise plant blocks).
#[test]
fn a_shared_cache_without_a_key_fails_the_mount() {
    let bucket = create_bucket("shared-cache-keyless");
    let near = OwnMinio::start();
    near.create_bucket("near");
    let local = tempfile::tempdir_in("/var/tmp").expect("local cache dir");
    let builder = || {
        MountBuilder::new()
            .bucket(&bucket)
            .background()
            .args(["--cache", local.path().to_str().expect("UTF-8")])
            .args(["--shared-cache", "s3://near/cache", "--shared-cache-endpoint-url", &near.server.endpoint])
    };
    builder().expect_failure().assert_error("s3://near/cache needs --shared-cache-key-file");
    let (_key_dir, short) = key_file(b"short\n");
    let failure = builder().args(["--shared-cache-key-file", &short]).expect_failure();
    failure.assert_error("holds 5 bytes, fewer than 16");
}

/// An object of an SSE-C source, read through a machine with a shared cache, leaves no
/// readable byte of it in the near store (its blocks are sealed with the tier's key); a
/// second machine reads it from there, right. A machine with another key finds nothing
/// of it there, and a chunk it wrote put in the place of the first key's is a miss.
#[test]
fn an_encrypted_source_leaves_no_readable_bytes_in_the_shared_cache() {
    let server = minio_tls();
    let certificate = server.certificate.clone().expect("a TLS MinIO");
    let client = s3_client_tls(&server.endpoint, &certificate);
    let bucket = unique_bucket_name("ssec-shared");
    block_on(client.create_bucket().bucket(&bucket).send()).expect("create bucket");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, sse_key) = (dir.path().join("ca.pem"), dir.path().join("sse-c.key"));
    std::fs::write(&ca, &certificate).expect("CA file");
    std::fs::write(&sse_key, [0x5a_u8; 32]).expect("key file");
    let (ca, sse_key) = (ca.to_str().expect("UTF-8"), sse_key.to_str().expect("UTF-8"));
    let source = || {
        MountBuilder::new().endpoint(&server.endpoint).bucket(&bucket).args([
            "--ca-bundle",
            ca,
            "--sse-c-key-file",
            sse_key,
        ])
    };
    // Text that is easy to find: lines that are all different.
    let secret: Vec<u8> = (0..120_000).flat_map(|n| format!("secret line {n:06}\n").into_bytes()).collect();
    let writer = source().mount();
    std::fs::write(writer.join("secret.txt"), &secret).expect("write");
    drop(writer);
    let near = OwnMinio::start();
    near.create_bucket("near");

    let (first, _first) = machine_with(source(), &near);
    assert_same_bytes(&std::fs::read(first.join("secret.txt")).expect("read"), &secret, "first machine");
    drop(first); // the daemon writes the blocks before it exits
    let keys = near.keys("near");
    assert!(!keys.is_empty(), "blocks in the shared cache");
    for key in &keys {
        let stored = near.get("near", key);
        let readable = stored.windows(12).any(|window| window == b"secret line ");
        assert!(!readable, "{key} holds plaintext of the encrypted source");
    }

    let (second, _second) = machine_with(source(), &near);
    assert_same_bytes(&std::fs::read(second.join("secret.txt")).expect("read"), &secret, "second machine");
    assert_eq!(source_gets(&second, "secret.txt"), [], "read from the shared cache");
    drop(second);

    // A machine with another key: the first key's blocks are not its own (another name).
    let local = tempfile::tempdir_in("/var/tmp").expect("local cache dir");
    let (_other_dir, other_key) = key_file(b"another key, of another tenant\n");
    let other = source()
        .args(["--cache", local.path().to_str().expect("UTF-8")])
        .args(["--shared-cache", "s3://near/cache", "--shared-cache-endpoint-url", &near.server.endpoint])
        .args(["--shared-cache-key-file", &other_key])
        .request_log()
        .mount();
    assert_same_bytes(&std::fs::read(other.join("secret.txt")).expect("read"), &secret, "another key");
    assert!(!source_gets(&other, "secret.txt").is_empty(), "another key reads the source");
    drop(other);
    // Its chunk, well framed with its key, planted where the first key's chunk is: a miss.
    let theirs = near.keys("near").into_iter().find(|key| !keys.contains(key)).expect("the other key's chunk");
    let ours = keys.iter().find(|key| key.ends_with("/c0")).expect("the first key's chunk");
    near.put("near", ours, near.get("near", &theirs));
    let (third, _third) = machine_with(source(), &near);
    assert_same_bytes(&std::fs::read(third.join("secret.txt")).expect("read"), &secret, "planted chunk");
    assert!(!source_gets(&third, "secret.txt").is_empty(), "a planted chunk is a miss: read from the source");
}
