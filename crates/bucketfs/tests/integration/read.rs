//! Reading object content through the mount: sizes around the part size, a large object,
//! sequential reads with big and small buffers, random positional reads, concurrency.

use std::fs::File;
use std::sync::Arc;

use crate::common::*;

/// Mounts with `--part-size 1MiB` and checks objects of 0 B, 1 B, part-1, part, part+1 and a
/// few parts plus change, read with 1 MiB and with 4 KiB buffers.
#[test]
fn sizes_around_a_small_part_size() {
    let b = create_bucket("part-1m");
    let sizes = [0usize, 1, MIB - 1, MIB, MIB + 1, 3 * MIB + 12_345];
    let mut objs = Vec::new();
    for (i, s) in sizes.iter().enumerate() {
        objs.push((format!("f{i}-{s}"), gen_data(100 + i as u64, *s)));
    }
    put_many(&b, objs.clone(), 6);
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "1MiB"]).mount();
    for (key, data) in &objs {
        let p = m.join(key);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), data.len() as u64, "size of {key}");
        let want = sha256_hex(data);
        for buf in [MIB, 4 * KIB] {
            let (got, n) =
                sha256_file(&p, buf).unwrap_or_else(|e| panic!("reading {key} with a {buf}-byte buffer: {e}"));
            assert_eq!(n, data.len() as u64, "{key}: bytes read with a {buf}-byte buffer");
            assert_eq!(got, want, "{key}: sha256 with a {buf}-byte buffer");
        }
    }
}

/// The same around the default part size (8 MiB), without --part-size.
#[test]
fn sizes_around_the_default_part_size() {
    let b = create_bucket("part-default");
    let sizes = [8 * MIB - 1, 8 * MIB, 8 * MIB + 1];
    let objs: Vec<(String, Vec<u8>)> =
        sizes.iter().enumerate().map(|(i, s)| (format!("g{i}-{s}"), gen_data(200 + i as u64, *s))).collect();
    put_many(&b, objs.clone(), 3);
    let m = MountBuilder::new().bucket(&b).mount();
    for (key, data) in &objs {
        let p = m.join(key);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), data.len() as u64, "size of {key}");
        let (got, n) = sha256_file(&p, MIB).unwrap_or_else(|e| panic!("reading {key}: {e}"));
        assert_eq!(n, data.len() as u64, "{key}: bytes read");
        assert_eq!(got, sha256_hex(data), "{key}: sha256 with a 1 MiB buffer");
        assert_file_content(&p, 4 * KIB, data);
    }
}

/// 100 MiB: sha256 with a 1 MiB buffer, then a second full pass with a 4 KiB buffer compared
/// byte by byte (hashing twice is slow in a debug build).
#[test]
fn large_object_100_mib() {
    let b = create_bucket("large-obj");
    let data = gen_data(300, 100 * MIB);
    put(&b, "big.bin", data.clone());
    let want = sha256_hex(&data);
    let m = MountBuilder::new().bucket(&b).mount();
    let p = m.join("big.bin");
    assert_eq!(std::fs::metadata(&p).unwrap().len(), data.len() as u64);
    let t = std::time::Instant::now();
    let (got, n) = sha256_file(&p, MIB).unwrap_or_else(|e| panic!("reading big.bin: {e}"));
    eprintln!("100 MiB read + sha256 through the mount: {:?}", t.elapsed());
    assert_eq!(n, data.len() as u64);
    assert_eq!(got, want, "sha256 of the 100 MiB object read with a 1 MiB buffer");
    let t = std::time::Instant::now();
    assert_file_content(&p, 4 * KIB, &data);
    eprintln!("100 MiB read with 4 KiB buffers: {:?}", t.elapsed());
}

/// 200 pread calls at random offsets and lengths (some crossing part boundaries and EOF).
#[test]
fn random_offset_reads() {
    let b = create_bucket("random-reads");
    let size = 24 * MIB + 333;
    let data = gen_data(400, size);
    put(&b, "r.bin", data.clone());
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "1MiB"]).mount();
    let f = File::open(m.join("r.bin")).unwrap();
    let mut rng = Rng::new(401);
    let mut cases: Vec<(u64, usize)> = vec![
        (0, 1),
        (size as u64 - 1, 1),
        (MIB as u64 - 1, 2),
        (2 * MIB as u64 - 10, 20),
        (size as u64 - 100, 200), // crosses EOF: short read
        (size as u64, 10),        // at EOF: empty
        (size as u64 + 5000, 10), // past EOF: empty
        (5 * MIB as u64, 3 * MIB),
    ];
    while cases.len() < 200 {
        let off = rng.below(size as u64);
        let len = match rng.below(4) {
            0 => 1 + rng.below(64) as usize,
            1 => 1 + rng.below(64 * KIB as u64) as usize,
            2 => 1 + rng.below(MIB as u64) as usize,
            _ => 1 + rng.below(3 * MIB as u64) as usize,
        };
        cases.push((off, len));
    }
    for (i, (off, len)) in cases.into_iter().enumerate() {
        let got = pread_full(&f, off, len)
            .unwrap_or_else(|e| panic!("case {i}: pread({off}, {len}): {e}\n{}", m.diagnostics()));
        let start = (off as usize).min(size);
        let end = (off as usize + len).min(size);
        assert_same_bytes(&got, &data[start..end], &format!("case {i}: pread({off}, {len})"));
    }
}

/// Four threads read the same file at once: two with their own handles sequentially (1 MiB
/// and 4 KiB buffers), two sharing one handle with random preads.
#[test]
fn concurrent_readers_of_one_file() {
    let b = create_bucket("conc-one");
    let size = 16 * MIB + 77;
    let data = Arc::new(gen_data(500, size));
    put(&b, "shared.bin", data.to_vec());
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "1MiB"]).mount();
    let path = m.join("shared.bin");
    let shared = Arc::new(File::open(&path).unwrap());
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..4u64 {
            let (data, path, shared) = (data.clone(), path.clone(), shared.clone());
            handles.push(s.spawn(move || match t {
                0 => assert_file_content(&path, MIB, &data),
                1 => assert_file_content(&path, 4 * KIB, &data),
                _ => {
                    let mut rng = Rng::new(600 + t);
                    for i in 0..60 {
                        let off = rng.below(size as u64);
                        let len = 1 + rng.below(512 * KIB as u64) as usize;
                        let got = pread_full(&shared, off, len).unwrap_or_else(|e| panic!("thread {t} read {i}: {e}"));
                        let end = (off as usize + len).min(size);
                        assert_same_bytes(&got, &data[off as usize..end], &format!("thread {t} read {i}"));
                    }
                }
            }));
        }
        for (t, h) in handles.into_iter().enumerate() {
            if h.join().is_err() {
                panic!("reader thread {t} failed\n{}", m.diagnostics());
            }
        }
    });
}

/// Eight different files read at the same time.
#[test]
fn concurrent_reads_of_different_files() {
    let b = create_bucket("conc-many");
    let objs: Vec<(String, Vec<u8>)> =
        (0..8).map(|i| (format!("c/file{i}"), gen_data(700 + i, 2 * MIB + (i as usize) * 300_001))).collect();
    put_many(&b, objs.clone(), 8);
    let m = MountBuilder::new().bucket(&b).args(["--part-size", "1MiB"]).mount();
    std::thread::scope(|s| {
        let handles: Vec<_> = objs
            .iter()
            .enumerate()
            .map(|(i, (key, data))| {
                let p = m.join(key);
                s.spawn(move || assert_file_content(&p, if i % 2 == 0 { MIB } else { 64 * KIB }, data))
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            if h.join().is_err() {
                panic!("reader of c/file{i} failed\n{}", m.diagnostics());
            }
        }
    });
}

/// Very small limits (memory for two parts, one request at a time) must slow reads down, not
/// break or deadlock them, even with several readers competing.
#[test]
fn tight_memory_and_request_limits_still_read_correctly() {
    let b = create_bucket("tight");
    let objs: Vec<(String, Arc<Vec<u8>>)> =
        (0..3).map(|i| (format!("t{i}"), Arc::new(gen_data(800 + i, 6 * MIB + 1000 * i as usize)))).collect();
    put_many(&b, objs.iter().map(|(k, d)| (k.clone(), d.to_vec())).collect(), 3);
    let m = MountBuilder::new()
        .bucket(&b)
        .args(["--part-size", "512KiB", "--memory-limit", "2M", "--max-concurrent-requests", "1"])
        .mount();
    let mut threads = Vec::new();
    for (i, (key, data)) in objs.iter().enumerate() {
        let p = m.join(key);
        let data = data.clone();
        threads.push(std::thread::spawn(move || {
            if i == 2 {
                let f = File::open(&p).unwrap();
                let mut rng = Rng::new(900);
                for j in 0..40 {
                    let off = rng.below(data.len() as u64);
                    let len = 1 + rng.below(700 * KIB as u64) as usize;
                    let got = pread_full(&f, off, len).unwrap_or_else(|e| panic!("pread {j}: {e}"));
                    let end = (off as usize + len).min(data.len());
                    assert_same_bytes(&got, &data[off as usize..end], &format!("pread {j}"));
                }
            } else {
                assert_file_content(&p, if i == 0 { MIB } else { 16 * KIB }, &data);
            }
        }));
    }
    let diag = m.diagnostics();
    run_with_timeout("3 readers under tight limits", std::time::Duration::from_secs(90), move || {
        for (i, t) in threads.into_iter().enumerate() {
            if t.join().is_err() {
                panic!("reader {i} failed\n{diag}");
            }
        }
    });
}
