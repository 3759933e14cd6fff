//! Re-evaluation of waiting resizes after the node's capacity changed (KEP-3953 meets KEP-1287).
//!
//! A kubelet-driven resize that admission found Deferred or Infeasible was refused (in enforce
//! mode) and its desired resources stay in the container's resize record. When the capacity
//! watcher (`crate::capacity`, through [`OnCapacityChange`]) sees CPUs or memory come or go,
//! [`Engine::reevaluate_waiting`] admits each such record again against the node as it is now:
//!
//! - it **fits**: the desired resources are applied through the runtime link's
//!   `UpdateContainers` (the pod cgroup raised first where KEP ordering needs it, as for a
//!   kubelet update), and the record follows (`allocated` = desired, no state);
//!   `mode = "Observe"` only reports that it would;
//! - it **still does not fit**: the record keeps waiting, with the state (Deferred or
//!   Infeasible, which may have swapped) and the reason as of the new capacity.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{info, warn};

use super::{Engine, PodCgroupError, UpdateError};
use crate::capacity::OnCapacityChange;
use crate::clock::now_ms;
use crate::config::Mode;
use crate::model::{fields_changed, Container, LinuxResources, Pod};
use crate::policy::{plan_single, Admission, Limits, Quantities, ResizeState, Step};
use crate::state::{Reevaluation, ReevaluationOutcome};

/// Why a waiting resize that fits now could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}")]
    ReadPod(#[source] PodCgroupError),
    #[error("raising the pod cgroup first: {0}")]
    RaisePod(#[source] PodCgroupError),
    #[error(transparent)]
    Update(#[from] UpdateError),
}

/// The capacity watcher's hook: a capacity change re-evaluates the waiting resizes.
#[async_trait::async_trait]
impl OnCapacityChange for Engine {
    async fn capacity_changed(self: Arc<Self>, cause: &str) -> Vec<Reevaluation> {
        self.reevaluate_waiting(cause).await
    }
}

impl Engine {
    /// Container ids of the resizes waiting in Deferred or Infeasible, with their desired
    /// resources and state.
    fn waiting(&self) -> Vec<(String, LinuxResources, ResizeState)> {
        let mut v: Vec<_> = self
            .records
            .view()
            .containers()
            .into_iter()
            // A memory decrease waiting on reclaim is not a capacity question, and applying it
            // directly could OOM-kill: the staged decrease (or kubelet's retry) owns it.
            .filter(|(_, r)| !super::decrease::is_memory_decrease(r))
            .filter_map(|(id, r)| match (r.state, &r.desired) {
                (Some(s @ (ResizeState::Deferred | ResizeState::Infeasible)), Some(d)) => {
                    Some((id, d.clone(), s))
                }
                _ => None,
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Admission of one waiting resize against the node as it is now.
    fn readmit(&self, pod: &Pod, ctr: &Container, desired: &LinuxResources) -> Admission {
        self.admission(
            pod,
            &BTreeMap::from([(ctr.name.clone(), Quantities::from_linux(desired))]),
        )
    }

    /// Re-admits every waiting (Deferred / Infeasible) resize; applies those that fit now. See
    /// the module docs. `cause` names the capacity change, for the log and the record.
    pub async fn reevaluate_waiting(self: &Arc<Self>, cause: &str) -> Vec<Reevaluation> {
        let enforce = self.config().resize.mode == Mode::Enforce;
        let mut out = Vec::new();
        for (id, desired, before) in self.waiting() {
            let found = self.state.read_model(|m| {
                let c = m.container(&id)?.clone();
                Some((m.pod(&c.pod_id)?.clone(), c))
            });
            let Some((pod, ctr)) = found else {
                // The container went away; its record goes with it (and a reclaim checkpoint
                // of its, a file removal with an fsync).
                self.off_worker(move |e| e.forget_container(&id)).await;
                continue;
            };
            let subject = format!("{}/{}", pod.full_name(), ctr.name);
            // Without the capacity watcher's snapshot, admission reads the node's files.
            let verdict = {
                let (p, c, d) = (pod.clone(), ctr.clone(), desired.clone());
                self.off_worker(move |e| e.readmit(&p, &c, &d)).await
            };
            let (outcome, reason) = match verdict {
                Admission::Fits if !enforce => (
                    ReevaluationOutcome::WouldApply,
                    format!(
                        "fits after a node capacity change ({cause}); mode = observe: not applied"
                    ),
                ),
                Admission::Fits => match self.apply_waiting(&pod, &ctr, &desired).await {
                    Ok(()) => (ReevaluationOutcome::Applied, String::new()),
                    Err(e) => (ReevaluationOutcome::Failed, e.to_string()),
                },
                Admission::Deferred { reason } => (ReevaluationOutcome::Deferred, reason),
                Admission::Infeasible { reason } => (ReevaluationOutcome::Infeasible, reason),
            };
            match outcome {
                ReevaluationOutcome::Applied => {
                    info!(container = %subject, ?before, %cause, "waiting resize applied after a node capacity change");
                }
                ReevaluationOutcome::WouldApply => {
                    info!(container = %subject, ?before, %cause, "waiting resize would fit now (mode = observe)");
                    self.set_waiting(&id, before, &reason);
                }
                ReevaluationOutcome::Deferred | ReevaluationOutcome::Infeasible => {
                    let state = if outcome == ReevaluationOutcome::Deferred {
                        ResizeState::Deferred
                    } else {
                        ResizeState::Infeasible
                    };
                    info!(container = %subject, ?before, now = ?state, %reason, %cause, "waiting resize still does not fit");
                    self.set_waiting(
                        &id,
                        state,
                        &format!("{reason} (re-evaluated after {cause})"),
                    );
                }
                ReevaluationOutcome::Failed => {
                    warn!(container = %subject, ?before, error = %reason, "waiting resize fits now but could not be applied");
                    self.set_waiting(
                        &id,
                        before,
                        &format!("fits now, but applying it failed: {reason}"),
                    );
                }
            }
            out.push(Reevaluation {
                container_id: id,
                subject,
                before,
                outcome,
                reason,
            });
        }
        out
    }

    fn set_waiting(&self, id: &str, state: ResizeState, reason: &str) {
        self.records.update_container(id, |r| {
            r.state = Some(state);
            reason.clone_into(&mut r.reason);
            r.updated_ms = now_ms();
        });
    }

    /// Applies a waiting resize as the runtime would have for kubelet: the pod cgroup raised
    /// first where KEP ordering needs it, then the container through `UpdateContainers`.
    async fn apply_waiting(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
    ) -> Result<(), ApplyError> {
        if self.cgroups.is_some() {
            // cgroupfs reads and writes on a blocking thread: the capacity watcher's timeout
            // around the re-evaluation can fire while they are stuck.
            let (p, name, limits) = (pod.clone(), ctr.name.clone(), Limits::from_linux(desired));
            self.off_worker(move |e| {
                let current = e.current_pod(&p).map_err(ApplyError::ReadPod)?;
                if let Ok(Some(Step::SetPod(raise))) =
                    plan_single(&current, &name, &limits, &e.plan_options())
                {
                    e.write_pod(&p, &raise).map_err(ApplyError::RaisePod)?;
                }
                Ok::<(), ApplyError>(())
            })
            .await?;
        }
        // Only what changes: the fields the container already has belong to the request or to
        // other plugins (NRI gives each field one owner).
        let allocated = ctr.resources.clone().unwrap_or_default();
        self.update_through_runtime(&ctr.id, &fields_changed(&allocated, desired))
            .await?;
        let (id, d) = (ctr.id.clone(), desired.clone());
        self.off_worker(move |e| e.note_applied_update(&id, &d))
            .await;
        self.state.metrics.resize_outcome("in_place");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::capacity::snapshot::fixture::meminfo;
    use crate::cgroup::worker_check::{OffWorkerOnly, OnWorker};
    use crate::config::Config;
    use crate::model::{ContainerState, CpuResources, MemoryResources};
    use crate::nri::{Rejection, RuntimeLink};
    use crate::resize::fake_runtime::Connected;
    use crate::resize::node::NodeReader;
    use crate::state::NodeState;

    const GI: u64 = 1 << 30;

    fn guaranteed(millis: i64, mem: u64) -> LinuxResources {
        LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(millis * 100),
                period: Some(100_000),
                shares: Some(u64::try_from(millis * 1024 / 1000).expect("shares")),
                ..CpuResources::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(i64::try_from(mem).expect("mem")),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        }
    }

    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new(cpus: &str, mem_gib: u64) -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir_all(dir.path().join("sys/devices/system/cpu")).expect("mkdir");
            std::fs::create_dir_all(dir.path().join("proc")).expect("mkdir");
            let n = Node { dir };
            n.set(cpus, mem_gib);
            n
        }

        fn set(&self, cpus: &str, mem_gib: u64) {
            std::fs::write(
                self.dir.path().join("sys/devices/system/cpu/online"),
                format!("{cpus}\n"),
            )
            .expect("write");
            std::fs::write(
                self.dir.path().join("proc/meminfo"),
                meminfo(mem_gib * 1024 * 1024),
            )
            .expect("write");
        }
    }

    /// A node with two Guaranteed pods; `web/app` asks to grow.
    fn engine(node: &Node, mode: Mode) -> (Arc<NodeState>, Arc<Engine>) {
        let mut cfg = Config::default();
        cfg.resize.mode = mode;
        let state = NodeState::new(cfg);
        state.write_model(|m| {
            for (pod, ctr, res) in [
                ("p1", "c1", guaranteed(1000, GI)),
                ("p2", "c2", guaranteed(2000, 2 * GI)),
            ] {
                m.upsert_pod(Pod {
                    id: pod.into(),
                    namespace: "ns".into(),
                    name: if pod == "p1" { "web" } else { "db" }.into(),
                    ..Pod::default()
                });
                m.upsert_container(Container {
                    id: ctr.into(),
                    pod_id: pod.into(),
                    name: if pod == "p1" { "app" } else { "main" }.into(),
                    state: ContainerState::Running,
                    resources: Some(res),
                    ..Container::default()
                });
            }
        });
        let engine = Arc::new(Engine::new(
            state.clone(),
            RuntimeLink::default(),
            None,
            NodeReader::new(node.dir.path()),
            None,
        ));
        (state, engine)
    }

    fn ask(state: &NodeState, engine: &Arc<Engine>, res: &LinuxResources) -> Result<(), Rejection> {
        let (pod, ctr) = state.read_model(|m| {
            (
                m.pod("p1").cloned().expect("pod"),
                m.container("c1").cloned().expect("ctr"),
            )
        });
        engine
            .on_update(&pod, &ctr, res, &crate::nri::Deadline::none())
            .map(|_| ())
    }

    fn record(engine: &Engine) -> (Option<ResizeState>, String) {
        let r = engine.container_resizes().remove("c1").expect("record");
        (r.state, r.reason)
    }

    #[tokio::test(start_paused = true)]
    async fn deferred_resize_fits_after_cpus_come_online() {
        let node = Node::new("0-3", 16);
        let (state, engine) = engine(&node, Mode::Enforce);
        // 1 + 2 CPUs held; growing app to 3 needs 5 of 4.
        let err = ask(&state, &engine, &guaranteed(3000, GI)).expect_err("deferred");
        assert!(err.0.contains("Deferred"), "{}", err.0);
        assert_eq!(record(&engine).0, Some(ResizeState::Deferred));

        // Nothing changed: still deferred, reason refreshed.
        let out = engine.reevaluate_waiting("nothing").await;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].outcome, ReevaluationOutcome::Deferred);
        assert!(record(&engine).1.contains("re-evaluated after nothing"));

        // Two more CPUs: it fits. The runtime link is not connected here, so applying fails
        // and the record says so, still waiting in its state.
        node.set("0-5", 16);
        let out = engine.reevaluate_waiting("OnlineCpus 4 → 6").await;
        assert_eq!(out[0].outcome, ReevaluationOutcome::Failed, "{out:?}");
        assert!(out[0].reason.contains("UpdateContainers"), "{out:?}");
        let (st, reason) = record(&engine);
        assert_eq!(st, Some(ResizeState::Deferred));
        assert!(reason.starts_with("fits now"), "{reason}");
    }

    #[tokio::test]
    async fn infeasible_and_deferred_swap_with_capacity_and_observe_only_reports() {
        let node = Node::new("0-1", 16);
        let (state, engine) = engine(&node, Mode::Observe);
        // A 3-CPU limit on a 2-CPU node: Infeasible (observe mode lets the update through).
        ask(&state, &engine, &guaranteed(3000, GI)).expect("observe mode");
        assert_eq!(record(&engine).0, Some(ResizeState::Infeasible));

        // Four CPUs: the limit fits the node, but the other pod holds 2: Deferred now.
        node.set("0-3", 16);
        let out = engine.reevaluate_waiting("OnlineCpus 2 → 4").await;
        assert_eq!(out[0].outcome, ReevaluationOutcome::Deferred, "{out:?}");
        assert_eq!(out[0].before, ResizeState::Infeasible);
        assert_eq!(record(&engine).0, Some(ResizeState::Deferred));

        // Eight CPUs: fits; observe mode only says it would apply.
        node.set("0-7", 16);
        let out = engine.reevaluate_waiting("OnlineCpus 4 → 8").await;
        assert_eq!(out[0].outcome, ReevaluationOutcome::WouldApply, "{out:?}");
        assert_eq!(record(&engine).0, Some(ResizeState::Deferred));

        // Memory gone below the limit: Infeasible again, with the memory reason.
        node.set("0-7", 0);
        let out = engine.reevaluate_waiting("MemoryTotal down").await;
        assert_eq!(out[0].outcome, ReevaluationOutcome::Infeasible, "{out:?}");
        assert!(out[0].reason.contains("memory"), "{out:?}");
    }

    #[tokio::test]
    async fn a_deferred_resize_that_fits_now_is_applied_through_the_runtime() {
        let node = Node::new("0-3", 16);
        let (state, _) = engine(&node, Mode::Enforce);
        let link = RuntimeLink::default();
        let engine = Arc::new(Engine::new(
            state.clone(),
            link.clone(),
            None,
            NodeReader::new(node.dir.path()),
            None,
        ));
        let connected = Connected::start(&link).await;
        let runtime = Arc::clone(&connected.runtime);
        ask(&state, &engine, &guaranteed(3000, GI)).expect_err("deferred on 4 CPUs");
        node.set("0-5", 16);
        let out = engine.reevaluate_waiting("OnlineCpus 4 → 6").await;
        assert_eq!(out[0].outcome, ReevaluationOutcome::Applied, "{out:?}");

        // The runtime was asked for exactly the desired resources of that container.
        let updates = runtime.updates.lock().expect("lock").clone();
        assert_eq!(updates.len(), 1, "{updates:?}");
        let u = &updates[0].update[0];
        assert_eq!(u.container_id, "c1");
        let res = &u.linux.resources;
        let cpu = res.cpu.as_ref().expect("cpu");
        assert_eq!(cpu.quota.as_ref().map(|q| q.value), Some(300_000));
        assert_eq!(cpu.shares.as_ref().map(|q| q.value), Some(3072));
        // Nothing but what changes: period and memory limit are as they were, and no other
        // field is claimed (NRI gives each one owner).
        assert!(cpu.period.is_none(), "{cpu:?}");
        assert!(cpu.cpus.is_empty() && cpu.mems.is_empty(), "{cpu:?}");
        assert!(res.memory.is_none(), "{res:?}");
        assert!(res.hugepage_limits.is_empty(), "{res:?}");
        assert!(res.unified.is_empty(), "{res:?}");
        assert!(res.pids.is_none(), "{res:?}");
        // The model and the record follow: allocated = desired, nothing waiting.
        let r = engine.container_resizes().remove("c1").expect("record");
        assert_eq!(r.state, None, "{r:?}");
        assert_eq!(
            r.allocated.as_ref().and_then(LinuxResources::cpu_quota),
            Some(300_000)
        );
        assert_eq!(
            state
                .read_model(|m| m.container("c1").and_then(|c| c.resources.clone()))
                .and_then(|r| r.cpu_quota()),
            Some(300_000)
        );
        assert!(engine.reevaluate_waiting("again").await.is_empty());
        connected.close().await;
    }

    /// A cgroup v2 tree with pod `p1` (memory.max 1Gi) and its container `c1`, every call
    /// watched for the async worker ([`OffWorkerOnly`]).
    fn watched_cgroups() -> (tempfile::TempDir, crate::cgroup::Cgroups, OnWorker) {
        let root = tempfile::tempdir().expect("tempdir");
        for (dir, max) in [("kubepods/pod1", GI), ("kubepods/pod1/c1", GI)] {
            let dir = root.path().join(dir);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("memory.max"), format!("{max}\n")).expect("write");
            std::fs::write(dir.join("cpu.max"), "100000 100000\n").expect("write");
        }
        let (cgroups, on_worker) =
            OffWorkerOnly::wrap(crate::cgroup::Cgroups::V2(crate::cgroup::V2 {
                root: root.path().to_owned(),
            }));
        (root, cgroups, on_worker)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reevaluation_does_its_cgroup_io_off_the_async_worker() {
        let node = Node::new("0-3", 16);
        let (_root, cgroups, on_worker) = watched_cgroups();
        let (model, _) = engine(&node, Mode::Enforce);
        let state = NodeState::with_cgroups(Config::default(), Some(cgroups.clone()));
        let (pod, ctr) = model.read_model(|m| {
            let mut pod = m.pod("p1").cloned().expect("pod");
            pod.cgroup_parent = "/kubepods/pod1".into();
            let mut ctr = m.container("c1").cloned().expect("ctr");
            ctr.cgroups_path = "/kubepods/pod1/c1".into();
            (pod, ctr)
        });
        let other = model.read_model(|m| {
            (
                m.pod("p2").cloned().expect("pod"),
                m.container("c2").cloned().expect("ctr"),
            )
        });
        state.write_model(|m| {
            m.upsert_pod(pod.clone());
            m.upsert_container(ctr.clone());
            m.upsert_pod(other.0);
            m.upsert_container(other.1);
        });
        state.track(&pod, &ctr);
        let link = RuntimeLink::default();
        let engine = Arc::new(Engine::new(
            state.clone(),
            link.clone(),
            Some(cgroups),
            NodeReader::new(node.dir.path()),
            None,
        ));
        let connected = Connected::start(&link).await;
        // kubelet's update, as the NRI handler runs it: on a blocking thread.
        let asked = {
            let (state, engine) = (state.clone(), Arc::clone(&engine));
            tokio::task::spawn_blocking(move || ask(&state, &engine, &guaranteed(3000, GI)))
                .await
                .expect("update")
        };
        asked.expect_err("deferred on 4 CPUs");
        node.set("0-5", 16);
        let out = engine.reevaluate_waiting("OnlineCpus 4 → 6").await;
        assert_eq!(out[0].outcome, ReevaluationOutcome::Applied, "{out:?}");
        // The pod cgroup was read (and raised), and the container's read back to confirm.
        let confirmed = state.observed(|o| o.confirmations.get("c1").cloned());
        assert!(
            confirmed.is_some_and(|c| c.actual.is_some()),
            "the container's cgroup was read back"
        );
        assert_eq!(
            on_worker.lock().expect("lock").clone(),
            Vec::<String>::new(),
            "cgroup I/O on the async worker"
        );
        connected.close().await;
    }

    #[tokio::test]
    async fn removed_containers_are_forgotten() {
        let node = Node::new("0-3", 16);
        let (state, engine) = engine(&node, Mode::Enforce);
        ask(&state, &engine, &guaranteed(3000, GI)).expect_err("deferred");
        state.write_model(|m| m.remove_container("c1"));
        assert!(engine.reevaluate_waiting("x").await.is_empty());
        assert!(engine.container_resizes().is_empty());
    }
}
