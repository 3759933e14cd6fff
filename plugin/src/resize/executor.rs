//! The whole-pod executor: drives a pod to its target one planned step at a time (pod cgroup
//! through cgroupfs, containers through NRI `UpdateContainers`), re-planning from the cgroups'
//! actual values after every step, so a newer request takes over mid-resize and a resumed resize
//! never applies a step twice. What a step leaves is read back and checked against the pod's
//! invariants: a step whose result breaks one, or cannot be read back, failed like a step the
//! runtime refused (a new plan from the actual state after a backoff, at most `max_attempts`).

use crate::backoff::Backoff;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::pod_cgroup::{update_resources, PodCgroupError};
use super::pod_checkpoint::checkpoint_key;
use super::pod_runs::Submitted;
use super::records::{from_snapshot, snapshot};
use super::runtime_update::UpdateError;
use super::{Engine, PodResize, ResizeError, SnapshotLimits, StepRecord};
use crate::model::Pod;
use crate::policy::{
    check_invariants, plan, Limit, PlanOptions, PodResources, ResizeState, Step, Violation,
};

/// Why a step of a whole-pod resize did not complete.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepFailure {
    /// Retried from a new plan, with backoff, up to `max_attempts`.
    #[error(transparent)]
    Failed(#[from] StepError),
    /// Cannot be done now (e.g. memory that cannot be reclaimed): the resize stops, Deferred.
    #[error("{0}")]
    Deferred(String),
    /// A newer request took over: re-plan at once.
    #[error("superseded by a newer request")]
    Superseded,
}

/// A step that failed, or whose result the executor cannot accept.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error("{source}")]
    WritePod {
        #[source]
        source: PodCgroupError,
    },
    #[error("container {name} is gone")]
    ContainerGone { name: String },
    #[error("{name}: {source}")]
    Update {
        name: String,
        #[source]
        source: UpdateError,
    },
    /// Reclaim before a memory decrease failed ([`super::reclaim`] says why in words).
    #[error("{0}")]
    Reclaim(String),
    /// The step was applied, but the cgroups cannot be read back to check it.
    #[error("applied, but the result cannot be read back: {source}")]
    Unreadable {
        #[source]
        source: PodCgroupError,
    },
    /// The step was applied, and the cgroups read back break an invariant.
    #[error("applied, but the result breaks an invariant: {violation}")]
    Broken { violation: Violation },
}

/// What a whole-pod record says when the daemon stopped it.
const STOPPED: &str =
    "stopped: nri-resize is stopping; the resize resumes from its checkpoint at the next start";

/// An executor in flight for a pod ([`Engine::run`]); dropped before its end (its task stopped
/// at shutdown) it clears the pod's running mark, so no later request of the pod waits for it.
struct Running<'a> {
    engine: &'a Engine,
    pod_id: &'a str,
    ended: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        self.engine.runs.end(self.pod_id);
        self.engine.records.update_pod(self.pod_id, |r| {
            STOPPED.clone_into(&mut r.reason);
        });
    }
}

impl Engine {
    /// Drives `pod` to `target` (the latest target wins if another request arrives meanwhile).
    pub(super) async fn run(
        self: &Arc<Self>,
        pod: Pod,
        target: SnapshotLimits,
        resumed: bool,
    ) -> Result<PodResize, ResizeError> {
        if self.runs.submit(&pod.id, target.clone()) == Submitted::Wait {
            // A reclaim for the older target must not hold the newer one up.
            self.reclaims.supersede_pod(&pod.id);
            return self.wait_for(&pod.id, &target).await;
        }
        // Dropped before its end (the daemon stops): the pod's later resizes and their waiters
        // must not wait for an executor that is gone.
        let mut guard = Running {
            engine: self.as_ref(),
            pod_id: &pod.id,
            ended: false,
        };
        let mut resumed = resumed;
        let result = loop {
            let result = self.execute(&pod, resumed).await;
            if self.shutdown.is_cancelled() {
                // Stopped, not done: the checkpoint stays for the next start.
                break Err(ResizeError::Stopping);
            }
            let done = self
                .records
                .view()
                .pod(&pod.id)
                .map(|r| r.target)
                .unwrap_or_default();
            if let Some(store) = self.checkpoints.clone() {
                let key = checkpoint_key(&pod.id);
                // A file removal and a directory fsync: blocking I/O.
                if let Err(e) = super::off_worker::off_worker(move || store.remove(&key)).await {
                    warn!(pod = %pod.full_name(), error = %e, "cannot remove the resize checkpoint");
                }
            }
            let again = result.is_ok() && !self.pod_gone(&pod.id);
            // A newer request came after the last plan (it waits for this executor).
            let newer = self.runs.next_or_end(&pod.id, &done, again);
            let Some(newer) = newer else {
                break result;
            };
            info!(pod = %pod.full_name(), "a newer resize request arrived as the last one finished: resizing again");
            let p = pod.clone();
            self.off_worker(move |e| e.checkpoint(&p, &newer)).await;
            resumed = false;
        };
        guard.ended = true;
        let result = result.and_then(|r| {
            if r.target == target {
                Ok(r)
            } else {
                Err(ResizeError::Failed(
                    "superseded by a newer resize request, which was applied instead".into(),
                ))
            }
        });
        // The pod was removed meanwhile (`forget_pod` came before the record's last update):
        // its record goes with it.
        if self.pod_gone(&pod.id) {
            self.records.remove_pod(&pod.id);
        }
        if matches!(result, Err(ResizeError::Stopping)) {
            self.runs.end(&pod.id);
        }
        result
    }

    fn pod_gone(&self, pod_id: &str) -> bool {
        self.state.read_model(|m| m.pod(pod_id).is_none())
    }

    /// Another executor runs for this pod and picked up `target`: wait until it is done.
    async fn wait_for(
        &self,
        pod_id: &str,
        target: &SnapshotLimits,
    ) -> Result<PodResize, ResizeError> {
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
                () = self.shutdown.cancelled() => return Err(ResizeError::Stopping),
            }
            if !self.runs.running(pod_id) {
                let r = self.records.view().pod(pod_id).unwrap_or_default();
                return if r.state.is_none() && &r.target == target {
                    Ok(r)
                } else {
                    Err(ResizeError::Failed(format!(
                        "superseded or failed: {}",
                        r.reason
                    )))
                };
            }
        }
    }

    /// Plans from the actual state, applies the steps one by one and checks each ([`Self::checked_step`]);
    /// a failed step, or one whose result breaks an invariant or cannot be read back, stops the
    /// plan and counts as a failed attempt: after a backoff the pod is planned again from where
    /// it stands, until `max_attempts`.
    async fn execute(self: &Arc<Self>, pod: &Pod, resumed: bool) -> Result<PodResize, ResizeError> {
        let cfg = self.config();
        let opts = self.plan_options();
        let full = pod.full_name();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut attempts = 0u32;
        let mut record = PodResize {
            pod_id: pod.id.clone(),
            pod: full.clone(),
            resumed,
            state: Some(ResizeState::InProgress),
            ..PodResize::default()
        };
        'replan: loop {
            if self.shutdown.is_cancelled() {
                // Stopping: the checkpoint stays, the next start resumes from the actual state.
                info!(pod = %full, "stopping: the whole-pod resize stays checkpointed");
                record.reason = STOPPED.into();
                self.records.put_pod(record.clone());
                return Err(ResizeError::Stopping);
            }
            let target = self.runs.target(&pod.id);
            record.target = target.clone();
            self.records.put_pod(record.clone());
            let current = self.current_or_end(pod, &mut record).await?;
            let steps = match plan(&current, &from_snapshot(&target), &opts) {
                Ok(p) => p.steps,
                Err(e) => {
                    self.end_in_error(&mut record, format!("no safe plan: {e}"));
                    return Err(ResizeError::Failed(record.reason));
                }
            };
            if steps.is_empty() {
                record.state = None;
                record.reason.clear();
                self.records.put_pod(record.clone());
                info!(pod = %full, steps = record.steps.len(), attempts, "whole-pod resize done");
                self.state.metrics.resize_outcome("in_place");
                return Ok(record);
            }
            for step in steps {
                if self.runs.superseded(&pod.id, &target) {
                    info!(pod = %full, "newer resize request: re-planning from the current state");
                    continue 'replan;
                }
                match self.checked_step(pod, &step, &opts, &mut record).await {
                    Ok(()) => {}
                    Err(StepFailure::Superseded) => continue 'replan,
                    Err(StepFailure::Deferred(reason)) => {
                        warn!(pod = %full, step = %step, %reason, "resize deferred");
                        record.state = Some(ResizeState::Deferred);
                        record.reason.clone_from(&reason);
                        self.records.put_pod(record.clone());
                        self.state.metrics.resize_outcome("deferred");
                        return Err(ResizeError::Refused {
                            state: ResizeState::Deferred,
                            reason,
                        });
                    }
                    Err(StepFailure::Failed(e)) => {
                        attempts += 1;
                        record.attempts = attempts;
                        warn!(pod = %full, step = %step, error = %e, attempts, "resize step failed; backing off");
                        if attempts >= cfg.resize.max_attempts {
                            let reason = format!("step {step} failed {attempts} times: {e}");
                            self.end_in_error(&mut record, reason);
                            self.state.metrics.resize_outcome("error");
                            return Err(ResizeError::Failed(record.reason));
                        }
                        record.reason = format!(
                            "step {step} failed (attempt {attempts} of {}): {e}; planning again from the actual state",
                            cfg.resize.max_attempts
                        );
                        self.records.put_pod(record.clone());
                        tokio::time::sleep(backoff.next_delay()).await;
                        continue 'replan;
                    }
                }
                if cfg.resize.step_pause_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(cfg.resize.step_pause_ms)).await;
                }
            }
        }
    }

    /// The pod as it stands, to plan from; unreadable, no plan can be made and `record` ends
    /// in `Error` like a step that failed for good.
    async fn current_or_end(
        self: &Arc<Self>,
        pod: &Pod,
        record: &mut PodResize,
    ) -> Result<PodResources, ResizeError> {
        let read = self.read_current_pod(pod).await;
        if let Err(e) = &read {
            warn!(pod = %record.pod, error = %e, "cannot read the pod to plan its resize");
            self.end_in_error(record, format!("cannot plan from the actual state: {e}"));
            self.state.metrics.resize_outcome("error");
        }
        read
    }

    /// Ends `record` in `Error` for `reason`: the executor returns next (and `run` removes the
    /// checkpoint, as after any resize that ended).
    fn end_in_error(&self, record: &mut PodResize, reason: String) {
        record.state = Some(ResizeState::Error);
        record.reason = reason;
        self.records.put_pod(record.clone());
    }

    /// Applies one step, reads the pod's cgroups back and checks the invariants on them; the
    /// step goes into the record with what was read. A step whose result breaks an invariant,
    /// or cannot be read back, failed.
    async fn checked_step(
        self: &Arc<Self>,
        pod: &Pod,
        step: &Step,
        opts: &PlanOptions,
        record: &mut PodResize,
    ) -> Result<(), StepFailure> {
        let applied = self.apply_step(pod, step).await;
        let p = pod.clone();
        let (actual, unreadable) = match self.off_worker(move |e| e.actual_pod(&p)).await {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(e)),
        };
        let violation = actual
            .as_ref()
            .and_then(|a| check_invariants(a, opts).err());
        let outcome = match (applied, unreadable, &violation) {
            (Err(failure), _, _) => Err(failure),
            (Ok(()), Some(source), _) => Err(StepError::Unreadable { source }.into()),
            (Ok(()), None, Some(v)) => Err(StepError::Broken {
                violation: v.clone(),
            }
            .into()),
            (Ok(()), None, None) => Ok(()),
        };
        record.steps.push(StepRecord {
            target: match step {
                Step::SetPod(_) => "pod".to_string(),
                Step::SetContainer { name, .. } => name.clone(),
            },
            step: step.to_string(),
            ok: outcome.is_ok(),
            error: outcome
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default(),
            actual: actual.as_ref().map(snapshot),
            violation: violation.map(|v| v.to_string()).unwrap_or_default(),
        });
        self.records.put_pod(record.clone());
        outcome
    }

    async fn apply_step(self: &Arc<Self>, pod: &Pod, step: &Step) -> Result<(), StepFailure> {
        match step {
            Step::SetPod(u) => {
                let (p, u) = (pod.clone(), *u);
                self.off_worker(move |e| e.write_pod(&p, &u))
                    .await
                    .map_err(|source| StepError::WritePod { source }.into())
            }
            Step::SetContainer { name, update } => {
                let ctr = self
                    .state
                    .read_model(|m| {
                        m.containers()
                            .filter(|c| c.pod_id == pod.id)
                            .find(|c| &c.name == name)
                            .cloned()
                    })
                    .ok_or_else(|| StepError::ContainerGone { name: name.clone() })?;
                // A memory decrease below usage: reclaim first (the pod cgroup, lowered by a
                // later step, waits for it).
                if let Some(Limit::Limited(target)) = update.memory {
                    self.reclaim_before_step(pod, &ctr, target).await?;
                }
                let resources = update_resources(update);
                self.update_through_runtime(&ctr.id, &resources)
                    .await
                    .map_err(|source| StepError::Update {
                        name: name.clone(),
                        source,
                    })?;
                // Records it and reads the container's cgroup back (blocking).
                let id = ctr.id.clone();
                self.off_worker(move |e| e.note_applied_update(&id, &resources))
                    .await;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cgroup::worker_check::{OffWorkerOnly, OnWorker};
    use crate::cgroup::{Cgroups, V2};
    use crate::config::Config;
    use crate::model::{Container, ContainerState, LinuxResources, MemoryResources};
    use crate::nri::RuntimeLink;
    use crate::resize::checkpoint::CheckpointStore;
    use crate::resize::fake_runtime::Connected;
    use crate::resize::node::NodeReader;
    use crate::resize::{ContainerTarget, PodResizeRequest};
    use crate::state::NodeState;

    const MI: u64 = 1 << 20;

    /// A v2 cgroup tree with pod `ns/web` (memory.max 512Mi) and its container `app` (256Mi in
    /// the model; its cgroup's `memory.max` as given), and an engine without a runtime
    /// connection (container steps fail) that gives up after two attempts.
    fn engine(app_memory_max: &str) -> (tempfile::TempDir, Arc<Engine>) {
        let (root, engine, _) = engine_with(app_memory_max, Config::default(), false);
        (root, engine)
    }

    /// [`engine`] with this configuration (`max_attempts` 2 all the same), a checkpoint
    /// directory (`<root>/state`), `app` tracked for confirmation, and with `watched` its cgroup
    /// I/O watched for the async worker ([`OffWorkerOnly`]).
    fn engine_with(
        app_memory_max: &str,
        mut cfg: Config,
        watched: bool,
    ) -> (tempfile::TempDir, Arc<Engine>, OnWorker) {
        let root = tempfile::tempdir().expect("tempdir");
        let write = |dir: &str, file: &str, value: &str| {
            let dir = root.path().join(dir);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join(file), format!("{value}\n")).expect("write");
        };
        write("kubepods/podA", "memory.max", &(512 * MI).to_string());
        write("kubepods/podA/app", "memory.max", app_memory_max);
        cfg.resize.max_attempts = 2;
        let mut cgroups = Cgroups::V2(V2 {
            root: root.path().to_owned(),
        });
        let mut on_worker = OnWorker::default();
        if watched {
            (cgroups, on_worker) = OffWorkerOnly::wrap(cgroups);
        }
        let state = NodeState::with_cgroups(cfg, Some(cgroups.clone()));
        state.write_model(|m| {
            m.upsert_pod(Pod {
                id: "pA".into(),
                namespace: "ns".into(),
                name: "web".into(),
                cgroup_parent: "/kubepods/podA".into(),
                ..Pod::default()
            });
            m.upsert_container(Container {
                id: "cA".into(),
                pod_id: "pA".into(),
                name: "app".into(),
                state: ContainerState::Running,
                cgroups_path: "/kubepods/podA/app".into(),
                resources: Some(LinuxResources {
                    memory: Some(MemoryResources {
                        limit: Some(256 << 20),
                        ..MemoryResources::default()
                    }),
                    ..LinuxResources::default()
                }),
                ..Container::default()
            });
        });
        state.read_model(|m| {
            let (pod, ctr) = (m.pod("pA").expect("pod"), m.container("cA").expect("ctr"));
            state.track(pod, ctr);
        });
        let store = CheckpointStore::open(root.path().join("state")).expect("checkpoints");
        let engine = Arc::new(Engine::new(
            state,
            RuntimeLink::default(),
            Some(cgroups),
            NodeReader::new(root.path().join("no-node")),
            Some(store),
        ));
        (root, engine, on_worker)
    }

    fn checkpoints(root: &tempfile::TempDir) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(root.path().join("state"))
            .expect("state dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| std::path::Path::new(n).extension() == Some("json".as_ref()))
            .collect();
        v.sort();
        v
    }

    /// `app` to 300Mi.
    fn grow_app_request() -> PodResizeRequest {
        PodResizeRequest {
            containers: BTreeMap::from([(
                "app".to_string(),
                ContainerTarget {
                    cpu_millis: None,
                    memory_bytes: Some(300 * MI),
                },
            )]),
        }
    }

    /// `app` to 300Mi: the plan raises the pod cgroup first, then writes the container.
    async fn grow_app(engine: &Arc<Engine>) -> (Result<PodResize, ResizeError>, PodResize) {
        let result = engine.resize_pod("ns", "web", &grow_app_request()).await;
        let record = engine.pod_resizes().pop().expect("a whole-pod record");
        (result, record)
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_that_leaves_an_invariant_broken_stops_the_plan_and_counts_as_an_attempt() {
        // The container's cgroup holds 1Gi (not what the model says): raising the pod to 556Mi
        // leaves the containers' sum above the pod.
        let (_root, engine) = engine(&(1024 * MI).to_string());
        let (result, record) = grow_app(&engine).await;
        assert!(matches!(result, Err(ResizeError::Failed(_))), "{result:?}");
        let first = &record.steps[0];
        assert_eq!(first.target, "pod", "{record:?}");
        assert!(!first.ok && first.error.contains("invariant"), "{first:?}");
        assert!(first.violation.contains("above"), "{first:?}");
        // The plan stopped there: the next step is the new plan's, counted as the second
        // attempt (the runtime is not connected), and the resize gave up.
        assert_eq!(record.steps.len(), 2, "{record:?}");
        assert_eq!(record.steps[1].target, "app");
        assert_eq!(record.attempts, 2);
        assert_eq!(record.state, Some(ResizeState::Error));
        assert!(record.reason.contains("failed 2 times"), "{record:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_removed_during_its_resize_leaves_no_record() {
        let (_root, engine) = engine(&(256 * MI).to_string());
        let running = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.resize_pod("ns", "web", &grow_app_request()).await }
        });
        // The executor has started (its record is there); paused time stands still meanwhile,
        // so it cannot have finished (a failed step backs off before the next attempt).
        while engine.pod_resizes().is_empty() {
            tokio::task::yield_now().await;
        }
        engine.state.write_model(|m| m.remove_pod("pA"));
        engine.forget_pod("pA");
        let result = running.await.expect("the resize task");
        assert!(result.is_err(), "{result:?}");
        assert_eq!(
            engine.pod_resizes(),
            Vec::new(),
            "the removed pod's record came back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_whose_result_cannot_be_read_back_stops_the_plan() {
        let (_root, engine) = engine("not a number");
        let (result, record) = grow_app(&engine).await;
        assert!(matches!(result, Err(ResizeError::Failed(_))), "{result:?}");
        let first = &record.steps[0];
        assert_eq!(first.target, "pod", "{record:?}");
        assert!(
            !first.ok && first.actual.is_none() && first.error.contains("read back"),
            "{first:?}"
        );
        assert_eq!(record.steps.len(), 2, "{record:?}");
        assert_eq!(record.attempts, 2);
        assert_eq!(record.state, Some(ResizeState::Error));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_whole_pod_resize_does_its_cgroup_io_off_the_async_worker() {
        let (root, engine, on_worker) =
            engine_with(&(256 * MI).to_string(), Config::default(), true);
        let connected = Connected::start(&engine.link).await;
        let (result, record) = grow_app(&engine).await;
        let done = result.expect("the resize is done");
        assert_eq!(record.state, None, "{record:?}");
        assert_eq!(done.steps.len(), 2, "pod, then app: {done:?}");
        // The container's cgroup was read back for its confirmation.
        let confirmed = engine
            .state
            .observed(|o| o.confirmations.get("cA").cloned());
        assert!(
            confirmed.is_some_and(|c| c.actual.is_some()),
            "the container's cgroup was read back"
        );
        assert_eq!(
            checkpoints(&root),
            Vec::<String>::new(),
            "checkpoint removed"
        );
        assert_eq!(
            on_worker.lock().expect("lock").clone(),
            Vec::<String>::new(),
            "cgroup I/O on the async worker"
        );
        connected.close().await;
    }

    /// A config whose executor pauses a minute after every step (paused time: the test decides
    /// when the pause ends).
    fn pausing() -> Config {
        let mut cfg = Config::default();
        cfg.resize.step_pause_ms = 60_000;
        cfg
    }

    /// Waits until the executor has done its first step (it then pauses).
    async fn first_step(engine: &Arc<Engine>) {
        while !engine.pod_resizes().iter().any(|r| !r.steps.is_empty()) {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_resize_whose_caller_went_away_runs_to_its_end_and_the_next_one_runs() {
        let (root, engine, _) = engine_with(&(256 * MI).to_string(), pausing(), false);
        let connected = Connected::start(&engine.link).await;
        let caller = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.resize_pod("ns", "web", &grow_app_request()).await }
        });
        first_step(&engine).await;
        // The API client disconnects: its request (this task) is dropped mid-plan.
        caller.abort();
        assert!(caller.await.expect_err("aborted").is_cancelled());
        // The resize goes on without it: the pause ends, the container step runs, the record
        // ends done and the checkpoint goes.
        tokio::time::timeout(Duration::from_secs(3600), async {
            while engine.pod_resizes()[0].state.is_some() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
        .await
        .expect("the resize ends without its caller");
        let record = engine.pod_resizes().pop().expect("record");
        assert_eq!(record.steps.len(), 2, "{record:?}");
        assert!(record.steps.iter().all(|s| s.ok), "{record:?}");
        assert_eq!(
            checkpoints(&root),
            Vec::<String>::new(),
            "checkpoint removed"
        );
        // The pod's next resize is not left waiting on the request that went away.
        let next = PodResizeRequest {
            containers: BTreeMap::from([(
                "app".to_string(),
                ContainerTarget {
                    cpu_millis: None,
                    memory_bytes: Some(320 * MI),
                },
            )]),
        };
        let again = tokio::time::timeout(
            Duration::from_secs(3600),
            engine.resize_pod("ns", "web", &next),
        )
        .await
        .expect("the next resize of the pod ends");
        assert!(again.is_ok(), "{again:?}");
        connected.close().await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_a_resize_under_way_and_keeps_its_checkpoint() {
        let (root, engine, _) = engine_with(&(256 * MI).to_string(), pausing(), false);
        let connected = Connected::start(&engine.link).await;
        let caller = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.resize_pod("ns", "web", &grow_app_request()).await }
        });
        first_step(&engine).await;
        // SIGTERM: the engine's tasks end, the resize among them.
        engine.shutdown().await;
        let result = caller.await.expect("the caller");
        assert!(matches!(result, Err(ResizeError::Stopping)), "{result:?}");
        let record = engine.pod_resizes().pop().expect("record");
        assert_eq!(
            record.steps.len(),
            1,
            "stopped after its first step: {record:?}"
        );
        assert!(record.reason.contains("stopping"), "{record:?}");
        assert_eq!(
            checkpoints(&root),
            vec!["pod-pA.json".to_string()],
            "the checkpoint stays for the next start"
        );
        // Nothing waits on it, and a request after shutdown is refused at once.
        assert!(!engine.runs.running("pA"));
        let late = engine.resize_pod("ns", "web", &grow_app_request()).await;
        assert!(matches!(late, Err(ResizeError::Stopping)), "{late:?}");
        connected.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_during_a_steps_reclaim_leaves_no_reclaim_and_no_gauge_behind() {
        // `app` uses 200Mi of page cache that the fixture's cgroup never gives back: lowering
        // it to 100Mi reclaims (until the minute's timeout) before the container step.
        let (root, engine, _) = engine_with(&(256 * MI).to_string(), Config::default(), false);
        let app = root.path().join("kubepods/podA/app");
        std::fs::write(app.join("memory.current"), format!("{}\n", 200 * MI)).expect("write");
        std::fs::write(
            app.join("memory.stat"),
            format!("anon 0\nfile {}\nshmem 0\n", 200 * MI),
        )
        .expect("write");
        let connected = Connected::start(&engine.link).await;
        let in_progress = |engine: &Engine| {
            engine
                .state
                .metrics
                .encode()
                .expect("metrics")
                .lines()
                .find(|l| l.starts_with("nri_resize_memory_decrease_reclaims_in_progress "))
                .map(ToString::to_string)
        };
        let caller = tokio::spawn({
            let engine = Arc::clone(&engine);
            let shrink = PodResizeRequest {
                containers: BTreeMap::from([(
                    "app".to_string(),
                    ContainerTarget {
                        cpu_millis: None,
                        memory_bytes: Some(100 * MI),
                    },
                )]),
            };
            async move { engine.resize_pod("ns", "web", &shrink).await }
        });
        while engine.reclaims.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            in_progress(&engine).as_deref(),
            Some("nri_resize_memory_decrease_reclaims_in_progress 1")
        );
        // SIGTERM mid-reclaim: the resize ends (it does not re-plan into a new reclaim that the
        // cancelled token ends at once, for ever), leaving no handle and no gauge behind.
        engine.shutdown().await;
        // (The bound only turns a hang into a failure.)
        let result = tokio::time::timeout(Duration::from_secs(60), caller)
            .await
            .expect("the resize ends at shutdown")
            .expect("the caller");
        assert!(matches!(result, Err(ResizeError::Stopping)), "{result:?}");
        assert!(engine.reclaims.is_empty(), "a reclaim handle leaked");
        assert_eq!(
            in_progress(&engine).as_deref(),
            Some("nri_resize_memory_decrease_reclaims_in_progress 0")
        );
        assert_eq!(checkpoints(&root), vec!["pod-pA.json".to_string()]);
        connected.close().await;
    }

    /// `app` to `mib` MiB.
    fn app_to(mib: u64) -> PodResizeRequest {
        PodResizeRequest {
            containers: BTreeMap::from([(
                "app".to_string(),
                ContainerTarget {
                    cpu_millis: None,
                    memory_bytes: Some(mib * MI),
                },
            )]),
        }
    }

    /// Audit: a step's reclaim put its handle in place of the one in flight for the container
    /// (here a kubelet-path reclaim toward a refused limit) without cancelling it, so two
    /// reclaimers worked on one cgroup.
    #[tokio::test(start_paused = true)]
    async fn a_steps_reclaim_cancels_the_reclaim_it_replaces() {
        let mut cfg = Config::default();
        // The reclaim gives up at its first pass (the fixture's cgroup gives nothing back).
        cfg.memory_decrease.timeout_ms = 0;
        let (root, engine, _) = engine_with(&(256 * MI).to_string(), cfg, false);
        let app = root.path().join("kubepods/podA/app");
        std::fs::write(app.join("memory.current"), format!("{}\n", 200 * MI)).expect("write");
        std::fs::write(
            app.join("memory.stat"),
            format!("anon 0\nfile {}\nshmem 0\n", 200 * MI),
        )
        .expect("write");
        let older = engine
            .reclaims
            .toward_in_flight_for_test("pA", "cA", 150 * MI, 256 * MI);
        let result = engine.resize_pod("ns", "web", &app_to(100)).await;
        assert!(
            matches!(
                result,
                Err(ResizeError::Refused {
                    state: ResizeState::Deferred,
                    ..
                })
            ),
            "the step's reclaim ran and timed out: {result:?}"
        );
        assert!(
            older.is_cancelled(),
            "the reclaim the step replaced goes on beside it"
        );
    }

    /// Audit: a step lowering a container's memory whose usage could not be read went ahead, and
    /// the runtime wrote the limit unchecked (on v2, below anonymous usage: an OOM kill).
    #[tokio::test(start_paused = true)]
    async fn a_decrease_whose_usage_cannot_be_read_is_deferred_and_never_written() {
        // The fixture's `app` has no `memory.current`: its usage cannot be read.
        let (_root, engine, _) = engine_with(&(256 * MI).to_string(), Config::default(), false);
        let connected = Connected::start(&engine.link).await;
        let result = engine.resize_pod("ns", "web", &app_to(100)).await;
        let record = engine.pod_resizes().pop().expect("record");
        assert!(
            matches!(
                result,
                Err(ResizeError::Refused {
                    state: ResizeState::Deferred,
                    ..
                })
            ),
            "{result:?}"
        );
        assert_eq!(record.state, Some(ResizeState::Deferred), "{record:?}");
        assert!(
            record.reason.contains("app") && record.reason.contains("memory.current"),
            "the reason names the container and the read that failed: {record:?}"
        );
        assert_eq!(
            connected.runtime.updates.lock().expect("lock").len(),
            0,
            "the runtime was asked to write the decrease"
        );
        connected.close().await;
    }

    /// Audit: a re-plan whose read of the pod cgroup failed returned with the record still
    /// `InProgress`, for ever.
    #[tokio::test(start_paused = true)]
    async fn a_replan_that_cannot_read_the_pod_cgroup_ends_the_record_in_error() {
        let (root, engine, _) = engine_with(&(256 * MI).to_string(), pausing(), false);
        let caller = tokio::spawn({
            let engine = Arc::clone(&engine);
            async move { engine.resize_pod("ns", "web", &grow_app_request()).await }
        });
        first_step(&engine).await;
        // The pod cgroup becomes unreadable: the container step fails (no runtime, and its
        // result cannot be read back), and the plan after its backoff cannot read the pod.
        std::fs::write(
            root.path().join("kubepods/podA/memory.max"),
            "not a number\n",
        )
        .expect("write");
        let result = caller.await.expect("the caller");
        assert!(result.is_err(), "{result:?}");
        let record = engine.pod_resizes().pop().expect("record");
        assert_eq!(record.state, Some(ResizeState::Error), "{record:?}");
        assert!(record.reason.contains("pod cgroup"), "{record:?}");
        assert_eq!(
            checkpoints(&root),
            Vec::<String>::new(),
            "checkpoint removed, as after any failed resize"
        );
    }
}
