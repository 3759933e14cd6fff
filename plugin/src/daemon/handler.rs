//! The daemon's NRI handler: keeps the [`Model`](crate::model::Model) and the event
//! [`Journal`](crate::model::Journal) of the [`NodeState`] in step with the runtime. The model
//! work is in-memory under short locks (microseconds); whatever touches a file (cgroup reads
//! and writes, checkpoints, the resize engine's decisions) runs off the async workers ([`crate::resize::off_worker::logged`]), so the
//! transport's deadline can always fire and answer fail-open.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::{debug, info, warn};

use crate::resize::off_worker::logged as off_worker;

use crate::model::{Container, ContainerState, EventKind, LinuxResources, Pod};
use crate::nri::{
    ContainerUpdate, CreateReply, Deadline, EventSet, Handler, Rejection, RuntimeInfo, UpdateReply,
};
use crate::resize::node::NodeReader;
use crate::resize::pod_level::PodLevel;
use crate::resize::read_back::ReadBacks;
use crate::resize::Engine;
use crate::state::NodeState;
use crate::sync::ReadWriteLocked as _;

/// See the module docs.
#[derive(Debug, Clone)]
pub struct ModelHandler {
    state: Arc<NodeState>,
    engine: Option<Arc<Engine>>,
    /// Cgroup read-backs that follow the answer instead of delaying it (shared with
    /// `pod_level`).
    read_backs: Arc<ReadBacks>,
    /// `UpdatePodSandbox` and `PostUpdatePodSandbox`, decided in the resize domain.
    pod_level: PodLevel,
}

impl ModelHandler {
    pub fn new(state: Arc<NodeState>) -> Self {
        let read_backs = Arc::<ReadBacks>::default();
        ModelHandler {
            pod_level: PodLevel::new(Arc::clone(&state), Arc::clone(&read_backs)),
            state,
            engine: None,
            read_backs,
        }
    }

    /// With working-set trimming consulted by pod-level admission, through an owner of reclaim
    /// of its own (tests without an engine; the daemon's comes from the engine).
    #[cfg(test)]
    #[must_use]
    pub(super) fn with_trimmer(mut self, trimmer: crate::trim::Trimmer) -> Self {
        let engine = Engine::detached_for_test(Arc::clone(&self.state)).with_trimmer(trimmer);
        self.pod_level = engine.pod_level(self.pod_level);
        self
    }

    /// With the pod cgroup read back at `after` following an accepted `UpdatePodSandbox`
    /// (tests: none, to see the record before any read-back, or a short schedule).
    #[cfg(test)]
    #[must_use]
    pub(super) fn with_pod_read_back(mut self, after: &'static [Duration]) -> Self {
        self.pod_level = self.pod_level.with_read_back_after(after);
        self
    }

    /// With node capacity read for pod-level admission (`/` on a node).
    #[must_use]
    pub fn with_node(mut self, node: NodeReader) -> Self {
        self.pod_level = self.pod_level.with_node(node);
        self
    }

    /// Waits, at most `within`, for the read-backs started after answers.
    pub async fn settle(&self, within: Duration) {
        self.read_backs.settle(within).await;
    }

    /// With the resize engine deciding kubelet-driven updates.
    #[must_use]
    pub fn with_engine(mut self, engine: Arc<Engine>) -> Self {
        self.pod_level = engine.pod_level(self.pod_level);
        self.engine = Some(engine);
        self
    }

    fn container_event(&self, event: EventKind, pod: Pod, ctr: Container) {
        debug!(event = event.as_str(), pod = %pod.full_name(), container = %ctr.name, id = %ctr.id, "container event");
        self.state
            .record(event, &pod, Some(&ctr), ctr.resources.clone());
        self.state.track(&pod, &ctr);
        self.state.write_model(|m| {
            m.upsert_pod(pod);
            m.upsert_container(ctr);
        });
    }

    /// A pod's nri-resize annotations in a spelling of before 2026-11-25, read as the current
    /// one: logged when the runtime announces the pod (`RunPodSandbox`, or `Synchronize` after a
    /// (re)connection), once per pod and session, not at every resize.
    fn warn_deprecated_spellings(pod: &Pod) {
        for d in crate::policy::deprecated_spellings(&pod.annotations) {
            warn!(pod = %pod.full_name(), annotation = %d.annotation, written = %d.written, current = d.current, "deprecated annotation spelling accepted; write the current one");
        }
    }

    fn pod_event(&self, event: EventKind, pod: Pod) {
        debug!(event = event.as_str(), pod = %pod.full_name(), id = %pod.id, "pod event");
        self.state.record(event, &pod, None, pod.resources.clone());
        self.state.write_model(|m| m.upsert_pod(pod));
    }
}

#[async_trait]
impl Handler for ModelHandler {
    fn events(&self) -> EventSet {
        use EventKind as E;
        [
            E::RunPodSandbox,
            E::StopPodSandbox,
            E::RemovePodSandbox,
            E::UpdatePodSandbox,
            E::PostUpdatePodSandbox,
            E::CreateContainer,
            E::PostCreateContainer,
            E::StartContainer,
            E::PostStartContainer,
            E::UpdateContainer,
            E::PostUpdateContainer,
            E::StopContainer,
            E::RemoveContainer,
        ]
        .into_iter()
        .collect()
    }

    async fn configure(&self, runtime: &RuntimeInfo, config: &str) -> Result<(), Rejection> {
        let effective = if config.trim().is_empty() {
            self.state.file_config.clone()
        } else {
            let origin = format!("the runtime ({} {})", runtime.name, runtime.version);
            let (cfg, ignored) = self
                .state
                .file_config
                .runtime_overlay(config, &origin)
                .map_err(|e| Rejection(e.to_string()))?;
            for key in &ignored {
                warn!(key = %key, %origin, "configuration key from the runtime ignored: it cannot change while the daemon runs (set it in --config)");
            }
            cfg
        };
        self.state
            .journal(|j| j.set_capacity(effective.journal_size));
        info!(
            journal_size = effective.journal_size,
            mode = ?effective.resize.mode,
            "configuration in effect"
        );
        self.state
            .metrics
            .set_cadvisor_duplicates(effective.metrics.cadvisor_duplicates);
        self.state.metrics.set_mode(effective.resize.mode);
        *self.state.config.write_locked() = effective;
        Ok(())
    }

    async fn synchronize(
        &self,
        pods: Vec<Pod>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, Rejection> {
        let sync_pod = Pod {
            id: String::new(),
            name: format!("{} pods, {} containers", pods.len(), containers.len()),
            ..Pod::default()
        };
        for pod in &pods {
            Self::warn_deprecated_spellings(pod);
        }
        self.state.retrack(&pods, &containers);
        self.state.retain_pod_levels(&pods);
        let present: Vec<String> = pods.iter().map(|p| p.id.clone()).collect();
        self.state.write_model(|m| m.rebuild(pods, containers));
        if let Some(engine) = &self.engine {
            let engine = Arc::clone(engine);
            // Forgets the records of pods that are gone, then reads the checkpoint directory.
            off_worker("resume checkpoints", move || {
                engine.retain_pods(&present);
                engine.resume_checkpointed();
            })
            .await;
        }
        self.state
            .record(EventKind::Synchronize, &sync_pod, None, None);
        Ok(Vec::new())
    }

    async fn run_pod_sandbox(&self, pod: Pod) -> Result<(), Rejection> {
        Self::warn_deprecated_spellings(&pod);
        self.pod_event(EventKind::RunPodSandbox, pod);
        Ok(())
    }

    async fn update_pod_sandbox(
        &self,
        mut pod: Pod,
        overhead: Option<LinuxResources>,
        resources: Option<LinuxResources>,
        deadline: Deadline,
    ) -> Result<(), Rejection> {
        let asked = resources.is_some();
        let verdict = match &resources {
            Some(r) => {
                self.pod_level
                    .admit_update(&pod, overhead.as_ref(), r, &deadline)
                    .await
            }
            None => Ok(()),
        };
        if resources.is_some() {
            pod.resources = resources;
        }
        if overhead.is_some() {
            pod.overhead = overhead;
        }
        if verdict.is_err() {
            // Refused: the runtime keeps the pod as it was, and so does the model.
            self.state.record(
                EventKind::UpdatePodSandbox,
                &pod,
                None,
                pod.resources.clone(),
            );
            return verdict;
        }
        let admitted = pod.clone();
        self.pod_event(EventKind::UpdatePodSandbox, pod);
        if asked {
            // The pod cgroup is read back after the answer: CRI-O sends no
            // PostUpdatePodSandbox, and kubelet 1.36 writes the cgroup after this call.
            self.pod_level.follow_update(admitted);
        }
        Ok(())
    }

    fn undecided_pod_memory_decrease(
        &self,
        pod: &Pod,
        overhead: Option<&LinuxResources>,
        resources: &LinuxResources,
    ) -> Option<Rejection> {
        self.pod_level
            .refuse_undecided_decrease(pod, overhead, resources)
    }

    async fn post_update_pod_sandbox(&self, mut pod: Pod) {
        // containerd sends the sandbox's creation-time resources here; the model keeps what
        // the accepted `UpdatePodSandbox` asked for.
        if let Some(known) = self.state.read_model(|m| m.pod(&pod.id).cloned()) {
            pod.resources = known.resources;
            pod.overhead = known.overhead;
        }
        self.pod_event(EventKind::PostUpdatePodSandbox, pod.clone());
        self.pod_level.confirm(&pod).await;
    }

    async fn stop_pod_sandbox(&self, pod: Pod) {
        self.pod_event(EventKind::StopPodSandbox, pod);
    }

    async fn remove_pod_sandbox(&self, pod: Pod) {
        debug!(pod = %pod.full_name(), id = %pod.id, "pod removed");
        self.state
            .record(EventKind::RemovePodSandbox, &pod, None, None);
        self.state.untrack_pod(&pod.id);
        self.state.forget_pod_level(&pod);
        self.state.write_model(|m| m.remove_pod(&pod.id));
        if let Some(engine) = &self.engine {
            // After the model forgot the pod: a whole-pod resize ending now sees it gone and
            // leaves no record. Removes reclaim checkpoints of leftover containers, if any.
            let (engine, id) = (Arc::clone(engine), pod.id.clone());
            off_worker("forget pod", move || engine.forget_pod(&id)).await;
        }
    }

    async fn create_container(
        &self,
        pod: Pod,
        mut ctr: Container,
    ) -> Result<CreateReply, Rejection> {
        if ctr.state == ContainerState::Unknown {
            ctr.state = ContainerState::Created;
        }
        self.container_event(EventKind::CreateContainer, pod, ctr);
        Ok(CreateReply::default())
    }

    async fn post_create_container(&self, pod: Pod, ctr: Container) {
        self.container_event(EventKind::PostCreateContainer, pod, ctr);
    }

    async fn start_container(&self, pod: Pod, ctr: Container) {
        self.container_event(EventKind::StartContainer, pod, ctr);
    }

    async fn post_start_container(&self, pod: Pod, ctr: Container) {
        let id = ctr.id.clone();
        self.container_event(EventKind::PostStartContainer, pod, ctr);
        // The runtime has written the container's limits by now: its actual values, read back
        // once the runtime has its answer. (The observer's first read of a new cgroup can come
        // before runc wrote them.)
        let state = Arc::clone(&self.state);
        let rb_id = id.clone();
        self.read_backs.start("confirm", &rb_id, move || {
            state.confirm(&id, None);
        });
    }

    async fn update_container(
        &self,
        pod: Pod,
        ctr: Container,
        resources: LinuxResources,
        deadline: Deadline,
    ) -> Result<UpdateReply, Rejection> {
        debug!(pod = %pod.full_name(), container = %ctr.name, "update requested");
        self.state.record(
            EventKind::UpdateContainer,
            &pod,
            Some(&ctr),
            Some(resources.clone()),
        );
        let reply = match &self.engine {
            Some(engine) => {
                // The engine reads (and may write) cgroups: off the workers, sharing the
                // runtime's deadline so that a late decision acts on nothing.
                let (engine, p, c, r) = (
                    Arc::clone(engine),
                    pod.clone(),
                    ctr.clone(),
                    resources.clone(),
                );
                off_worker("update", move || engine.on_update(&p, &c, &r, &deadline))
                    .await
                    .ok_or_else(|| Rejection("the resize decision failed".into()))??
            }
            None => UpdateReply::default(),
        };
        // What the runtime will apply: the request, adjusted by the engine's reply.
        let mut expected = resources;
        if let Some(u) = reply.updates.iter().find(|u| u.container_id == ctr.id) {
            expected.merge(&u.resources);
        }
        self.state.expect_update(&ctr.id, &expected);
        self.state.write_model(|m| {
            m.upsert_pod(pod);
            m.upsert_container(ctr);
        });
        Ok(reply)
    }

    fn undecided_memory_decrease(&self, container_id: &str, subject: &str) -> Option<Rejection> {
        self.engine
            .as_ref()?
            .refuse_undecided_decrease(container_id, subject)
    }

    async fn post_update_container(&self, pod: Pod, ctr: Container) {
        let id = ctr.id.clone();
        self.container_event(EventKind::PostUpdateContainer, pod, ctr);
        if let Some(engine) = &self.engine {
            if let Some(c) = self.state.read_model(|m| m.container(&id).cloned()) {
                engine.applied(&c);
            }
        }
        // Confirmation: what the update asked vs what the cgroup now says. The request is taken
        // now, in memory; the read-back runs once the runtime has its answer, so that the CRI
        // call kubelet waits on does not wait for it too.
        let taken = self.state.take_update(&id);
        let state = Arc::clone(&self.state);
        let rb_id = id.clone();
        self.read_backs.start("confirm", &rb_id, move || {
            state.confirm_taken(&id, taken);
        });
    }

    async fn stop_container(&self, pod: Pod, mut ctr: Container) -> Vec<ContainerUpdate> {
        ctr.state = ContainerState::Stopped;
        // A read-back of this container still running sees its cgroup before runc stops it.
        self.read_backs.finish(&ctr.id).await;
        if let Some(engine) = &self.engine {
            // Ends a staged decrease, if any (its checkpoint goes: file I/O, off the workers).
            let (engine, id) = (Arc::clone(engine), ctr.id.clone());
            off_worker("stopped", move || engine.container_stopped(&id)).await;
        }
        self.container_event(EventKind::StopContainer, pod, ctr);
        Vec::new()
    }

    async fn remove_container(&self, pod: Pod, ctr: Container) {
        debug!(pod = %pod.full_name(), container = %ctr.name, id = %ctr.id, "container removed");
        // Everything in memory first, before any await: the transport's deadline can cut the
        // call short at an await, and what it skipped would never be cleaned up. A read-back
        // still running finds the container untracked and records nothing.
        self.state
            .record(EventKind::RemoveContainer, &pod, Some(&ctr), None);
        self.state.untrack(&ctr.id);
        self.state.write_model(|m| m.remove_container(&ctr.id));
        let staged = self
            .engine
            .as_ref()
            .is_some_and(|e| e.forget_container_in_memory(&ctr.id));
        self.read_backs.finish(&ctr.id).await;
        if let (true, Some(engine)) = (staged, &self.engine) {
            // Its staged decrease's checkpoint goes (file I/O, off the workers).
            let (engine, id) = (Arc::clone(engine), ctr.id.clone());
            off_worker("forget", move || engine.remove_reclaim_checkpoint(&id)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn pod() -> Pod {
        Pod {
            id: "p1".into(),
            namespace: "ns".into(),
            name: "pod".into(),
            ..Pod::default()
        }
    }

    fn ctr() -> Container {
        Container {
            id: "c1".into(),
            pod_id: "p1".into(),
            name: "app".into(),
            state: ContainerState::Running,
            ..Container::default()
        }
    }

    /// `RemoveContainer` cut short by the runtime's deadline while it waits for a read-back that
    /// hangs (a stuck cgroupfs): the container is still forgotten — untracked, out of the model.
    #[tokio::test]
    async fn a_remove_cut_short_at_its_deadline_still_forgets_the_container() {
        let state = NodeState::new(Config::default());
        let handler = ModelHandler::new(Arc::clone(&state));
        handler.container_event(EventKind::StartContainer, pod(), ctr());
        assert!(state.read_model(|m| m.container("c1").is_some()));
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        handler.read_backs.start("test", "c1", move || {
            let _ = stuck.recv();
        });
        let cut = tokio::time::timeout(
            Duration::from_millis(50),
            handler.remove_container(pod(), ctr()),
        )
        .await;
        assert!(cut.is_err(), "the remove waited for the stuck read-back");
        assert!(
            state.read_model(|m| m.container("c1").is_none()),
            "still in the model"
        );
        assert!(
            state.observed(|o| !o.targets.contains_key("c1")),
            "still tracked"
        );
        release.send(()).expect("release the read-back");
    }
}
