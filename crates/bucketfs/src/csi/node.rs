//! The CSI Node service: mounts a volume at the target path the kubelet names for a pod
//! (`NodePublishVolume`), and stores what was written, then unmounts
//! (`NodeUnpublishVolume`). Each mount is a `bucketfs mount` daemon started in the
//! background, in its own session, so it keeps serving while the driver restarts; the
//! records in [`Publications`] let the restarted driver recognise it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::proto::node_server::Node;
use super::proto::volume_capability::AccessType;
use super::proto::*;
use super::publications::{Publication, Publications};
use super::volume::{check_capability, VolumeSecret, VolumeSpec};

pub struct NodeService {
    pub node_id: String,
    /// The `bucketfs` executable that runs the mounts (this one).
    pub bucketfs: PathBuf,
    pub publications: Arc<Publications>,
}

/// What is at a target path now.
enum TargetState {
    NotMounted,
    Mounted,
    /// A mount whose daemon is gone ("Transport endpoint is not connected").
    Dead,
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let volume_id = required(&request.volume_id, "volume_id")?;
        let target = target_path(&request.target_path)?;
        let capability = request.volume_capability.as_ref().ok_or_else(|| missing("volume_capability"))?;
        let reader_mode = check_capability(capability).map_err(Status::invalid_argument)?;
        let mount_flags = match &capability.access_type {
            Some(AccessType::Mount(mount)) => mount.mount_flags.as_slice(),
            _ => &[],
        };
        let spec = VolumeSpec::new(&request.volume_context, mount_flags, request.readonly || reader_mode)
            .map_err(Status::invalid_argument)?;
        let secret = VolumeSecret::new(&request.secrets).map_err(Status::invalid_argument)?;

        let work_dir = self
            .publications
            .work_dir(volume_id)
            .map_err(|error| Status::internal(format!("making the work directory of volume {volume_id}: {error}")))?;
        let arguments = spec.mount_arguments(&target, &self.publications.log_file(&target), &work_dir);
        let publication = Publication { volume_id: volume_id.to_owned(), target, arguments };
        let (bucketfs, publications) = (self.bucketfs.clone(), self.publications.clone());
        let source = spec.source();
        run_to_the_end(async move {
            let _serialised = publications.lock(&publication.target).await;
            publish(&bucketfs, &publications, &publication, &source, secret).await
        })
        .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let request = request.into_inner();
        let volume_id = required(&request.volume_id, "volume_id")?;
        let target = target_path(&request.target_path)?;
        let publications = self.publications.clone();
        let volume_id = volume_id.to_owned();
        run_to_the_end(async move {
            let _serialised = publications.lock(&target).await;
            unpublish(&publications, &volume_id, &target).await
        })
        .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // No staging, no stats, no expansion: a bucket has nothing to format or resize.
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities: Vec::new() }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }

    async fn node_stage_volume(
        &self,
        _request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented("bucketfs volumes are not staged"))
    }

    async fn node_unstage_volume(
        &self,
        _request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented("bucketfs volumes are not staged"))
    }

    async fn node_get_volume_stats(
        &self,
        _request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("a bucket has no capacity to report"))
    }

    async fn node_expand_volume(
        &self,
        _request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("a bucket has no size to expand"))
    }
}

/// Mounts `publication` (under its target's lock), unless it is mounted already.
async fn publish(
    bucketfs: &Path,
    publications: &Publications,
    publication: &Publication,
    source: &str,
    secret: VolumeSecret,
) -> Result<(), Status> {
    let target = &publication.target;
    match target_state(target).await? {
        TargetState::Mounted => {
            return if publications.read(target).as_ref() == Some(publication) {
                Ok(())
            } else {
                Err(Status::already_exists(format!(
                    "{} already has a mount that is not volume {} with these options",
                    target.display(),
                    publication.volume_id
                )))
            };
        }
        TargetState::Dead => {
            tracing::warn!(target = %target.display(), "the daemon of this mount is gone; mounting again");
            detach(target).await?;
        }
        TargetState::NotMounted => {}
    }
    std::fs::create_dir_all(target)
        .map_err(|error| Status::internal(format!("creating {}: {error}", target.display())))?;
    let mut command = Command::new(bucketfs);
    command.arg("mount").args(&publication.arguments).envs(secret.environment());
    // The key goes through a pipe: in the environment, /proc/PID/environ would show it.
    let key = secret.credentials.as_ref().map(crate::mount_args::credentials::text);
    if key.is_some() {
        command.arg("--credentials-from-stdin");
    }
    let output = blocking(move || output_with_input(command, key.as_deref().unwrap_or_default()))
        .await?
        .map_err(|error| Status::internal(format!("starting bucketfs mount: {error}")))?;
    if !output.status.success() {
        let message = String::from_utf8_lossy(&output.stderr);
        let message = message.trim().trim_start_matches("bucketfs: error: ");
        return Err(Status::internal(format!("mounting {source}: {message}")));
    }
    publications.write(publication).map_err(|error| {
        Status::internal(format!("recording the mount of {} in the state directory: {error}", target.display()))
    })?;
    tracing::info!(volume_id = publication.volume_id, target = %target.display(), source, "published");
    Ok(())
}

/// Runs `command` to its end with `input` on its standard input; its output.
fn output_with_input(mut command: Command, input: &str) -> std::io::Result<std::process::Output> {
    use std::io::Write as _;
    use std::process::Stdio;
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A mount that fails before reading it says why on stderr.
        let _ = stdin.write_all(input.as_bytes());
    }
    child.wait_with_output()
}

/// Stores what was written to `target`'s mount, unmounts it and removes the directory
/// (under its target's lock).
async fn unpublish(publications: &Publications, volume_id: &str, target: &Path) -> Result<(), Status> {
    match target_state(target).await? {
        TargetState::Mounted => {
            // Returns once the daemon has stored every file and exited.
            let unmount_target = target.to_owned();
            blocking(move || crate::mounts::unmount(&unmount_target))
                .await?
                .map_err(|error| Status::internal(format!("{error:#}")))?;
        }
        TargetState::Dead => detach(target).await?,
        TargetState::NotMounted => {}
    }
    // The CSI spec: the plugin removes the target path it created.
    match std::fs::remove_dir(target) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(Status::internal(format!("removing {}: {error}", target.display())));
        }
        _ => {}
    }
    publications.remove(target).map_err(|error| Status::internal(error.to_string()))?;
    tracing::info!(volume_id, target = %target.display(), "unpublished");
    Ok(())
}

/// Runs `work` as a task of its own: a call the kubelet gives up on (its deadline) does
/// not cut a mount or an unmount short, and its retry waits on the target's lock for
/// this one to end.
async fn run_to_the_end(
    work: impl std::future::Future<Output = Result<(), Status>> + Send + 'static,
) -> Result<(), Status> {
    tokio::spawn(work).await.map_err(|error| Status::internal(error.to_string()))?
}

pub(super) fn required<'a>(value: &'a str, name: &str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(missing(name))
    } else {
        Ok(value)
    }
}

/// The kubelet names target paths in full; the mount table is matched on them as given.
fn target_path(path: &str) -> Result<PathBuf, Status> {
    let path = PathBuf::from(required(path, "target_path")?);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(Status::invalid_argument(format!("target_path {} is not an absolute path", path.display())))
    }
}

pub(super) fn missing(name: &str) -> Status {
    Status::invalid_argument(format!("{name} is missing"))
}

/// Runs `work` (a child process, a stat of a mount point) off the gRPC workers.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(work).await.map_err(|error| Status::internal(error.to_string()))
}

async fn target_state(target: &Path) -> Result<TargetState, Status> {
    let target = target.to_owned();
    blocking(move || {
        let mounted = crate::mounts::is_mount_point(&target).map_err(|error| Status::internal(format!("{error:#}")))?;
        if !mounted {
            return Ok(TargetState::NotMounted);
        }
        match std::fs::metadata(&target) {
            Err(error) if error.raw_os_error() == Some(libc::ENOTCONN) => Ok(TargetState::Dead),
            _ => Ok(TargetState::Mounted),
        }
    })
    .await?
}

/// Detaches a mount whose daemon is gone (nothing is left to store).
async fn detach(target: &Path) -> Result<(), Status> {
    let mut command = Command::new("fusermount3");
    command.arg("-u").arg("-z").arg(target);
    let output = blocking(move || command.output())
        .await?
        .map_err(|error| Status::internal(format!("running fusermount3: {error}")))?;
    if output.status.success() {
        Ok(())
    } else {
        let reason = String::from_utf8_lossy(&output.stderr);
        Err(Status::internal(format!("detaching {}: {}", target.display(), reason.trim())))
    }
}
