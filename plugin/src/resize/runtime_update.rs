//! Updates the engine asks the runtime to apply (NRI `UpdateContainers`): a whole-pod step, a
//! staged decrease's limit, a waiting resize that fits after a capacity change. The runtime's
//! spec follows (what kubelet reads back as actual), then the model.

use std::time::Duration;

use super::Engine;
use crate::model::LinuxResources;
use crate::nri::{ContainerUpdate, LinkError};

/// How long an update waits for the runtime connection before failing as not connected.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Why the runtime did not apply an update.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The call to the runtime failed.
    #[error("runtime UpdateContainers: {source}")]
    Link {
        #[source]
        source: LinkError,
    },
    /// The runtime answered, listing the container as not updated.
    #[error("the runtime could not update the container")]
    NotUpdated,
    /// A newer update superseded the staged decrease that was about to apply this.
    #[error("superseded by a newer update before it was applied")]
    Superseded,
}

impl Engine {
    /// Asks the runtime to apply `resources` to container `id`; once applied, the model holds them.
    pub(super) async fn update_through_runtime(
        &self,
        id: &str,
        resources: &LinuxResources,
    ) -> Result<(), UpdateError> {
        // Work resumed at `Synchronize` can get here before the runtime answered
        // `RegisterPlugin` (which gives the link its client): wait for it, briefly.
        self.link.wait_connected(CONNECT_WAIT).await;
        // The swap limit moves with the memory limit (see `with_swap_following`).
        let resources = self.state.read_model(|m| {
            m.container(id)
                .and_then(|c| c.resources.as_ref())
                .map_or_else(
                    || resources.clone(),
                    |now| now.with_swap_following(resources),
                )
        });
        let failed = self
            .link
            .update_containers(
                &[ContainerUpdate {
                    container_id: id.to_string(),
                    resources: resources.clone(),
                    ignore_failure: false,
                }],
                &[],
            )
            .await
            .map_err(|source| UpdateError::Link { source })?;
        if !failed.is_empty() {
            return Err(UpdateError::NotUpdated);
        }
        self.state
            .write_model(|m| m.apply_resources(id, &resources));
        Ok(())
    }
}
