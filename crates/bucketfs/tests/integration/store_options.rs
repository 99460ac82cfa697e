//! Store options s3fs, goofys and rclone users rely on, against MinIO: server-side
//! encryption (SSE-S3 and SSE-KMS with the test MinIO's static KMS key), the storage class,
//! requester pays and the expected bucket owner (MinIO ignores those two: a recording
//! relay shows they go on every request), upload checksums, the requests sent without the
//! SDK (and `--sdk-requests`), and unsigned requests to a public bucket.

use std::os::unix::fs::PermissionsExt;

use crate::common::*;

/// Writes through `mount` the ways that create objects: a small PUT, a multipart upload
/// (over the 5 MiB part size given), a rename (CopyObject) and a chmod (a copy onto
/// itself); returns the keys and the bytes they must hold.
fn write_every_way(mount: &Mount) -> Vec<(&'static str, Vec<u8>)> {
    let small = b"small object".to_vec();
    let large = gen_data(31, 12 * MIB);
    std::fs::write(mount.join("small.txt"), &small).expect("small");
    std::fs::write(mount.join("large.bin"), &large).expect("large");
    std::fs::write(mount.join("before-rename.txt"), b"renamed").expect("to rename");
    std::fs::rename(mount.join("before-rename.txt"), mount.join("renamed.txt")).expect("rename");
    std::fs::set_permissions(mount.join("small.txt"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    vec![("small.txt", small), ("large.bin", large), ("renamed.txt", b"renamed".to_vec())]
}

fn head_object(bucket: &str, key: &str) -> aws_sdk_s3::operation::head_object::HeadObjectOutput {
    block_on(s3().head_object().bucket(bucket).key(key).send()).unwrap_or_else(|e| panic!("HEAD {key}: {e:?}"))
}

#[test]
fn sse_s3_and_sse_kms_encrypt_every_object_written() {
    for (sse, extra) in [("AES256", None), ("aws:kms", Some(KMS_KEY_ID))] {
        let bucket = create_bucket("sse");
        let mut args = vec!["--sse", sse, "--part-size", "5MiB"];
        if let Some(key) = extra {
            args.extend(["--sse-kms-key-id", key]);
        }
        let mount = MountBuilder::new().bucket(&bucket).args(args).mount();
        let written = write_every_way(&mount);
        for (key, bytes) in &written {
            let head = head_object(&bucket, key);
            let shown = head.server_side_encryption().map(|s| s.as_str().to_owned());
            assert_eq!(shown.as_deref(), Some(sse), "{key} with --sse {sse}");
            if let Some(kms_key) = extra {
                let used = head.ssekms_key_id().unwrap_or_default();
                assert!(used.ends_with(kms_key), "{key}: KMS key {used:?}");
            }
            assert_file_content(&mount.join(key), 1024 * KIB, bytes);
        }
    }
}

#[test]
fn the_storage_class_goes_on_new_objects() {
    let bucket = create_bucket("class");
    let mount = MountBuilder::new()
        .bucket(&bucket)
        .args(["--storage-class", "REDUCED_REDUNDANCY", "--part-size", "5MiB"])
        .mount();
    for (key, bytes) in write_every_way(&mount) {
        let class = head_object(&bucket, key).storage_class().map(|c| c.as_str().to_owned());
        assert_eq!(class.as_deref(), Some("REDUCED_REDUNDANCY"), "{key}");
        assert_eq!(get(&bucket, key), bytes);
    }
}

#[test]
fn requester_pays_and_the_expected_owner_go_on_every_request() {
    let bucket = create_bucket("payer");
    put(&bucket, "listed/existing.txt", b"existing".to_vec());
    let relay = Relay::recording(minio().port);
    let mount = MountBuilder::new()
        .bucket(&bucket)
        .endpoint(&relay.endpoint)
        .args(["--requester-pays", "--expected-bucket-owner", "123456789012", "--part-size", "5MiB"])
        .mount();
    assert_eq!(std::fs::read(mount.join("listed/existing.txt")).expect("read"), b"existing");
    write_every_way(&mount);
    std::fs::remove_file(mount.join("renamed.txt")).expect("delete");
    drop(mount);
    let heads = relay.request_heads();
    assert!(heads.len() > 10, "{} requests", heads.len());
    for head in &heads {
        assert!(head.contains("\r\nx-amz-request-payer: requester"), "{head}");
        assert!(head.contains("\r\nx-amz-expected-bucket-owner: 123456789012"), "{head}");
        if head.contains("\r\nx-amz-copy-source:") {
            assert!(head.contains("\r\nx-amz-source-expected-bucket-owner: 123456789012"), "{head}");
        }
    }
}

#[test]
fn upload_checksums_are_chosen_or_left_out() {
    for (choice, trailer) in [("crc32c", Some("x-amz-checksum-crc32c")), ("off", None)] {
        let bucket = create_bucket("checksums");
        let relay = Relay::recording(minio().port);
        let mount = MountBuilder::new()
            .bucket(&bucket)
            .endpoint(&relay.endpoint)
            .args(["--upload-checksums", choice, "--part-size", "5MiB"])
            .mount();
        let large = gen_data(32, 12 * MIB);
        std::fs::write(mount.join("large.bin"), &large).expect("write");
        drop(mount);
        assert_eq!(get(&bucket, "large.bin"), large, "--upload-checksums {choice}");
        let uploads: Vec<String> =
            relay.request_heads().into_iter().filter(|h| h.starts_with("put /") && h.contains("partnumber=")).collect();
        assert_eq!(uploads.len(), 3, "three parts of 5 MiB or less");
        for head in uploads {
            match trailer {
                Some(name) => assert!(head.contains(name), "{choice}: {head}"),
                None => {
                    assert!(!head.contains("x-amz-trailer") && !head.contains("aws-chunked"), "{choice}: {head}");
                    assert!(!head.contains("unsigned-payload"), "off signs the body: {head}");
                }
            }
        }
    }
}

/// A small PUT and the reads' GETs are signed and sent without the SDK's pipeline (no
/// `x-id=` query, no SDK invocation id), the PUT with its body's SHA-256 in the signature;
/// `--sdk-requests` sends both through the SDK again.
#[test]
fn small_puts_and_reads_skip_the_sdk_unless_asked() {
    let data = b"a small file".to_vec();
    for sdk in [false, true] {
        let bucket = create_bucket("direct");
        let relay = Relay::recording(minio().port);
        let args: &[&str] = if sdk { &["--sdk-requests"] } else { &[] };
        let mount = MountBuilder::new().bucket(&bucket).endpoint(&relay.endpoint).args(args.iter().copied()).mount();
        std::fs::write(mount.join("small.txt"), &data).expect("write");
        drop(mount);
        let mount = MountBuilder::new().bucket(&bucket).endpoint(&relay.endpoint).args(args.iter().copied()).mount();
        assert_eq!(std::fs::read(mount.join("small.txt")).expect("read"), data);
        drop(mount);
        let heads = relay.request_heads();
        let of = |method: &str| -> Vec<&String> {
            heads.iter().filter(|h| h.starts_with(&format!("{method} /{bucket}/small.txt"))).collect()
        };
        let (puts, gets) = (of("put"), of("get"));
        assert_eq!(puts.len(), 1, "one PUT (--sdk-requests: {sdk}): {heads:#?}");
        assert!(!gets.is_empty(), "a GET (--sdk-requests: {sdk}): {heads:#?}");
        for head in puts.iter().chain(&gets) {
            let through_sdk = head.contains("x-id=") && head.contains("\r\namz-sdk-invocation-id:");
            assert_eq!(through_sdk, sdk, "--sdk-requests: {sdk}: {head}");
        }
        let body_hash = format!("\r\nx-amz-content-sha256: {}", sha256_hex(&data));
        assert!(puts[0].contains(&body_hash), "the PUT's body is signed: {}", puts[0]);
    }
}

#[test]
fn a_public_bucket_is_read_without_credentials() {
    let bucket = create_bucket("public");
    put(&bucket, "open/data.txt", b"anyone may read this".to_vec());
    let policy = format!(
        r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":{{"AWS":["*"]}},"Action":["s3:GetObject","s3:ListBucket","s3:GetBucketLocation"],"Resource":["arn:aws:s3:::{bucket}","arn:aws:s3:::{bucket}/*"]}}]}}"#
    );
    block_on(s3().put_bucket_policy().bucket(&bucket).policy(policy).send()).expect("public policy");
    let mount = MountBuilder::new()
        .bucket(&bucket)
        .access_key("no-such-user")
        .secret_key("wrong")
        .args(["--no-sign-request", "--attributes-from-listing"])
        .mount();
    assert_eq!(std::fs::read(mount.join("open/data.txt")).expect("read"), b"anyone may read this");
    // close() reports the refusal (std::fs::write would drop it with the File).
    let written = std::fs::File::create(mount.join("open/new.txt")).and_then(|mut file| {
        std::io::Write::write_all(&mut file, b"x")?;
        close(file)
    });
    let refused = written.expect_err("anonymous writes are refused");
    assert_eq!(refused.raw_os_error(), Some(libc::EACCES), "{refused}");
}

#[test]
fn sse_c_over_tls_with_a_private_ca() {
    use base64::Engine as _;
    use md5::Digest as _;
    let server = minio_tls();
    let certificate = server.certificate.clone().expect("a TLS MinIO");
    let client = s3_client_tls(&server.endpoint, &certificate);
    let bucket = unique_bucket_name("ssec");
    block_on(client.create_bucket().bucket(&bucket).send()).expect("create bucket");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, key_file) = (dir.path().join("ca.pem"), dir.path().join("sse-c.key"));
    std::fs::write(&ca, &certificate).expect("CA file");
    let key = [0x5a_u8; 32];
    std::fs::write(&key_file, key).expect("key file");
    let (ca, key_file) = (ca.to_str().expect("UTF-8"), key_file.to_str().expect("UTF-8"));

    // The server's certificate is not trusted without the bundle: the mount says so.
    let untrusted = MountBuilder::new().endpoint(&server.endpoint).bucket(&bucket).expect_failure();
    untrusted.assert_error("--ca-bundle");

    let options = ["--ca-bundle", ca, "--sse-c-key-file", key_file, "--part-size", "5MiB"];
    let written =
        write_every_way(&MountBuilder::new().endpoint(&server.endpoint).bucket(&bucket).args(options).mount());
    // An object written without the key cannot be read through the mount: EIO.
    let plain = aws_sdk_s3::primitives::ByteStream::from_static(b"not encrypted");
    block_on(client.put_object().bucket(&bucket).key("plain.txt").body(plain).send()).expect("plain PUT");
    // A new mount reads every object back from the store, with the key.
    let reader = MountBuilder::new().endpoint(&server.endpoint).bucket(&bucket).args(options).mount();
    let refused = std::fs::read(reader.join("plain.txt")).expect_err("the store refuses the key for it");
    assert_eq!(refused.raw_os_error(), Some(libc::EIO), "{refused}");
    let engine = base64::engine::general_purpose::STANDARD;
    for (name, bytes) in &written {
        assert_file_content(&reader.join(name), 1024 * KIB, bytes);
        let without_key = block_on(client.head_object().bucket(&bucket).key(*name).send());
        assert!(without_key.is_err(), "{name} is readable without the key");
        let with_key = block_on(
            client
                .get_object()
                .bucket(&bucket)
                .key(*name)
                .sse_customer_algorithm("AES256")
                .sse_customer_key(engine.encode(key))
                .sse_customer_key_md5(engine.encode(md5::Md5::digest(key)))
                .send(),
        )
        .unwrap_or_else(|e| panic!("GET {name} with the key: {e:?}"));
        assert_eq!(block_on(with_key.body.collect()).expect("body").into_bytes().as_ref(), bytes.as_slice());
    }
}
