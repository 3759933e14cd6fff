//! What domain code implements to hear from the runtime: a [`Handler`] whose methods all have
//! no-op defaults, and an explicit [`EventSet`] naming the events it implements. The set becomes the
//! NRI subscription mask, so the runtime never calls the plugin for events it ignores.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::version::RuntimeNri;
use crate::model::{Container, EventKind, LinuxResources, Pod};

/// Default per-request deadline of NRI runtimes (used until `Configure` says otherwise).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A set of subscribed events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventSet(u32);

impl EventSet {
    pub const fn empty() -> Self {
        EventSet(0)
    }

    #[must_use]
    pub const fn with(self, e: EventKind) -> Self {
        EventSet(self.0 | Self::bit(e))
    }

    const fn bit(e: EventKind) -> u32 {
        1 << (e as u32 - 1)
    }

    pub fn contains(self, e: EventKind) -> bool {
        e != EventKind::Synchronize && self.0 & Self::bit(e) != 0
    }

    /// NRI's subscription mask (`ConfigureResponse.events`).
    pub fn mask(self) -> i32 {
        i32::try_from(self.0).unwrap_or(0)
    }

    /// The set as the runtime can honour it: runtimes before NRI v0.10 reject unknown bits, so
    /// the pod-level events (12–14) are dropped unless it accepts them
    /// (`RuntimeNri::accepts_pod_events`).
    #[must_use]
    pub fn for_runtime(self, accepts_pod_events: bool) -> Self {
        if accepts_pod_events {
            self
        } else {
            EventSet(self.0 & ((1 << 11) - 1))
        }
    }
}

impl FromIterator<EventKind> for EventSet {
    fn from_iter<I: IntoIterator<Item = EventKind>>(iter: I) -> Self {
        iter.into_iter().fold(EventSet::empty(), EventSet::with)
    }
}

/// What the runtime told us about itself in `Configure`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeInfo {
    pub name: String,
    pub version: String,
    /// NRI version of the runtime, as it announced it in `Configure` (NRI v0.12+; else empty).
    pub nri_version: String,
    /// Per-request deadline the runtime enforces, in milliseconds (0 when not announced).
    pub request_timeout_ms: i64,
    pub registration_timeout_ms: i64,
}

impl RuntimeInfo {
    /// The runtime's NRI version as nri-resize determines it: announced, else inferred from the
    /// runtime's name and version (`nri::version::detect`).
    pub fn nri(&self) -> RuntimeNri {
        super::version::detect(&self.name, &self.version, &self.nri_version)
    }

    /// The runtime's NRI version and where it came from: `v0.11.0 (inferred from cri-o 1.36.3)`.
    pub fn nri_description(&self) -> String {
        self.nri().describe(&self.name, &self.version)
    }

    /// The runtime's per-request deadline: as announced, else NRI's default (2 s).
    pub fn request_timeout(&self) -> Duration {
        u64::try_from(self.request_timeout_ms)
            .ok()
            .filter(|ms| *ms > 0)
            .map_or(DEFAULT_REQUEST_TIMEOUT, Duration::from_millis)
    }

    /// How long a handler may take: 3/4 of the runtime's deadline, so that the fail-open answer
    /// reaches the runtime before it drops the plugin.
    pub fn handler_budget(&self) -> Duration {
        budget_within(self.request_timeout())
    }
}

/// The handler budget within a runtime deadline of `request_timeout`: 3/4 of it.
pub(crate) fn budget_within(request_timeout: Duration) -> Duration {
    request_timeout * 3 / 4
}

/// A resource update for an existing container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerUpdate {
    pub container_id: String,
    pub resources: LinuxResources,
    /// Ask the runtime not to fail the whole request if this update fails.
    #[serde(default)]
    pub ignore_failure: bool,
}

/// A container the runtime should stop (the orchestrator restarts it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eviction {
    pub container_id: String,
    pub reason: String,
}

/// Answer to `CreateContainer`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateReply {
    /// Resources to change on the container being created (`None`: as requested).
    pub adjust: Option<LinuxResources>,
    pub updates: Vec<ContainerUpdate>,
    pub evictions: Vec<Eviction>,
}

/// Answer to `UpdateContainer`: further updates (possibly of the same container, to change what
/// is applied) and evictions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpdateReply {
    pub updates: Vec<ContainerUpdate>,
    pub evictions: Vec<Eviction>,
}

/// A refusal the runtime sees as the failed request (creation or update fails with this text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection(pub String);

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Rejection {}

/// Domain-side NRI callbacks. Every method has a no-op default; [`Handler::events`] must name
/// the events the implementation cares about (only those are subscribed). `configure`,
/// `synchronize` and `shutdown` are always called.
///
/// Each call must finish within the runtime's deadline (2 s by default); the transport cuts a
/// call off at three quarters of it and answers fail-open, so work that may take longer belongs
/// in a task of its own that reports back through [`super::RuntimeLink`].
#[async_trait]
#[expect(
    unused_variables,
    reason = "default no-op bodies ignore their arguments"
)]
pub trait Handler: Send + Sync + 'static {
    /// The events this handler implements.
    fn events(&self) -> EventSet;

    /// The runtime passed its info and the plugin's configuration text (may be empty).
    async fn configure(&self, runtime: &RuntimeInfo, config: &str) -> Result<(), Rejection> {
        Ok(())
    }

    /// The runtime's full state, on every (re)connect (split replies are already joined).
    async fn synchronize(
        &self,
        pods: Vec<Pod>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, Rejection> {
        Ok(Vec::new())
    }

    /// The runtime is shutting down.
    async fn shutdown(&self) {}

    async fn run_pod_sandbox(&self, pod: Pod) -> Result<(), Rejection> {
        Ok(())
    }
    /// `resources` (with `overhead` apart) is what the update asks for the pod; `pod` still
    /// holds the current resources. Work within the call stays inside `deadline` (see
    /// [`Deadline`](super::Deadline)).
    async fn update_pod_sandbox(
        &self,
        pod: Pod,
        overhead: Option<LinuxResources>,
        resources: Option<LinuxResources>,
        deadline: super::Deadline,
    ) -> Result<(), Rejection> {
        Ok(())
    }
    /// `update_pod_sandbox` of `pod` asking for `resources` (with `overhead` apart) did not
    /// answer within the runtime's deadline. The transport answers fail-open — the runtime
    /// applies the update and kubelet writes the pod cgroup — unless this returns a refusal: a
    /// handler that guards pod memory decreases refuses one it could not check (on cgroup v2 a
    /// pod `memory.max` below usage is an OOM kill); kubelet asks again.
    fn undecided_pod_memory_decrease(
        &self,
        pod: &Pod,
        overhead: Option<&LinuxResources>,
        resources: &LinuxResources,
    ) -> Option<Rejection> {
        None
    }
    async fn post_update_pod_sandbox(&self, pod: Pod) {}
    async fn stop_pod_sandbox(&self, pod: Pod) {}
    async fn remove_pod_sandbox(&self, pod: Pod) {}

    async fn create_container(
        &self,
        pod: Pod,
        container: Container,
    ) -> Result<CreateReply, Rejection> {
        Ok(CreateReply::default())
    }
    async fn post_create_container(&self, pod: Pod, container: Container) {}
    async fn start_container(&self, pod: Pod, container: Container) {}
    async fn post_start_container(&self, pod: Pod, container: Container) {}
    /// `resources` is what the update asks for; `container` still holds the current resources.
    /// Work that outlives the call checks `deadline` before acting on its answer (see
    /// [`Deadline`](super::Deadline)).
    async fn update_container(
        &self,
        pod: Pod,
        container: Container,
        resources: LinuxResources,
        deadline: super::Deadline,
    ) -> Result<UpdateReply, Rejection> {
        Ok(UpdateReply::default())
    }
    /// `update_container` of `container_id` (`subject` as logs name it) did not answer within
    /// the runtime's deadline, and the update lowers the container's memory limit. The
    /// transport answers fail-open — the runtime applies the update as asked — unless this
    /// returns a refusal. A memory decrease nobody checked is not harmless (on cgroup v2 the
    /// kernel OOM-kills inside the runtime's write), so a handler that guards decreases refuses
    /// it; kubelet asks again on a later sync.
    fn undecided_memory_decrease(&self, container_id: &str, subject: &str) -> Option<Rejection> {
        None
    }
    async fn post_update_container(&self, pod: Pod, container: Container) {}
    async fn stop_container(&self, pod: Pod, container: Container) -> Vec<ContainerUpdate> {
        Vec::new()
    }
    async fn remove_container(&self, pod: Pod, container: Container) {}
    /// Another plugin's adjustments to a container being created; `Err` rejects the creation.
    async fn validate_container_adjustment(
        &self,
        pod: Pod,
        container: Container,
        adjusted: Option<LinuxResources>,
    ) -> Result<(), Rejection> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_follow_nri_numbering() {
        let set: EventSet = [
            EventKind::RunPodSandbox,
            EventKind::CreateContainer,
            EventKind::UpdateContainer,
        ]
        .into_iter()
        .collect();
        assert_eq!(set.mask(), 0b1000_1001);
        assert!(set.contains(EventKind::CreateContainer));
        assert!(!set.contains(EventKind::StopContainer));
        assert!(!set.contains(EventKind::Synchronize));
    }

    #[test]
    fn old_runtimes_get_only_events_they_know() {
        let set: EventSet = EventKind::ALL.into_iter().collect();
        assert_eq!(set.mask(), (1 << 14) - 1);
        let old = set.for_runtime(false);
        assert_eq!(old.mask(), (1 << 11) - 1);
        assert!(!old.contains(EventKind::UpdatePodSandbox));
        assert_eq!(set.for_runtime(true), set);
    }
}
