//! Options that go on S3 requests as headers, for every request that needs them:
//! server-side encryption (SSE-S3, SSE-KMS, SSE-C), the storage class of new objects,
//! requester pays, and the expected bucket owner.
//!
//! One interceptor on the client adds them by operation, before signing, so no call site
//! can forget one (a rename's copy, a metadata rewrite, a part of a multipart upload):
//!
//! | header | operations |
//! |---|---|
//! | `x-amz-server-side-encryption`, `…-aws-kms-key-id` | PutObject, CreateMultipartUpload, CopyObject |
//! | `x-amz-server-side-encryption-customer-*` | every read or write of object content, and HeadObject |
//! | `x-amz-copy-source-server-side-encryption-customer-*` | CopyObject, UploadPartCopy |
//! | `x-amz-storage-class` | PutObject, CreateMultipartUpload, CopyObject |
//! | `x-amz-request-payer`, `x-amz-expected-bucket-owner` | every request |

use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextMut;
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::client::orchestrator::Metadata as Operation;
use base64::Engine as _;
use md5::{Digest, Md5};

/// Server-side encryption of the objects bucketfs writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// SSE-S3 (`AES256`).
    S3,
    /// SSE-KMS, with the bucket's default key or this one.
    Kms { key_id: Option<String> },
    /// SSE-C: every object is encrypted with this 256-bit key, which must come with every
    /// read and write of it.
    Customer(CustomerKey),
}

/// A 256-bit SSE-C key, as its headers carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct CustomerKey {
    base64: String,
    md5_base64: String,
}

impl std::fmt::Debug for CustomerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CustomerKey(..)") // never the key itself, in logs or errors
    }
}

impl CustomerKey {
    /// The key from a key file's content: 32 bytes, or their base64 text (spaces and a
    /// final newline ignored).
    pub fn from_file_content(content: &[u8]) -> Result<Self, String> {
        let key = if content.len() == 32 {
            content.to_vec()
        } else {
            let text = String::from_utf8_lossy(content);
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|_| "an SSE-C key file holds 32 bytes, or their base64 text".to_owned())?
        };
        if key.len() != 32 {
            return Err(format!("an SSE-C key is 32 bytes (256 bits), this one {} bytes", key.len()));
        }
        let engine = base64::engine::general_purpose::STANDARD;
        Ok(Self { base64: engine.encode(&key), md5_base64: engine.encode(Md5::digest(&key)) })
    }
}

/// How the bodies of uploads are protected in transit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UploadChecksums {
    /// Large bodies unsigned with a CRC32 trailer (aws-chunked), small ones signed.
    #[default]
    Crc32,
    Crc32c,
    Crc64Nvme,
    /// No checksum and no aws-chunked body, for stores that refuse them: every body is
    /// signed instead (SigV4 over the payload's SHA-256, which costs CPU on large ones).
    Off,
}

impl UploadChecksums {
    /// The algorithm to name on large PUTs and parts; `None` for the SDK's default
    /// (CRC32) or none at all.
    pub fn algorithm(self) -> Option<aws_sdk_s3::types::ChecksumAlgorithm> {
        use aws_sdk_s3::types::ChecksumAlgorithm;
        match self {
            UploadChecksums::Crc32 | UploadChecksums::Off => None,
            UploadChecksums::Crc32c => Some(ChecksumAlgorithm::Crc32C),
            UploadChecksums::Crc64Nvme => Some(ChecksumAlgorithm::Crc64Nvme),
        }
    }
}

/// What goes on the requests of one store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    pub encryption: Option<Encryption>,
    pub storage_class: Option<String>,
    pub requester_pays: bool,
    pub expected_bucket_owner: Option<String>,
}

impl RequestOptions {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The headers for operation `operation` (the SDK's name, e.g. `PutObject`).
    pub(super) fn headers(&self, operation: &str) -> Vec<(&'static str, String)> {
        let creates = matches!(operation, "PutObject" | "CreateMultipartUpload" | "CopyObject");
        let copies = matches!(operation, "CopyObject" | "UploadPartCopy");
        let has_content = creates
            || copies
            || matches!(operation, "GetObject" | "HeadObject" | "UploadPart" | "CompleteMultipartUpload");
        let mut headers = Vec::new();
        match &self.encryption {
            Some(Encryption::S3) if creates => headers.push(("x-amz-server-side-encryption", "AES256".to_owned())),
            Some(Encryption::Kms { key_id }) if creates => {
                headers.push(("x-amz-server-side-encryption", "aws:kms".to_owned()));
                if let Some(key_id) = key_id {
                    headers.push(("x-amz-server-side-encryption-aws-kms-key-id", key_id.clone()));
                }
            }
            Some(Encryption::Customer(key)) => {
                if has_content {
                    headers.push(("x-amz-server-side-encryption-customer-algorithm", "AES256".to_owned()));
                    headers.push(("x-amz-server-side-encryption-customer-key", key.base64.clone()));
                    headers.push(("x-amz-server-side-encryption-customer-key-md5", key.md5_base64.clone()));
                }
                if copies {
                    headers.push(("x-amz-copy-source-server-side-encryption-customer-algorithm", "AES256".to_owned()));
                    headers.push(("x-amz-copy-source-server-side-encryption-customer-key", key.base64.clone()));
                    headers.push(("x-amz-copy-source-server-side-encryption-customer-key-md5", key.md5_base64.clone()));
                }
            }
            _ => {}
        }
        if let Some(class) = self.storage_class.as_ref().filter(|_| creates) {
            headers.push(("x-amz-storage-class", class.clone()));
        }
        if self.requester_pays {
            headers.push(("x-amz-request-payer", "requester".to_owned()));
        }
        if let Some(owner) = &self.expected_bucket_owner {
            headers.push(("x-amz-expected-bucket-owner", owner.clone()));
            if copies {
                headers.push(("x-amz-source-expected-bucket-owner", owner.clone()));
            }
        }
        headers
    }
}

/// Adds [`RequestOptions`] to each request of the client it is installed on.
#[derive(Debug)]
pub struct RequestOptionsInterceptor(pub RequestOptions);

impl Intercept for RequestOptionsInterceptor {
    fn name(&self) -> &'static str {
        "bucketfs request options"
    }

    fn modify_before_signing(
        &self,
        context: &mut BeforeTransmitInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        let Some(operation) = cfg.load::<Operation>() else { return Ok(()) };
        let headers = context.request_mut().headers_mut();
        for (name, value) in self.0.headers(operation.name()) {
            headers.insert(name, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(options: &RequestOptions, operation: &str) -> Vec<&'static str> {
        options.headers(operation).into_iter().map(|(name, _)| name).collect()
    }

    #[test]
    fn each_operation_gets_the_headers_it_needs_and_no_other() {
        let kms = RequestOptions {
            encryption: Some(Encryption::Kms { key_id: Some("k1".into()) }),
            storage_class: Some("STANDARD_IA".into()),
            ..RequestOptions::default()
        };
        for creating in ["PutObject", "CreateMultipartUpload", "CopyObject"] {
            assert_eq!(
                names(&kms, creating),
                ["x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id", "x-amz-storage-class"]
            );
        }
        for other in ["GetObject", "HeadObject", "UploadPart", "ListObjectsV2", "DeleteObject"] {
            assert!(names(&kms, other).is_empty(), "{other}: SSE-KMS headers on a read fail it");
        }

        let key = CustomerKey::from_file_content(&[7u8; 32]).expect("key");
        let sse_c = RequestOptions { encryption: Some(Encryption::Customer(key)), ..RequestOptions::default() };
        for content in ["GetObject", "HeadObject", "PutObject", "UploadPart", "CompleteMultipartUpload"] {
            assert_eq!(names(&sse_c, content).len(), 3, "{content}");
        }
        assert_eq!(names(&sse_c, "UploadPartCopy").len(), 6, "the source's key too");
        assert!(names(&sse_c, "ListObjectsV2").is_empty() && names(&sse_c, "DeleteObject").is_empty());

        let payer = RequestOptions {
            requester_pays: true,
            expected_bucket_owner: Some("123".into()),
            ..RequestOptions::default()
        };
        assert_eq!(names(&payer, "ListObjectsV2"), ["x-amz-request-payer", "x-amz-expected-bucket-owner"]);
        assert_eq!(names(&payer, "CopyObject").len(), 3, "and the source's owner");
    }

    #[test]
    fn customer_keys_are_32_bytes_raw_or_base64_and_never_shown() {
        let raw = [9u8; 32];
        let text = base64::engine::general_purpose::STANDARD.encode(raw) + "\n";
        let from_raw = CustomerKey::from_file_content(&raw).expect("raw");
        assert_eq!(CustomerKey::from_file_content(text.as_bytes()).expect("base64"), from_raw);
        assert!(CustomerKey::from_file_content(b"short").is_err());
        assert!(CustomerKey::from_file_content(&[1u8; 16]).is_err());
        assert_eq!(format!("{from_raw:?}"), "CustomerKey(..)");
    }
}
