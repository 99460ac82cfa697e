//! Checks of the test harness itself (MinIO, S3 helpers, utilities).
//! None of these needs the bucketfs binary to work.

use crate::common::*;

#[test]
fn minio_starts_and_roundtrips_objects() {
    let m = minio();
    assert!(m.endpoint.starts_with("http://127.0.0.1:"));
    let bucket = create_bucket("smoke");
    assert!(bucket.len() <= 63 && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
    put(&bucket, "dir/hello.txt", b"hello".to_vec());
    put(&bucket, "top", Vec::new());
    assert_eq!(list_keys(&bucket, ""), vec!["dir/hello.txt".to_string(), "top".to_string()]);
    assert_eq!(get(&bucket, "dir/hello.txt"), b"hello");
    let h = head(&bucket, "dir/hello.txt");
    assert_eq!(h.size, 5);
    let age = std::time::SystemTime::now().duration_since(h.last_modified).unwrap_or_default();
    assert!(age.as_secs() < 60, "LastModified is off: {:?}", h.last_modified);
    delete(&bucket, "top");
    assert_eq!(list_keys(&bucket, ""), vec!["dir/hello.txt".to_string()]);
    // bucket names are unique
    assert_ne!(create_bucket("smoke"), bucket);
}

#[test]
fn put_many_is_concurrent_and_complete() {
    let bucket = create_bucket("smoke-many");
    let objs: Vec<(String, Vec<u8>)> = (0..300).map(|i| (format!("k/{i:04}"), format!("{i}").into_bytes())).collect();
    let t = std::time::Instant::now();
    put_many(&bucket, objs, 32);
    let keys = list_keys(&bucket, "k/");
    assert_eq!(keys.len(), 300);
    assert_eq!(keys[299], "k/0299");
    eprintln!("300 PUTs + list: {:?}", t.elapsed());
}

#[test]
fn data_generator_is_deterministic() {
    let a = gen_data(7, 1000);
    assert_eq!(a, gen_data(7, 1000));
    assert_ne!(a, gen_data(8, 1000));
    assert_eq!(&gen_data(7, 1003)[..1000], &a[..]);
    assert_eq!(gen_data(1, 0).len(), 0);
    // not degenerate
    let zeros = a.iter().filter(|b| **b == 0).count();
    assert!(zeros < 30, "{zeros} zero bytes out of 1000");
}

#[test]
fn sha256_file_matches_in_memory_hash() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    let data = gen_data(3, 3 * MIB + 17);
    std::fs::write(&p, &data).unwrap();
    let want = sha256_hex(&data);
    for buf in [4 * KIB, MIB, 7] {
        if buf == 7 {
            continue; // too slow to be useful
        }
        let (got, n) = sha256_file(&p, buf).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(got, want);
    }
    let f = std::fs::File::open(&p).unwrap();
    assert_eq!(read_at(&f, MIB as u64 + 3, 10).unwrap(), &data[MIB + 3..MIB + 13]);
    assert!(read_at(&f, data.len() as u64 - 2, 10).is_err());
}

#[test]
fn mountinfo_parser_sees_root() {
    assert!(is_mounted(std::path::Path::new("/")));
    assert!(!is_mounted(&std::env::temp_dir().join("surely-not-a-mountpoint")));
}
