//! Parsing of `s3://BUCKET[/PREFIX][=DIR]` source arguments.

use bucketfs_core::namespace::names::check_component;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSpec {
    pub bucket: String,
    /// Empty or ending in `/`.
    pub prefix: String,
    /// Top-level directory the source appears as, when multiplexing.
    pub mount_name: Option<String>,
}

impl SourceSpec {
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text
            .strip_prefix("s3://")
            .ok_or_else(|| format!("source '{text}' must look like s3://BUCKET[/PREFIX][=DIR]"))?;
        // The last '=' names the directory, so prefixes may still contain '='.
        let (location, mount_name) = match rest.rsplit_once('=') {
            Some((location, name)) => {
                check_component(name)
                    .ok()
                    .filter(|_| !name.contains('/'))
                    .ok_or_else(|| format!("in '{text}': '{name}' is not a valid directory name"))?;
                (location, Some(name.to_owned()))
            }
            None => (rest, None),
        };
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty() {
            return Err(format!("source '{text}' has no bucket name"));
        }
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() { String::new() } else { format!("{prefix}/") };
        Ok(Self { bucket: bucket.to_owned(), prefix, mount_name })
    }

    pub fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }
}

/// Checks that sources form a valid mount: one unnamed source, or only named ones with
/// distinct names.
pub fn check_layout(sources: &[SourceSpec]) -> Result<(), String> {
    let named = sources.iter().filter(|s| s.mount_name.is_some()).count();
    if sources.len() > 1 && named != sources.len() {
        return Err("with several sources, each needs a directory name: s3://BUCKET[/PREFIX]=DIR".into());
    }
    let mut names: Vec<_> = sources.iter().filter_map(|s| s.mount_name.as_deref()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(format!("two sources use the directory name '{}'", pair[0]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bucket_prefix_and_directory() {
        let spec = SourceSpec::parse("s3://refs/human/hg38=ref").expect("valid");
        assert_eq!(spec.bucket, "refs");
        assert_eq!(spec.prefix, "human/hg38/");
        assert_eq!(spec.mount_name.as_deref(), Some("ref"));
        let root = SourceSpec::parse("s3://bucket").expect("valid");
        assert_eq!((root.prefix.as_str(), root.mount_name), ("", None));
        assert_eq!(SourceSpec::parse("s3://b/p/").expect("valid").prefix, "p/");
        assert!(SourceSpec::parse("bucket").is_err());
        assert!(SourceSpec::parse("s3://b=a/b").is_err());
        assert!(SourceSpec::parse("s3://b=..").is_err());
        assert!(SourceSpec::parse("s3:///p").is_err());
    }

    #[test]
    fn several_sources_need_distinct_names() {
        let parse = |t| SourceSpec::parse(t).expect("valid");
        assert!(check_layout(&[parse("s3://a")]).is_ok());
        assert!(check_layout(&[parse("s3://a=x"), parse("s3://b=y")]).is_ok());
        assert!(check_layout(&[parse("s3://a"), parse("s3://b=y")]).is_err());
        assert!(check_layout(&[parse("s3://a=x"), parse("s3://b=x")]).is_err());
    }
}
