//! Objects' stored metadata from the listing itself, where the server offers it.
//!
//! A plain S3 listing gives each object's size, Last-Modified and ETag, but not the
//! `x-amz-meta-*` headers where bucketfs keeps mode, owner and mtime: `ls -l` of a
//! listed directory costs one HEAD per file. MinIO lists them too when asked with the
//! query parameter `metadata=true` (an extension of ListObjectsV2: each `<Contents>`
//! gains a `<UserMetadata>` element with the object's metadata headers and content type).
//! On this machine's MinIO, 71k HEADs take about half a minute; the same metadata in the
//! listing costs a few tenths of a second more listing time.
//!
//! This file owns the two halves of that: an interceptor that adds the parameter and
//! keeps the raw body of the answer (the SDK's parser drops elements it does not know),
//! and a parser that reads `<UserMetadata>` out of it. Whether a server gets the
//! parameter is decided by [`ServerKind`] (`server_kind`): only servers that said they are MinIO (the
//! `Server` header of any listing), so no other server is sent a parameter it may
//! refuse. An object whose `<Contents>` has no `<UserMetadata>` keeps `metadata: None`
//! and is HEADed as before: an absent element is never read as "no metadata".

use std::sync::Arc;

use aws_sdk_s3::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextMut,
};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_xml::decode::{try_data, Document, XmlDecodeError};
use bytes::Bytes;
use parking_lot::Mutex;

use super::server_kind::ServerKind;
use super::{Metadata, SharedMetadata, KEPT_HEADERS};

/// Interceptor of one ListObjectsV2 call: notes the server's kind, adds `metadata=true`
/// when asked to, and keeps the body of the answer for [`parse`].
#[derive(Debug)]
pub struct ListingInterceptor {
    server: Arc<ServerKind>,
    ask_metadata: bool,
    body: Arc<Mutex<Option<Bytes>>>,
}

impl ListingInterceptor {
    /// Returns the interceptor and the slot where the body of the answer lands (only
    /// when metadata is `wanted` and the server can list it).
    pub fn new(server: &Arc<ServerKind>, wanted: bool) -> (Self, Arc<Mutex<Option<Bytes>>>) {
        let body = Arc::new(Mutex::new(None));
        let ask_metadata = wanted && server.lists_metadata();
        (Self { server: server.clone(), ask_metadata, body: body.clone() }, body)
    }

    /// Whether this call asks for metadata.
    pub fn asks(&self) -> bool {
        self.ask_metadata
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Intercept for ListingInterceptor {
    fn name(&self) -> &'static str {
        "bucketfs-listing-metadata"
    }

    // Added before signing: the parameter is part of what the signature covers.
    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if self.ask_metadata {
            let request = context.request_mut();
            let uri = format!("{}&metadata=true", request.uri());
            request.set_uri(uri)?;
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let response = context.response();
        if response.headers().get("server").is_some_and(|server| server.starts_with("MinIO")) {
            self.server.note_minio();
        }
        if self.ask_metadata {
            // A non-streaming answer's body has been read into memory by now.
            *self.body.lock() = response.body().bytes().map(Bytes::copy_from_slice);
        }
        Ok(())
    }
}

/// The `<UserMetadata>` of each `<Contents>` of a ListObjectsV2 answer that has one, in
/// listing order, with the key as sent (URL-encoded when the listing asked for it).
///
/// Objects of a page with the same metadata share one copy: objects written by other
/// tools mostly carry nothing but a content type, and each listed file the kernel holds
/// keeps its metadata (a copy each was about 100 bytes of the 950 per entry a walk of
/// the linux-5.12.13 shape held).
pub fn parse(body: &[u8]) -> Result<Vec<(String, Arc<Metadata>)>, XmlDecodeError> {
    let text = std::str::from_utf8(body).map_err(XmlDecodeError::unhandled)?;
    let mut document = Document::new(text);
    let mut root = document.root_element()?;
    let mut found = Vec::new();
    let mut shared = SharedMetadata::default();
    while let Some(mut element) = root.next_tag() {
        if !element.start_el().matches("Contents") {
            continue;
        }
        let mut key = None;
        let mut metadata = None;
        while let Some(mut field) = element.next_tag() {
            if field.start_el().matches("Key") {
                key = Some(try_data(&mut field)?.into_owned());
            } else if field.start_el().matches("UserMetadata") {
                let mut stored = Metadata { listed: true, ..Metadata::default() };
                while let Some(mut header) = field.next_tag() {
                    let name = header.start_el().local().to_ascii_lowercase();
                    let value = try_data(&mut header)?.into_owned();
                    if let Some(user) = name.strip_prefix("x-amz-meta-") {
                        stored.user.insert(user.to_owned(), value);
                    } else if name == "content-type" {
                        stored.content_type = Some(value);
                    } else if KEPT_HEADERS.contains(&name.as_str()) {
                        stored.headers.insert(name, value);
                    }
                }
                metadata = Some(shared.share(Arc::new(stored)));
            }
        }
        if let (Some(key), Some(metadata)) = (key, metadata) {
            found.push((key, metadata));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The shape MinIO answers (`metadata=true`, `encoding-type=url`), shortened.
    const ANSWER: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix></Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated><Contents><Key>d%2Ff+1</Key><LastModified>2026-11-24T20:31:27.040Z</LastModified><ETag>&#34;764efa883dda1e11db47671c4a3bbd9e&#34;</ETag><Size>3</Size><StorageClass>STANDARD</StorageClass><UserMetadata><X-Amz-Meta-Mtime>123</X-Amz-Meta-Mtime><content-type>text/plain</content-type><X-Amz-Meta-Mode>33188</X-Amz-Meta-Mode><X-Amz-Meta-Note>a &amp; b</X-Amz-Meta-Note><X-Amz-Meta-Empty></X-Amz-Meta-Empty></UserMetadata><Internal><K>1</K><M>0</M></Internal></Contents><Contents><Key>d%2Ff2</Key><Size>3</Size><UserMetadata><content-type>application/octet-stream</content-type></UserMetadata></Contents><Contents><Key>d%2Ff3</Key><Size>3</Size></Contents></ListBucketResult>"#;

    #[test]
    fn user_metadata_of_each_listed_object_is_read() {
        let found = parse(ANSWER.as_bytes()).expect("parses");
        assert_eq!(found.len(), 2, "an object without <UserMetadata> is not reported: {found:?}");
        let (key, first) = &found[0];
        assert_eq!(key, "d%2Ff+1");
        assert_eq!(first.user.get("mode").map(String::as_str), Some("33188"));
        assert_eq!(first.user.get("mtime").map(String::as_str), Some("123"));
        assert_eq!(first.user.get("note").map(String::as_str), Some("a & b"));
        assert_eq!(first.user.get("empty").map(String::as_str), Some(""));
        assert_eq!(first.user.len(), 4);
        assert_eq!(first.content_type.as_deref(), Some("text/plain"));
        let (key, second) = &found[1];
        assert_eq!(key, "d%2Ff2");
        assert!(second.user.is_empty());
        assert_eq!(second.content_type.as_deref(), Some("application/octet-stream"));
    }

    /// Only a server that said it is MinIO is sent the parameter, only when the caller
    /// wants metadata, and never with `--no-listing-metadata`.
    #[test]
    fn only_minio_is_asked_and_only_when_wanted_and_allowed() {
        let asks = |server: &Arc<ServerKind>, wanted| ListingInterceptor::new(server, wanted).0.asks();
        let server = Arc::new(ServerKind::new(true));
        assert!(!asks(&server, true), "a server not known to be MinIO");
        server.note_minio();
        assert!(asks(&server, true));
        assert!(!asks(&server, false), "a listing that wants no metadata");
        let refused = Arc::new(ServerKind::new(false));
        refused.note_minio();
        assert!(!asks(&refused, true), "--no-listing-metadata");
    }

    #[test]
    fn objects_of_a_page_with_the_same_metadata_share_one_copy() {
        let contents =
            |key: &str, meta: &str| format!("<Contents><Key>{key}</Key><UserMetadata>{meta}</UserMetadata></Contents>");
        let plain = "<content-type>application/octet-stream</content-type>";
        let mode = "<content-type>application/octet-stream</content-type><X-Amz-Meta-Mode>33261</X-Amz-Meta-Mode>";
        let body = format!(
            "<ListBucketResult>{}{}{}{}</ListBucketResult>",
            contents("a", plain),
            contents("b", mode),
            contents("c", plain),
            contents("d", mode)
        );
        let found = parse(body.as_bytes()).expect("parse");
        let [(_, a), (_, b), (_, c), (_, d)] = &found[..] else { panic!("{found:?}") };
        assert!(Arc::ptr_eq(a, c) && Arc::ptr_eq(b, d), "equal metadata shared");
        assert!(!Arc::ptr_eq(a, b));
        assert_eq!(b.user.get("mode").map(String::as_str), Some("33261"));
        assert_eq!(a.content_type.as_deref(), Some("application/octet-stream"));
    }

    #[test]
    fn a_listing_without_the_extension_reports_nothing() {
        let plain = ANSWER.replace("<UserMetadata>", "<Other>").replace("</UserMetadata>", "</Other>");
        assert!(parse(plain.as_bytes()).expect("parses").is_empty());
        assert!(parse(b"not xml").is_err());
    }
}
