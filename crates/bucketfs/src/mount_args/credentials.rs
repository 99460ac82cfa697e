//! An access key handed to a mount on its standard input (`--credentials-from-stdin`),
//! as the CSI driver hands a volume's Secret to its daemon: never in the environment,
//! where `/proc/PID/environ` and core dumps would keep it. The text is `NAME=VALUE`
//! lines of the three names below; the foreground parent passes it on to the daemon it
//! starts through a pipe in the same way.

use std::io::Read;

use anyhow::{bail, Context, Result};

use bucketfs_client::store::s3::StaticCredentials;

pub const ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
pub const SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";
pub const SESSION_TOKEN: &str = "AWS_SESSION_TOKEN";

/// The names a credentials text may hold.
pub const NAMES: [&str; 3] = [ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN];

/// Reads standard input to its end and parses it.
pub fn read_stdin() -> Result<StaticCredentials> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("--credentials-from-stdin: reading standard input")?;
    parse(&text).context("--credentials-from-stdin")
}

/// `NAME=VALUE` lines: both halves of the key, and a session token if any.
pub fn parse(text: &str) -> Result<StaticCredentials> {
    let (mut access_key_id, mut secret_access_key, mut session_token) = (None, None, None);
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let Some((name, value)) = line.split_once('=') else { bail!("a line without NAME=VALUE") };
        let slot = match name.trim() {
            ACCESS_KEY_ID => &mut access_key_id,
            SECRET_ACCESS_KEY => &mut secret_access_key,
            SESSION_TOKEN => &mut session_token,
            other => bail!("unknown name {other:?} (known: {})", NAMES.join(", ")),
        };
        *slot = Some(value.trim().to_owned()).filter(|value| !value.is_empty());
    }
    match (access_key_id, secret_access_key) {
        (Some(access_key_id), Some(secret_access_key)) => {
            Ok(StaticCredentials { access_key_id, secret_access_key, session_token })
        }
        _ => bail!("needs both {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY}"),
    }
}

/// The text [`parse`] reads back.
pub fn text(credentials: &StaticCredentials) -> String {
    let mut text = format!(
        "{ACCESS_KEY_ID}={}\n{SECRET_ACCESS_KEY}={}\n",
        credentials.access_key_id, credentials.secret_access_key
    );
    if let Some(token) = &credentials.session_token {
        text.push_str(&format!("{SESSION_TOKEN}={token}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_read_back_what_was_written_and_refuse_anything_else() {
        let key = StaticCredentials {
            access_key_id: "AKID".into(),
            secret_access_key: "se=cret".into(),
            session_token: Some("token".into()),
        };
        let read = parse(&text(&key)).expect("parse");
        assert_eq!(
            (read.access_key_id, read.secret_access_key, read.session_token),
            ("AKID".into(), "se=cret".into(), Some("token".into()))
        );
        assert!(parse("AWS_ACCESS_KEY_ID=a\n").unwrap_err().to_string().contains("needs both"));
        assert!(parse("AWS_REGION=x\n").unwrap_err().to_string().contains("unknown name"));
        assert!(parse("just a line\n").is_err());
    }
}
