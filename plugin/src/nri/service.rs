//! The ttrpc `Plugin` service: decodes each runtime request, calls the [`Handler`] within the
//! runtime's deadline, encodes the answer. Both event paths land on the same handler methods:
//! the dedicated RPCs of NRI v0.10+ and the `StateChange` of older runtimes.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nri_resize_proto::api as pb;
use nri_resize_proto::api_ttrpc::Plugin;
use protobuf::MessageField;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};
use ttrpc::r#async::TtrpcContext;

use super::convert::{
    container_from_pb, eviction_to_pb, pod_from_pb, resources_from_pb, resources_to_pb,
    update_to_pb,
};
use super::deadline::Deadline;
use super::handler::{budget_within, Handler, Rejection, RuntimeInfo};
use super::runtime::RuntimeLink;
use crate::model::{Container, EventKind, LinuxResources, Pod};
use crate::sync::Locked as _;

/// Most pods plus containers a split `Synchronize` may carry in all (a node runs hundreds; the
/// cap bounds what a runtime, or anything speaking for it on the socket, can make the plugin
/// buffer). Beyond it the synchronize is refused with the reason and nothing is kept.
pub const MAX_SYNC_OBJECTS: usize = 100_000;

/// Things the service tells the session about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionSignal {
    /// The runtime sent `Shutdown`.
    RuntimeShutdown,
    /// Our `Synchronize` answer was computed only after the runtime's request deadline had
    /// passed: the runtime has given up on this plugin. containerd 1.7 (NRI before v0.8) then
    /// leaves the connection open without ever sending another event, so the session ends and
    /// the plugin registers again rather than stay connected and deaf.
    SynchronizedLate,
}

#[derive(Debug, Default)]
struct SyncBuffer {
    pods: Vec<Pod>,
    containers: Vec<Container>,
}

/// Observes handler latency; implemented by the metrics module.
pub trait HandlerObserver: Send + Sync + std::fmt::Debug + 'static {
    fn observe(&self, event: &'static str, seconds: f64, outcome: &'static str);
}

pub(crate) struct PluginService<H> {
    handler: Arc<H>,
    link: RuntimeLink,
    /// The runtime's per-request deadline (announced in `Configure`, else NRI's default); the
    /// handler budget is derived from it.
    request_timeout: Mutex<Duration>,
    sync: Mutex<SyncBuffer>,
    signals: mpsc::UnboundedSender<SessionSignal>,
    observer: Option<Arc<dyn HandlerObserver>>,
}

fn status(code: ttrpc::Code, msg: impl ToString) -> ttrpc::Error {
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, msg))
}

fn reject(r: &Rejection) -> ttrpc::Error {
    status(ttrpc::Code::FAILED_PRECONDITION, format!("nri-resize: {r}"))
}

/// Pod and container of a request; missing ones are a malformed request.
fn parts(
    pod: &MessageField<pb::PodSandbox>,
    ctr: &MessageField<pb::Container>,
    what: &str,
) -> ttrpc::Result<(Pod, Container)> {
    if let (Some(p), Some(c)) = (pod.as_ref(), ctr.as_ref()) {
        Ok((pod_from_pb(p), container_from_pb(c)))
    } else {
        warn!(request = what, "malformed request without pod or container");
        Err(status(
            ttrpc::Code::INVALID_ARGUMENT,
            format!("{what}: request lacks pod or container"),
        ))
    }
}

fn pod_part(pod: &MessageField<pb::PodSandbox>, what: &str) -> ttrpc::Result<Pod> {
    pod.as_ref().map(pod_from_pb).ok_or_else(|| {
        warn!(request = what, "malformed request without pod");
        status(
            ttrpc::Code::INVALID_ARGUMENT,
            format!("{what}: request lacks pod"),
        )
    })
}

impl<H: Handler> PluginService<H> {
    pub(crate) fn new(
        handler: Arc<H>,
        link: RuntimeLink,
        signals: mpsc::UnboundedSender<SessionSignal>,
        observer: Option<Arc<dyn HandlerObserver>>,
    ) -> Self {
        PluginService {
            handler,
            link,
            request_timeout: Mutex::new(RuntimeInfo::default().request_timeout()),
            sync: Mutex::new(SyncBuffer::default()),
            signals,
            observer,
        }
    }

    fn budget(&self) -> Duration {
        budget_within(*self.request_timeout.locked())
    }

    /// Runs one handler call within the budget. `None` means it overran: the caller answers
    /// fail-open (the runtime proceeds as if the plugin had no opinion).
    async fn within<T>(
        &self,
        event: EventKind,
        subject: &str,
        fut: impl Future<Output = T>,
    ) -> Option<T> {
        self.within_deadline(event, subject, &Deadline::after(self.budget()), fut)
            .await
    }

    /// [`Self::within`] for work that shares `deadline` (see [`Deadline`]): work that
    /// committed before the deadline is waited for, work that did not is answered fail-open and
    /// told so through the deadline.
    async fn within_deadline<T>(
        &self,
        event: EventKind,
        subject: &str,
        deadline: &Deadline,
        fut: impl Future<Output = T>,
    ) -> Option<T> {
        let started = Instant::now();
        let mut fut = std::pin::pin!(fut);
        let out = match tokio::time::timeout_at(deadline.at(), &mut fut).await {
            Ok(v) => Some(v),
            Err(_) if deadline.expire() => None,
            Err(_) => {
                warn!(
                    event = event.as_str(),
                    subject, "handler committed to its answer at the deadline; delivering it"
                );
                Some(fut.await)
            }
        };
        let secs = started.elapsed().as_secs_f64();
        if let Some(o) = &self.observer {
            o.observe(
                event.as_str(),
                secs,
                if out.is_some() { "ok" } else { "deadline" },
            );
        }
        if out.is_none() {
            error!(
                event = event.as_str(),
                subject,
                budget_ms = self.budget().as_millis(),
                "handler overran the runtime deadline; answering fail-open"
            );
        }
        out
    }

    async fn pod_event(&self, event: EventKind, pod: Pod) {
        let h = &self.handler;
        let subject = pod.full_name();
        let fut = async move {
            match event {
                EventKind::RunPodSandbox => {
                    if let Err(r) = h.run_pod_sandbox(pod).await {
                        warn!(%r, "run_pod_sandbox rejection ignored on the StateChange path");
                    }
                }
                EventKind::StopPodSandbox => h.stop_pod_sandbox(pod).await,
                EventKind::RemovePodSandbox => h.remove_pod_sandbox(pod).await,
                EventKind::PostUpdatePodSandbox => h.post_update_pod_sandbox(pod).await,
                other => debug!(event = other.as_str(), "pod state change not handled here"),
            }
        };
        self.within(event, &subject, fut).await;
    }

    async fn container_event(&self, event: EventKind, pod: Pod, ctr: Container) {
        let h = &self.handler;
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let fut = async move {
            match event {
                EventKind::PostCreateContainer => h.post_create_container(pod, ctr).await,
                EventKind::StartContainer => h.start_container(pod, ctr).await,
                EventKind::PostStartContainer => h.post_start_container(pod, ctr).await,
                EventKind::PostUpdateContainer => h.post_update_container(pod, ctr).await,
                EventKind::RemoveContainer => h.remove_container(pod, ctr).await,
                EventKind::StopContainer => {
                    // StopContainer has a dedicated RPC in every NRI version; the updates a
                    // StateChange cannot carry are dropped.
                    let _ = h.stop_container(pod, ctr).await;
                }
                other => debug!(
                    event = other.as_str(),
                    "container state change not handled here"
                ),
            }
        };
        self.within(event, &subject, fut).await;
    }
}

#[async_trait]
impl<H: Handler> Plugin for PluginService<H> {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: pb::ConfigureRequest,
    ) -> ttrpc::Result<pb::ConfigureResponse> {
        let info = RuntimeInfo {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            nri_version: req.NRI_version.clone(),
            request_timeout_ms: req.request_timeout,
            registration_timeout_ms: req.registration_timeout,
        };
        *self.request_timeout.locked() = info.request_timeout();
        let budget = self.budget();
        info!(runtime = %info.name, version = %info.version, nri = %info.nri_description(), pod_events = info.nri().accepts_pod_events(), request_timeout_ms = info.request_timeout_ms, handler_budget_ms = budget.as_millis(), "configure");
        self.handler
            .configure(&info, &req.config)
            .await
            .map_err(|r| {
                error!(%r, "configuration rejected");
                reject(&r)
            })?;
        self.link.set_runtime(info.clone());
        let events = self
            .handler
            .events()
            .for_runtime(info.nri().accepts_pod_events());
        Ok(pb::ConfigureResponse {
            events: events.mask(),
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: pb::SynchronizeRequest,
    ) -> ttrpc::Result<pb::SynchronizeResponse> {
        let (pods, containers) = {
            let mut buf = self.sync.locked();
            let total =
                buf.pods.len() + buf.containers.len() + req.pods.len() + req.containers.len();
            if total > MAX_SYNC_OBJECTS {
                *buf = SyncBuffer::default();
                let reason = format!(
                    "synchronize refused: {total} pods and containers in its parts, more than the {MAX_SYNC_OBJECTS} the plugin buffers"
                );
                error!(total, cap = MAX_SYNC_OBJECTS, "{reason}");
                return Err(reject(&Rejection(reason)));
            }
            buf.pods.extend(req.pods.iter().map(pod_from_pb));
            buf.containers
                .extend(req.containers.iter().map(container_from_pb));
            if req.more {
                debug!(
                    pods = buf.pods.len(),
                    containers = buf.containers.len(),
                    "partial synchronize; more to come"
                );
                return Ok(pb::SynchronizeResponse {
                    more: true,
                    ..Default::default()
                });
            }
            (
                std::mem::take(&mut buf.pods),
                std::mem::take(&mut buf.containers),
            )
        };
        info!(
            pods = pods.len(),
            containers = containers.len(),
            "synchronize"
        );
        let started = Instant::now();
        let updates = match self
            .within(
                EventKind::Synchronize,
                "runtime",
                self.handler.synchronize(pods, containers),
            )
            .await
        {
            Some(Ok(u)) => u,
            Some(Err(r)) => return Err(reject(&r)),
            None => Vec::new(),
        };
        // The handler is bounded by the budget, but a starved process (a CPU-bound neighbour,
        // an emulated guest) can still be late; the runtime has then already given up.
        let timeout = *self.request_timeout.locked();
        let took = started.elapsed();
        if took >= timeout {
            error!(
                took_ms = took.as_millis(),
                request_timeout_ms = timeout.as_millis(),
                "Synchronize answered after the runtime's deadline: the runtime dropped this plugin; registering again"
            );
            let _ = self.signals.send(SessionSignal::SynchronizedLate);
            return Err(status(
                ttrpc::Code::DEADLINE_EXCEEDED,
                "synchronize answered after the runtime's deadline; the plugin registers again",
            ));
        }
        self.link.set_synchronized();
        Ok(pb::SynchronizeResponse {
            update: updates.iter().map(update_to_pb).collect(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: pb::Empty) -> ttrpc::Result<pb::Empty> {
        info!("runtime is shutting down");
        self.handler.shutdown().await;
        let _ = self.signals.send(SessionSignal::RuntimeShutdown);
        Ok(pb::Empty::new())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::CreateContainerRequest,
    ) -> ttrpc::Result<pb::CreateContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "CreateContainer")?;
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let Some(result) = self
            .within(
                EventKind::CreateContainer,
                &subject,
                self.handler.create_container(pod, ctr),
            )
            .await
        else {
            return Ok(pb::CreateContainerResponse::new());
        };
        let reply = result.map_err(|r| reject(&r))?;
        let adjust = reply.adjust.map_or_else(MessageField::none, |res| {
            MessageField::some(pb::ContainerAdjustment {
                linux: MessageField::some(pb::LinuxContainerAdjustment {
                    resources: MessageField::some(resources_to_pb(&res)),
                    ..Default::default()
                }),
                ..Default::default()
            })
        });
        Ok(pb::CreateContainerResponse {
            adjust,
            update: reply.updates.iter().map(update_to_pb).collect(),
            evict: reply.evictions.iter().map(eviction_to_pb).collect(),
            ..Default::default()
        })
    }

    async fn update_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::UpdateContainerRequest,
    ) -> ttrpc::Result<pb::UpdateContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "UpdateContainer")?;
        let resources = req
            .linux_resources
            .as_ref()
            .map(resources_from_pb)
            .unwrap_or_default();
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let lowers_memory = ctr.resources.as_ref().map_or_else(
            || LinuxResources::default().lowers_memory_limit(&resources),
            |current| current.lowers_memory_limit(&resources),
        );
        let id = lowers_memory.then(|| ctr.id.clone());
        let ctr_id = ctr.id.clone();
        self.link.runtime_update_begins(&ctr_id);
        let deadline = Deadline::after(self.budget());
        let Some(result) = self
            .within_deadline(
                EventKind::UpdateContainer,
                &subject,
                &deadline,
                self.handler
                    .update_container(pod, ctr, resources, deadline.clone()),
            )
            .await
        else {
            // Overran: fail-open, but never into a memory decrease nobody checked.
            if let Some(id) = id {
                if let Some(r) = self.handler.undecided_memory_decrease(&id, &subject) {
                    self.link.runtime_update_ends(&ctr_id);
                    return Err(reject(&r));
                }
            }
            return Ok(pb::UpdateContainerResponse::new());
        };
        // Refused: the runtime applies nothing, and no `PostUpdateContainer` follows.
        let reply = result.map_err(|r| {
            self.link.runtime_update_ends(&ctr_id);
            reject(&r)
        })?;
        Ok(pb::UpdateContainerResponse {
            update: reply.updates.iter().map(update_to_pb).collect(),
            evict: reply.evictions.iter().map(eviction_to_pb).collect(),
            ..Default::default()
        })
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::StopContainerRequest,
    ) -> ttrpc::Result<pb::StopContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "StopContainer")?;
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let updates = self
            .within(
                EventKind::StopContainer,
                &subject,
                self.handler.stop_container(pod, ctr),
            )
            .await
            .unwrap_or_default();
        Ok(pb::StopContainerResponse {
            update: updates.iter().map(update_to_pb).collect(),
            ..Default::default()
        })
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: pb::StateChangeEvent,
    ) -> ttrpc::Result<pb::Empty> {
        let Some(event) = EventKind::from_number(req.event.value()) else {
            warn!(
                event = req.event.value(),
                "unknown state change event ignored"
            );
            return Ok(pb::Empty::new());
        };
        // Dispatch on the event, not on which fields are set: runtimes may fill in an empty
        // container for pod events.
        let pod_scoped = matches!(
            event,
            EventKind::RunPodSandbox
                | EventKind::StopPodSandbox
                | EventKind::RemovePodSandbox
                | EventKind::UpdatePodSandbox
                | EventKind::PostUpdatePodSandbox
        );
        if pod_scoped {
            let pod = pod_part(&req.pod, event.as_str())?;
            self.pod_event(event, pod).await;
        } else {
            let (pod, ctr) = parts(&req.pod, &req.container, event.as_str())?;
            self.container_event(event, pod, ctr).await;
        }
        Ok(pb::Empty::new())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: pb::RunPodSandboxRequest,
    ) -> ttrpc::Result<pb::RunPodSandboxResponse> {
        let pod = pod_part(&req.pod, "RunPodSandbox")?;
        let subject = pod.full_name();
        if let Some(Err(r)) = self
            .within(
                EventKind::RunPodSandbox,
                &subject,
                self.handler.run_pod_sandbox(pod),
            )
            .await
        {
            return Err(reject(&r));
        }
        Ok(pb::RunPodSandboxResponse::new())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: pb::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<pb::UpdatePodSandboxResponse> {
        let pod = pod_part(&req.pod, "UpdatePodSandbox")?;
        let overhead = req.overhead_linux_resources.as_ref().map(resources_from_pb);
        let resources = req.linux_resources.as_ref().map(resources_from_pb);
        let subject = pod.full_name();
        // What the handler is asked, kept for the answer should it overrun.
        let asked = resources
            .clone()
            .map(|r| (pod.clone(), overhead.clone(), r));
        let deadline = Deadline::after(self.budget());
        let verdict = self
            .within_deadline(
                EventKind::UpdatePodSandbox,
                &subject,
                &deadline,
                self.handler
                    .update_pod_sandbox(pod, overhead, resources, deadline.clone()),
            )
            .await;
        match verdict {
            Some(Err(r)) => return Err(reject(&r)),
            Some(Ok(())) => {}
            // Overran: fail-open, unless the handler refuses a memory decrease nobody checked.
            None => {
                if let Some((pod, overhead, resources)) = &asked {
                    if let Some(r) = self.handler.undecided_pod_memory_decrease(
                        pod,
                        overhead.as_ref(),
                        resources,
                    ) {
                        return Err(reject(&r));
                    }
                }
            }
        }
        Ok(pb::UpdatePodSandboxResponse::new())
    }

    async fn post_update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: pb::PostUpdatePodSandboxRequest,
    ) -> ttrpc::Result<pb::PostUpdatePodSandboxResponse> {
        let pod = pod_part(&req.pod, "PostUpdatePodSandbox")?;
        self.pod_event(EventKind::PostUpdatePodSandbox, pod).await;
        Ok(pb::PostUpdatePodSandboxResponse::new())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: pb::StopPodSandboxRequest,
    ) -> ttrpc::Result<pb::StopPodSandboxResponse> {
        let pod = pod_part(&req.pod, "StopPodSandbox")?;
        self.pod_event(EventKind::StopPodSandbox, pod).await;
        Ok(pb::StopPodSandboxResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: pb::RemovePodSandboxRequest,
    ) -> ttrpc::Result<pb::RemovePodSandboxResponse> {
        let pod = pod_part(&req.pod, "RemovePodSandbox")?;
        self.pod_event(EventKind::RemovePodSandbox, pod).await;
        Ok(pb::RemovePodSandboxResponse::new())
    }

    async fn post_create_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::PostCreateContainerRequest,
    ) -> ttrpc::Result<pb::PostCreateContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "PostCreateContainer")?;
        self.container_event(EventKind::PostCreateContainer, pod, ctr)
            .await;
        Ok(pb::PostCreateContainerResponse::new())
    }

    async fn start_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::StartContainerRequest,
    ) -> ttrpc::Result<pb::StartContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "StartContainer")?;
        self.container_event(EventKind::StartContainer, pod, ctr)
            .await;
        Ok(pb::StartContainerResponse::new())
    }

    async fn post_start_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::PostStartContainerRequest,
    ) -> ttrpc::Result<pb::PostStartContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "PostStartContainer")?;
        self.container_event(EventKind::PostStartContainer, pod, ctr)
            .await;
        Ok(pb::PostStartContainerResponse::new())
    }

    async fn post_update_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::PostUpdateContainerRequest,
    ) -> ttrpc::Result<pb::PostUpdateContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "PostUpdateContainer")?;
        self.link.runtime_update_ends(&ctr.id);
        self.container_event(EventKind::PostUpdateContainer, pod, ctr)
            .await;
        Ok(pb::PostUpdateContainerResponse::new())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: pb::RemoveContainerRequest,
    ) -> ttrpc::Result<pb::RemoveContainerResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "RemoveContainer")?;
        self.container_event(EventKind::RemoveContainer, pod, ctr)
            .await;
        Ok(pb::RemoveContainerResponse::new())
    }

    async fn validate_container_adjustment(
        &self,
        _ctx: &TtrpcContext,
        req: pb::ValidateContainerAdjustmentRequest,
    ) -> ttrpc::Result<pb::ValidateContainerAdjustmentResponse> {
        let (pod, ctr) = parts(&req.pod, &req.container, "ValidateContainerAdjustment")?;
        let adjusted = req
            .adjust
            .as_ref()
            .and_then(|a| a.linux.as_ref())
            .and_then(|l| l.resources.as_ref())
            .map(resources_from_pb);
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let verdict = self
            .within(
                EventKind::ValidateContainerAdjustment,
                &subject,
                self.handler
                    .validate_container_adjustment(pod, ctr, adjusted),
            )
            .await;
        Ok(match verdict {
            Some(Err(r)) => pb::ValidateContainerAdjustmentResponse {
                reject: true,
                reason: r.0,
                ..Default::default()
            },
            _ => pb::ValidateContainerAdjustmentResponse::new(),
        })
    }
}
