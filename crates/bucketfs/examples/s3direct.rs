//! `s3direct`: a plain aws-sdk-s3 client, used by `bench/` in two roles:
//!
//! * the "direct S3" baseline that the FUSE mounts are compared with
//!   (`get`, `get-ranges`, `get-prefix`, `list`, `put-file`, `put-dir`, `rm-prefix`);
//! * the fast set-up tool that fills the benchmark buckets
//!   (`mb`, `put-file`, `put-gen`, `put-dir`, `populate`).
//!
//! `mixed` runs GETs and PUTs all at once: the reference of the bench's `throttled` workload,
//! with `--adaptive` (the SDK's adaptive retry mode) against a MinIO that refuses requests over
//! its `MINIO_API_REQUESTS_MAX` with HTTP 429 `TooManyRequests`. The SDK's classifiers do not
//! retry that answer (its throttling codes are `SlowDown`, `Throttling`,
//! `TooManyRequestsException`...; its transient statuses 500/502/503/504), so every client made
//! here also has [`TooManyRequests`], a classifier that calls a 429 a throttling error: then
//! the SDK's own retry strategy (backoff; with `--adaptive`, its client-side rate limiter too)
//! handles it. `--no-429-classifier` leaves it out, to see what the SDK does on its own.
//!
//! Every command prints exactly one JSON object on stdout (its measurements);
//! diagnostics go to stderr. Credentials and endpoint come from flags or from the
//! usual `AWS_*` variables; path-style addressing is always used.
//!
//! Build: `cargo build --release -p bucketfs --example s3direct`

use bucketfs::mount_args::parse_size;
use std::fmt::Write as _;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aws_config::retry::RetryConfig;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_s3::config::{
    ConfigBag, Credentials, Intercept, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    RuntimeComponents,
};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use aws_sdk_s3::Client;
use aws_smithy_runtime_api::client::interceptors::context::InterceptorContext;
use aws_smithy_runtime_api::client::retries::classifiers::{ClassifyRetry, RetryAction, RetryClassifierPriority};
use clap::{Parser, Subcommand};
use futures::stream::{self, StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};

#[derive(Parser, Debug)]
#[command(name = "s3direct", about = "Direct S3 client used as the bucketfs benchmark baseline")]
struct Cli {
    /// S3 endpoint, e.g. http://127.0.0.1:9000
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint_url: Option<String>,
    /// Region sent in the signature
    #[arg(long, default_value = "us-east-1")]
    region: String,
    /// Access key (or AWS_ACCESS_KEY_ID)
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    access_key: String,
    /// Secret key (or AWS_SECRET_ACCESS_KEY)
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    secret_key: String,
    /// The SDK's adaptive retry mode (`RetryConfig::adaptive()`: backoff plus a client-side
    /// rate limiter that slows down on throttling errors) instead of the standard one
    #[arg(long, global = true)]
    adaptive: bool,
    /// Attempts per request, the first one included
    #[arg(long, global = true, default_value_t = 5)]
    max_attempts: u32,
    /// Do not add the classifier that makes HTTP 429 a throttling error (the SDK alone)
    #[arg(long, global = true)]
    no_429_classifier: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create a bucket (no error if it already exists)
    Mb { bucket: String },
    /// GET one object and discard its bytes (one streamed GET, or parallel ranged GETs)
    Get {
        bucket: String,
        key: String,
        /// Number of parallel ranged GETs; 1 = a single streamed GET
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Range size when --concurrency > 1
        #[arg(long, default_value = "16MiB", value_parser = parse_size)]
        part_size: u64,
    },
    /// Sequential ranged GETs at the offsets listed in a file (one per line); prints each latency
    GetRanges {
        bucket: String,
        key: String,
        #[arg(long)]
        offsets: PathBuf,
        #[arg(long, default_value_t = 100)]
        len: u64,
    },
    /// List a prefix and GET every object under it, in parallel
    GetPrefix {
        bucket: String,
        #[arg(default_value = "")]
        prefix: String,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// List a prefix (recursively); prints object count, bytes and directory markers
    List {
        bucket: String,
        #[arg(default_value = "")]
        prefix: String,
        /// Also print every key with its size (`"keys":[["KEY",SIZE],...]`)
        #[arg(long)]
        keys: bool,
    },
    /// Upload one local file (multipart with parallel parts when larger than a part)
    PutFile {
        file: PathBuf,
        bucket: String,
        key: String,
        #[arg(long, default_value = "16MiB", value_parser = parse_size)]
        part_size: u64,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// Upload an object of deterministic pseudo-random bytes generated on the fly
    PutGen {
        bucket: String,
        key: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value = "16MiB", value_parser = parse_size)]
        part_size: u64,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
    },
    /// Upload a local directory tree under PREFIX, files in parallel
    PutDir {
        dir: PathBuf,
        bucket: String,
        #[arg(default_value = "")]
        prefix: String,
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// Also store an empty `DIR/` marker per subdirectory, as the mounts do: the same
        /// requests as a mount's untar.
        #[arg(long)]
        dir_markers: bool,
    },
    /// Create COUNT objects PREFIX000000.. of SIZE deterministic bytes, in parallel
    Populate {
        bucket: String,
        prefix: String,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value = "0", value_parser = parse_size)]
        size: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Appended to every key (e.g. ".txt")
        #[arg(long, default_value = "")]
        suffix: String,
    },
    /// Copy an object inside the store (one CopyObject, up to 5 GiB)
    Copy { bucket: String, source: String, key: String },
    /// Delete every object under a prefix (batched DeleteObjects)
    RmPrefix {
        bucket: String,
        #[arg(default_value = "")]
        prefix: String,
    },
    /// GETs and PUTs all at once, one request per object (the `throttled` workload's
    /// reference); exits non-zero if any fails or a GET's bytes have another SHA-256
    Mixed {
        bucket: String,
        /// KEY or KEY=SHA256 (hex): an object to GET and hash (repeatable)
        #[arg(long = "get", value_name = "KEY[=SHA256]")]
        gets: Vec<String>,
        /// FILE=KEY: a local file to upload with one PutObject (repeatable)
        #[arg(long = "put", value_name = "FILE=KEY")]
        puts: Vec<String>,
    },
}

/// Responses received (one per attempt that got an answer) and those with HTTP 429, counted by
/// [`CountResponses`].
static RESPONSES: AtomicU64 = AtomicU64::new(0);
static THROTTLED_RESPONSES: AtomicU64 = AtomicU64::new(0);

/// Counts every HTTP response, retried attempts included, for `mixed`'s report.
#[derive(Debug)]
struct CountResponses;

impl Intercept for CountResponses {
    fn name(&self) -> &'static str {
        "s3direct-count-responses"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> std::result::Result<(), aws_smithy_runtime_api::box_error::BoxError> {
        RESPONSES.fetch_add(1, Ordering::Relaxed);
        if context.response().status().as_u16() == 429 {
            THROTTLED_RESPONSES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Classifies HTTP 429 (MinIO's `TooManyRequests` when more requests arrive than its
/// `MINIO_API_REQUESTS_MAX`) as a throttling error, which the SDK's classifiers do not.
#[derive(Debug, Default)]
struct TooManyRequests;

impl ClassifyRetry for TooManyRequests {
    fn classify_retry(&self, ctx: &InterceptorContext) -> RetryAction {
        match ctx.response() {
            Some(res) if res.status().as_u16() == 429 => RetryAction::throttling_error(),
            _ => RetryAction::NoActionIndicated,
        }
    }

    fn name(&self) -> &'static str {
        "HTTP 429 Too Many Requests is throttling"
    }

    fn priority(&self) -> RetryClassifierPriority {
        // After the SDK's own (the last one's verdict stands, unless one forbids a retry).
        RetryClassifierPriority::run_after(RetryClassifierPriority::transient_error_classifier())
    }
}

/// Deterministic pseudo-random bytes: `splitmix64` keyed by (seed, stream, word index).
fn gen_bytes(seed: u64, stream_id: u64, offset: u64, len: usize) -> Vec<u8> {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let key = mix(seed ^ mix(stream_id));
    let mut out = Vec::with_capacity(len + 8);
    let first_word = offset / 8;
    let skip = (offset % 8) as usize;
    let words = (skip + len).div_ceil(8) as u64;
    for w in 0..words {
        out.extend_from_slice(&mix(key ^ (first_word + w).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes());
    }
    out.drain(..skip);
    out.truncate(len);
    out
}

fn secs(d: Duration) -> String {
    format!("{:.6}", d.as_secs_f64())
}

async fn make_client(cli: &Cli) -> Client {
    let creds = Credentials::new(&cli.access_key, &cli.secret_key, None, None, "s3direct");
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(cli.region.clone()))
        .credentials_provider(creds)
        .retry_config(
            if cli.adaptive { RetryConfig::adaptive() } else { RetryConfig::standard() }
                .with_max_attempts(cli.max_attempts.max(1)),
        );
    if let Some(url) = &cli.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    let sdk = loader.load().await;
    let mut conf = aws_sdk_s3::config::Builder::from(&sdk)
        .force_path_style(true)
        // A lean baseline: no extra checksums beyond what the API requires.
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .interceptor(CountResponses);
    if !cli.no_429_classifier {
        conf = conf.retry_classifier(TooManyRequests);
    }
    Client::from_conf(conf.build())
}

/// Reads the bytes of one part of an upload source.
type PartSource = Arc<dyn Fn(u64, usize) -> Result<Vec<u8>> + Send + Sync>;

/// Uploads `size` bytes from `source` as one object: a single PUT when it fits in one part,
/// otherwise a multipart upload with up to `concurrency` parts in flight.
async fn upload_object(
    client: &Client,
    bucket: &str,
    key: &str,
    size: u64,
    part_size: u64,
    concurrency: usize,
    source: PartSource,
) -> Result<()> {
    if part_size < 5 << 20 {
        bail!("part size must be at least 5 MiB");
    }
    if size <= part_size {
        let src = source.clone();
        let data = tokio::task::spawn_blocking(move || src(0, size as usize)).await??;
        client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(ByteStream::from(data))
            .send()
            .await
            .with_context(|| format!("PutObject {bucket}/{key}"))?;
        return Ok(());
    }
    let created = client
        .create_multipart_upload()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .with_context(|| format!("CreateMultipartUpload {bucket}/{key}"))?;
    let upload_id = created.upload_id().ok_or_else(|| anyhow!("no upload id"))?.to_string();
    let nparts = size.div_ceil(part_size);
    let result: Result<Vec<CompletedPart>> = stream::iter(0..nparts)
        .map(|i| {
            let client = client.clone();
            let source = source.clone();
            let upload_id = upload_id.clone();
            async move {
                let off = i * part_size;
                let len = part_size.min(size - off) as usize;
                let data = tokio::task::spawn_blocking(move || source(off, len)).await??;
                let part_number = i32::try_from(i + 1)?;
                let out = client
                    .upload_part()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .part_number(part_number)
                    .body(ByteStream::from(data))
                    .send()
                    .await
                    .with_context(|| format!("UploadPart {part_number} of {bucket}/{key}"))?;
                Ok(CompletedPart::builder().part_number(part_number).set_e_tag(out.e_tag().map(str::to_string)).build())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect()
        .await;
    let mut parts = match result {
        Ok(parts) => parts,
        Err(e) => {
            let _ = client.abort_multipart_upload().bucket(bucket).key(key).upload_id(&upload_id).send().await;
            return Err(e);
        }
    };
    parts.sort_by_key(|p| p.part_number());
    client
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(&upload_id)
        .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
        .send()
        .await
        .with_context(|| format!("CompleteMultipartUpload {bucket}/{key}"))?;
    Ok(())
}

fn file_source(path: &Path) -> Result<(u64, PartSource)> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let size = file.metadata()?.len();
    let file = Arc::new(file);
    let src: PartSource = Arc::new(move |off, len| {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, off)?;
        Ok(buf)
    });
    Ok((size, src))
}

/// All objects under a prefix: (key, size).
async fn list_all(client: &Client, bucket: &str, prefix: &str) -> Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let mut pages = client.list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
    while let Some(page) = pages.next().await {
        let page = page.with_context(|| format!("ListObjectsV2 {bucket}/{prefix}"))?;
        for obj in page.contents() {
            if let Some(key) = obj.key() {
                out.push((key.to_string(), obj.size().unwrap_or(0).max(0) as u64));
            }
        }
    }
    Ok(out)
}

async fn get_discard(client: &Client, bucket: &str, key: &str, range: Option<String>) -> Result<u64> {
    let out = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .set_range(range)
        .send()
        .await
        .with_context(|| format!("GetObject {bucket}/{key}"))?;
    let mut body = out.body;
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        n += chunk.with_context(|| format!("reading body of {bucket}/{key}"))?.len() as u64;
    }
    Ok(n)
}

/// GETs a whole object; returns its size and the SHA-256 of its bytes (hex).
async fn get_sha256(client: &Client, bucket: &str, key: &str) -> Result<(u64, String)> {
    let out = client
        .get_object()
        .bucket(bucket)
        .key(key)
        .send()
        .await
        .with_context(|| format!("GetObject {bucket}/{key}"))?;
    let mut body = out.body;
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.with_context(|| format!("reading body of {bucket}/{key}"))?;
        n += chunk.len() as u64;
        hasher.update(&chunk);
    }
    Ok((n, hex::encode(hasher.finalize())))
}

/// One request of `mixed`: a GET (with the SHA-256 its bytes must have) or a PUT of a file.
enum MixedOp {
    Get { key: String, sha256: Option<String> },
    Put { file: PathBuf, key: String },
}

/// Runs every operation at once; returns (bytes moved, one line per failed operation).
async fn run_mixed(client: &Client, bucket: &str, ops: Vec<MixedOp>) -> (u64, Vec<String>) {
    let tasks: Vec<_> = ops
        .into_iter()
        .map(|op| {
            let client = client.clone();
            let bucket = bucket.to_string();
            tokio::spawn(async move {
                match op {
                    MixedOp::Get { key, sha256 } => {
                        let (n, got) =
                            get_sha256(&client, &bucket, &key).await.map_err(|e| format!("GET {key}: {e:#}"))?;
                        match sha256 {
                            Some(want) if !want.eq_ignore_ascii_case(&got) => {
                                Err(format!("GET {key}: {n} bytes with SHA-256 {got}, expected {want}"))
                            }
                            _ => Ok(n),
                        }
                    }
                    MixedOp::Put { file, key } => {
                        let (size, src) = file_source(&file).map_err(|e| format!("PUT {key}: {e:#}"))?;
                        // One PutObject up to 5 GiB, as one writer of one file (multipart above).
                        let part = size.clamp(5 << 20, 5 << 30);
                        upload_object(&client, &bucket, &key, size, part, 4, src)
                            .await
                            .map_err(|e| format!("PUT {key}: {e:#}"))?;
                        Ok(size)
                    }
                }
            })
        })
        .collect();
    let mut bytes = 0u64;
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(n)) => bytes += n,
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("task failed: {e}")),
        }
    }
    (bytes, errors)
}

/// The files under `dir` into `out`, and its subdirectories into `dirs`, in name order.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("read_dir {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let ft = e.file_type()?;
        if ft.is_dir() {
            dirs.push(e.path());
            walk(&e.path(), out, dirs)?;
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

fn join_key(prefix: &str, rel: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        format!("{prefix}{rel}")
    } else {
        format!("{prefix}/{rel}")
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let client = make_client(&cli).await;
    let t0 = Instant::now();
    match &cli.cmd {
        Cmd::Mb { bucket } => {
            let created = if client.head_bucket().bucket(bucket).send().await.is_ok() {
                false
            } else {
                client.create_bucket().bucket(bucket).send().await.with_context(|| format!("CreateBucket {bucket}"))?;
                true
            };
            println!("{{\"bucket\":\"{bucket}\",\"created\":{created},\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::Get { bucket, key, concurrency, part_size } => {
            let bytes = if *concurrency <= 1 {
                get_discard(&client, bucket, key, None).await?
            } else {
                let head = client
                    .head_object()
                    .bucket(bucket)
                    .key(key)
                    .send()
                    .await
                    .with_context(|| format!("HeadObject {bucket}/{key}"))?;
                let size = head.content_length().unwrap_or(0).max(0) as u64;
                let ranges: Vec<(u64, u64)> = (0..size.div_ceil(*part_size))
                    .map(|i| (i * part_size, ((i + 1) * part_size).min(size) - 1))
                    .collect();
                stream::iter(ranges)
                    .map(|(a, b)| {
                        let client = client.clone();
                        async move { get_discard(&client, bucket, key, Some(format!("bytes={a}-{b}"))).await }
                    })
                    .buffer_unordered(*concurrency)
                    .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
                    .await?
            };
            let el = t0.elapsed();
            println!(
                "{{\"bytes\":{bytes},\"seconds\":{},\"mib_per_s\":{:.1}}}",
                secs(el),
                bytes as f64 / (1 << 20) as f64 / el.as_secs_f64().max(1e-9)
            );
        }
        Cmd::GetRanges { bucket, key, offsets, len } => {
            let text = std::fs::read_to_string(offsets).with_context(|| format!("read {}", offsets.display()))?;
            let offs: Vec<u64> = text
                .split_whitespace()
                .map(|s| s.parse::<u64>().with_context(|| format!("bad offset {s:?}")))
                .collect::<Result<_>>()?;
            if *len == 0 {
                bail!("--len must be > 0");
            }
            let mut lat = String::new();
            let mut total = 0u64;
            let start = Instant::now();
            for (i, off) in offs.iter().enumerate() {
                let t = Instant::now();
                let n = get_discard(&client, bucket, key, Some(format!("bytes={}-{}", off, off + len - 1))).await?;
                total += n;
                if i > 0 {
                    lat.push(',');
                }
                let _ = write!(lat, "{:.6}", t.elapsed().as_secs_f64());
            }
            println!(
                "{{\"reads\":{},\"bytes\":{total},\"seconds\":{},\"latencies\":[{lat}]}}",
                offs.len(),
                secs(start.elapsed())
            );
        }
        Cmd::GetPrefix { bucket, prefix, concurrency } => {
            let keys = list_all(&client, bucket, prefix).await?;
            let n = keys.len();
            let bytes = stream::iter(keys)
                .map(|(k, _)| {
                    let client = client.clone();
                    async move { get_discard(&client, bucket, &k, None).await }
                })
                .buffer_unordered((*concurrency).max(1))
                .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
                .await?;
            println!("{{\"objects\":{n},\"bytes\":{bytes},\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::List { bucket, prefix, keys: with_keys } => {
            let keys = list_all(&client, bucket, prefix).await?;
            let markers = keys.iter().filter(|(k, _)| k.ends_with('/')).count();
            let files: Vec<_> = keys.iter().filter(|(k, _)| !k.ends_with('/')).collect();
            let bytes: u64 = files.iter().map(|(_, s)| s).sum();
            let listed = if *with_keys {
                let each: Vec<String> =
                    files.iter().map(|(k, s)| format!("[{},{s}]", serde_json::Value::from(k.as_str()))).collect();
                format!(",\"keys\":[{}]", each.join(","))
            } else {
                String::new()
            };
            println!(
                "{{\"objects\":{},\"bytes\":{bytes},\"dir_markers\":{markers}{listed},\"seconds\":{}}}",
                files.len(),
                secs(t0.elapsed())
            );
        }
        Cmd::PutFile { file, bucket, key, part_size, concurrency } => {
            let (size, src) = file_source(file)?;
            upload_object(&client, bucket, key, size, *part_size, *concurrency, src).await?;
            println!("{{\"objects\":1,\"bytes\":{size},\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::PutGen { bucket, key, size, seed, part_size, concurrency } => {
            let seed = *seed;
            let src: PartSource = Arc::new(move |off, len| Ok(gen_bytes(seed, 0, off, len)));
            upload_object(&client, bucket, key, *size, *part_size, *concurrency, src).await?;
            println!("{{\"objects\":1,\"bytes\":{size},\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::PutDir { dir, bucket, prefix, concurrency, dir_markers } => {
            let (mut files, mut dirs) = (Vec::new(), Vec::new());
            walk(dir, &mut files, &mut dirs)?;
            let n = files.len();
            let part_size: u64 = 16 << 20;
            // Each directory's marker goes before the files in it, as a mount's mkdir does.
            let markers = if *dir_markers { dirs } else { Vec::new() };
            let uploads =
                markers.into_iter().map(|path| (path, true)).chain(files.into_iter().map(|path| (path, false)));
            let bytes = stream::iter(uploads)
                .map(|(path, is_dir)| {
                    let client = client.clone();
                    let rel = path.strip_prefix(dir).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
                    let key = join_key(prefix, &rel);
                    async move {
                        if is_dir {
                            let marker = format!("{key}/");
                            let request =
                                client.put_object().bucket(bucket).key(&marker).body(ByteStream::from_static(b""));
                            request.send().await.with_context(|| format!("PutObject {bucket}/{marker}"))?;
                            return Ok::<u64, anyhow::Error>(0);
                        }
                        let (size, src) = file_source(&path)?;
                        upload_object(&client, bucket, &key, size, part_size, 4, src).await?;
                        Ok::<u64, anyhow::Error>(size)
                    }
                })
                .buffer_unordered((*concurrency).max(1))
                .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
                .await?;
            println!("{{\"objects\":{n},\"bytes\":{bytes},\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::Populate { bucket, prefix, count, size, seed, concurrency, suffix } => {
            let (size, seed) = (*size, *seed);
            if size > 5 << 30 {
                bail!("populate objects are single PUTs: size must be <= 5 GiB");
            }
            stream::iter(0..*count)
                .map(|i| {
                    let client = client.clone();
                    let key = format!("{prefix}{i:06}{suffix}");
                    async move {
                        let data = gen_bytes(seed, i + 1, 0, size as usize);
                        client
                            .put_object()
                            .bucket(bucket)
                            .key(&key)
                            .body(ByteStream::from(data))
                            .send()
                            .await
                            .with_context(|| format!("PutObject {bucket}/{key}"))?;
                        Ok::<(), anyhow::Error>(())
                    }
                })
                .buffer_unordered((*concurrency).max(1))
                .try_collect::<Vec<()>>()
                .await?;
            println!("{{\"objects\":{count},\"bytes\":{},\"seconds\":{}}}", count * size, secs(t0.elapsed()));
        }
        Cmd::Copy { bucket, source, key } => {
            client
                .copy_object()
                .bucket(bucket)
                .key(key)
                .copy_source(format!("{bucket}/{source}"))
                .send()
                .await
                .with_context(|| format!("CopyObject {bucket}/{source} to {key}"))?;
            println!("{{\"objects\":1,\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::RmPrefix { bucket, prefix } => {
            let keys = list_all(&client, bucket, prefix).await?;
            let n = keys.len();
            let batches: Vec<Vec<String>> =
                keys.chunks(1000).map(|c| c.iter().map(|(k, _)| k.clone()).collect()).collect();
            stream::iter(batches)
                .map(|batch| {
                    let client = client.clone();
                    async move {
                        let objects = batch
                            .iter()
                            .map(|k| ObjectIdentifier::builder().key(k).build())
                            .collect::<std::result::Result<Vec<_>, _>>()?;
                        let out = client
                            .delete_objects()
                            .bucket(bucket)
                            .delete(Delete::builder().set_objects(Some(objects)).quiet(true).build()?)
                            .send()
                            .await
                            .with_context(|| format!("DeleteObjects in {bucket}"))?;
                        if let Some(err) = out.errors().first() {
                            bail!(
                                "DeleteObjects {bucket}/{}: {}",
                                err.key().unwrap_or("?"),
                                err.message().unwrap_or("?")
                            );
                        }
                        Ok(())
                    }
                })
                .buffer_unordered(4)
                .try_collect::<Vec<()>>()
                .await?;
            println!("{{\"deleted\":{n},\"seconds\":{}}}", secs(t0.elapsed()));
        }
        Cmd::Mixed { bucket, gets, puts } => {
            let mut ops = Vec::new();
            for g in gets {
                ops.push(match g.rsplit_once('=') {
                    Some((key, sha)) => MixedOp::Get { key: key.to_string(), sha256: Some(sha.to_string()) },
                    None => MixedOp::Get { key: g.clone(), sha256: None },
                });
            }
            for p in puts {
                let (file, key) = p.rsplit_once('=').ok_or_else(|| anyhow!("--put wants FILE=KEY, got {p:?}"))?;
                ops.push(MixedOp::Put { file: PathBuf::from(file), key: key.to_string() });
            }
            let (bytes, errors) = run_mixed(&client, bucket, ops).await;
            for e in &errors {
                eprintln!("s3direct mixed: {e}");
            }
            let list =
                errors.iter().map(|e| serde_json::Value::from(e.as_str()).to_string()).collect::<Vec<_>>().join(",");
            println!(
                "{{\"gets\":{},\"puts\":{},\"bytes\":{bytes},\"errors\":{},\"error_list\":[{list}],\"responses\":{},\"throttled_responses\":{},\"adaptive\":{},\"max_attempts\":{},\"seconds\":{}}}",
                gets.len(),
                puts.len(),
                errors.len(),
                RESPONSES.load(Ordering::Relaxed),
                THROTTLED_RESPONSES.load(Ordering::Relaxed),
                cli.adaptive,
                cli.max_attempts,
                secs(t0.elapsed())
            );
            if !errors.is_empty() {
                bail!("{} of {} requests failed", errors.len(), gets.len() + puts.len());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("10"), Ok(10));
        assert_eq!(parse_size("1KB"), Ok(1024));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn generator_is_deterministic_and_offset_consistent() {
        let whole = gen_bytes(7, 0, 0, 100);
        assert_eq!(whole, gen_bytes(7, 0, 0, 100));
        assert_eq!(&whole[13..50], &gen_bytes(7, 0, 13, 37)[..]);
        assert_ne!(whole, gen_bytes(8, 0, 0, 100));
    }
}
