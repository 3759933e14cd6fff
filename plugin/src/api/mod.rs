//! The node-local status API: HTTP/1.1 with JSON over a root-only unix socket
//! (`--api-socket`, default `/run/nri-resize/api.sock`). The CLI (`nri-resize status`,
//! `resizes`, `events`, `update`) is its client.
//!
//! | method | path | answer |
//! |---|---|---|
//! | GET | `/v1/status` | [`Status`]: runtime connection, every pod with its containers (each with an optional `observed`: desired vs actual, throttling, reclaim, OOM kills), the observer, the metrics address and the `node` (capacity, allocatable, last capacity change) |
//! | GET | `/v1/events?since=N` | [`EventRecord`]s with `seq > N`, oldest first |
//! | POST | `/v1/containers/{id}/resources` | applies a [`LinuxResources`] through NRI `UpdateContainers` |
//! | POST | `/v1/pods/{namespace}/{name}/resize` | a whole-pod resize ([`PodResizeRequest`]), planned in KEP order and executed step by step; answers the [`PodResize`] record when it is done; the resize belongs to the daemon, not the request: a client that disconnects leaves it running to its end (`GET /v1/resizes` follows it) |
//! | GET | `/v1/resizes` | the resize records: per container (kubelet-driven) and per pod (whole-pod), with state, reason and steps |
//! | GET | `/healthz` | 200 while the process serves |
//! | GET | `/readyz` | 200 once registered with the runtime, synchronized and the observer loaded (as the metrics listener's), else 503 with why |

mod client;
mod pod_row;
mod resize_spec;
mod resizes_view;
mod resolve;
mod row;
mod table;

use std::ops::Deref;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use client::{ApiClient, ClientError};
pub use resize_spec::{parse_target, TargetSpecError};
pub use resizes_view::{render_resizes, resize_records, ResizeRecord, ResizeRecords};
pub use resolve::{resolve_container, ResolveError};
pub use table::render_status;

use crate::cgroup::{ActualResources, Caps};
use crate::model::{Container, EventRecord, LinuxResources, Pod, PodView};
use crate::nri::{ContainerUpdate, LinkError, LinkStatus, RuntimeInfo, RuntimeLink};
use crate::observer::{ReclaimWatchStatus, Strategies};
use crate::resize::off_worker::off_worker;
use crate::resize::{
    ContainerResize, Engine, PodResize, PodResizeRequest, RecordsView, ResizeError,
};
use crate::state::{
    Confirmation, ContainerObservation, NodeState, ObserverInfo, PodLevelStatus, ResizeVerdict,
};
use crate::sync::{Locked as _, ReadWriteLocked as _};
use crate::trim::{ContainerTrim, Trimmer};

/// `GET /v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub runtime: LinkStatusView,
    pub pods: Vec<PodStatus>,
    /// The observer's strategies and fallbacks, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observer: Option<ObserverView>,
    /// Where `/metrics` is served (the bound address, port 0 resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_addr: Option<String>,
    /// The checkpoint directory (`--state-dir`) and its problems.
    #[serde(default)]
    pub state_dir: crate::state::StateDirStatus,
    /// The node's CPUs and memory, allocatable, and the last capacity change, once the
    /// capacity watcher runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<crate::state::NodeStatus>,
    /// What admission keeps back from the node, where from, and where it disagrees with
    /// kubelet's, once checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<crate::state::ReserveStatus>,
}

/// A pod with its containers: the model's [`PodView`] JSON, each container with `observed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodStatus {
    #[serde(flatten)]
    pub pod: Pod,
    pub containers: Vec<ContainerStatus>,
    /// Pod-level resources (KEP-5419), once an `UpdatePodSandbox` asked for some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_level: Option<PodLevelStatus>,
}

/// A container as in the model plus, once known, what the plugin observed of it. Derefs to
/// [`Container`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerStatus {
    #[serde(flatten)]
    pub container: Container,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ContainerObserved>,
    /// Working-set trimming: its state (`off`, `unavailable` with the reason, `trimming`,
    /// `holding` with the reason, `converged` with the working set found) and figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trim: Option<ContainerTrim>,
}

impl Deref for ContainerStatus {
    type Target = Container;

    fn deref(&self) -> &Container {
        &self.container
    }
}

/// Desired vs actual and the observer's counters for one container. Counters are cumulative:
/// eBPF strategies count from when the observer attached, polling strategies from the cgroup's
/// creation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerObserved {
    /// What the last update asked for (or the container's spec when first seen).
    pub desired: Option<LinuxResources>,
    /// The container cgroup's values when last confirmed.
    pub actual: Option<ActualResources>,
    /// Whether every limit asked for is in effect.
    pub matches: Option<bool>,
    /// What differs, field by field with both values (`memory limit: desired 40Mi, actual 66.6Mi`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<String>,
    pub confirmed_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_error: Option<String>,
    /// Limits an ancestor cgroup (the pod's, or one between it and the container's) caps below
    /// the container's own: the effective value (bytes, millicores), the cgroup and the reason
    /// (`capped by the pod cgroup at 175Mi`). Absent when unknown; empty when nothing caps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caps: Option<Caps>,
    pub throttling: Option<ThrottlingView>,
    pub reclaim: Option<ReclaimView>,
    pub oom: Option<OomView>,
    /// Cumulative stalled seconds per resource (cgroup v2 with PSI only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure: Option<PressureView>,
    /// Stalled share of the observer's last interval (cgroup v2 with PSI only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall: Option<StallView>,
    pub observed_at_ms: Option<u64>,
    pub strategies: Option<StrategiesView>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ThrottlingView {
    pub count: u64,
    pub seconds: f64,
}

/// Reclaim in pages; `None` where the strategy cannot tell (v1 `memory.stat` has no pgsteal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReclaimView {
    pub pages: Option<u64>,
    pub pgscan: Option<u64>,
    pub direct_reclaim_events: Option<u64>,
    pub direct_reclaim_seconds: Option<f64>,
    pub direct_reclaimed_pages: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct OomView {
    pub kills: u64,
    pub last_victim_tgid: Option<u32>,
    /// The kernel's own `oom_kill` count for the cgroup.
    pub kernel_oom_kill: Option<u64>,
}

/// Seconds some (or all) tasks were stalled, from the cgroup's `*.pressure` files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PressureView {
    pub cpu_some_seconds: f64,
    pub cpu_full_seconds: Option<f64>,
    pub memory_some_seconds: f64,
    pub memory_full_seconds: Option<f64>,
    pub io_some_seconds: f64,
    pub io_full_seconds: Option<f64>,
}

/// The share of wall time (0..=1) some task was stalled, over the observer's last interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StallView {
    pub cpu_some: f64,
    pub memory_some: f64,
    pub io_some: f64,
    pub interval_ms: u64,
}

/// Strategy names as in `nri_resize_observer_strategy`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StrategiesView {
    pub throttle: String,
    pub reclaim: String,
    pub oom: String,
    pub hotplug: String,
    /// `pressure_files`, or why not (`unavailable_cgroup_v1`, `unavailable_no_psi`).
    #[serde(default)]
    pub pressure: String,
}

impl From<Strategies> for StrategiesView {
    fn from(s: Strategies) -> Self {
        StrategiesView {
            throttle: s.throttle.as_str().into(),
            reclaim: s.reclaim.as_str().into(),
            oom: s.oom.as_str().into(),
            hotplug: s.hotplug.as_str().into(),
            pressure: s.pressure.as_str().into(),
        }
    }
}

/// The observer as started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObserverView {
    pub strategies: StrategiesView,
    pub fallbacks: Vec<FallbackView>,
    pub interval_ms: u64,
    /// The eBPF maps' memory: charged to the daemon's memory cgroup, not in its RSS (empty
    /// without eBPF; absent from an older daemon's answer).
    #[serde(default)]
    pub maps: Vec<MapMemoryView>,
    /// The kernel's possible CPUs (`/sys/devices/system/cpu/possible`), read at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub possible_cpus: Option<u64>,
    /// The reclaim program attached only while nri-resize reclaims (`memcg/count_memcg_events`
    /// on cgroup v1 where the kernel refuses trampolines); absent where there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_on_demand: Option<ReclaimOnDemandView>,
}

/// One eBPF map's memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMemoryView {
    pub name: String,
    /// `memlock` from `/proc/self/fdinfo`.
    pub bytes: u64,
    pub max_entries: u32,
}

impl ObserverView {
    /// The maps' total memory.
    pub fn map_memory_bytes(&self) -> u64 {
        self.maps.iter().map(|m| m.bytes).sum()
    }
}

/// The on-demand reclaim program now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReclaimOnDemandView {
    pub program: String,
    pub attached: bool,
    /// Reclaims of nri-resize in flight (decreases, trimming turns) holding it attached.
    pub reclaims_in_flight: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl From<ReclaimWatchStatus> for ReclaimOnDemandView {
    fn from(s: ReclaimWatchStatus) -> Self {
        ReclaimOnDemandView {
            program: s.program.into(),
            attached: s.attached,
            reclaims_in_flight: s.watchers,
            last_error: s.last_error,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallbackView {
    pub program: String,
    pub reason: String,
}

impl From<&ObserverInfo> for ObserverView {
    fn from(i: &ObserverInfo) -> Self {
        ObserverView {
            strategies: i.strategies.into(),
            fallbacks: i
                .fallbacks
                .iter()
                .map(|f| FallbackView {
                    program: f.program.into(),
                    reason: f.reason.clone(),
                })
                .collect(),
            interval_ms: u64::try_from(i.interval.as_millis()).unwrap_or(u64::MAX),
            maps: i
                .map_memory
                .iter()
                .map(|m| MapMemoryView {
                    name: m.name.clone(),
                    bytes: m.bytes,
                    max_entries: m.max_entries,
                })
                .collect(),
            possible_cpus: i.possible_cpus.and_then(|n| u64::try_from(n).ok()),
            reclaim_on_demand: None,
        }
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "nanoseconds to seconds as f64 for display"
)]
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn observed_view(
    confirmation: Option<&Confirmation>,
    observation: Option<&ContainerObservation>,
    strategies: Option<Strategies>,
) -> Option<ContainerObserved> {
    if confirmation.is_none() && observation.is_none() {
        return None;
    }
    let mut v = ContainerObserved {
        strategies: strategies.map(Into::into),
        ..ContainerObserved::default()
    };
    if let Some(c) = confirmation {
        v.desired.clone_from(&c.desired);
        v.actual = c.actual;
        v.matches = c.matches;
        v.differences.clone_from(&c.differences);
        v.confirmed_at_ms = Some(c.at_ms);
        v.confirm_error.clone_from(&c.error);
        v.caps.clone_from(&c.caps);
    }
    if let Some(o) = observation {
        let obs = &o.observation;
        v.observed_at_ms = Some(o.at_ms);
        v.throttling = obs.throttling.map(|t| ThrottlingView {
            count: t.count,
            seconds: secs(t.throttled_ns),
        });
        let r = &obs.reclaim;
        v.reclaim = Some(ReclaimView {
            pages: r.pgsteal(),
            pgscan: r.pgscan(),
            direct_reclaim_events: r.direct_reclaim_count,
            direct_reclaim_seconds: r.direct_reclaim_ns.map(secs),
            direct_reclaimed_pages: r.direct_reclaimed_pages,
        });
        v.oom = Some(OomView {
            kills: obs.oom.kills,
            last_victim_tgid: obs.oom.last_victim_tgid,
            kernel_oom_kill: obs.oom.kernel_oom_kill,
        });
        let us = |us: u64| secs(us.saturating_mul(1000));
        v.pressure = obs.pressure.map(|p| PressureView {
            cpu_some_seconds: us(p.cpu.some_us),
            cpu_full_seconds: p.cpu.full_us.map(us),
            memory_some_seconds: us(p.memory.some_us),
            memory_full_seconds: p.memory.full_us.map(us),
            io_some_seconds: us(p.io.some_us),
            io_full_seconds: p.io.full_us.map(us),
        });
        v.stall = o.stall.map(|s| StallView {
            cpu_some: s.cpu(),
            memory_some: s.memory(),
            io_some: s.io(),
            interval_ms: s.wall_us / 1000,
        });
    }
    Some(v)
}

fn status_of(
    state: &NodeState,
    link: &RuntimeLink,
    trim: &std::collections::HashMap<String, ContainerTrim>,
) -> Status {
    let pods = state.read_model(crate::model::Model::snapshot);
    let info = state.observer_info.read_locked().clone();
    let strategies = info.as_ref().map(|i| i.strategies);
    let mut pod_levels = state.pod_levels();
    let pods = state.observed(|o| {
        pods.into_iter()
            .map(|PodView { pod, containers }| PodStatus {
                pod_level: pod_levels.remove(&pod.id),
                pod,
                containers: containers
                    .into_iter()
                    .map(|c| ContainerStatus {
                        observed: observed_view(
                            o.confirmations.get(&c.id).map(AsRef::as_ref),
                            o.observations.get(&c.id).map(AsRef::as_ref),
                            strategies,
                        ),
                        trim: trim.get(&c.id).cloned(),
                        container: c,
                    })
                    .collect(),
            })
            .collect()
    });
    Status {
        runtime: link.status().into(),
        pods,
        observer: info.as_ref().map(|i| ObserverView {
            reclaim_on_demand: state.reclaim_watch.status().map(Into::into),
            ..i.into()
        }),
        metrics_addr: state.metrics_addr.read_locked().map(|a| a.to_string()),
        state_dir: state.state_dir.locked().clone(),
        node: state.capacity.read_locked().clone(),
        reserve: state.reserve.read_locked().clone(),
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runtime connection as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkStatusView {
    pub connected: bool,
    pub synchronized: bool,
    pub name: Option<String>,
    pub version: Option<String>,
    /// The runtime's NRI version and where it came from: announced (NRI v0.12+: containerd
    /// 2.3, CRI-O 1.37) or inferred from the runtime's release (`v0.11.0 (inferred from cri-o
    /// 1.36.3)`); it decides whether the pod-level events are subscribed (NRI v0.10+).
    #[serde(default)]
    pub nri_version: Option<String>,
    /// The runtime's per-request deadline (announced since NRI v0.8, else NRI's default 2 s).
    #[serde(default)]
    pub request_timeout_ms: Option<u64>,
    /// How long the plugin's handlers may take before answering fail-open (3/4 of the deadline).
    #[serde(default)]
    pub handler_budget_ms: Option<u64>,
    pub connects: u64,
    pub connected_since: Option<u64>,
}

#[cfg(test)]
impl LinkStatusView {
    /// A runtime link that is up and synchronized, nothing else known: the API's test fixtures.
    pub(crate) fn up() -> Self {
        LinkStatusView {
            connected: true,
            synchronized: true,
            name: None,
            version: None,
            nri_version: None,
            request_timeout_ms: None,
            handler_budget_ms: None,
            connects: 1,
            connected_since: None,
        }
    }
}

impl From<LinkStatus> for LinkStatusView {
    fn from(s: LinkStatus) -> Self {
        LinkStatusView {
            connected: s.connected,
            synchronized: s.synchronized,
            name: s.runtime.as_ref().map(|r| r.name.clone()),
            version: s.runtime.as_ref().map(|r| r.version.clone()),
            nri_version: s.runtime.as_ref().map(RuntimeInfo::nri_description),
            request_timeout_ms: s.runtime.as_ref().map(|r| millis(r.request_timeout())),
            handler_budget_ms: s.runtime.as_ref().map(|r| millis(r.handler_budget())),
            connects: s.connects,
            connected_since: s.connected_since,
        }
    }
}

/// `POST /v1/containers/{id}/resources` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateResult {
    /// Updates the runtime reported as failed (empty: applied).
    pub failed: Vec<ContainerUpdate>,
}

/// An API error body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

#[derive(Debug, Clone)]
struct Ctx {
    state: Arc<NodeState>,
    link: RuntimeLink,
    engine: Option<Arc<Engine>>,
    /// The engine's resize records, read through their view.
    records: Option<RecordsView>,
    trim: Option<Trimmer>,
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    #[serde(default)]
    since: u64,
}

type ApiResult<T> = Result<Json<T>, (StatusCode, Json<ApiError>)>;

fn api_err(code: StatusCode, msg: impl Into<String>) -> (StatusCode, Json<ApiError>) {
    (code, Json(ApiError { error: msg.into() }))
}

/// Builds the router (also used by tests without a socket).
fn router(
    state: Arc<NodeState>,
    link: RuntimeLink,
    engine: Option<Arc<Engine>>,
    trim: Option<Trimmer>,
) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/events", get(events))
        .route("/v1/containers/{id}/resources", post(update_resources))
        .route("/v1/pods/{namespace}/{name}/resize", post(resize_pod))
        .route("/v1/resizes", get(resizes))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Ctx {
            state,
            link,
            records: engine.as_ref().map(|e| e.records()),
            engine,
            trim,
        })
}

/// `GET /v1/resizes`: per container (by id) and per whole-pod resize, and the verdict on each
/// container's last applied resize.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Resizes {
    pub containers: std::collections::BTreeMap<String, ContainerResize>,
    pub pods: Vec<PodResize>,
    /// By container id: `verdict` is `healthy`, `harmful` or absent while the window runs.
    #[serde(default)]
    pub verdicts: std::collections::BTreeMap<String, ResizeVerdict>,
}

async fn resizes(State(ctx): State<Ctx>) -> Json<Resizes> {
    let mut r = ctx
        .records
        .as_ref()
        .map_or_else(Resizes::default, |records| Resizes {
            containers: records.containers().into_iter().collect(),
            pods: records.pods(),
            verdicts: std::collections::BTreeMap::new(),
        });
    r.verdicts = ctx.state.verdicts(|v| {
        v.records
            .iter()
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect()
    });
    Json(r)
}

async fn resize_pod(
    State(ctx): State<Ctx>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
    Json(req): Json<PodResizeRequest>,
) -> ApiResult<PodResize> {
    let engine = ctx
        .engine
        .as_ref()
        .ok_or_else(|| api_err(StatusCode::SERVICE_UNAVAILABLE, "the resize engine is off"))?;
    // The resize is the engine's task: a client that disconnects drops this wait, not the resize.
    engine
        .resize_pod(&namespace, &name, &req)
        .await
        .map(Json)
        .map_err(|e| {
            let code = match &e {
                ResizeError::Stopping => StatusCode::SERVICE_UNAVAILABLE,
                ResizeError::UnknownPod(_) | ResizeError::UnknownContainer { .. } => {
                    StatusCode::NOT_FOUND
                }
                ResizeError::Invalid(_) => StatusCode::BAD_REQUEST,
                ResizeError::Refused { .. } => StatusCode::CONFLICT,
                ResizeError::Cgroup { .. } | ResizeError::Failed(_) => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            };
            api_err(code, e.to_string())
        })
}

async fn status(State(ctx): State<Ctx>) -> Json<Status> {
    let trim = ctx.trim.as_ref().map(Trimmer::states).unwrap_or_default();
    Json(status_of(&ctx.state, &ctx.link, &trim))
}

async fn events(State(ctx): State<Ctx>, Query(q): Query<EventsQuery>) -> Json<Vec<EventRecord>> {
    Json(ctx.state.journal(|j| j.since(q.since)))
}

/// The same answer as the metrics listener's `/readyz`: registered, synchronized and the
/// observer loaded.
async fn readyz(State(ctx): State<Ctx>) -> (StatusCode, String) {
    crate::metrics::Readiness {
        link: ctx.link.clone(),
        observer_loaded: ctx.state.observer_loaded.clone(),
        observer_fallbacks: ctx.state.observer_fallbacks.clone(),
        observer_map_bytes: ctx.state.observer_map_bytes.clone(),
        reclaim_watch: ctx.state.reclaim_watch.clone(),
    }
    .answer()
}

async fn update_resources(
    State(ctx): State<Ctx>,
    UrlPath(id): UrlPath<String>,
    Json(resources): Json<LinuxResources>,
) -> ApiResult<UpdateResult> {
    let Some(current) = ctx.state.read_model(|m| {
        m.container(&id)
            .map(|c| c.resources.clone().unwrap_or_default())
    }) else {
        return Err(api_err(
            StatusCode::NOT_FOUND,
            format!("no container {id:?} known to the plugin"),
        ));
    };
    // The swap limit moves with a memory limit that leaves it alone (see `with_swap_following`).
    let resources = current.with_swap_following(&resources);
    let update = ContainerUpdate {
        container_id: id.clone(),
        resources: resources.clone(),
        ignore_failure: false,
    };
    match ctx
        .link
        .update_containers(std::slice::from_ref(&update), &[])
        .await
    {
        Ok(failed) => {
            if failed.is_empty() {
                let desired = ctx.state.write_model(|m| {
                    m.apply_resources(&id, &resources);
                    m.container(&id).and_then(|c| c.resources.clone())
                });
                info!(container = %id, "plugin-initiated update applied");
                // The cgroup read back against it, on a blocking thread (cgroupfs).
                let (state, engine) = (Arc::clone(&ctx.state), ctx.engine.clone());
                off_worker(move || {
                    if let Some(engine) = engine {
                        // Records it and reads the cgroup back against it.
                        engine.note_applied_update(&id, &resources);
                    } else {
                        // Confirmation: the merged resources asked for vs the cgroup now.
                        state.confirm(&id, desired.or(Some(resources)));
                    }
                })
                .await;
            } else {
                warn!(container = %id, "runtime reported the update as failed");
            }
            Ok(Json(UpdateResult { failed }))
        }
        Err(e @ LinkError::NotConnected) => {
            Err(api_err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
        }
        Err(e) => Err(api_err(StatusCode::BAD_GATEWAY, e.to_string())),
    }
}

/// Why the socket's directory is not used.
#[derive(Debug, thiserror::Error)]
#[error(
    "{dir} is a shared directory (mode {mode:o}, holds {entry:?} and more): nri-resize will not \
     change its mode; put the status API socket in a directory of its own (the default is \
     /run/nri-resize/api.sock)"
)]
struct SharedDir {
    dir: String,
    mode: u32,
    entry: String,
}

/// Makes sure only root can reach the socket's directory: a new directory is created 0700; an
/// existing one that already admits no group or others is used as it is; an existing one of the
/// socket's own (empty, or holding only the socket from an earlier run: the `DaemonSet`'s
/// `DirectoryOrCreate` makes it 0755 first) is tightened to 0700. Any other existing directory is
/// shared (`/run`, `/tmp`, a runtime's state directory): its mode is never changed, and the
/// daemon refuses to start there.
fn secure_dir(dir: &Path, socket_name: &std::ffi::OsStr) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Ok(()) => {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            info!(dir = %dir.display(), "status API directory created 0700");
            return Ok(());
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Parents missing: create them (default mode), then this one as above.
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            return secure_dir(dir, socket_name);
        }
        Err(e) => return Err(e),
    }
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            format!("{} is not a directory", dir.display()),
        ));
    }
    let mode = meta.permissions().mode() & 0o7777;
    let group_and_others = mode & 0o077;
    if group_and_others == 0 {
        return Ok(());
    }
    let other = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .find(|name| name != socket_name);
    if mode & 0o1000 != 0 || other.is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            SharedDir {
                dir: dir.display().to_string(),
                mode,
                entry: other.map_or_else(
                    || "a sticky bit".to_string(),
                    |n| n.to_string_lossy().into_owned(),
                ),
            },
        ));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    info!(dir = %dir.display(), from = format!("{mode:o}"), "status API directory made 0700");
    Ok(())
}

/// Binds the socket (root-only, mode 0600, its directory 0700) and serves until `cancel`.
#[expect(
    clippy::unused_async,
    reason = "kept async: callers await it and binding may become async"
)]
pub async fn serve(
    socket: &Path,
    state: Arc<NodeState>,
    link: RuntimeLink,
    engine: Option<Arc<Engine>>,
    trim: Option<Trimmer>,
    cancel: CancellationToken,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let with_path = |e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!("status API socket {}: {e}", socket.display()),
        )
    };
    if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
        let name = socket.file_name().unwrap_or_default();
        secure_dir(dir, name).map_err(with_path)?;
    }
    if socket.exists() {
        // A live daemon answers on it; a stale file from a crash does not.
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(with_path(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another nri-resize is serving on it",
            )));
        }
        std::fs::remove_file(socket).map_err(with_path)?;
    }
    let listener = UnixListener::bind(socket).map_err(with_path)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(with_path)?;
    info!(socket = %socket.display(), "status API listening");
    let app = router(state, link, engine, trim);
    let path = socket.to_path_buf();
    Ok(tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
        let _ = std::fs::remove_file(&path);
        r
    }))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    use axum::extract::{Path as UrlPath, State};
    use axum::Json;

    use super::{secure_dir, update_resources, Ctx};
    use crate::cgroup::worker_check::OffWorkerOnly;
    use crate::cgroup::{Cgroups, V2};
    use crate::config::Config;
    use crate::model::{Container, ContainerState, LinuxResources, MemoryResources, Pod};
    use crate::nri::RuntimeLink;
    use crate::resize::fake_runtime::Connected;
    use crate::resize::node::NodeReader;
    use crate::resize::Engine;
    use crate::state::NodeState;

    /// `/v1/status` carries each container's trim record as the trimmer published it.
    #[test]
    fn the_status_carries_each_containers_trim_record() {
        use crate::policy::Found;
        use crate::trim::{ContainerTrim, TrimState};

        let state = NodeState::new(Config::default());
        state.write_model(|m| {
            m.upsert_pod(Pod {
                id: "p1".into(),
                ..Pod::default()
            });
            for id in ["c1", "c2"] {
                m.upsert_container(Container {
                    id: id.into(),
                    pod_id: "p1".into(),
                    ..Container::default()
                });
            }
        });
        let trim = std::collections::HashMap::from([(
            "c1".to_owned(),
            ContainerTrim {
                state: TrimState::Converged {
                    working_set: 64 << 20,
                    found: Found::Refaults { bytes: 1 << 20 },
                },
                working_set_bytes: Some(64 << 20),
                ..ContainerTrim::default()
            },
        )]);
        let status = super::status_of(&state, &RuntimeLink::default(), &trim);
        let json = serde_json::to_value(&status).expect("json");
        let c1 = &json["pods"][0]["containers"][0];
        assert_eq!(c1["id"], "c1");
        assert_eq!(c1["trim"]["state"], "converged");
        assert_eq!(c1["trim"]["working_set_bytes"], 64 << 20);
        assert_eq!(c1["trim"]["found"]["by"], "refaults");
        assert!(json["pods"][0]["containers"][1].get("trim").is_none());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_update_through_the_api_is_confirmed_off_the_async_worker() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("kubepods/pod1/c1");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("memory.max"), "268435456\n").expect("write");
        // The pod cgroup caps it: the path above the container is read too (off the worker).
        std::fs::write(root.path().join("kubepods/pod1/memory.max"), "134217728\n").expect("write");
        let (cgroups, on_worker) = OffWorkerOnly::wrap(Cgroups::V2(V2 {
            root: root.path().to_owned(),
        }));
        let state = NodeState::with_cgroups(Config::default(), Some(cgroups.clone()));
        let pod = Pod {
            id: "p1".into(),
            namespace: "ns".into(),
            name: "web".into(),
            cgroup_parent: "/kubepods/pod1".into(),
            ..Pod::default()
        };
        let ctr = Container {
            id: "c1".into(),
            pod_id: "p1".into(),
            name: "app".into(),
            state: ContainerState::Running,
            cgroups_path: "/kubepods/pod1/c1".into(),
            ..Container::default()
        };
        state.write_model(|m| {
            m.upsert_pod(pod.clone());
            m.upsert_container(ctr.clone());
        });
        state.track(&pod, &ctr);
        let link = RuntimeLink::default();
        let connected = Connected::start(&link).await;
        let engine = Arc::new(Engine::new(
            state.clone(),
            link.clone(),
            Some(cgroups),
            NodeReader::new(root.path().join("no-node")),
            None,
        ));
        let resources = LinuxResources {
            memory: Some(MemoryResources {
                limit: Some(256 << 20),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        };
        // With the engine (its record follows) and without (the state confirms alone).
        for engine in [Some(engine), None] {
            state.observed(|o| o.confirmations.clear());
            let ctx = Ctx {
                state: state.clone(),
                link: link.clone(),
                records: engine.as_ref().map(|e| e.records()),
                engine,
                trim: None,
            };
            let answer = update_resources(
                State(ctx),
                UrlPath("c1".to_string()),
                Json(resources.clone()),
            )
            .await;
            assert!(answer.is_ok_and(|Json(r)| r.failed.is_empty()));
            let confirmed = state.observed(|o| o.confirmations.get("c1").cloned());
            assert_eq!(
                confirmed.as_ref().and_then(|c| c.matches),
                Some(true),
                "the cgroup was read back and holds the update"
            );
            assert_eq!(
                confirmed.and_then(|c| c.caps?.memory).map(|m| m.effective),
                Some(128 << 20),
                "the pod cgroup was read as well"
            );
        }
        assert_eq!(
            on_worker.lock().expect("lock").clone(),
            Vec::<String>::new(),
            "cgroup I/O on the async worker"
        );
        connected.close().await;
    }

    fn mode(p: &std::path::Path) -> u32 {
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn the_socket_directory_is_0700_whether_new_or_its_own() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sock = std::ffi::OsStr::new("api.sock");
        let new = tmp.path().join("new/api");
        secure_dir(&new, sock).expect("create");
        assert_eq!(mode(&new), 0o700);
        // Its own: empty, as `DirectoryOrCreate` leaves it.
        let own = tmp.path().join("own");
        std::fs::create_dir(&own).expect("mkdir");
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        secure_dir(&own, sock).expect("tighten");
        assert_eq!(mode(&own), 0o700, "tightened although it existed");
        // Its own with the socket an earlier run left.
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(own.join("api.sock"), "").expect("stale socket");
        secure_dir(&own, sock).expect("tighten");
        assert_eq!(mode(&own), 0o700);
        // Already private, shared or not: used as it is.
        let private = tmp.path().join("private");
        std::fs::create_dir(&private).expect("mkdir");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::write(private.join("other"), "").expect("other file");
        secure_dir(&private, sock).expect("private");
        assert_eq!(mode(&private), 0o700);
    }

    /// A shared directory such as `/run` (0755, other entries) or `/tmp` (sticky) is refused
    /// and never chmodded.
    #[test]
    fn a_shared_directory_is_refused_and_left_as_it_is() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sock = std::ffi::OsStr::new("api.sock");
        let run = tmp.path().join("run");
        std::fs::create_dir(&run).expect("mkdir");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir(run.join("containerd")).expect("a neighbour");
        let err = secure_dir(&run, sock).expect_err("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        let text = err.to_string();
        assert!(
            text.contains("shared directory") && text.contains("containerd"),
            "{text}"
        );
        assert_eq!(mode(&run), 0o755, "a shared directory is never changed");
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let err = secure_dir(&shared, sock).expect_err("sticky refused");
        assert!(err.to_string().contains("sticky"), "{err}");
        assert_eq!(mode(&shared), 0o1777, "a sticky directory is never changed");
    }
}
