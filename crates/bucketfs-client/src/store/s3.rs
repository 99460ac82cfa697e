//! [`ObjectStore`] on aws-sdk-s3: client construction (credential chain, endpoint,
//! timeouts, retries), the calls themselves, and the one mapping from SDK errors to
//! [`StoreError`].

use std::error::Error as _;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use aws_config::meta::region::RegionProviderChain;
use aws_config::retry::RetryConfig;
use aws_config::stalled_stream_protection::StalledStreamProtectionConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::RequestChecksumCalculation;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::RequestId;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    CompletedMultipartUpload, CompletedPart, Delete, EncodingType, MetadataDirective, ObjectIdentifier,
};
use aws_sdk_s3::Client;
use aws_smithy_runtime_api::client::http::HttpConnectorSettings;
use aws_smithy_runtime_api::client::result::ConnectorError;
use bytes::Bytes;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::direct::{self, Direct};
use super::endpoints::{EndpointReport, Endpoints, PoolResolver};
use super::listing_metadata::{self, ListingInterceptor};
use super::request_options::{RequestOptions, RequestOptionsInterceptor, UploadChecksums};
use super::request_window::{RequestWindow, WindowReport};
use super::server_kind::{ServerKind, Support};
use super::{
    etag, version_to_restore, BodySink, ListPage, Metadata, ObjectInfo, ObjectStore, OpenUpload, StoreError,
    VersionInfo, WriteCondition, KEPT_HEADERS, MAX_VERSIONS_LISTED,
};

/// How to reach one bucket. Each source of a mount has its own.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub bucket: String,
    /// The store's URLs: none for AWS (or `AWS_ENDPOINT_URL`), several for the nodes or
    /// gateways of one cluster (see `endpoints`).
    pub endpoint_urls: Vec<String>,
    pub region: Option<String>,
    pub profile: Option<String>,
    pub force_path_style: bool,
    pub max_concurrent_requests: usize,
    pub read_timeout: Duration,
    /// How long a call keeps retrying transient failures (see [`S3Store::retrying`]).
    pub retry_window: Duration,
    /// Ask servers that offer it (MinIO) for objects' metadata in listings.
    pub listing_metadata: bool,
    /// Headers for encryption, storage class, requester pays, bucket owner.
    pub options: RequestOptions,
    pub upload_checksums: UploadChecksums,
    /// Send unsigned requests (public buckets).
    pub no_sign_request: bool,
    /// Send the reads' GETs and the small PUTs through the SDK even where [`Direct`] could
    /// send them.
    pub sdk_requests: bool,
    /// PEM certificates to trust besides the system's (a private CA of the endpoint).
    pub ca_bundle: Option<Vec<u8>>,
    /// Sign with this key instead of the credential chain's (the CSI controller, which
    /// gets a key with each call).
    pub credentials: Option<StaticCredentials>,
}

/// An access key given with a request, not found by the SDK's credential chain.
#[derive(Clone)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret in a log line.
        write!(f, "StaticCredentials({})", self.access_key_id)
    }
}

/// Timeouts are what keeps a dead server from hanging a program on the mount: bytes must
/// keep flowing (`read_timeout`, default 20 s), a connection must open within
/// `CONNECT_TIMEOUT` (or the read timeout, if shorter), and one attempt may not take
/// longer than twice the read timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a response body may receive nothing (the SDK's default grace period).
const BODY_STALL: Duration = Duration::from_secs(5);
/// How long a paced GET's answer is kept unread for its reader to want more, before its
/// connection is closed. A closed answer wastes what the store had already sent into the
/// connection's buffers (megabytes): at 5 s, 256 readers sharing two cores let so many
/// go that MinIO spent 2.5 times the CPU. A store that closes first is resumed as for
/// any broken body.
const PAUSE_KEEPS_ANSWER: Duration = Duration::from_secs(30);
/// Retries are ours, not the SDK's (whose standard mode gives up after 3 attempts, about
/// 2 s against a refused connection, and draws on a shared retry quota): a transient
/// failure is retried with exponential backoff and jitter, from `FIRST_BACKOFF` doubling
/// up to `MAX_BACKOFF`, for as long as the store's `retry_window` (default 10 s) allows.
/// So a store restarting for a few seconds is invisible, and a dead one fails in about
/// the window.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

// Uploads are sent with UNSIGNED-PAYLOAD: hashing every byte with SHA-256 for the
// signature cost 40% of the daemon's CPU when copying a large file, and the SDK's CRC32
// checksum, which the server verifies, already protects the bytes in transit.
// Small PUTs (most of an untar) go the other way: signing a few KiB costs microseconds,
// the signature protects the bytes just as well, and without the checksum trailer the
// body is not aws-chunked: 0.05 to 0.15 ms less per 9 KB PUT to local MinIO (1.8 vs 1.9
// ms, 1,000 sequential PUTs), and `tar x` of 7,100 files 21.6 s against 22.1 s (3 runs each).
// They are sent by `Direct` where it has a route: the SDK's PutObject pipeline took a
// quarter of the daemon's CPU in an untar (5.5 CPU-s against 4.1 without it).
const SIGNED_PUT_LIMIT: usize = 256 * 1024;

pub struct S3Store {
    client: Client,
    bucket: String,
    /// The endpoint as messages name it (the first URL and how many more).
    endpoint: String,
    /// The URLs requests are spread over, when the store has several.
    endpoints: Option<Arc<Endpoints>>,
    /// Caps requests in flight to this bucket, whoever issues them: at most
    /// `--max-concurrent-requests`, fewer while the store is throttling.
    window: Arc<RequestWindow>,
    retry_window: Duration,
    /// Whether listings may carry objects' metadata (learnt from the server's answers).
    server: Arc<ServerKind>,
    checksums: UploadChecksums,
    /// Sends the reads' GETs and the small PUTs without the SDK's pipeline, where the
    /// store's URL is known.
    direct: Option<Direct>,
    /// How long a body may receive nothing before the GET is retried.
    body_stall: Duration,
}

impl S3Store {
    pub async fn new(config: &StoreConfig) -> Result<Arc<Self>, String> {
        let read_timeout = config.read_timeout.max(Duration::from_millis(100));
        let region = RegionProviderChain::first_try(config.region.clone().map(aws_config::Region::new))
            .or_default_provider()
            .or_else(aws_config::Region::new("us-east-1"));
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(region)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT.min(read_timeout))
                    .read_timeout(read_timeout)
                    .operation_attempt_timeout(read_timeout * 2)
                    .build(),
            );
        // A body whose bytes stop coming fails after BODY_STALL (the SDK's stalled-stream
        // protection), or the read timeout if shorter, and is resumed by a retry (maybe
        // from another endpoint).
        loader = loader.stalled_stream_protection(
            StalledStreamProtectionConfig::enabled().grace_period(BODY_STALL.min(read_timeout)).build(),
        );
        if let Some(profile) = &config.profile {
            loader = loader.profile_name(profile);
        }
        if let Some(first) = config.endpoint_urls.first() {
            loader = loader.endpoint_url(first);
        }
        if config.no_sign_request {
            loader = loader.no_credentials();
        } else if let Some(key) = &config.credentials {
            loader = loader.credentials_provider(aws_credential_types::Credentials::new(
                &key.access_key_id,
                &key.secret_access_key,
                key.session_token.clone(),
                None,
                "bucketfs-static",
            ));
        }
        use aws_smithy_http_client::tls;
        let trust = match &config.ca_bundle {
            Some(pem) => {
                let trust = tls::TrustStore::default().with_pem_certificate(pem.clone());
                Some(tls::TlsContext::builder().with_trust_store(trust).build().map_err(|e| e.to_string())?)
            }
            None => None,
        };
        if let Some(context) = &trust {
            let client = aws_smithy_http_client::Builder::new()
                .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
                .tls_context(context.clone())
                .build_https();
            loader = loader.http_client(client);
        }
        let shared = loader.load().await;
        let mut endpoint = shared.endpoint_url().map(str::to_owned).unwrap_or_else(|| "the AWS S3 endpoint".to_owned());
        let mut s3_config = aws_sdk_s3::config::Builder::from(&shared).force_path_style(config.force_path_style);
        let endpoints = (config.endpoint_urls.len() > 1).then(|| Endpoints::new(config.endpoint_urls.clone()));
        if let Some(pool) = &endpoints {
            s3_config = s3_config.endpoint_resolver(PoolResolver::new(pool.clone()));
            endpoint = format!("{endpoint} (+{} more)", config.endpoint_urls.len() - 1);
        }
        if !config.options.is_empty() {
            s3_config = s3_config.interceptor(RequestOptionsInterceptor(config.options.clone()));
        }
        if config.upload_checksums == UploadChecksums::Off {
            s3_config = s3_config.request_checksum_calculation(RequestChecksumCalculation::WhenRequired);
        }
        let s3_config = s3_config.build();
        let direct = if config.sdk_requests { None } else { Self::direct(config, &shared, trust, read_timeout).await };
        Ok(Arc::new(Self {
            client: Client::from_conf(s3_config),
            bucket: config.bucket.clone(),
            window: RequestWindow::new(format!("{endpoint}/{}", config.bucket), config.max_concurrent_requests),
            endpoint,
            endpoints,
            retry_window: config.retry_window,
            server: Arc::new(ServerKind::new(config.listing_metadata)),
            checksums: config.upload_checksums,
            direct,
            body_stall: BODY_STALL.min(read_timeout),
        }))
    }

    /// A [`Direct`] client for the reads and small PUTs, with a route for each of the
    /// store's URLs, if the SDK's endpoint rules resolve every one to a plain SigV4 `s3`
    /// endpoint (not S3 Express sessions, access point ARNs signed with SigV4a, ...): those
    /// keep the SDK.
    async fn direct(
        config: &StoreConfig,
        shared: &aws_config::SdkConfig,
        trust: Option<aws_smithy_http_client::tls::TlsContext>,
        read_timeout: Duration,
    ) -> Option<Direct> {
        let region = shared.region().map_or_else(|| "us-east-1".to_owned(), |region| region.to_string());
        let urls: Vec<Option<&str>> = match config.endpoint_urls.as_slice() {
            [_, _, ..] => config.endpoint_urls.iter().map(|url| Some(url.as_str())).collect(),
            _ => vec![shared.endpoint_url()],
        };
        let several = urls.len() > 1;
        let mut routes = Vec::new();
        for url in urls {
            let mut params = aws_sdk_s3::config::endpoint::Params::builder()
                .bucket(&config.bucket)
                .region(&region)
                .use_fips(shared.use_fips().unwrap_or(false))
                .use_dual_stack(shared.use_dual_stack().unwrap_or(false))
                .force_path_style(config.force_path_style)
                .accelerate(false);
            if let Some(url) = url {
                params = params.endpoint(url);
            }
            routes.push(direct::route(params.build().ok()?, several).await?);
        }
        for route in &routes {
            tracing::debug!(base = %route.base, region = %route.signing_region, "GETs and small PUTs sent without the SDK");
        }
        let settings = HttpConnectorSettings::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(read_timeout))
            .read_timeout(read_timeout)
            .build();
        Some(Direct::new(direct::Target {
            settings,
            attempt_timeout: read_timeout * 2,
            trust,
            routes,
            credentials: if config.no_sign_request { None } else { shared.credentials_provider() },
            get_headers: config.options.headers("GetObject"),
            put_headers: config.options.headers("PutObject"),
        }))
    }

    /// Probes endpoint `url`, left out, in the background until it answers: any answer to a
    /// HeadBucket (even a refusal) shows the node is back. The probe takes no place in the
    /// request window: it is one request every few seconds at most.
    fn start_probing(&self, pool: &Arc<Endpoints>, url: usize) {
        let (pool, client, bucket) = (pool.clone(), self.client.clone(), self.bucket.clone());
        tokio::spawn(async move {
            pool.probe(url, || async {
                match client.head_bucket().bucket(&bucket).send().await {
                    Ok(_) => true,
                    Err(SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) | SdkError::ResponseError(_)) => false,
                    Err(_) => true,
                }
            })
            .await
        });
    }

    /// The URL the request being answered went to, for messages.
    fn endpoint_now(&self) -> String {
        match self.endpoints.as_ref().and_then(|pool| pool.chosen()) {
            Some(url) => url.to_owned(),
            None => self.endpoint.clone(),
        }
    }

    /// Turns any SDK failure into a [`StoreError`]: a failure to send through
    /// [`S3Store::connector_failure`], an answer through [`S3Store::answer_error`].
    fn map_error<E>(&self, err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        match &err {
            SdkError::DispatchFailure(failure) => {
                if let Some(missing) = missing_credentials(&err) {
                    return StoreError::NoCredentials(missing);
                }
                return match failure.as_connector_error() {
                    Some(connector) => self.connector_failure(connector),
                    None => StoreError::Unreachable { endpoint: self.endpoint_now(), detail: format!("{err}") },
                };
            }
            SdkError::TimeoutError(_) => return StoreError::Timeout(self.endpoint_now()),
            // An answer that could not be read whole: the connection broke while it came.
            SdkError::ResponseError(_) => return StoreError::Interrupted(innermost_message(&err)),
            _ => {}
        }
        let status = err.raw_response().map(|r| r.status().as_u16());
        let request_id = err.request_id().map(str::to_owned);
        self.answer_error(err.code(), status, err.message(), request_id, || innermost_message(&err))
    }

    /// A request that got no answer: no connection, or no answer in time.
    fn connector_failure(&self, failure: &ConnectorError) -> StoreError {
        let detail = failure.source().map(innermost_message).unwrap_or_else(|| failure.to_string());
        if failure.is_timeout() {
            return StoreError::Timeout(format!("{} ({detail})", self.endpoint_now()));
        }
        // Retrying does not make a certificate trusted: fail now, and say what helps.
        if detail.contains("certificate") {
            let message = format!("TLS with {} failed: {detail} (a private CA: --ca-bundle)", self.endpoint_now());
            return StoreError::Other { message, request_id: None };
        }
        StoreError::Unreachable { endpoint: self.endpoint_now(), detail }
    }

    /// What an answer other than success means, from its S3 error code and HTTP status.
    /// The only place that reads S3 error codes. `describe` says what failed when the
    /// answer has neither.
    fn answer_error(
        &self,
        code: Option<&str>,
        status: Option<u16>,
        message: Option<&str>,
        request_id: Option<String>,
        describe: impl Fn() -> String,
    ) -> StoreError {
        let answer = match (code, status) {
            (Some(code), Some(status)) => format!("{code} (HTTP {status})"),
            (Some(code), None) => code.to_owned(),
            (None, Some(status)) => format!("HTTP {status}"),
            _ => describe(),
        };
        match (code, status) {
            (Some("NoSuchBucket"), _) => StoreError::NoSuchBucket(self.bucket.clone()),
            (Some("NoSuchKey" | "NotFound"), _) | (None, Some(404)) => StoreError::NotFound,
            (Some(code @ ("InvalidAccessKeyId" | "SignatureDoesNotMatch" | "InvalidToken" | "ExpiredToken")), _) => {
                StoreError::BadCredentials(code.to_owned())
            }
            (Some("AccessDenied" | "AllAccessDisabled"), _) | (None, Some(403)) => StoreError::AccessDenied(request_id),
            (Some("PreconditionFailed"), _) | (_, Some(412)) => StoreError::Changed,
            (Some("NoSuchUpload"), _) => StoreError::UploadGone,
            (Some("EntityTooLarge"), _) => StoreError::TooLarge,
            (Some("KeyTooLongError"), _) => StoreError::KeyTooLong,
            // MinIO's answer to a path component over 255 bytes; bucketfs sends no other
            // names it calls invalid (empty, `.` and `..` components are refused before).
            (Some("XMinioInvalidObjectName"), _) => StoreError::KeyTooLong,
            // A server still starting answers 503 too, but asks for no slower pace.
            (Some("InternalError" | "RequestTimeout" | "XMinioServerNotInitialized"), _) => {
                StoreError::Unavailable { message: answer, request_id }
            }
            (Some(code), _) if is_throttling_code(code) => StoreError::Throttled { message: answer, request_id },
            (_, Some(429 | 503)) => StoreError::Throttled { message: answer, request_id },
            (_, Some(500..=599)) => StoreError::Unavailable { message: answer, request_id },
            _ => StoreError::Other {
                message: match (code, message, status) {
                    (Some(code), Some(msg), _) => format!("{code}: {msg}"),
                    (Some(code), None, _) => code.to_owned(),
                    (None, _, Some(status)) => format!("HTTP {status}"),
                    _ => describe(),
                },
                request_id,
            },
        }
    }
}

impl S3Store {
    /// [`S3Store::map_error`] for a request naming `key` (or listing prefix `key`; a copy
    /// names two keys, one per line). MinIO never stores a key with a path component over
    /// 255 bytes, and says so in ways that read as something else: one drive answers 400
    /// (`XMinioInvalidObjectName`, mapped as such; a HEAD has no body, so a bare 400), an
    /// erasure set 503 `SlowDownRead`/`SlowDownWrite` (each drive failed with "file name
    /// too long", so there is no quorum), which was retried as throttling for the whole
    /// retry window and ended in EIO. Either is the name refused. Other stores (AWS S3
    /// takes components up to 1024 bytes) are judged by their answers as they are.
    fn map_key_error<E>(&self, key: &str, err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let refused_name = err.raw_response().is_some_and(|response| {
            let from_minio = response.headers().get("server").is_some_and(|server| server.starts_with("MinIO"));
            refused_long_name(key, response.status().as_u16(), err.code().is_none(), from_minio)
        });
        if refused_name {
            return StoreError::KeyTooLong;
        }
        self.map_error(err)
    }
}

/// Whether an answer with `status` (and no error code, if `no_code`) is MinIO refusing
/// `key` for a path component over 255 bytes (see [`S3Store::map_key_error`]).
fn refused_long_name(key: &str, status: u16, no_code: bool, from_minio: bool) -> bool {
    key.split(['/', '\n']).any(|component| component.len() > 255)
        && match status {
            400 => no_code,
            503 => from_minio,
            _ => false,
        }
}

/// The most of an error answer's body read for its code and message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The error codes of answers asking the client to slow down, whatever their HTTP status
/// (AWS services' throttling codes, and MinIO's `TooManyRequests`).
fn is_throttling_code(code: &str) -> bool {
    matches!(
        code,
        "SlowDown"
            | "SlowDownRead"
            | "SlowDownWrite"
            | "TooManyRequests"
            | "TooManyRequestsException"
            | "ServiceUnavailable"
            | "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "RequestLimitExceeded"
            | "BandwidthLimitExceeded"
            | "ProvisionedThroughputExceededException"
            | "PriorRequestNotComplete"
    )
}

/// What the credential providers said, if a request failed because none of them had
/// credentials (or one was set up wrong): the SDK reports it as a failure to send the
/// request, which would read as an unreachable endpoint and be retried.
fn missing_credentials(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    use aws_credential_types::provider::error::CredentialsError;
    let mut current = Some(err);
    while let Some(error) = current {
        if let Some(credentials) = error.downcast_ref::<CredentialsError>() {
            return match credentials {
                CredentialsError::CredentialsNotLoaded(_) | CredentialsError::InvalidConfiguration(_) => {
                    Some(innermost_message(credentials))
                }
                _ => None, // a provider that timed out or failed may answer later
            };
        }
        current = error.source();
    }
    None
}

fn innermost_message(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

/// Listing keys come back URL-encoded (we ask for `encoding-type=url` so that keys with
/// characters XML cannot carry still list). Servers encode as HTML forms do: a space is
/// `+` and a literal `+` is `%2B`. A key that does not decode to UTF-8 is kept raw rather
/// than dropped, so the caller can warn about it.
fn decode_key(encoded: &str) -> String {
    let spaces = encoded.replace('+', " ");
    percent_decode_str(&spaces).decode_utf8().map(|s| s.into_owned()).unwrap_or_else(|_| encoded.to_owned())
}

/// The metadata headers of a HEAD or GET response (names lower-cased): its user
/// metadata, content type, and the values of [`KEPT_HEADERS`] in that order.
fn stored_metadata(
    user: Option<&std::collections::HashMap<String, String>>,
    content_type: Option<&str>,
    kept: [Option<&str>; KEPT_HEADERS.len()],
) -> Arc<Metadata> {
    Arc::new(Metadata {
        user: user.into_iter().flatten().map(|(name, value)| (name.to_ascii_lowercase(), value.clone())).collect(),
        content_type: content_type.map(str::to_owned),
        headers: KEPT_HEADERS
            .iter()
            .zip(kept)
            .filter_map(|(name, value)| Some(((*name).to_owned(), value?.to_owned())))
            .collect(),
        listed: false,
        tagging: None,
    })
}

/// The values of [`KEPT_HEADERS`], in order, in a HEAD or GET response.
macro_rules! kept_headers_of {
    ($response:expr) => {
        [
            $response.cache_control(),
            $response.content_disposition(),
            $response.content_encoding(),
            $response.content_language(),
            $response.expires_string(),
        ]
    };
}

/// Sets on a PUT, CreateMultipartUpload or CopyObject request the headers of `metadata`
/// that bucketfs keeps ([`KEPT_HEADERS`]) besides user metadata and content type.
macro_rules! with_kept_headers {
    ($request:expr, $metadata:expr) => {
        $request
            .set_cache_control($metadata.header("cache-control"))
            .set_content_disposition($metadata.header("content-disposition"))
            .set_content_encoding($metadata.header("content-encoding"))
            .set_content_language($metadata.header("content-language"))
            .set_expires($metadata.header("expires").as_deref().and_then(http_date))
    };
}

/// An `Expires` value (an HTTP date) as the SDK sends it; `None`, with a warning, for
/// one that is not a date (S3 keeps such a value, but the SDK can only send dates).
fn http_date(value: &str) -> Option<aws_sdk_s3::primitives::DateTime> {
    use aws_sdk_s3::primitives::{DateTime, DateTimeFormat};
    DateTime::from_str(value, DateTimeFormat::HttpDate)
        .inspect_err(|_| tracing::warn!(value, "an Expires header that is not a date is not kept"))
        .ok()
}

fn to_system_time(t: Option<&aws_sdk_s3::primitives::DateTime>) -> SystemTime {
    t.and_then(|t| SystemTime::try_from(*t).ok()).unwrap_or(SystemTime::UNIX_EPOCH)
}

impl S3Store {
    async fn list_once(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        continuation: Option<String>,
        max_keys: Option<i32>,
        with_metadata: bool,
        start_after: Option<&str>,
    ) -> Result<ListPage, StoreError> {
        let (interceptor, answer) = ListingInterceptor::new(&self.server, with_metadata);
        let recursive = delimiter.is_none();
        tracing::debug!(bucket = %self.bucket, prefix, recursive, metadata = interceptor.asks(), "s3 LIST");
        let response = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .set_delimiter(delimiter.map(str::to_owned))
            .encoding_type(EncodingType::Url)
            .set_continuation_token(continuation)
            .set_max_keys(max_keys)
            .set_start_after(start_after.map(str::to_owned))
            .customize()
            .interceptor(interceptor)
            .send()
            .await
            .map_err(|e| self.map_key_error(prefix, e))?;
        let answer = answer.lock().take();
        let stored = match answer.as_deref().map(listing_metadata::parse).transpose() {
            Ok(stored) => stored.unwrap_or_default(),
            Err(error) => {
                tracing::warn!(prefix, %error, "metadata in a listing could not be read: HEAD instead");
                Vec::new()
            }
        };
        // `stored` follows the listing's order, with the objects that had no metadata left out.
        let mut stored = stored.into_iter().peekable();
        let objects = response
            .contents()
            .iter()
            .filter_map(|object| {
                let raw_key = object.key()?;
                let metadata = stored.next_if(|(key, _)| key == raw_key).map(|(_, metadata)| metadata);
                Some(ObjectInfo {
                    key: decode_key(raw_key),
                    size: object.size().unwrap_or(0).max(0) as u64,
                    mtime: to_system_time(object.last_modified()),
                    etag: object.e_tag().map(str::to_owned),
                    metadata,
                })
            })
            .collect();
        let prefixes = response.common_prefixes().iter().filter_map(|p| p.prefix().map(decode_key)).collect();
        let next_token = if response.is_truncated().unwrap_or(false) {
            response.next_continuation_token().map(str::to_owned)
        } else {
            None
        };
        Ok(ListPage { objects, prefixes, next_token })
    }
}

/// One attempt of each call; [`S3Store::retrying`] repeats them.
impl S3Store {
    async fn head_once(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, "s3 HEAD");
        let response = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        Ok(ObjectInfo {
            key: key.to_owned(),
            size: response.content_length().unwrap_or(0).max(0) as u64,
            mtime: to_system_time(response.last_modified()),
            etag: response.e_tag().map(str::to_owned),
            metadata: Some(stored_metadata(response.metadata(), response.content_type(), kept_headers_of!(response))),
        })
    }

    async fn tagging_once(&self, key: &str) -> Result<Option<String>, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, "s3 GET-TAGGING");
        let response = self
            .client
            .get_object_tagging()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        let tags: Vec<String> = response
            .tag_set()
            .iter()
            .map(|tag| {
                let (name, value) = (tag.key(), tag.value());
                format!(
                    "{}={}",
                    utf8_percent_encode(name, NON_ALPHANUMERIC),
                    utf8_percent_encode(value, NON_ALPHANUMERIC)
                )
            })
            .collect();
        Ok((!tags.is_empty()).then(|| tags.join("&")))
    }

    async fn head_with_body_once(&self, key: &str, limit: u64) -> Result<(ObjectInfo, Bytes), StoreError> {
        tracing::debug!(bucket = %self.bucket, key, limit, "s3 GET-SMALL");
        let response = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(format!("bytes=0-{}", limit.max(1) - 1))
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        // "bytes 0-99/12345": the object's size is after the slash.
        let size = response
            .content_range()
            .and_then(|range| range.rsplit_once('/')?.1.parse().ok())
            .unwrap_or(response.content_length().unwrap_or(0).max(0) as u64);
        let info = ObjectInfo {
            key: key.to_owned(),
            size,
            mtime: to_system_time(response.last_modified()),
            etag: response.e_tag().map(str::to_owned),
            metadata: Some(stored_metadata(response.metadata(), response.content_type(), kept_headers_of!(response))),
        };
        let body = response
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Interrupted(format!("reading {key}: {}", innermost_message(&e))))?;
        let body = body.into_bytes();
        crate::metrics::s3_bytes_received(body.len() as u64);
        Ok((info, body))
    }

    /// One attempt at the rest of `body`: from what earlier attempts received on, so
    /// that a link which drops connections after some megabytes still brings the range
    /// closer with every attempt. Later attempts ask for the version the first answer
    /// came from (`If-Match`), so a range is never spliced from two versions. A paced
    /// body that has what its reader allowed pauses the GET: its answer is handed back
    /// unread (see [`Self::take_body`]).
    async fn get_range_once(
        &self,
        key: &str,
        origin: u64,
        body: &dyn BodySink,
        until: u64,
    ) -> Result<Option<ByteStream>, StoreError> {
        let received = body.received();
        if received >= until {
            return Ok(None);
        }
        let if_match = body.etag();
        if if_match.is_none() && received > 0 {
            // No version to pin the rest to (a store without ETags): the bytes already
            // handed to readers could not be told apart from another version's.
            return Err(StoreError::Other {
                message: format!("reading {key}: body cut short and the store sends no ETag to resume it by"),
                request_id: None,
            });
        }
        let (start, end) = (origin + received, origin + until);
        tracing::debug!(bucket = %self.bucket, key, start, len = end - start, "s3 GET");
        let (etag, stream) = match &self.direct {
            Some(direct) => {
                let endpoint = self.endpoints.as_ref().and_then(|pool| pool.chosen());
                let range = start..end;
                let answer = direct.get(endpoint, key, range, if_match.as_deref(), body.version_id()).await;
                let answer = self.direct_answer(key, answer, &[200, 206]).await?;
                (answer.etag, answer.body)
            }
            None => {
                let response = self
                    .client
                    .get_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .range(format!("bytes={}-{}", start, end - 1))
                    .set_if_match(if_match)
                    .set_version_id(body.version_id().map(str::to_owned))
                    .send()
                    .await
                    .map_err(|e| self.map_key_error(key, e))?;
                (response.e_tag, response.body)
            }
        };
        body.pin_etag(etag.as_deref());
        self.take_body(stream, key, origin, body, until).await
    }

    /// Takes a GET's answer into `body` up to `until`: `None` once all of it is there,
    /// or the answer unread past what the paced body allowed so far.
    async fn take_body(
        &self,
        mut stream: ByteStream,
        key: &str,
        origin: u64,
        body: &dyn BodySink,
        until: u64,
    ) -> Result<Option<ByteStream>, StoreError> {
        let (start, end) = (origin + body.received(), origin + until);
        loop {
            if body.received() < until && !body.has_room() {
                return Ok(Some(stream));
            }
            let Some(chunk) = self.next_chunk(&mut stream, key).await? else { break };
            let room = (until - body.received()) as usize;
            if chunk.len() > room {
                body.append(&chunk[..room]);
                return Err(StoreError::Other {
                    message: format!("reading {key} bytes {start}..{end}: the server sent more than the range"),
                    request_id: None,
                });
            }
            crate::metrics::s3_bytes_received(chunk.len() as u64);
            if !body.append(&chunk) {
                return Err(StoreError::Other {
                    message: format!("reading {key} bytes {start}..{end}: the reader took no more"),
                    request_id: None,
                });
            }
        }
        let got = body.received();
        if got != until {
            return Err(StoreError::Interrupted(format!(
                "short read of {key} bytes {start}..{end}: got {} bytes",
                got - (start - origin)
            )));
        }
        Ok(None)
    }

    /// The next bytes of a body; a body that receives nothing for `body_stall` is cut
    /// (and resumed by a retry).
    async fn next_chunk(&self, stream: &mut ByteStream, key: &str) -> Result<Option<Bytes>, StoreError> {
        match tokio::time::timeout(self.body_stall, stream.try_next()).await {
            Ok(chunk) => {
                chunk.map_err(|e| StoreError::Interrupted(format!("reading {key}: {}", innermost_message(&e))))
            }
            Err(_) => Err(StoreError::Interrupted(format!("reading {key}: no bytes for {:?}", self.body_stall))),
        }
    }

    /// What a request sent by [`Direct`] (to the endpoint this attempt was given) came to:
    /// the answer if its status is one of `success`, else the failure as the SDK's would be
    /// mapped.
    async fn direct_answer(
        &self,
        key: &str,
        answer: Result<direct::Answer, direct::Failure>,
        success: &[u16],
    ) -> Result<direct::Answer, StoreError> {
        use aws_credential_types::provider::error::CredentialsError;
        let answer = answer.map_err(|failure| match failure {
            direct::Failure::Connector(error) => self.connector_failure(&error),
            direct::Failure::Credentials(
                error @ (CredentialsError::CredentialsNotLoaded(_) | CredentialsError::InvalidConfiguration(_)),
            ) => StoreError::NoCredentials(innermost_message(&error)),
            // A provider that timed out or failed may answer later.
            direct::Failure::Credentials(error) => StoreError::Unavailable {
                message: format!("getting credentials: {}", innermost_message(&error)),
                request_id: None,
            },
            direct::Failure::Request(message) => StoreError::Other { message, request_id: None },
        })?;
        if success.contains(&answer.status) {
            return Ok(answer);
        }
        let status = answer.status;
        let mut stream = answer.body;
        let mut body = Vec::new();
        while body.len() < ERROR_BODY_LIMIT {
            match self.next_chunk(&mut stream, key).await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                _ => break,
            }
        }
        let error = direct::ErrorBody::parse(&body);
        if refused_long_name(key, status, error.code.is_none(), answer.from_minio) {
            return Err(StoreError::KeyTooLong);
        }
        let request_id = error.request_id.or(answer.request_id);
        let describe = || format!("HTTP {status}");
        Err(self.answer_error(error.code.as_deref(), Some(status), error.message.as_deref(), request_id, describe))
    }

    async fn put_once(
        &self,
        key: &str,
        data: Bytes,
        metadata: &Metadata,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, len = data.len(), ?condition, "s3 PUT");
        crate::metrics::s3_bytes_sent(data.len() as u64);
        let small = data.len() <= SIGNED_PUT_LIMIT;
        if let (true, Some(direct)) = (small, &self.direct) {
            let endpoint = self.endpoints.as_ref().and_then(|pool| pool.chosen());
            let answer = direct.put(endpoint, key, data, put_headers(metadata, condition)).await;
            let answer = self.direct_answer(key, answer, &[200]).await.map_err(|e| refused(e, condition))?;
            return Ok(answer.etag);
        }
        let request = with_kept_headers!(self.client.put_object(), metadata)
            .bucket(&self.bucket)
            .key(key)
            .set_metadata(user_metadata(metadata))
            .set_content_type(metadata.content_type.clone())
            .body(ByteStream::from(data))
            .set_if_none_match(if_none_match(condition))
            .set_if_match(if_match(condition));
        let request = if small || self.checksums == UploadChecksums::Off {
            request.customize().config_override(
                aws_sdk_s3::config::Builder::default()
                    .request_checksum_calculation(RequestChecksumCalculation::WhenRequired),
            )
        } else {
            request.set_checksum_algorithm(self.checksums.algorithm()).customize().disable_payload_signing()
        };
        let response = request.send().await.map_err(|e| refused(self.map_key_error(key, e), condition))?;
        Ok(response.e_tag().map(str::to_owned))
    }

    async fn start_upload_once(&self, key: &str, metadata: &Metadata) -> Result<String, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, "s3 CREATE-MULTIPART");
        let response = with_kept_headers!(self.client.create_multipart_upload(), metadata)
            .bucket(&self.bucket)
            .key(key)
            .set_tagging(metadata.tagging.clone())
            .set_metadata(user_metadata(metadata))
            .set_content_type(metadata.content_type.clone())
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        response
            .upload_id()
            .map(str::to_owned)
            .ok_or_else(|| StoreError::Other { message: format!("no upload id for {key}"), request_id: None })
    }

    async fn upload_part_once(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        data: Bytes,
    ) -> Result<String, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, number, len = data.len(), "s3 UPLOAD-PART");
        crate::metrics::s3_bytes_sent(data.len() as u64);
        let response = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(data))
            .set_checksum_algorithm(self.checksums.algorithm());
        // Off: a signed body (no aws-chunked trailer), as for small PUTs.
        let response = if self.checksums == UploadChecksums::Off {
            response.customize()
        } else {
            response.customize().disable_payload_signing()
        };
        let response = response.send().await.map_err(|e| self.map_key_error(key, e))?;
        response.e_tag().map(str::to_owned).ok_or_else(|| StoreError::Other {
            message: format!("no ETag for part {number} of {key}"),
            request_id: None,
        })
    }

    async fn copy_once(
        &self,
        what: &'static str,
        source: &str,
        key: &str,
        if_match: Option<&str>,
        metadata: &Metadata,
    ) -> Result<Option<String>, StoreError> {
        tracing::debug!(bucket = %self.bucket, source, key, "s3 {what}");
        let response = with_kept_headers!(self.client.copy_object(), metadata)
            .bucket(&self.bucket)
            .key(key)
            .copy_source(self.copy_source(source))
            .set_copy_source_if_match(if_match.map(str::to_owned))
            .metadata_directive(MetadataDirective::Replace)
            .set_metadata(user_metadata(metadata))
            .set_content_type(metadata.content_type.clone())
            .send()
            .await
            .map_err(|e| self.map_key_error(&format!("{source}\n{key}"), e))?;
        Ok(response.copy_object_result().and_then(|r| r.e_tag()).map(str::to_owned))
    }

    async fn upload_part_copy_once(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        source: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<String, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, number, source, start = range.start, len = range.end - range.start, "s3 UPLOAD-PART-COPY");
        let response = self
            .client
            .upload_part_copy()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .copy_source(self.copy_source(source))
            .copy_source_range(format!("bytes={}-{}", range.start, range.end - 1))
            .set_copy_source_if_match(if_match.map(str::to_owned))
            .send()
            .await
            .map_err(|e| self.map_key_error(&format!("{source}\n{key}"), e))?;
        response.copy_part_result().and_then(|r| r.e_tag()).map(str::to_owned).ok_or_else(|| StoreError::Other {
            message: format!("no ETag for copied part {number} of {key}"),
            request_id: None,
        })
    }

    async fn finish_upload_once(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, String)>,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, parts = parts.len(), ?condition, "s3 COMPLETE-MULTIPART");
        let parts = parts
            .into_iter()
            .map(|(number, etag)| CompletedPart::builder().part_number(number).e_tag(etag).build())
            .collect();
        let response = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .set_if_none_match(if_none_match(condition))
            .set_if_match(if_match(condition))
            .send()
            .await
            .map_err(|e| refused(self.map_key_error(key, e), condition))?;
        Ok(response.e_tag().map(str::to_owned))
    }

    async fn abort_upload_once(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        tracing::debug!(bucket = %self.bucket, key, "s3 ABORT-MULTIPART");
        self.client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        Ok(())
    }

    /// The outcome of a write that took `attempts`: a refusal that may come of an earlier
    /// attempt the store carried out without its answer reaching us (the retry found the
    /// key taken, its `If-Match` stale, or its upload completed) is that write's success
    /// where the object at `key` has the ETag the write gives (`ours`, unquoted). Another
    /// client's object, or an ETag that is no MD5 (SSE-C, SSE-KMS; `ours` is `None` where
    /// it cannot be known), leaves the refusal as it is.
    async fn unless_stored_by_a_lost_attempt(
        &self,
        key: &str,
        result: Result<Option<String>, StoreError>,
        attempts: u32,
        ours: impl FnOnce() -> Option<String>,
    ) -> Result<Option<String>, StoreError> {
        let error = match result {
            Err(error) if attempts > 1 && may_be_our_own_doing(&error) => error,
            other => return other,
        };
        let Some(ours) = ours() else { return Err(error) };
        match self.head(key).await {
            Ok(found) if found.etag.as_deref().map(etag::unquoted) == Some(ours.as_str()) => {
                tracing::info!(bucket = %self.bucket, key, "the answer to a write of {key} was lost; the retry found the object that write stored");
                Ok(found.etag)
            }
            _ => Err(error),
        }
    }

    /// [`Self::retrying`], and how many attempts it sent.
    async fn retrying_counted<T, F, Fut>(
        &self,
        what: &'static str,
        key: &str,
        attempt: F,
    ) -> (Result<T, StoreError>, u32)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let attempts = AtomicU32::new(0);
        let counted = || {
            attempts.fetch_add(1, Relaxed);
            attempt()
        };
        let result = self.retrying(what, key, counted).await;
        (result, attempts.into_inner())
    }

    /// After a start of `key`'s upload that took more than one attempt: aborts the uploads
    /// an attempt whose answer was lost may have started (the store started one, the
    /// connection broke before its upload id came back, and the next attempt started
    /// another). They are the other uploads of `key` started within `took` before `ours`,
    /// by the store's clock (with a second's margin for its precision). Another writer of
    /// the same key starting an upload in that window would lose it (and be told so at its
    /// complete); a stray left behind would cost storage until a lifecycle rule, forever
    /// on most stores. Best effort: a failure here is logged, the upload goes on.
    async fn abort_strays(&self, key: &str, ours: &str, took: Duration) {
        let of_key = match self.open_uploads_of_once(key).await {
            Ok(uploads) => uploads,
            Err(error) => {
                tracing::warn!(bucket = %self.bucket, key, "cannot list the uploads of {key} to abort those of attempts whose answer was lost: {error}");
                return;
            }
        };
        let Some(ours_at) = of_key.iter().find(|upload| upload.id == ours).and_then(|upload| upload.initiated) else {
            tracing::debug!(bucket = %self.bucket, key, "the upload just started is not listed yet: no stray looked for");
            return;
        };
        let since = ours_at - took - Duration::from_secs(1);
        for upload in of_key {
            let Some(at) = upload.initiated else { continue };
            if upload.id == ours || at < since || at > ours_at {
                continue;
            }
            tracing::info!(bucket = %self.bucket, key, "aborting an upload of {key} started by an attempt whose answer was lost");
            if let Err(error) = self.abort_upload(key, &upload.id).await {
                tracing::warn!(bucket = %self.bucket, key, "cannot abort a stray upload of {key}: {error}");
            }
        }
    }

    async fn open_uploads_of_once(&self, key: &str) -> Result<Vec<OpenUpload>, StoreError> {
        tracing::debug!(bucket = %self.bucket, key, "s3 LIST-MULTIPART");
        let listed = self
            .client
            .list_multipart_uploads()
            .bucket(&self.bucket)
            .prefix(key)
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        let of_key = listed.uploads.unwrap_or_default().into_iter().filter(|upload| upload.key() == Some(key));
        Ok(of_key
            .filter_map(|upload| {
                let initiated = upload.initiated().and_then(|at| SystemTime::try_from(*at).ok());
                Some(OpenUpload { id: upload.upload_id?, initiated })
            })
            .collect())
    }

    /// One `DeleteObjects` request, quiet (the answer names only the keys refused).
    async fn delete_many_once(&self, keys: &[String]) -> Result<Vec<(String, StoreError)>, StoreError> {
        if tracing::enabled!(tracing::Level::DEBUG) {
            for key in keys {
                tracing::debug!(bucket = %self.bucket, key, keys_in_request = keys.len(), "s3 DELETE-OBJECTS");
            }
        }
        let objects = keys
            .iter()
            .map(|key| ObjectIdentifier::builder().key(key).build())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| StoreError::Other { message: error.to_string(), request_id: None })?;
        let delete = Delete::builder()
            .set_objects(Some(objects))
            .quiet(true)
            .build()
            .map_err(|error| StoreError::Other { message: error.to_string(), request_id: None })?;
        let answer = self
            .client
            .delete_objects()
            .bucket(&self.bucket)
            .delete(delete)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        Ok(answer
            .errors()
            .iter()
            .filter_map(|refused| {
                let key = refused.key()?.to_owned();
                let code = refused.code().unwrap_or_default();
                let answer = format!("{code}: {}", refused.message().unwrap_or_default());
                let error = match code {
                    "AccessDenied" | "AllAccessDisabled" => StoreError::AccessDenied(None),
                    "InternalError" => StoreError::Unavailable { message: answer, request_id: None },
                    code if is_throttling_code(code) => StoreError::Throttled { message: answer, request_id: None },
                    _ => StoreError::Other { message: answer, request_id: None },
                };
                Some((key, error))
            })
            .collect())
    }

    async fn delete_once(&self, key: &str, if_match: Option<&str>) -> Result<(), StoreError> {
        tracing::debug!(bucket = %self.bucket, key, if_match, "s3 DELETE");
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .set_if_match(if_match.map(str::to_owned))
            .send()
            .await
            .map_err(|e| self.map_key_error(key, e))?;
        Ok(())
    }
}

impl S3Store {
    /// Runs `attempt` (one request) until it succeeds, fails for good, or transient
    /// failures ([`StoreError::is_transient`]) have gone on for the retry window: the time
    /// since the first attempt was sent, less the time later attempts waited for room in
    /// the request window (queueing behind other requests is no failure of the store,
    /// and under throttling the window is narrow). Each attempt takes a place
    /// in the window of its own, so a call waiting out an outage holds none; a throttled
    /// answer narrows the window, a success widens it. Calls that are not idempotent are
    /// safe to repeat here: a conditional PUT or complete repeated after a lost answer
    /// fails its precondition rather than write twice, and the write then tells its own
    /// object from another client's (`unless_stored_by_a_lost_attempt`; see SEMANTICS,
    /// "Limits and timeouts").
    async fn retrying<T, F, Fut>(&self, what: &'static str, key: &str, attempt: F) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut first_sent: Option<Instant> = None;
        let mut queued = Duration::ZERO;
        let mut backoff = FIRST_BACKOFF;
        let mut failures = 0u32;
        // Throttling is said once per episode (`request_window`), not once per request.
        let mut only_throttled = true;
        loop {
            let result = {
                let waiting = Instant::now();
                let permit = self.window.acquire().await;
                let began = Instant::now();
                if first_sent.is_some() {
                    queued += began - waiting;
                }
                first_sent.get_or_insert(began);
                let result = match &self.endpoints {
                    Some(pool) => {
                        let url = pool.pick();
                        let result = pool.scope(url, attempt()).await;
                        match &result {
                            Err(error) if error.is_connection_failure() => {
                                if pool.failed(url, error) {
                                    self.start_probing(pool, url);
                                }
                            }
                            _ => pool.answered(url, began),
                        }
                        result
                    }
                    None => attempt().await,
                };
                let outcome = result.as_ref().map_or_else(StoreError::kind, |_| "ok");
                crate::metrics::s3_request(what, outcome, began.elapsed());
                match &result {
                    Err(StoreError::Throttled { message, .. }) => permit.throttled(message),
                    // Any answer but a failure of the store is a request it could take.
                    Err(error) if error.is_transient() => drop(permit),
                    _ => permit.succeeded(),
                }
                result
            };
            let error = match result {
                Err(error) if error.is_transient() => error,
                done => {
                    if let (true, Some(first_sent)) = (failures > 0, first_sent) {
                        let waited = first_sent.elapsed();
                        if only_throttled {
                            tracing::debug!(bucket = %self.bucket, key, "s3 {what} answered after {failures} throttled attempts ({waited:?})");
                        } else {
                            tracing::info!(bucket = %self.bucket, key, "s3 {what} answered after {failures} failed attempts ({waited:?})");
                        }
                    }
                    return done;
                }
            };
            failures += 1;
            only_throttled &= matches!(error, StoreError::Throttled { .. });
            let failing_for = first_sent.map_or(Duration::ZERO, |sent| sent.elapsed().saturating_sub(queued));
            // Equal jitter: half the backoff fixed, half random, so the clients one outage
            // stopped do not all come back at the same instant.
            let pause = backoff / 2 + backoff.mul_f64(rand::random::<f64>() / 2.0);
            // The window is used whole: a pause that would end past it is cut short to
            // one last attempt at its end (giving up when the next pause would not fit
            // failed a 2 s window after 0.95 s, and a 10 s one after about 6 s).
            let Some(left) = self.retry_window.checked_sub(failing_for).filter(|left| !left.is_zero()) else {
                // The operation that gets this error logs it (at warn, with the answer).
                tracing::info!(bucket = %self.bucket, key, "s3 {what} failed after {failures} attempts: {error}");
                return Err(error);
            };
            let pause = pause.min(left);
            tracing::debug!(bucket = %self.bucket, key, "s3 {what} failed ({error}); retrying in {pause:?}");
            crate::metrics::s3_retry(what);
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    fn location(&self) -> String {
        format!("{}/{}", self.endpoint, self.bucket)
    }

    fn request_window(&self) -> Option<WindowReport> {
        Some(self.window.report())
    }

    fn endpoints(&self) -> Vec<EndpointReport> {
        self.endpoints.as_ref().map(|pool| pool.report()).unwrap_or_default()
    }

    async fn list(
        &self,
        prefix: &str,
        continuation: Option<String>,
        max_keys: Option<i32>,
        with_metadata: bool,
    ) -> Result<ListPage, StoreError> {
        let mut continuation = continuation;
        loop {
            let page = self
                .retrying("LIST", prefix, || {
                    self.list_once(prefix, Some("/"), continuation.clone(), max_keys, with_metadata, None)
                })
                .await?;
            // A page with nothing in it that is not the last says nothing about what is
            // there (a loaded store may cut a listing short): callers asking "is anything
            // below this prefix?" with one page must not read it as "no".
            if page.objects.is_empty() && page.prefixes.is_empty() && page.next_token.is_some() {
                tracing::debug!(prefix, "empty LIST page that is not the last: asking for the next");
                continuation = page.next_token;
                continue;
            }
            return Ok(page);
        }
    }

    async fn list_recursive(
        &self,
        prefix: &str,
        continuation: Option<String>,
        with_metadata: bool,
    ) -> Result<ListPage, StoreError> {
        self.retrying("LIST", prefix, || self.list_once(prefix, None, continuation.clone(), None, with_metadata, None))
            .await
    }

    async fn list_metadata_after(
        &self,
        prefix: &str,
        start_after: Option<&str>,
    ) -> Result<Option<ListPage>, StoreError> {
        if !self.server.lists_metadata() {
            return Ok(None);
        }
        let page =
            self.retrying("LIST", prefix, || self.list_once(prefix, Some("/"), None, None, true, start_after)).await?;
        Ok(Some(page))
    }

    async fn head(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        self.retrying("HEAD", key, || self.head_once(key)).await
    }

    async fn tagging(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.retrying("GET-TAGGING", key, || self.tagging_once(key)).await
    }

    async fn head_with_body(&self, key: &str, limit: u64) -> Result<(ObjectInfo, Bytes), StoreError> {
        self.retrying("GET", key, || self.head_with_body_once(key, limit)).await
    }

    /// A paced body's GET pauses when the body has what its reader allowed: its
    /// connection stays open (TCP holds the store back) while the reader catches up
    /// within [`PAUSE_KEEPS_ANSWER`], out of the request window (a paused GET sends
    /// nothing), then is let go, and the next bytes come from a new GET when the reader
    /// wants them. A continued answer that breaks is resumed by a new GET. An abandoned
    /// body ends the GET where it is, short of `until`.
    async fn get_range_into(&self, key: &str, origin: u64, body: &dyn BodySink, until: u64) -> Result<(), StoreError> {
        loop {
            body.room().await;
            if !body.has_room() {
                return Ok(()); // abandoned: the caller finds the rest missing
            }
            let mut paused = self.retrying("GET", key, || self.get_range_once(key, origin, body, until)).await?;
            while let Some(stream) = paused.take() {
                if tokio::time::timeout(PAUSE_KEEPS_ANSWER, body.room()).await.is_err() {
                    tracing::debug!(bucket = %self.bucket, key, "paced GET let go: its reader went quiet");
                    break; // the connection is closed
                }
                if !body.has_room() {
                    return Ok(()); // abandoned
                }
                match self.take_body(stream, key, origin, body, until).await {
                    Ok(still_paused) => paused = still_paused,
                    Err(error) if error.is_transient() => {
                        tracing::debug!(bucket = %self.bucket, key, "paced GET resumed by a new one: {error}");
                        break;
                    }
                    Err(error) => return Err(error),
                }
            }
            if body.received() >= until {
                return Ok(());
            }
        }
    }

    async fn put(
        &self,
        key: &str,
        data: Bytes,
        metadata: &Metadata,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        let (result, attempts) =
            self.retrying_counted("PUT", key, || self.put_once(key, data.clone(), metadata, condition)).await;
        let etag = self.unless_stored_by_a_lost_attempt(key, result, attempts, || Some(etag::of_put(&data))).await?;
        self.learn_marker_metadata(key, metadata).await;
        Ok(etag)
    }

    async fn start_upload(&self, key: &str, metadata: &Metadata) -> Result<String, StoreError> {
        let began = Instant::now();
        let (result, attempts) =
            self.retrying_counted("CREATE-MULTIPART", key, || self.start_upload_once(key, metadata)).await;
        let upload_id = result?;
        if attempts > 1 {
            self.abort_strays(key, &upload_id, began.elapsed()).await;
        }
        Ok(upload_id)
    }

    async fn upload_part(&self, key: &str, upload_id: &str, number: i32, data: Bytes) -> Result<String, StoreError> {
        self.retrying("UPLOAD-PART", key, || self.upload_part_once(key, upload_id, number, data.clone())).await
    }

    async fn copy(
        &self,
        source: &str,
        key: &str,
        if_match: Option<&str>,
        metadata: &Metadata,
    ) -> Result<Option<String>, StoreError> {
        let learning = self.check_copy_source(source, if_match).await?;
        let etag = self.retrying("COPY", key, || self.copy_once("COPY", source, key, if_match, metadata)).await?;
        if learning {
            self.learn_copy_conditions(key, metadata).await;
        }
        Ok(etag)
    }

    async fn upload_part_copy(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        source: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<String, StoreError> {
        self.check_copy_source(source, if_match).await?;
        let attempt = || self.upload_part_copy_once(key, upload_id, number, source, range.clone(), if_match);
        self.retrying("UPLOAD-PART-COPY", key, attempt).await
    }

    async fn finish_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, String)>,
        condition: &WriteCondition,
    ) -> Result<Option<String>, StoreError> {
        let attempt = || self.finish_upload_once(key, upload_id, parts.clone(), condition);
        let (result, attempts) = self.retrying_counted("COMPLETE-MULTIPART", key, attempt).await;
        self.unless_stored_by_a_lost_attempt(key, result, attempts, || etag::of_multipart(&parts)).await
    }

    async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        match self.retrying("ABORT-MULTIPART", key, || self.abort_upload_once(key, upload_id)).await {
            // Gone already: what an abort is for (also when an earlier attempt's answer was
            // lost). A deleted bucket took its uploads with it.
            Err(StoreError::UploadGone | StoreError::NoSuchBucket(_)) => Ok(()),
            other => other,
        }
    }

    async fn open_uploads_of(&self, key: &str) -> Result<Vec<OpenUpload>, StoreError> {
        self.retrying("LIST-MULTIPART", key, || self.open_uploads_of_once(key)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.retrying("DELETE", key, || self.delete_once(key, None)).await
    }

    async fn delete_if_match(&self, key: &str, etag: &str) -> Result<(), StoreError> {
        match self.retrying("DELETE", key, || self.delete_once(key, Some(etag))).await {
            Err(StoreError::NotFound) => Ok(()),
            other => other,
        }
    }

    async fn delete_many(&self, keys: &[String]) -> Result<Vec<(String, StoreError)>, StoreError> {
        let Some(first) = keys.first() else { return Ok(Vec::new()) };
        self.retrying("DELETE-OBJECTS", first, || self.delete_many_once(keys)).await
    }

    async fn list_versions(&self, prefix: &str, exact: bool) -> Result<Vec<VersionInfo>, StoreError> {
        let mut versions = Vec::new();
        let mut markers = None;
        loop {
            let attempt = || async {
                let mut page = Vec::new();
                let next = self.list_versions_once(prefix, &markers, &mut page).await?;
                Ok((page, next))
            };
            let (page, next) = self.retrying("LIST-VERSIONS", prefix, attempt).await?;
            // Keys come in order, `prefix` first among those it begins: once another
            // shows, every version of `prefix` itself has been seen.
            let past_key = exact && page.iter().any(|v| v.key != prefix);
            versions.extend(page.into_iter().filter(|v| !exact || v.key == prefix));
            if versions.len() >= MAX_VERSIONS_LISTED {
                tracing::warn!(prefix, "more than {MAX_VERSIONS_LISTED} versions: listing the first only");
                versions.truncate(MAX_VERSIONS_LISTED);
                break;
            }
            match next {
                Some(next) if !past_key => markers = Some(next),
                _ => break,
            }
        }
        Ok(versions)
    }

    async fn restore_latest_version(&self, key: &str) -> Result<ObjectInfo, StoreError> {
        let versions = self.list_versions(key, true).await?;
        let version = version_to_restore(&versions)?.version_id.clone();
        self.retrying("COPY", key, || self.copy_version_once(key, &version)).await?;
        self.head(key).await
    }
}

/// An ETag no object has: the condition of the copy that tells whether a store honours
/// copy conditions.
const NO_SUCH_ETAG: &str = "\"bucketfs-probe-matches-no-object\"";

/// What the store does with the condition on a copy and the metadata of a directory
/// marker, learnt from the first request that needs it (`server_kind`; docs/STORES.md).
impl S3Store {
    /// Before a copy pinned to version `if_match` of `source`, on a store not known to
    /// honour `x-amz-copy-source-if-match` (moto copies whatever is there): a HEAD checks
    /// that `source` is still that version, else `Changed`, as a store that honours it
    /// answers, with nothing written. A change between the HEAD and the copy is not caught
    /// there: the weaker rule such a store gets. Returns whether the copy is to tell what
    /// the store does ([`S3Store::learn_copy_conditions`]).
    async fn check_copy_source(&self, source: &str, if_match: Option<&str>) -> Result<bool, StoreError> {
        let Some(if_match) = if_match else { return Ok(false) };
        let support = self.server.copy_conditions();
        if support == Support::Works {
            return Ok(false);
        }
        if self.head(source).await?.etag.as_deref() != Some(if_match) {
            return Err(StoreError::Changed);
        }
        Ok(support == Support::Unknown)
    }

    /// Whether the store honours copy conditions, learnt from `key`, which a copy just
    /// wrote with `metadata`: the same copy of `key` onto itself, on the condition of an
    /// ETag no object has, is refused (412) by a store that honours it, and only rewrites
    /// `key` as it is by one that does not. Said once in the log when not honoured.
    async fn learn_copy_conditions(&self, key: &str, metadata: &Metadata) {
        let probe = || self.copy_once("COPY-PROBE", key, key, Some(NO_SUCH_ETAG), metadata);
        match self.retrying("COPY-PROBE", key, probe).await {
            Err(StoreError::Changed) => {
                self.server.learnt_copy_conditions(true);
            }
            Ok(_) => {
                if !self.server.learnt_copy_conditions(false) {
                    return;
                }
                tracing::warn!(
                    store = %self.location(),
                    "the store ignores copy conditions (x-amz-copy-source-if-match): the version of each \
                     copy's source is checked with a HEAD just before the copy (rename, chmod, copy_file_range), \
                     so a change another client makes in between is not caught"
                );
            }
            Err(error) => tracing::debug!(key, "could not tell whether the store honours copy conditions: {error}"),
        }
    }

    /// After a PUT of `key` with `metadata`: if it is a directory marker carrying user
    /// metadata and the store is not known to keep that, a HEAD tells whether it did
    /// (SeaweedFS answers the PUT 200 and keeps none). Said once in the log when not.
    async fn learn_marker_metadata(&self, key: &str, metadata: &Metadata) {
        if !key.ends_with('/') || metadata.user.is_empty() || self.server.marker_metadata() != Support::Unknown {
            return;
        }
        let stored = match self.head(key).await {
            Ok(stored) => stored.metadata,
            Err(error) => {
                tracing::debug!(key, "could not tell whether the store keeps directories' metadata: {error}");
                return;
            }
        };
        let kept = stored.is_some_and(|stored| metadata.user.keys().all(|name| stored.user.contains_key(name)));
        if self.server.learnt_marker_metadata(kept) {
            tracing::warn!(
                store = %self.location(),
                "the store drops the metadata of directory markers: a directory's mode, owner, times and \
                 xattrs set through this mount show until --metadata-ttl passes, then the defaults \
                 (--dir-mode, --uid, --gid, the time of mounting); files keep theirs"
            );
        }
    }
}

/// Characters kept as they are in an `x-amz-copy-source` key: RFC 3986's unreserved ones
/// and the `/` between key segments.
const COPY_SOURCE_KEEP: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');

impl S3Store {
    /// One page of `ListObjectVersions(prefix, delimiter "/")`, appended to `into`:
    /// returns the markers of the next page, `None` after the last.
    async fn list_versions_once(
        &self,
        prefix: &str,
        markers: &Option<(Option<String>, Option<String>)>,
        into: &mut Vec<VersionInfo>,
    ) -> Result<Option<(Option<String>, Option<String>)>, StoreError> {
        tracing::debug!(bucket = %self.bucket, prefix, "s3 LIST-VERSIONS");
        let (key_marker, version_marker) = markers.clone().unwrap_or_default();
        let page = self
            .client
            .list_object_versions()
            .bucket(&self.bucket)
            .prefix(prefix)
            .delimiter("/")
            .encoding_type(EncodingType::Url)
            .set_key_marker(key_marker)
            .set_version_id_marker(version_marker)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        let versions = page.versions().iter().filter_map(|v| {
            let etag = v.e_tag().map(str::to_owned);
            let size = v.size().unwrap_or(0).max(0) as u64;
            Some((v.key()?, v.version_id()?, v.last_modified(), v.is_latest(), size, etag, false))
        });
        let markers = page
            .delete_markers()
            .iter()
            .filter_map(|m| Some((m.key()?, m.version_id()?, m.last_modified(), m.is_latest(), 0, None, true)));
        let first = into.len();
        for (key, version_id, modified, is_latest, size, etag, deleted) in versions.chain(markers) {
            into.push(VersionInfo {
                key: decode_key(key),
                version_id: version_id.to_owned(),
                mtime: to_system_time(modified),
                size,
                etag,
                is_latest: is_latest == Some(true),
                deleted,
            });
        }
        // A page lists versions and delete markers apart: back in key order, newest first.
        into[first..].sort_by(|a, b| a.key.cmp(&b.key).then(b.mtime.cmp(&a.mtime)));
        if page.is_truncated() != Some(true) {
            return Ok(None);
        }
        // With `encoding-type=url` the next key marker comes encoded too.
        Ok(Some((page.next_key_marker().map(decode_key), page.next_version_id_marker().map(str::to_owned))))
    }

    /// Copies version `version` of `key` onto `key`, with its metadata: it becomes current.
    async fn copy_version_once(&self, key: &str, version: &str) -> Result<(), StoreError> {
        tracing::debug!(bucket = %self.bucket, key, version, "s3 COPY (restore a version)");
        let source = format!("{}?versionId={}", self.copy_source(key), utf8_percent_encode(version, COPY_SOURCE_KEEP));
        self.client
            .copy_object()
            .bucket(&self.bucket)
            .key(key)
            .copy_source(source)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        Ok(())
    }

    /// `bucket/key`, URL-encoded, as `x-amz-copy-source` wants it.
    fn copy_source(&self, key: &str) -> String {
        format!("{}/{}", self.bucket, utf8_percent_encode(key, COPY_SOURCE_KEEP))
    }
}

/// The headers of a PUT of an object with `metadata` on `condition`, as the SDK's
/// PutObject would send them with [`with_kept_headers`], `user_metadata`, the content type
/// and the conditions.
fn put_headers(metadata: &Metadata, condition: &WriteCondition) -> Vec<(String, String)> {
    let mut headers: Vec<(String, String)> =
        metadata.user.iter().map(|(name, value)| (format!("x-amz-meta-{name}"), value.clone())).collect();
    // The SDK's default for a body without a type: a store would pick its own otherwise
    // (MinIO's is `binary/octet-stream`).
    let content_type = metadata.content_type.as_deref().unwrap_or("application/octet-stream");
    headers.push(("content-type".to_owned(), content_type.to_owned()));
    for name in KEPT_HEADERS {
        let Some(value) = metadata.header(name) else { continue };
        // An Expires that is no date is dropped, as the SDK's request does.
        if name == "expires" && http_date(&value).is_none() {
            continue;
        }
        headers.push((name.to_owned(), value));
    }
    headers.extend(if_none_match(condition).map(|value| ("if-none-match".to_owned(), value)));
    headers.extend(if_match(condition).map(|value| ("if-match".to_owned(), value)));
    headers
}

fn user_metadata(metadata: &Metadata) -> Option<std::collections::HashMap<String, String>> {
    (!metadata.user.is_empty()).then(|| metadata.user.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// The `If-None-Match` header of a write on `condition`.
fn if_none_match(condition: &WriteCondition) -> Option<String> {
    (*condition == WriteCondition::Absent).then(|| "*".to_owned())
}

/// The `If-Match` header of a write on `condition`.
fn if_match(condition: &WriteCondition) -> Option<String> {
    match condition {
        WriteCondition::Replaces(etag) => Some(etag.clone()),
        _ => None,
    }
}

/// Whether a retried write's `error` may come of an earlier attempt that the store carried
/// out without its answer reaching us.
fn may_be_our_own_doing(error: &StoreError) -> bool {
    matches!(error, StoreError::AlreadyExists | StoreError::Changed | StoreError::UploadGone)
}

/// For a create-only write, the failed precondition means someone else created the key.
fn refused(error: StoreError, condition: &WriteCondition) -> StoreError {
    match error {
        StoreError::Changed if *condition == WriteCondition::Absent => StoreError::AlreadyExists,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_key, put_headers, Metadata, WriteCondition};

    /// A direct PUT carries what the SDK's PutObject did: user metadata as
    /// `x-amz-meta-*`, the content type (the SDK's default without one), the kept headers
    /// (an `Expires` only if it is a date) and the write's condition.
    #[test]
    fn direct_puts_carry_metadata_headers_and_conditions() {
        let untyped = put_headers(&Metadata::default(), &WriteCondition::Any);
        assert_eq!(untyped, [("content-type".to_owned(), "application/octet-stream".to_owned())]);
        let mut metadata = Metadata { content_type: Some("text/plain".into()), ..Metadata::default() };
        metadata.user.insert("mode".into(), "33188".into());
        metadata.headers.insert("cache-control".into(), "no-cache".into());
        metadata.headers.insert("expires".into(), "soon".into());
        let pairs = |headers: Vec<(String, String)>| {
            let mut pairs: Vec<String> = headers.into_iter().map(|(name, value)| format!("{name}: {value}")).collect();
            pairs.sort();
            pairs
        };
        assert_eq!(
            pairs(put_headers(&metadata, &WriteCondition::Absent)),
            ["cache-control: no-cache", "content-type: text/plain", "if-none-match: *", "x-amz-meta-mode: 33188"]
        );
        let date = "Wed, 21 Oct 2015 07:28:00 GMT";
        metadata.headers.insert("expires".into(), date.into());
        let replaces = WriteCondition::Replaces("\"e1\"".into());
        assert_eq!(
            pairs(put_headers(&metadata, &replaces)),
            [
                "cache-control: no-cache".to_owned(),
                "content-type: text/plain".to_owned(),
                format!("expires: {date}"),
                "if-match: \"e1\"".to_owned(),
                "x-amz-meta-mode: 33188".to_owned(),
            ]
        );
    }

    #[test]
    fn listing_keys_decode_like_forms() {
        assert_eq!(decode_key("sp+ace%2Bplus%25"), "sp ace+plus%");
        assert_eq!(decode_key("%C3%A9%E6%97%A5"), "é日");
    }
}
