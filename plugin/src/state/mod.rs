//! Node state: what the NRI handler, the resize engine, the capacity watcher and the status API
//! share — the [`Model`] and the event [`Journal`], the configuration, the observer's view of the
//! containers (observations and desired-vs-actual confirmations), pod-level records, the
//! checkpoint directory's status, the node's capacity as last seen and admission's node reserve.
//!
//! Lives below everything that uses it: it imports none of `api`, `capacity`, `daemon`, `nri` or
//! `resize` (`tests/architecture.rs` checks). Its methods are in-memory work under short locks,
//! plus the cgroup read-back of a confirmation.

mod capacity;
mod caps;
mod confirm;
#[cfg(test)]
mod fixtures;
mod observed;
mod pod_level;
mod reevaluation;
mod reserve;
mod state_dir;
mod verdict;
mod verdict_history;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};

pub use capacity::{
    CapacityChange, CapacityResource, ChangeKind, LastChange, NodeStatus, PinnedContainer,
};
pub use caps::RECHECK_EVERY_TICKS;
pub use confirm::{desired_matches, differences, TakenUpdate};
pub use observed::{Confirmation, ContainerObservation, Observed, ObserverInfo, Target};
pub use pod_level::{limits_differences, limits_text, PodLevelStatus};
pub use reevaluation::{Reevaluation, ReevaluationOutcome};
pub use reserve::{NodeReserve, ReserveSource, ReserveStatus};
pub use state_dir::StateDirStatus;
pub use verdict::{counter_sample, ResizeVerdict, Verdicts};

use crate::cgroup::Cgroups;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::{Container, EventKind, EventRecord, Journal, LinuxResources, Model, Pod};
use crate::observer::ReclaimWatch;
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// State shared by the handler, the API and the daemon.
#[derive(Debug)]
pub struct NodeState {
    pub model: RwLock<Model>,
    pub journal: Mutex<Journal>,
    /// Configuration from `--config` (before the runtime's overlay).
    pub file_config: Config,
    /// Configuration in effect.
    pub config: RwLock<Config>,
    /// cgroup reads for resize confirmation; `None`: confirmation off.
    pub cgroups: Option<Cgroups>,
    /// Watched containers, their observations and desired-vs-actual confirmations.
    pub observed: Mutex<Observed>,
    /// Set once the observer has started.
    pub observer_loaded: Arc<AtomicBool>,
    /// The observer's fallbacks as `/readyz` says them (`program: reason`).
    pub observer_fallbacks: Arc<RwLock<Vec<String>>>,
    /// The observer's eBPF map memory in bytes as `/readyz` says it (0: no maps).
    pub observer_map_bytes: Arc<AtomicU64>,
    pub observer_info: RwLock<Option<ObserverInfo>>,
    /// Holds the observer's memcg event counter attached while nri-resize reclaims: every
    /// reclaim in flight takes a guard (the trimmer's pauses and turns); the observer binds it.
    pub reclaim_watch: ReclaimWatch,
    pub metrics: Arc<Metrics>,
    /// Where `/metrics` is served (port 0 resolved).
    pub metrics_addr: RwLock<Option<SocketAddr>>,
    /// The checkpoint directory and its problems.
    pub state_dir: Mutex<StateDirStatus>,
    /// The node's capacity as the capacity watcher last saw it.
    pub capacity: RwLock<Option<NodeStatus>>,
    /// Pod-level resources (KEP-5419): desired vs actual per pod id.
    pub pod_level: Mutex<HashMap<String, PodLevelStatus>>,
    /// Counter history, pending and recorded verdicts on applied resizes.
    pub verdicts: Mutex<Verdicts>,
    /// Admission's node reserve and its comparison with kubelet's, once checked.
    pub reserve: RwLock<Option<ReserveStatus>>,
}

impl NodeState {
    pub fn new(file_config: Config) -> Arc<Self> {
        Self::with_cgroups(file_config, None)
    }

    /// With cgroup reads for resize confirmation.
    pub fn with_cgroups(file_config: Config, cgroups: Option<Cgroups>) -> Arc<Self> {
        let metrics = Metrics::new().expect("metric names are unique and valid");
        metrics.set_cadvisor_duplicates(file_config.metrics.cadvisor_duplicates);
        metrics.set_mode(file_config.resize.mode);
        Arc::new(NodeState {
            model: RwLock::new(Model::default()),
            journal: Mutex::new(Journal::new(file_config.journal_size)),
            config: RwLock::new(file_config.clone()),
            file_config,
            cgroups,
            observed: Mutex::new(Observed::default()),
            observer_loaded: Arc::new(AtomicBool::new(false)),
            observer_fallbacks: Arc::new(RwLock::new(Vec::new())),
            observer_map_bytes: Arc::default(),
            observer_info: RwLock::new(None),
            reclaim_watch: ReclaimWatch::default(),
            metrics: Arc::new(metrics),
            metrics_addr: RwLock::new(None),
            state_dir: Mutex::new(StateDirStatus::default()),
            capacity: RwLock::new(None),
            pod_level: Mutex::new(HashMap::new()),
            verdicts: Mutex::new(Verdicts::default()),
            reserve: RwLock::new(None),
        })
    }

    /// What admission keeps back from the node: kubelet's reserve when its configuration was
    /// read, else `[resize] reserved_memory` / `reserved_cpu`.
    pub fn node_reserve(&self) -> NodeReserve {
        if let Some(r) = self
            .reserve
            .read_locked()
            .as_ref()
            .and_then(ReserveStatus::from_kubelet)
        {
            return r;
        }
        let cfg = self.config.read_locked();
        NodeReserve {
            memory_bytes: cfg.resize.reserved_memory,
            cpu_millis: cfg.resize.reserved_cpu_millicores,
        }
    }

    /// Records a state-directory problem for the status API (it is logged by the caller).
    pub fn state_dir_problem(&self, message: String) {
        self.state_dir.locked().problem(message);
    }

    pub fn read_model<R>(&self, f: impl FnOnce(&Model) -> R) -> R {
        f(&self.model.read_locked())
    }

    pub fn write_model<R>(&self, f: impl FnOnce(&mut Model) -> R) -> R {
        f(&mut self.model.write_locked())
    }

    pub fn journal<R>(&self, f: impl FnOnce(&mut Journal) -> R) -> R {
        f(&mut self.journal.locked())
    }

    /// Appends an event to the journal (which numbers and timestamps it).
    pub(crate) fn record(
        &self,
        event: EventKind,
        pod: &Pod,
        ctr: Option<&Container>,
        resources: Option<LinuxResources>,
    ) {
        let rec = EventRecord {
            seq: 0,
            time_ms: 0,
            event,
            pod_id: pod.id.clone(),
            pod: pod.full_name(),
            container_id: ctr.map(|c| c.id.clone()).unwrap_or_default(),
            container: ctr.map(|c| c.name.clone()).unwrap_or_default(),
            resources,
        };
        self.journal(|j| j.push(rec));
    }
}
