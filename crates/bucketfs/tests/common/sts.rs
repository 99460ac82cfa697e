//! Restricted identities: temporary credentials from MinIO's STS (AssumeRole with a session
//! policy), for mounts and clients that may do less than the root user.

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

use super::{block_on, minio, ACCESS_KEY, REGION, SECRET_KEY};

/// Temporary credentials handed out by MinIO's STS.
#[derive(Clone, Debug)]
pub struct TempCredentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: String,
}

/// An IAM policy allowing only to list and read `bucket` (no PutObject, no DeleteObject,
/// no multipart uploads).
pub fn read_only_policy(bucket: &str) -> String {
    format!(
        r#"{{
  "Version": "2012-10-17",
  "Statement": [
    {{"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
      "Resource": ["arn:aws:s3:::{bucket}"]}},
    {{"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::{bucket}/*"]}}
  ]
}}"#
    )
}

/// Temporary credentials limited to `policy`: an STS `AssumeRole` call by the root user
/// with `policy` as the inline session policy. MinIO evaluates the session policy even for
/// credentials derived from the root user (they are then no longer treated as the owner),
/// so the result can do exactly what `policy` allows. Needs no tool besides MinIO.
pub fn restricted_credentials(policy: &str) -> TempCredentials {
    let m = minio();
    let conf = aws_sdk_sts::Config::builder()
        .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
        .region(aws_sdk_sts::config::Region::new(REGION))
        .endpoint_url(&m.endpoint)
        .credentials_provider(aws_sdk_sts::config::Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "bucketfs-tests",
        ))
        .build();
    let sts = aws_sdk_sts::Client::from_conf(conf);
    let out = block_on(
        sts.assume_role()
            // MinIO ignores the role (the policy comes from the caller and the session
            // policy), but the API requires one.
            .role_arn("arn:minio:iam:::role/bucketfs-tests")
            .role_session_name("bucketfs-tests")
            .policy(policy)
            .duration_seconds(3600)
            .send(),
    )
    .unwrap_or_else(|e| {
        panic!(
            "cannot create a restricted identity: STS AssumeRole at {} with a session policy \
             failed: {}\npolicy: {policy}\nMinIO log:\n{}",
            m.endpoint,
            aws_sdk_s3::error::DisplayErrorContext(&e),
            m.log()
        )
    });
    let c = out.credentials().unwrap_or_else(|| {
        panic!("cannot create a restricted identity: STS AssumeRole returned no credentials: {out:?}")
    });
    TempCredentials {
        access_key: c.access_key_id().to_string(),
        secret_key: c.secret_access_key().to_string(),
        session_token: c.session_token().to_string(),
    }
}

/// Temporary credentials that can list and read `bucket` and nothing else.
pub fn read_only_credentials(bucket: &str) -> TempCredentials {
    restricted_credentials(&read_only_policy(bucket))
}

/// An S3 client (configured only from the arguments) using temporary credentials.
pub fn s3_client_with(creds: &TempCredentials) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .endpoint_url(&minio().endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(
            &creds.access_key,
            &creds.secret_key,
            Some(creds.session_token.clone()),
            None,
            "bucketfs-tests",
        ))
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}
