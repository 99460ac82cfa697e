//! The S3 client of the tests (built from explicit arguments, nothing taken from the
//! shell's AWS_* environment) and sync helpers that check the bucket directly, not through a
//! mount: buckets, objects, listings, open multipart uploads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;

use super::{block_on, minio, ACCESS_KEY, REGION, SECRET_KEY};

/// An S3 client for `endpoint`, configured only from the arguments (no env, no profile files).
pub fn s3_client_for(endpoint: &str, access_key: &str, secret_key: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(access_key, secret_key, None, None, "bucketfs-tests"))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// An S3 client for the TLS MinIO (`minio_tls`), trusting its certificate.
pub fn s3_client_tls(endpoint: &str, ca_pem: &[u8]) -> aws_sdk_s3::Client {
    use aws_smithy_http_client::tls;
    let trust = tls::TrustStore::empty().with_pem_certificate(ca_pem.to_vec());
    let context = tls::TlsContext::builder().with_trust_store(trust).build().expect("TLS context");
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
        .tls_context(context)
        .build_https();
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .http_client(http)
        .credentials_provider(Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "bucketfs-tests"))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// The client for the MinIO of this process.
pub fn s3() -> &'static aws_sdk_s3::Client {
    static CLIENT: OnceLock<aws_sdk_s3::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let m = minio();
        s3_client_for(&m.endpoint, ACCESS_KEY, SECRET_KEY)
    })
}

fn err_text<E: std::error::Error>(e: E) -> String {
    format!("{}", aws_sdk_s3::error::DisplayErrorContext(e))
}

/// A lowercase bucket name unique to this process and call: `t-<hint>-<counter>-<pid>`.
pub fn unique_bucket_name(hint: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let suffix = format!("-{n}-{}", std::process::id());
    let mut h: String =
        hint.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let max_hint = 63 - 2 - suffix.len();
    h.truncate(max_hint);
    let h = h.trim_matches('-');
    let h = if h.is_empty() { "b" } else { h };
    format!("t-{h}{suffix}")
}

/// Creates a fresh bucket in MinIO and returns its name.
pub fn create_bucket(hint: &str) -> String {
    let name = unique_bucket_name(hint);
    block_on(s3().create_bucket().bucket(&name).send())
        .unwrap_or_else(|e| panic!("create bucket {name}: {}", err_text(e)));
    name
}

pub fn put(bucket: &str, key: &str, data: impl Into<Vec<u8>>) {
    let data: Vec<u8> = data.into();
    block_on(s3().put_object().bucket(bucket).key(key).body(ByteStream::from(data)).send())
        .unwrap_or_else(|e| panic!("put s3://{bucket}/{key}: {}", err_text(e)));
}

/// PUTs many objects concurrently (up to `concurrency` requests in flight).
pub fn put_many(bucket: &str, objects: Vec<(String, Vec<u8>)>, concurrency: usize) {
    let client = s3().clone();
    let bucket = bucket.to_string();
    block_on(async move {
        let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        for (key, data) in objects {
            let permit = sem.clone().acquire_owned().await.unwrap();
            let client = client.clone();
            let bucket = bucket.clone();
            set.spawn(async move {
                let r = client.put_object().bucket(&bucket).key(&key).body(ByteStream::from(data)).send().await;
                drop(permit);
                r.map_err(|e| format!("put s3://{bucket}/{key}: {}", err_text(e)))
            });
        }
        while let Some(r) = set.join_next().await {
            if let Err(e) = r.expect("put task panicked") {
                panic!("{e}");
            }
        }
    });
}

pub fn delete(bucket: &str, key: &str) {
    block_on(s3().delete_object().bucket(bucket).key(key).send())
        .unwrap_or_else(|e| panic!("delete s3://{bucket}/{key}: {}", err_text(e)));
}

pub fn get(bucket: &str, key: &str) -> Vec<u8> {
    block_on(async {
        let out = s3()
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .unwrap_or_else(|e| panic!("get s3://{bucket}/{key}: {}", err_text(e)));
        out.body.collect().await.expect("read body").into_bytes().to_vec()
    })
}

#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
}

fn to_system_time(t: &aws_sdk_s3::primitives::DateTime) -> SystemTime {
    let secs = t.secs();
    let nanos = t.subsec_nanos();
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nanos)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs((-secs) as u64) + Duration::from_nanos(nanos as u64)
    }
}

pub fn head(bucket: &str, key: &str) -> ObjectInfo {
    let out = block_on(s3().head_object().bucket(bucket).key(key).send())
        .unwrap_or_else(|e| panic!("head s3://{bucket}/{key}: {}", err_text(e)));
    ObjectInfo {
        key: key.to_string(),
        size: out.content_length().unwrap_or(0) as u64,
        etag: out.e_tag().unwrap_or_default().to_string(),
        last_modified: out.last_modified().map(to_system_time).expect("LastModified"),
    }
}

/// The user metadata (`x-amz-meta-*`, without the prefix) of an object.
pub fn stored_metadata(bucket: &str, key: &str) -> std::collections::HashMap<String, String> {
    let out = block_on(s3().head_object().bucket(bucket).key(key).send()).expect("head");
    out.metadata().cloned().unwrap_or_default()
}

/// All objects of the bucket under `prefix` (flat listing, all pages).
pub fn list_objects(bucket: &str, prefix: &str) -> Vec<ObjectInfo> {
    block_on(async {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = s3().list_objects_v2().bucket(bucket).prefix(prefix);
            if let Some(t) = &token {
                req = req.continuation_token(t);
            }
            let page = req.send().await.unwrap_or_else(|e| panic!("list s3://{bucket}/{prefix}: {}", err_text(e)));
            for o in page.contents() {
                out.push(ObjectInfo {
                    key: o.key().unwrap_or_default().to_string(),
                    size: o.size().unwrap_or(0) as u64,
                    etag: o.e_tag().unwrap_or_default().to_string(),
                    last_modified: o.last_modified().map(to_system_time).expect("LastModified"),
                });
            }
            match page.next_continuation_token() {
                Some(t) if page.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        out
    })
}

pub fn list_keys(bucket: &str, prefix: &str) -> Vec<String> {
    list_objects(bucket, prefix).into_iter().map(|o| o.key).collect()
}

/// Key -> (size, etag) of every object: a snapshot to check that "nothing changed".
pub fn bucket_snapshot(bucket: &str) -> Vec<(String, u64, String)> {
    list_objects(bucket, "").into_iter().map(|o| (o.key, o.size, o.etag)).collect()
}

/// Multipart uploads started and neither completed nor aborted in the bucket.
pub fn open_uploads(bucket: &str) -> usize {
    let out = block_on(s3().list_multipart_uploads().bucket(bucket).send())
        .unwrap_or_else(|e| panic!("list multipart uploads of {bucket}: {}", err_text(e)));
    out.uploads().len()
}

/// Multipart uploads of exactly `key` still open (MinIO lists a key's uploads from disk,
/// independently of the bucket-wide listing above).
pub fn open_uploads_of(bucket: &str, key: &str) -> usize {
    let out = block_on(s3().list_multipart_uploads().bucket(bucket).prefix(key).send())
        .unwrap_or_else(|e| panic!("list multipart uploads of s3://{bucket}/{key}: {}", err_text(e)));
    out.uploads().iter().filter(|u| u.key() == Some(key)).count()
}
