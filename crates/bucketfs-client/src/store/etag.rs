//! The ETag a write gives an object on S3 and on the stores that follow it (MinIO, Ceph):
//! the MD5 of a single PUT's body, and for a multipart upload the MD5 of its parts' MD5s
//! followed by `-` and the number of parts. Used to tell our own object from another
//! client's after a retried write whose first answer was lost. Under SSE-C or SSE-KMS
//! the ETag is no MD5, so nothing matches and the caller keeps its error.

use md5::{Digest, Md5};

/// The ETag of an object stored by one PUT of `body`, without quotes.
pub fn of_put(body: &[u8]) -> String {
    hex::encode(Md5::digest(body))
}

/// The ETag of an object completed from `parts` (their ETags as the store gave them, in
/// order), without quotes; `None` where a part's ETag is no MD5.
pub fn of_multipart(parts: &[(i32, String)]) -> Option<String> {
    let mut digests = Md5::new();
    for (_, etag) in parts {
        let digest = hex::decode(unquoted(etag)).ok().filter(|digest| digest.len() == 16)?;
        digests.update(digest);
    }
    Some(format!("{}-{}", hex::encode(digests.finalize()), parts.len()))
}

/// `etag` without the quotes S3 sends it in.
pub fn unquoted(etag: &str) -> &str {
    etag.trim_matches('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_those_s3_gives() {
        // The MD5 of the empty string, and of "abc" (RFC 1321's test suite).
        assert_eq!(of_put(b""), "d41d8cd98f00b204e9800998ecf8427e");
        let abc = format!("\"{}\"", of_put(b"abc"));
        assert_eq!(abc, "\"900150983cd24fb0d6963f7d28e17f72\"");
        let parts = [(1, abc.clone()), (2, abc.clone())];
        let both = [hex::decode(of_put(b"abc")).unwrap(), hex::decode(of_put(b"abc")).unwrap()].concat();
        assert_eq!(of_multipart(&parts), Some(format!("{}-2", of_put(&both))));
        assert_eq!(of_multipart(&[(1, "\"not an md5\"".to_owned())]), None);
        assert_eq!(unquoted(&abc), of_put(b"abc"));
    }
}
