//! Decoding of every request payload the plugin service serves, into domain types, the way the
//! service does: exposed for the fuzz targets (`ttrpc_decoder`), which feed it arbitrary bytes.

use nri_resize_proto::api as pb;
use protobuf::{Message, MessageField};

use super::convert;

/// Every `Plugin` service request [`decode_plugin_request`] decodes, and the runtime's
/// `UpdateContainers`.
#[doc(hidden)]
pub const DECODED_METHODS: [&str; 19] = [
    "Configure",
    "Synchronize",
    "CreateContainer",
    "UpdateContainer",
    "StopContainer",
    "StateChange",
    "RunPodSandbox",
    "UpdatePodSandbox",
    "PostUpdatePodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "PostUpdateContainer",
    "RemoveContainer",
    "ValidateContainerAdjustment",
    "UpdateContainers",
    "Shutdown",
];

/// Why a request payload could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The payload is not a valid message of the method's request type.
    #[error("{method}: {source}")]
    Parse {
        method: String,
        #[source]
        source: protobuf::Error,
    },
    /// The plugin service serves no such method.
    #[error("unknown method {0}")]
    UnknownMethod(String),
}

fn parse<M: Message>(method: &str, payload: &[u8]) -> Result<M, DecodeError> {
    M::parse_from_bytes(payload).map_err(|source| DecodeError::Parse {
        method: method.to_string(),
        source,
    })
}

/// The pod (and container) as the service converts them; a count so nothing is optimized away.
fn pod(p: &MessageField<pb::PodSandbox>) -> usize {
    p.as_ref()
        .map(convert::pod_from_pb)
        .map_or(0, |p| p.annotations.len())
}

fn pod_ctr(p: &MessageField<pb::PodSandbox>, c: &MessageField<pb::Container>) -> usize {
    pod(p)
        + c.as_ref()
            .map(convert::container_from_pb)
            .map_or(0, |c| c.annotations.len())
}

fn resources(r: &MessageField<pb::LinuxResources>) -> usize {
    usize::from(r.as_ref().map(convert::resources_from_pb).is_some())
}

/// Decodes one request payload of `method` (see [`DECODED_METHODS`]).
#[doc(hidden)]
pub fn decode_plugin_request(method: &str, payload: &[u8]) -> Result<usize, DecodeError> {
    let m = method;
    Ok(match method {
        "Configure" => parse::<pb::ConfigureRequest>(m, payload)?.config.len(),
        "Synchronize" => {
            let r: pb::SynchronizeRequest = parse(m, payload)?;
            r.pods.iter().map(convert::pod_from_pb).count()
                + r.containers.iter().map(convert::container_from_pb).count()
        }
        "CreateContainer" => {
            let r: pb::CreateContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "UpdateContainer" => {
            let r: pb::UpdateContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container) + resources(&r.linux_resources)
        }
        "StopContainer" => {
            let r: pb::StopContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "StateChange" => {
            let r: pb::StateChangeEvent = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "RunPodSandbox" => pod(&parse::<pb::RunPodSandboxRequest>(m, payload)?.pod),
        "UpdatePodSandbox" => {
            let r: pb::UpdatePodSandboxRequest = parse(m, payload)?;
            pod(&r.pod) + resources(&r.overhead_linux_resources) + resources(&r.linux_resources)
        }
        "PostUpdatePodSandbox" => pod(&parse::<pb::PostUpdatePodSandboxRequest>(m, payload)?.pod),
        "StopPodSandbox" => pod(&parse::<pb::StopPodSandboxRequest>(m, payload)?.pod),
        "RemovePodSandbox" => pod(&parse::<pb::RemovePodSandboxRequest>(m, payload)?.pod),
        "PostCreateContainer" => {
            let r: pb::PostCreateContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "StartContainer" => {
            let r: pb::StartContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "PostStartContainer" => {
            let r: pb::PostStartContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "PostUpdateContainer" => {
            let r: pb::PostUpdateContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "RemoveContainer" => {
            let r: pb::RemoveContainerRequest = parse(m, payload)?;
            pod_ctr(&r.pod, &r.container)
        }
        "ValidateContainerAdjustment" => {
            let r: pb::ValidateContainerAdjustmentRequest = parse(m, payload)?;
            let adjusted = r
                .adjust
                .as_ref()
                .and_then(|a| a.linux.as_ref())
                .and_then(|l| l.resources.as_ref())
                .map(convert::resources_from_pb);
            pod_ctr(&r.pod, &r.container) + usize::from(adjusted.is_some())
        }
        "UpdateContainers" => {
            let r: pb::UpdateContainersRequest = parse(m, payload)?;
            r.update.iter().map(convert::update_from_pb).count()
        }
        "Shutdown" => {
            parse::<pb::Empty>(m, payload)?;
            0
        }
        other => return Err(DecodeError::UnknownMethod(other.to_string())),
    })
}
