//! The CSI Controller service: dynamic provisioning. A StorageClass names a bucket (and
//! a base prefix); each claim gets its own prefix in it, `BASE/NAME/`, with an empty
//! directory marker at that key, and a mark beside it, `BASE/NAME.bucketfs-csi-volume`,
//! that records the claim's requested size, so that a repeated `CreateVolume` is
//! recognised and one with another size refused. The mark is outside the volume: nothing
//! a pod does through its mount (`chmod`, `setfattr` of the root) can change or remove
//! it. `DeleteVolume` deletes every object under a prefix that has this mark, and
//! nothing else: a volume id that does not name a prefix this controller made deletes
//! nothing. (Volumes made before the mark moved carry it in their marker's metadata.)

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tonic::{Request, Response, Status};

use super::node::required;
use super::proto::controller_server::Controller;
use super::proto::controller_service_capability::{rpc, Rpc, Type};
use super::proto::*;
use super::volume::{self, check_capability, VolumeSecret, VolumeSpec};
use bucketfs_client::store::s3::S3Store;
use bucketfs_client::store::{Metadata, ObjectStore, StoreError, WriteCondition, MAX_DELETED_AT_ONCE};

/// The mark's user metadata (`x-amz-meta-bucketfs-csi-capacity`): the bytes asked for.
const CAPACITY_METADATA: &str = "bucketfs-csi-capacity";

/// What follows a claim's name (its prefix without the `/`) in the key of its mark.
const MARK_SUFFIX: &str = ".bucketfs-csi-volume";

pub struct ControllerService;

/// One provisioned volume: a prefix in a bucket, and where the store is if the
/// StorageClass said. `DeleteVolume` is given nothing but the id (and the secret), so
/// the id says all of it: `s3://BUCKET/PREFIX/`, then `?endpoint=URL&region=NAME` for
/// those the StorageClass named (percent-encoded).
#[derive(Debug, PartialEq, Eq)]
struct ClaimPrefix {
    bucket: String,
    prefix: String,
    endpoint_url: Option<String>,
    region: Option<String>,
}

impl ClaimPrefix {
    fn from_id(volume_id: &str) -> Option<Self> {
        let rest = volume_id.strip_prefix("s3://")?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/')?;
        if bucket.is_empty() || prefix.len() < 2 || !prefix.ends_with('/') || prefix.starts_with('/') {
            return None;
        }
        let mut claim = Self { bucket: bucket.to_owned(), prefix: prefix.to_owned(), endpoint_url: None, region: None };
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=')?;
            let value = percent_encoding::percent_decode_str(value).decode_utf8().ok()?.into_owned();
            match name {
                "endpoint" => claim.endpoint_url = Some(value),
                "region" => claim.region = Some(value),
                _ => return None,
            }
        }
        Some(claim)
    }

    fn id(&self) -> String {
        let encode =
            |value: &str| percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string();
        let query: Vec<String> = [("endpoint", &self.endpoint_url), ("region", &self.region)]
            .into_iter()
            .filter_map(|(name, value)| value.as_deref().map(|value| format!("{name}={}", encode(value))))
            .collect();
        let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
        format!("s3://{}/{}{query}", self.bucket, self.prefix)
    }

    /// The key of the claim's mark: beside its prefix, outside what its pods can write.
    fn mark_key(&self) -> String {
        format!("{}{MARK_SUFFIX}", self.prefix.trim_end_matches('/'))
    }

    /// Where the claim's store is, as the store client takes it.
    fn location(&self) -> Result<VolumeSpec, Status> {
        let mut attributes = HashMap::from([(volume::BUCKET.to_owned(), self.bucket.clone())]);
        attributes.extend(self.endpoint_url.clone().map(|url| (volume::ENDPOINT_URL.to_owned(), url)));
        attributes.extend(self.region.clone().map(|region| (volume::REGION.to_owned(), region)));
        VolumeSpec::new(&attributes, &[], false).map_err(Status::invalid_argument)
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        let name = required(&request.name, "name")?;
        if request.volume_capabilities.is_empty() {
            return Err(super::node::missing("volume_capabilities"));
        }
        for capability in &request.volume_capabilities {
            check_capability(capability).map_err(Status::invalid_argument)?;
        }
        let class = VolumeSpec::new(&request.parameters, &[], false).map_err(Status::invalid_argument)?;
        let capacity = requested_capacity(request.capacity_range.as_ref())?;
        let claim = ClaimPrefix {
            bucket: class.bucket.clone(),
            prefix: format!("{}{}/", class.prefix, name.replace('/', "-")),
            endpoint_url: class.endpoint_url.clone(),
            region: class.region.clone(),
        };
        let store = store_for(&claim.bucket, &class, &request.secrets).await?;
        let mark = Metadata {
            user: [(CAPACITY_METADATA.to_owned(), capacity.to_string())].into(),
            content_type: Some("text/plain".to_owned()),
            ..Metadata::default()
        };
        // The mark first: a call cut short after it is repeated (or deleted) whole.
        match store.put(&claim.mark_key(), Bytes::new(), &mark, &WriteCondition::Absent).await {
            Ok(_) => tracing::info!(volume_id = claim.id(), capacity, "created"),
            // Made before: the same claim again is done; another size is another claim.
            Err(StoreError::AlreadyExists) => {
                let recorded = recorded_capacity(store.as_ref(), &claim).await?;
                if recorded.as_deref() != Some(capacity.to_string().as_str()) {
                    return Err(Status::already_exists(format!(
                        "volume {name} exists with another capacity ({} bytes)",
                        recorded.as_deref().unwrap_or("unknown")
                    )));
                }
            }
            Err(error) => return Err(store_status(error)),
        }
        let marker = Metadata { content_type: Some("application/x-directory".to_owned()), ..Metadata::default() };
        match store.put(&claim.prefix, Bytes::new(), &marker, &WriteCondition::Absent).await {
            Ok(_) | Err(StoreError::AlreadyExists) => {}
            Err(error) => return Err(store_status(error)),
        }
        let mut context = HashMap::from([
            (volume::BUCKET.to_owned(), claim.bucket.clone()),
            (volume::PREFIX.to_owned(), claim.prefix.clone()),
        ]);
        context.extend(class.endpoint_url.clone().map(|url| (volume::ENDPOINT_URL.to_owned(), url)));
        context.extend(class.region.clone().map(|region| (volume::REGION.to_owned(), region)));
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: capacity,
                volume_id: claim.id(),
                volume_context: context,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let request = request.into_inner();
        let volume_id = required(&request.volume_id, "volume_id")?;
        // Not an id this controller makes: there is nothing of ours to delete.
        let Some(claim) = ClaimPrefix::from_id(volume_id) else {
            return Ok(Response::new(DeleteVolumeResponse {}));
        };
        let store = store_for(&claim.bucket, &claim.location()?, &request.secrets).await?;
        if recorded_capacity(store.as_ref(), &claim).await?.is_none() {
            // Gone already (a repeated call), or not made by CreateVolume: left alone.
            return Ok(Response::new(DeleteVolumeResponse {}));
        }
        let deleted = delete_below(store.as_ref(), &claim.prefix).await?;
        // The marks go last: a call cut short finds them and deletes the rest.
        store.delete(&claim.prefix).await.map_err(store_status)?;
        store.delete(&claim.mark_key()).await.map_err(store_status)?;
        tracing::info!(volume_id, deleted, "deleted");
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let request = request.into_inner();
        let volume_id = required(&request.volume_id, "volume_id")?;
        if request.volume_capabilities.is_empty() {
            return Err(super::node::missing("volume_capabilities"));
        }
        let claim = ClaimPrefix::from_id(volume_id).ok_or_else(|| no_volume(volume_id))?;
        let store = store_for(&claim.bucket, &claim.location()?, &request.secrets).await?;
        match store.head(&claim.prefix).await {
            Ok(_) => {}
            Err(StoreError::NotFound) => return Err(no_volume(volume_id)),
            Err(error) => return Err(store_status(error)),
        }
        let refused = request.volume_capabilities.iter().find_map(|c| check_capability(c).err());
        Ok(Response::new(ValidateVolumeCapabilitiesResponse {
            confirmed: refused.is_none().then(|| validate_volume_capabilities_response::Confirmed {
                volume_context: request.volume_context.clone(),
                volume_capabilities: request.volume_capabilities.clone(),
                parameters: request.parameters.clone(),
                mutable_parameters: Default::default(),
            }),
            message: refused.unwrap_or_default(),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let create_delete = ControllerServiceCapability {
            r#type: Some(Type::Rpc(Rpc { r#type: rpc::Type::CreateDeleteVolume as i32 })),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse { capabilities: vec![create_delete] }))
    }

    async fn controller_publish_volume(
        &self,
        _request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented("bucketfs volumes are not attached to nodes"))
    }

    async fn controller_unpublish_volume(
        &self,
        _request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented("bucketfs volumes are not attached to nodes"))
    }

    async fn list_volumes(
        &self,
        _request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        Err(Status::unimplemented("ListVolumes is not offered"))
    }

    async fn get_capacity(
        &self,
        _request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Err(Status::unimplemented("a bucket has no capacity to report"))
    }

    async fn create_snapshot(
        &self,
        _request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not offered"))
    }

    async fn delete_snapshot(
        &self,
        _request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not offered"))
    }

    async fn list_snapshots(
        &self,
        _request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        Err(Status::unimplemented("snapshots are not offered"))
    }

    async fn get_snapshot(
        &self,
        _request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        Err(Status::unimplemented("snapshots are not offered"))
    }

    async fn controller_expand_volume(
        &self,
        _request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("a bucket has no size to expand"))
    }

    async fn controller_get_volume(
        &self,
        _request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented("ControllerGetVolume is not offered"))
    }

    async fn controller_modify_volume(
        &self,
        _request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented("volumes have no parameters to modify"))
    }
}

/// The size asked for: a prefix holds any amount, so the claim gets what it asked
/// (the required bytes, else the limit, else 0: "unknown").
fn requested_capacity(range: Option<&CapacityRange>) -> Result<i64, Status> {
    let Some(range) = range else { return Ok(0) };
    if range.required_bytes < 0 || range.limit_bytes < 0 {
        return Err(Status::invalid_argument("a capacity cannot be negative"));
    }
    if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
        return Err(Status::out_of_range("the required capacity is above the limit"));
    }
    Ok(if range.required_bytes > 0 { range.required_bytes } else { range.limit_bytes })
}

/// The capacity `claim` was made with, from its mark; `None` if it has none (not made by
/// `CreateVolume`, or deleted). A volume made before the mark moved beside the prefix
/// has it in its marker's metadata.
async fn recorded_capacity(store: &dyn ObjectStore, claim: &ClaimPrefix) -> Result<Option<String>, Status> {
    for key in [claim.mark_key(), claim.prefix.clone()] {
        match store.head(&key).await {
            Ok(info) => {
                if let Some(capacity) = info.metadata.as_ref().and_then(|m| m.user.get(CAPACITY_METADATA)) {
                    return Ok(Some(capacity.clone()));
                }
            }
            Err(StoreError::NotFound) => {}
            Err(error) => return Err(store_status(error)),
        }
    }
    Ok(None)
}

/// Deletes every key under `prefix` but the prefix's own marker; returns how many.
async fn delete_below(store: &dyn ObjectStore, prefix: &str) -> Result<usize, Status> {
    let mut deleted = 0;
    let mut continuation = None;
    loop {
        let page = store.list_recursive(prefix, continuation.take(), false).await.map_err(store_status)?;
        let keys: Vec<String> = page.objects.into_iter().map(|o| o.key).filter(|key| key != prefix).collect();
        for chunk in keys.chunks(MAX_DELETED_AT_ONCE) {
            let refused = store.delete_many(chunk).await.map_err(store_status)?;
            if let Some((key, error)) = refused.into_iter().next() {
                return Err(Status::internal(format!("the store refused to delete {key}: {error}")));
            }
            deleted += chunk.len();
        }
        match page.next_token {
            Some(token) => continuation = Some(token),
            None => return Ok(deleted),
        }
    }
}

/// A client for `bucket`, at the volume's endpoint (else the secret's, else the
/// controller's environment), signing with the secret's key (else the credential chain).
async fn store_for(
    bucket: &str,
    location: &VolumeSpec,
    secrets: &HashMap<String, String>,
) -> Result<Arc<S3Store>, Status> {
    let secret = VolumeSecret::new(secrets).map_err(Status::invalid_argument)?;
    let endpoint = location.endpoint_url.clone().or(secret.endpoint_url);
    let region = location.region.clone().or(secret.region);
    let mut flags: Vec<String> = Vec::new();
    if let Some(url) = endpoint {
        // The controller's few calls work in path style on every store; virtual-hosted
        // style fails on most that are not AWS.
        flags.extend(["--endpoint-url".into(), url, "--force-path-style".into()]);
    }
    flags.extend(region.into_iter().flat_map(|region| ["--region".to_owned(), region]));
    let args = crate::mount_args::mount_args_for(flags, &format!("s3://{bucket}/"))
        .map_err(|error| Status::invalid_argument(error.to_string()))?;
    let mut config = crate::mount_args::store_config(&args).map_err(|error| Status::internal(format!("{error:#}")))?;
    config.bucket = bucket.to_owned();
    config.credentials = secret.credentials;
    S3Store::new(&config).await.map_err(Status::internal)
}

fn no_volume(volume_id: &str) -> Status {
    Status::not_found(format!("no volume {volume_id}"))
}

/// What a refused store call means to the caller (the kubelet retries `Unavailable`).
fn store_status(error: StoreError) -> Status {
    let message = error.to_string();
    match error {
        StoreError::NotFound => Status::not_found(message),
        StoreError::NoSuchBucket(_) => Status::failed_precondition(message),
        StoreError::AccessDenied(_) => Status::permission_denied(message),
        StoreError::BadCredentials(_) | StoreError::NoCredentials(_) => Status::unauthenticated(message),
        _ if error.is_transient() => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_id_names_the_prefix_and_where_its_store_is() {
        let claim = |endpoint_url: Option<&str>, region: Option<&str>| ClaimPrefix {
            bucket: "b".into(),
            prefix: "base/pvc-1/".into(),
            endpoint_url: endpoint_url.map(str::to_owned),
            region: region.map(str::to_owned),
        };
        assert_eq!(claim(None, None).id(), "s3://b/base/pvc-1/");
        let far = claim(Some("http://minio.s:9000/x?y"), Some("eu-west-1"));
        assert_eq!(far.id(), "s3://b/base/pvc-1/?endpoint=http%3A%2F%2Fminio%2Es%3A9000%2Fx%3Fy&region=eu%2Dwest%2D1");
        for claim in [claim(None, None), claim(None, Some("r")), far] {
            assert_eq!(ClaimPrefix::from_id(&claim.id()), Some(claim));
        }
    }

    #[test]
    fn only_prefixes_below_a_bucket_are_volume_ids_of_ours() {
        for id in ["b/p/", "s3://b", "s3://b/", "s3://b//", "s3://b/p", "s3:///p/", "", "s3://b/p/?other=1"] {
            assert!(ClaimPrefix::from_id(id).is_none(), "{id}");
        }
    }

    #[test]
    fn a_claim_gets_the_size_it_asked_for() {
        let range = |required_bytes, limit_bytes| Some(CapacityRange { required_bytes, limit_bytes });
        assert_eq!(requested_capacity(None).ok(), Some(0));
        assert_eq!(requested_capacity(range(10, 0).as_ref()).ok(), Some(10));
        assert_eq!(requested_capacity(range(0, 20).as_ref()).ok(), Some(20));
        assert!(requested_capacity(range(30, 20).as_ref()).is_err());
        assert!(requested_capacity(range(-1, 0).as_ref()).is_err());
    }
}
