//! The S3 requests a mount sent, parsed from its debug log (see
//! [`super::MountBuilder::request_log`]).

/// One S3 request, as bucketfs logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Request {
    pub op: String,
    pub key: String,
    /// Range of a GET: (start, length).
    pub range: Option<(u64, u64)>,
}

impl S3Request {
    pub(super) fn parse(line: &str) -> Option<Self> {
        let rest = &line[line.find(" s3 ")? + 4..];
        let (op, fields) = rest.split_once(' ')?;
        let field = |name: &str| -> Option<String> {
            let at = fields.find(&format!("{name}="))? + name.len() + 1;
            let value = &fields[at..];
            if let Some(quoted) = value.strip_prefix('"') {
                Some(quoted[..quoted.find('"')?].to_owned())
            } else {
                Some(value.split(' ').next()?.to_owned())
            }
        };
        let key = field("key").or_else(|| field("prefix")).unwrap_or_default();
        let range = match (field("start"), field("len")) {
            (Some(start), Some(len)) => Some((start.parse().ok()?, len.parse().ok()?)),
            _ => None,
        };
        Some(S3Request { op: op.to_owned(), key, range })
    }
}
