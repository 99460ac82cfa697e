//! The requests of the hot paths, sent without the SDK's request pipeline: the reads'
//! ranged GETs and the small PUTs (most of an untar).
//!
//! Through `aws-sdk-s3` a request costs far more CPU and latency than the HTTP exchange
//! itself: endpoint rules, a config bag, interceptors, serializers and deserializers run
//! for every one (a 1-byte GET to a local MinIO took about twice curl's time, and the
//! SDK's PutObject was a quarter of the daemon's CPU in an untar). So this module sends
//! them directly: to the base URL the SDK's endpoint rules give the bucket, resolved once
//! at start ([`route`]), signed with `aws-sigv4`, on the SDK's own connector (its
//! connection pool, TLS with the mount's trust store, connect and read timeouts).
//! Everything around one attempt stays where it was: retries, throttling and the endpoint
//! pool are `S3Store::retrying`'s, and an answer's status and code become a `StoreError`
//! in `S3Store::answer_error`, the one mapping.
//!
//! Endpoints the rules sign otherwise than with plain SigV4 for `s3` (S3 Express sessions,
//! SigV4a access points) have no route, and their requests keep the SDK.

use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{error::CredentialsError, ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sdk_s3::primitives::ByteStream;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_http_client::{tls, Connector};
use aws_smithy_runtime_api::client::http::{HttpConnector, HttpConnectorSettings};
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::endpoint::Endpoint;
use aws_smithy_types::Document;
use bytes::Bytes;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What a key keeps unencoded in a URL path: S3's unreserved characters and `/`.
const PATH_KEEP: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/');

/// Credentials are fetched again this long before they expire.
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(300);

/// How one store's direct GETs and PUTs are addressed, signed and sent.
pub struct Direct {
    connector: Connector,
    attempt_timeout: Duration,
    routes: Vec<Route>,
    /// `None`: unsigned requests (a public bucket).
    credentials: Option<CredentialCache>,
    /// The store's request options for a GetObject (SSE-C key, requester pays, owner).
    get_headers: Vec<(&'static str, String)>,
    /// The same for a PutObject (encryption, storage class, ...).
    put_headers: Vec<(&'static str, String)>,
}

/// Where the requests sent to one of the store's URLs go, as the SDK's endpoint rules resolve
/// a GetObject of the bucket there: its base URL (`http://host:9000/bucket` in path style,
/// `https://bucket.host` otherwise) and the region it is signed for.
pub struct Route {
    /// The store's URL this route is for (`--endpoint-url`); `None` for the only one.
    pub endpoint: Option<String>,
    pub base: String,
    pub signing_region: String,
}

/// How the SDK's endpoint rules address a GetObject of `bucket` at `endpoint` (AWS's own
/// endpoint for `region` if `None`): the route, or `None` where they sign it otherwise than
/// with plain SigV4 for `s3`. `endpoint_is_one_of_several`: the route answers for that URL
/// only (see [`Direct::get`]).
pub async fn route(params: aws_sdk_s3::config::endpoint::Params, endpoint_is_one_of_several: bool) -> Option<Route> {
    use aws_sdk_s3::config::endpoint::{DefaultResolver, ResolveEndpoint};
    let resolved = DefaultResolver::new().resolve_endpoint(&params).await.ok()?;
    let region = params.region().unwrap_or("us-east-1");
    Some(Route {
        endpoint: params.endpoint().filter(|_| endpoint_is_one_of_several).map(str::to_owned),
        base: resolved.url().to_owned(),
        signing_region: plain_sigv4_region(&resolved, region)?,
    })
}

/// The region a resolved endpoint is signed for, if it is signed with plain SigV4 as `s3`
/// and asks for no headers of its own (an endpoint naming no auth scheme is: the client's
/// region then). The rules name their schemes in `auth_schemes`, older ones in the
/// `authSchemes` property.
fn plain_sigv4_region(endpoint: &Endpoint, region: &str) -> Option<String> {
    if endpoint.headers().next().is_some() {
        return None;
    }
    let text = |value: Option<&Document>| match value {
        Some(Document::String(text)) => Some(text.clone()),
        _ => None,
    };
    let (name, signing_name, signing_region) = if let Some(first) = endpoint.auth_schemes().first() {
        (Some(first.name().to_owned()), text(first.get("signingName")), text(first.get("signingRegion")))
    } else {
        match endpoint.properties().get("authSchemes") {
            None => return Some(region.to_owned()),
            Some(Document::Array(schemes)) => match schemes.first() {
                None => return Some(region.to_owned()),
                Some(Document::Object(first)) => {
                    (text(first.get("name")), text(first.get("signingName")), text(first.get("signingRegion")))
                }
                Some(_) => return None,
            },
            Some(_) => return None,
        }
    };
    if name.as_deref() != Some("sigv4") || signing_name.is_some_and(|name| name != "s3") {
        return None;
    }
    Some(signing_region.unwrap_or_else(|| region.to_owned()))
}

/// What an S3 error answer's body says: `<Error><Code>…<Message>…<RequestId>…`.
#[derive(Debug, Default, PartialEq)]
pub struct ErrorBody {
    pub code: Option<String>,
    pub message: Option<String>,
    pub request_id: Option<String>,
}

impl ErrorBody {
    /// Read with the SDK's XML reader; a body that is not such XML (a proxy's page, a HEAD's
    /// empty one) says nothing.
    pub fn parse(body: &[u8]) -> Self {
        use aws_smithy_xml::decode::try_data;
        let mut fields = Self::default();
        let Ok(text) = std::str::from_utf8(body) else { return fields };
        let mut document = aws_smithy_xml::decode::Document::new(text);
        let Ok(mut root) = document.root_element() else { return fields };
        while let Some(mut element) = root.next_tag() {
            let slot = match element.start_el().local() {
                "Code" => &mut fields.code,
                "Message" => &mut fields.message,
                "RequestId" => &mut fields.request_id,
                _ => continue,
            };
            *slot = try_data(&mut element).ok().map(|text| text.into_owned()).filter(|text| !text.is_empty());
        }
        fields
    }
}

/// Where a store's direct requests go and what they carry.
pub struct Target {
    /// Connect and read timeouts, as the SDK's client has them.
    pub settings: HttpConnectorSettings,
    /// How long one attempt may wait for its answer's status and headers (the SDK's
    /// attempt timeout).
    pub attempt_timeout: Duration,
    /// The TLS context with the mount's CA bundle, if it has one.
    pub trust: Option<tls::TlsContext>,
    /// One per URL of the store (see [`Route`]).
    pub routes: Vec<Route>,
    /// The credential chain's provider; `None` sends unsigned requests.
    pub credentials: Option<SharedCredentialsProvider>,
    /// The store's request options for a GetObject and for a PutObject.
    pub get_headers: Vec<(&'static str, String)>,
    pub put_headers: Vec<(&'static str, String)>,
}

/// What went wrong with one request before a status came back, or the answer itself.
pub enum Failure {
    /// No connection, or none in time.
    Connector(ConnectorError),
    Credentials(CredentialsError),
    /// The request could not be built (a URL the key makes invalid, a metadata value no
    /// header can hold); not retried.
    Request(String),
}

/// An answer: its status, headers and body, read as it arrives.
pub struct Answer {
    pub status: u16,
    pub etag: Option<String>,
    pub request_id: Option<String>,
    pub from_minio: bool,
    pub body: ByteStream,
}

/// Which credentials sign, kept until shortly before they expire (the chain's providers
/// may each cost a request: instance metadata, STS).
struct CredentialCache {
    provider: SharedCredentialsProvider,
    current: parking_lot::Mutex<Option<Credentials>>,
}

impl CredentialCache {
    async fn get(&self) -> Result<Credentials, CredentialsError> {
        let fresh = |credentials: &Credentials| {
            credentials.expiry().is_none_or(|expiry| expiry > SystemTime::now() + REFRESH_BEFORE_EXPIRY)
        };
        if let Some(credentials) = self.current.lock().as_ref().filter(|c| fresh(c)) {
            return Ok(credentials.clone());
        }
        let credentials = self.provider.provide_credentials().await?;
        *self.current.lock() = Some(credentials.clone());
        Ok(credentials)
    }
}

impl Direct {
    pub fn new(target: Target) -> Self {
        let mut builder = Connector::builder()
            .connector_settings(target.settings)
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc));
        if let Some(context) = target.trust {
            builder = builder.tls_context(context);
        }
        if let Some(sleep) = aws_smithy_async::rt::sleep::default_async_sleep() {
            builder = builder.sleep_impl(sleep);
        }
        Self {
            connector: builder.build(),
            attempt_timeout: target.attempt_timeout,
            routes: target.routes,
            credentials: target
                .credentials
                .map(|provider| CredentialCache { provider, current: parking_lot::Mutex::new(None) }),
            get_headers: target.get_headers,
            put_headers: target.put_headers,
        }
    }

    /// Sends `GET key` for bytes `range` to `endpoint` (the store's own URL if `None`; a
    /// store with several URLs names the one this attempt goes to), pinned to `if_match`
    /// and `version_id` when given. Returns once the status and headers are in.
    pub async fn get(
        &self,
        endpoint: Option<&str>,
        key: &str,
        range: std::ops::Range<u64>,
        if_match: Option<&str>,
        version_id: Option<&str>,
    ) -> Result<Answer, Failure> {
        let route = self.route(endpoint)?;
        let url = route_url(route, key, version_id);
        let mut headers = vec![("range".to_owned(), format!("bytes={}-{}", range.start, range.end - 1))];
        if let Some(etag) = if_match {
            headers.push(("if-match".to_owned(), etag.to_owned()));
        }
        headers.extend(self.get_headers.iter().map(|(name, value)| ((*name).to_owned(), value.clone())));
        self.send("GET", route, &url, headers, Bytes::new()).await
    }

    /// Sends `PUT key` with `body` and `headers` (metadata, content type, conditions) to
    /// `endpoint`, as [`Direct::get`] does. The body is signed (its SHA-256 in the
    /// signature): meant for small bodies, whose hashing costs microseconds.
    pub async fn put(
        &self,
        endpoint: Option<&str>,
        key: &str,
        body: Bytes,
        mut headers: Vec<(String, String)>,
    ) -> Result<Answer, Failure> {
        let route = self.route(endpoint)?;
        let url = route_url(route, key, None);
        headers.push(("content-length".to_owned(), body.len().to_string()));
        headers.extend(self.put_headers.iter().map(|(name, value)| ((*name).to_owned(), value.clone())));
        self.send("PUT", route, &url, headers, body).await
    }

    /// The route to `endpoint`, or the only one.
    fn route(&self, endpoint: Option<&str>) -> Result<&Route, Failure> {
        endpoint
            .and_then(|url| self.routes.iter().find(|route| route.endpoint.as_deref() == Some(url)))
            .or(self.routes.first())
            .ok_or_else(|| Failure::Request("no route for a request".to_owned()))
    }

    /// Signs and sends one request; returns once the answer's status and headers are in.
    async fn send(
        &self,
        method: &str,
        route: &Route,
        url: &str,
        mut headers: Vec<(String, String)>,
        body: Bytes,
    ) -> Result<Answer, Failure> {
        match &self.credentials {
            Some(cache) => {
                let credentials = cache.get().await.map_err(Failure::Credentials)?;
                let signed = sign_request(method, url, &headers, &body, credentials, &route.signing_region)
                    .map_err(Failure::Request)?;
                headers.extend(signed.into_iter().map(|(name, value)| (name.to_owned(), value)));
            }
            // As the SDK sends an unsigned request.
            None if body.is_empty() => headers.push(("x-amz-content-sha256".to_owned(), EMPTY_SHA256.to_owned())),
            None => headers.push(("x-amz-content-sha256".to_owned(), "UNSIGNED-PAYLOAD".to_owned())),
        }
        let mut request = HttpRequest::new(SdkBody::from(body));
        request.set_method(method).map_err(|e| Failure::Request(format!("{method} {url}: {e}")))?;
        request.set_uri(url).map_err(|e| Failure::Request(format!("URL {url}: {e}")))?;
        for (name, value) in headers {
            request
                .headers_mut()
                .try_insert(name.clone(), value)
                .map_err(|e| Failure::Request(format!("{method} {url}: header {name}: {e}")))?;
        }
        let response = tokio::time::timeout(self.attempt_timeout, self.connector.call(request))
            .await
            .map_err(|_| {
                Failure::Connector(ConnectorError::timeout(format!("no answer in {:?}", self.attempt_timeout).into()))
            })?
            .map_err(Failure::Connector)?;
        let header = |name: &str| response.headers().get(name).map(str::to_owned);
        let (status, etag, request_id) = (response.status().as_u16(), header("etag"), header("x-amz-request-id"));
        let from_minio = response.headers().get("server").is_some_and(|server| server.starts_with("MinIO"));
        Ok(Answer { status, etag, request_id, from_minio, body: ByteStream::new(response.into_body()) })
    }
}

/// The URL of `key` (of version `version_id`, if given) on `route`.
fn route_url(route: &Route, key: &str, version_id: Option<&str>) -> String {
    let mut url = format!("{}/{}", route.base.trim_end_matches('/'), utf8_percent_encode(key, PATH_KEEP));
    if let Some(version) = version_id {
        url.push_str("?versionId=");
        url.extend(utf8_percent_encode(version, NON_ALPHANUMERIC));
    }
    url
}

/// The SigV4 headers (`authorization`, `x-amz-date`, `x-amz-content-sha256`, the session
/// token) for a `method` request of `url` with `headers` and `body`, as S3 wants them: the
/// path neither normalized nor encoded twice.
fn sign_request(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
    credentials: Credentials,
    region: &str,
) -> Result<Vec<(&'static str, String)>, String> {
    use aws_sigv4::http_request::{PayloadChecksumKind, PercentEncodingMode, UriPathNormalizationMode};
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let identity = Identity::from(credentials);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let signable = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(name, value)| (name.as_str(), value.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| format!("signing {method} {url}: {e}"))?;
    let (instructions, _signature) =
        sign(signable, &params).map_err(|e| format!("signing {method} {url}: {e}"))?.into_parts();
    let (signed, _query) = instructions.into_parts();
    Ok(signed.into_iter().map(|header| (header.name(), header.value().to_owned())).collect())
}

const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

#[cfg(test)]
mod tests {
    use super::*;

    fn params(
        bucket: &str,
        region: &str,
        endpoint: Option<&str>,
        path_style: bool,
    ) -> aws_sdk_s3::config::endpoint::Params {
        let mut params = aws_sdk_s3::config::endpoint::Params::builder()
            .bucket(bucket)
            .region(region)
            .use_fips(false)
            .use_dual_stack(false)
            .force_path_style(path_style)
            .accelerate(false);
        if let Some(url) = endpoint {
            params = params.endpoint(url);
        }
        params.build().expect("params")
    }

    fn resolve(params: aws_sdk_s3::config::endpoint::Params) -> Option<(String, String)> {
        futures::executor::block_on(route(params, false)).map(|route| (route.base, route.signing_region))
    }

    /// Routes are what the SDK would send to: an IP endpoint keeps the bucket in the path
    /// even without `--force-path-style` (a host name `bucket.127.0.0.1` does not resolve),
    /// AWS's own endpoint takes it in the host, and S3 Express has no route.
    #[test]
    fn routes_follow_the_sdks_endpoint_rules() {
        let ip = Some("http://127.0.0.1:9000");
        assert_eq!(
            resolve(params("b1", "us-east-1", ip, false)),
            Some(("http://127.0.0.1:9000/b1".into(), "us-east-1".into()))
        );
        assert_eq!(
            resolve(params("bucket", "us-east-1", Some("https://s3.example"), true)),
            Some(("https://s3.example/bucket".into(), "us-east-1".into()))
        );
        assert_eq!(
            resolve(params("bucket", "eu-west-1", None, false)),
            Some(("https://bucket.s3.eu-west-1.amazonaws.com".into(), "eu-west-1".into()))
        );
        assert_eq!(resolve(params("b--use1-az4--x-s3", "us-east-1", None, false)), None, "S3 Express");
    }

    #[test]
    fn error_bodies_give_their_code_message_and_request_id() {
        let body = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>PreconditionFailed</Code>\
            <Message>At least one of the pre-conditions &amp; more</Message><Key>k</Key>\
            <RequestId>18A</RequestId></Error>";
        let parsed = ErrorBody::parse(body);
        assert_eq!(parsed.code.as_deref(), Some("PreconditionFailed"));
        assert_eq!(parsed.message.as_deref(), Some("At least one of the pre-conditions & more"));
        assert_eq!(parsed.request_id.as_deref(), Some("18A"));
        assert_eq!(ErrorBody::parse(b""), ErrorBody::default());
        assert_eq!(ErrorBody::parse(b"<html>bad gateway</html>"), ErrorBody::default());
    }

    #[test]
    fn urls_encode_the_key_once_and_keep_its_slashes() {
        let route = Route { endpoint: None, base: "http://h:9/b/".into(), signing_region: "us-east-1".into() };
        assert_eq!(route_url(&route, "a b/c+d%/ü", None), "http://h:9/b/a%20b/c%2Bd%25/%C3%BC");
        assert_eq!(route_url(&route, "k", Some("v/1+")), "http://h:9/b/k?versionId=v%2F1%2B");
        let host =
            Route { endpoint: None, base: "https://bucket-1.s3.example".into(), signing_region: "eu-west-1".into() };
        assert_eq!(route_url(&host, "dir/k", None), "https://bucket-1.s3.example/dir/k");
    }
}
