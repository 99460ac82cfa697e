//! The CSI Identity service: the driver's name and version, what else it serves (a
//! Controller), and whether it is ready.

use tonic::{Request, Response, Status};

use super::proto::identity_server::Identity;
use super::proto::plugin_capability::{service, Service, Type};
use super::proto::*;

pub struct IdentityService;

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: super::DRIVER_NAME.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let controller = PluginCapability {
            r#type: Some(Type::Service(Service { r#type: service::Type::ControllerService as i32 })),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse { capabilities: vec![controller] }))
    }

    async fn probe(&self, _request: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        // Serving calls is all it takes: mounts and stores are checked per volume.
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}
