//! The pod-level handlers with real cgroupfs reads under an injected root (a v2 fixture) and a
//! node fixture; the last tests drive them over the NRI wire through an in-process runtime peer
//! (the same mux and ttrpc parts containerd uses).

use std::sync::Arc;

use nri_resize_proto::api as pb;
use nri_resize_proto::api_ttrpc::{create_runtime, PluginClient, Runtime};
use protobuf::MessageField;
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::transport::Socket;
use ttrpc::r#async::{Client, Server, TtrpcContext};

use super::*;
use crate::capacity::snapshot::fixture::meminfo;
use crate::cgroup::gate::{Gate, Gated};
use crate::cgroup::{Cgroups, V2};
use crate::config::Config;
use crate::config::Mode;
use crate::model::{Container, CpuResources, MemoryResources};
use crate::model::{LinuxResources, Pod, PodLimits};
use crate::nri::{
    Deadline, Handler, Mux, PluginIdentity, RuntimeLink, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN,
};
use crate::policy::ResizeState;
use crate::resize::node::NodeReader;
use crate::state::NodeState;
use crate::state::{limits_text, PodLevelStatus};

const MI: u64 = 1 << 20;
const POD_CG: &str = "/kubepods/podA";

/// A cgroup v2 root with the pod cgroup, and a node root with 2 CPUs and 8 GiB.
struct Fixture {
    cg: tempfile::TempDir,
    node: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let f = Fixture {
            cg: tempfile::tempdir().expect("tempdir"),
            node: tempfile::tempdir().expect("tempdir"),
        };
        let cpu = f.node.path().join("sys/devices/system/cpu");
        std::fs::create_dir_all(&cpu).expect("mkdir");
        std::fs::write(cpu.join("online"), "0-1\n").expect("write");
        std::fs::create_dir_all(f.node.path().join("proc")).expect("mkdir");
        std::fs::write(f.node.path().join("proc/meminfo"), meminfo(8_388_608)).expect("write");
        f.pod_cgroup("max 100000", "max", 50 * MI);
        f
    }

    /// Writes the pod cgroup's files as kubelet (and the kernel) would.
    fn pod_cgroup(&self, cpu_max: &str, memory_max: &str, usage: u64) {
        let dir = self.cg.path().join(POD_CG.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).expect("mkdir");
        // Each file replaced whole, as cgroupfs shows a write: a read-back running meanwhile
        // (after an answer) never sees one half-written.
        for (file, text) in [
            ("cpu.max", cpu_max.to_string()),
            ("memory.max", memory_max.to_string()),
            ("memory.current", usage.to_string()),
        ] {
            let tmp = dir.join(format!(".{file}.tmp"));
            std::fs::write(&tmp, format!("{text}\n")).expect("write");
            std::fs::rename(&tmp, dir.join(file)).expect("rename");
        }
    }

    /// Writes the pod cgroup's `memory.stat` and an empty `memory.reclaim` (cgroup v2).
    fn pod_memory(&self, anon: u64, shmem: u64, file: u64) {
        let dir = self.cg.path().join(POD_CG.trim_start_matches('/'));
        std::fs::write(
            dir.join("memory.stat"),
            format!("anon {anon}\nfile {file}\nshmem {shmem}\n"),
        )
        .expect("write");
        std::fs::write(dir.join("memory.reclaim"), "").expect("write");
    }

    /// What was last written to the pod cgroup's `memory.reclaim`.
    fn reclaim_written(&self) -> String {
        let dir = self.cg.path().join(POD_CG.trim_start_matches('/'));
        std::fs::read_to_string(dir.join("memory.reclaim")).expect("read")
    }

    /// The handlers, with no read-back after `UpdatePodSandbox` (the record is seen as the
    /// answer left it).
    fn handler(&self, mode: Mode) -> (Arc<NodeState>, ModelHandler) {
        let (state, h) = self.handler_reading_back(mode);
        (state, h.with_pod_read_back(&[]))
    }

    /// The handlers, with no read-back, on cgroup I/O whose reads wait at the returned gate
    /// until the test opens it (a stuck cgroupfs).
    fn handler_gated(&self, mode: Mode) -> (Arc<NodeState>, ModelHandler, Gate) {
        let mut cfg = Config::default();
        cfg.resize.mode = mode;
        let (cgroups, gate) = Gated::wrap(Cgroups::V2(V2 {
            root: self.cg.path().to_owned(),
        }));
        let state = NodeState::with_cgroups(cfg, Some(cgroups));
        let h = ModelHandler::new(state.clone())
            .with_node(NodeReader::new(self.node.path()))
            .with_pod_read_back(&[]);
        (state, h, gate)
    }

    /// The handlers as the daemon has them: the pod cgroup read back after the answer.
    fn handler_reading_back(&self, mode: Mode) -> (Arc<NodeState>, ModelHandler) {
        let mut cfg = Config::default();
        cfg.resize.mode = mode;
        let state = NodeState::with_cgroups(
            cfg,
            Some(Cgroups::V2(V2 {
                root: self.cg.path().to_owned(),
            })),
        );
        let h = ModelHandler::new(state.clone()).with_node(NodeReader::new(self.node.path()));
        (state, h)
    }
}

fn pod() -> Pod {
    Pod {
        id: "pA".into(),
        name: "web".into(),
        namespace: "ns".into(),
        cgroup_parent: POD_CG.into(),
        ..Pod::default()
    }
}

fn limits(cpu_millis: i64, memory: u64) -> LinuxResources {
    LinuxResources {
        cpu: Some(CpuResources {
            quota: Some(cpu_millis * 100),
            period: Some(100_000),
            ..CpuResources::default()
        }),
        memory: Some(MemoryResources {
            limit: Some(i64::try_from(memory).expect("fits")),
            ..MemoryResources::default()
        }),
        ..LinuxResources::default()
    }
}

fn container(name: &str, res: LinuxResources) -> Container {
    Container {
        id: format!("c-{name}"),
        pod_id: "pA".into(),
        name: name.into(),
        resources: Some(res),
        ..Container::default()
    }
}

fn record(state: &NodeState) -> PodLevelStatus {
    state.pod_levels().remove("pA").expect("a pod-level record")
}

#[tokio::test]
async fn an_admitted_resize_is_kept_in_the_model_and_confirmed_after_kubelet_wrote_it() {
    let f = Fixture::new();
    let (state, h) = f.handler(Mode::Enforce);
    h.run_pod_sandbox(pod()).await.expect("run");
    // kubelet writes the pod cgroup first (limits plus overhead), then the runtime relays the
    // update with the two apart.
    f.pod_cgroup("60000 100000", &(144 * MI).to_string(), 60 * MI);
    h.update_pod_sandbox(
        pod(),
        Some(limits(100, 16 * MI)),
        Some(limits(500, 128 * MI)),
        Deadline::none(),
    )
    .await
    .expect("admitted");
    let r = record(&state);
    assert_eq!(r.state, Some(ResizeState::InProgress), "{r:?}");
    assert_eq!(limits_text(&r.desired), "600m/144Mi");
    assert_eq!(
        r.overhead.map(|o| limits_text(&o)).as_deref(),
        Some("100m/16Mi")
    );
    // containerd's PostUpdatePodSandbox carries the creation-time resources: the model keeps
    // what the update asked.
    h.post_update_pod_sandbox(pod()).await;
    let kept = state.read_model(|m| m.pod("pA").cloned()).expect("pod");
    assert_eq!(kept.resources, Some(limits(500, 128 * MI)));
    assert_eq!(kept.overhead, Some(limits(100, 16 * MI)));
    let r = record(&state);
    assert_eq!((r.matches, r.state), (Some(true), None), "{r:?}");
    assert_eq!(
        r.actual.map(|a| limits_text(&a)).as_deref(),
        Some("600m/144Mi")
    );
    let text = state.metrics.encode().expect("encode");
    for series in [
        r#"nri_resize_pod_desired_cpu_cores{namespace="ns",pod="web"} 0.6"#,
        r#"nri_resize_pod_actual_memory_bytes{namespace="ns",pod="web"} 150994944"#,
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    h.remove_pod_sandbox(pod()).await;
    assert!(state.pod_levels().is_empty());
    let text = state.metrics.encode().expect("encode");
    assert!(!text.contains(r#"pod="web""#), "{text}");
}

/// kubelet 1.36 writes the pod cgroup after `UpdatePodSandbox` returns, and CRI-O sends no
/// `PostUpdatePodSandbox`: the pod cgroup is read back after the answer, again until it holds
/// the request, and the record is confirmed without a `PostUpdatePodSandbox`.
#[tokio::test]
async fn the_pod_cgroup_is_read_back_after_the_answer_without_post_update() {
    let f = Fixture::new();
    let (state, h) = f.handler_reading_back(Mode::Enforce);
    h.run_pod_sandbox(pod()).await.expect("run");
    h.update_pod_sandbox(pod(), None, Some(limits(500, 128 * MI)), Deadline::none())
        .await
        .expect("admitted");
    // kubelet 1.36: the pod cgroup is written once the call has returned.
    f.pod_cgroup("50000 100000", &(128 * MI).to_string(), 60 * MI);
    // The read-backs run at growing intervals (the last 10 s after the answer).
    let deadline = Instant::now() + Duration::from_secs(60);
    let r = loop {
        let r = record(&state);
        if r.matches == Some(true) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the pod cgroup was never read back as holding the request: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.state, None, "{r:?}");
    assert_eq!(
        r.actual.map(|a| limits_text(&a)).as_deref(),
        Some("500m/128Mi")
    );
}

/// kubelet 1.36 calls `UpdatePodSandbox` before it writes the pod cgroup: a memory limit the
/// handler could not check against the pod's usage is refused (kubelet retries), never let
/// through; a raise is not held back.
#[tokio::test]
async fn a_pod_memory_decrease_whose_usage_cannot_be_read_is_refused() {
    let f = Fixture::new();
    let (state, h) = f.handler(Mode::Enforce);
    let mut p = pod();
    p.resources = Some(limits(500, 256 * MI));
    h.run_pod_sandbox(p.clone()).await.expect("run");
    std::fs::remove_dir_all(f.cg.path().join(POD_CG.trim_start_matches('/'))).expect("rm");
    let refused = h
        .update_pod_sandbox(
            p.clone(),
            None,
            Some(limits(500, 128 * MI)),
            Deadline::none(),
        )
        .await
        .expect_err("a decrease checked against nothing is refused");
    assert!(
        refused.0.contains("not checked against the pod's usage"),
        "{}",
        refused.0
    );
    let r = record(&state);
    assert_eq!(r.state, Some(ResizeState::Deferred), "{r:?}");
    assert!(r.error.is_some(), "the failed read is shown: {r:?}");
    // The model keeps the pod as it was.
    let kept = state.read_model(|m| m.pod("pA").cloned()).expect("pod");
    assert_eq!(kept.resources, Some(limits(500, 256 * MI)));
    // A raise under the same failed read goes through.
    h.update_pod_sandbox(p, None, Some(limits(500, 512 * MI)), Deadline::none())
        .await
        .expect("a raise needs no usage");
}

#[tokio::test]
async fn drift_is_reported_when_the_pod_cgroup_does_not_hold_the_request() {
    let f = Fixture::new();
    let (state, h) = f.handler(Mode::Enforce);
    h.update_pod_sandbox(pod(), None, Some(limits(500, 128 * MI)), Deadline::none())
        .await
        .expect("admitted");
    // Nobody wrote the pod cgroup: still unlimited.
    h.post_update_pod_sandbox(pod()).await;
    let r = record(&state);
    assert_eq!(r.matches, Some(false), "{r:?}");
    assert_eq!(r.state, Some(ResizeState::InProgress));
    assert_eq!(
        r.actual.map(|a| limits_text(&a)).as_deref(),
        Some("max/max")
    );
}

#[tokio::test]
async fn enforce_refuses_and_keeps_the_model_observe_records_only() {
    let f = Fixture::new();
    f.pod_cgroup("max 100000", "max", 301 * MI);
    for (mode, refused) in [(Mode::Enforce, true), (Mode::Observe, false)] {
        let (state, h) = f.handler(mode);
        h.run_pod_sandbox(pod()).await.expect("run");
        let out = h
            .update_pod_sandbox(pod(), None, Some(limits(500, 100 * MI)), Deadline::none())
            .await;
        let r = record(&state);
        assert_eq!(r.state, Some(ResizeState::Deferred), "{r:?}");
        assert_eq!(
            r.reason,
            "usage 301Mi above requested pod limit 100Mi: memory.stat gives no breakdown, so all of it counts as memory that cannot be reclaimed"
        );
        assert_eq!(out.is_err(), refused, "{mode:?}: {out:?}");
        if let Err(e) = out {
            assert!(
                e.0.contains("usage 301Mi above requested pod limit 100Mi"),
                "{e}"
            );
        }
        let model = state.read_model(|m| m.pod("pA").and_then(|p| p.resources.clone()));
        assert_eq!(model.is_some(), !refused, "{mode:?}");
    }
}

#[tokio::test]
async fn infeasible_pod_limits_and_the_annotation_that_only_tightens() {
    let f = Fixture::new();
    let (state, h) = f.handler(Mode::Observe);
    h.create_container(pod(), container("app", limits(500, 256 * MI)))
        .await
        .expect("create");
    // Observe lets it through, with the reason recorded.
    h.update_pod_sandbox(pod(), None, Some(limits(400, 512 * MI)), Deadline::none())
        .await
        .expect("observe mode lets it through");
    let r = record(&state);
    assert_eq!(r.state, Some(ResizeState::Infeasible));
    assert_eq!(
        r.reason,
        "container app CPU limit 500m exceeds the requested pod limit 400m"
    );
    // The pod asks to be enforced: refused.
    let mut strict = pod();
    strict
        .annotations
        .insert(crate::policy::POD_MODE_ANNOTATION.into(), "Enforce".into());
    let e = h
        .update_pod_sandbox(strict, None, Some(limits(3000, 512 * MI)), Deadline::none())
        .await
        .expect_err("enforced by the annotation");
    assert!(
        e.0.contains("pod CPU limit 3000m exceeds the node's 2000m allocatable CPU"),
        "{e}"
    );
}

/// The runtime end of an in-memory NRI trunk: registration only.
#[derive(Debug, Default)]
struct Peer;

#[async_trait::async_trait]
impl Runtime for Peer {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        _req: pb::RegisterPluginRequest,
    ) -> ttrpc::Result<pb::Empty> {
        Ok(pb::Empty::new())
    }
    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        _req: pb::UpdateContainersRequest,
    ) -> ttrpc::Result<pb::UpdateContainersResponse> {
        Ok(pb::UpdateContainersResponse::default())
    }
}

fn pb_resources(cpu_millis: i64, memory: i64) -> pb::LinuxResources {
    let mut r = pb::LinuxResources::new();
    let mut cpu = pb::LinuxCPU::new();
    cpu.quota = MessageField::some(pb::OptionalInt64 {
        value: cpu_millis * 100,
        ..Default::default()
    });
    cpu.period = MessageField::some(pb::OptionalUInt64 {
        value: 100_000,
        ..Default::default()
    });
    r.cpu = MessageField::some(cpu);
    let mut mem = pb::LinuxMemory::new();
    mem.limit = MessageField::some(pb::OptionalInt64 {
        value: memory,
        ..Default::default()
    });
    r.memory = MessageField::some(mem);
    r
}

fn pb_pod() -> pb::PodSandbox {
    let mut p = pb::PodSandbox::new();
    p.id = "pA".into();
    p.name = "web".into();
    p.namespace = "ns".into();
    p.linux = MessageField::some(pb::LinuxPodSandbox {
        cgroup_parent: POD_CG.into(),
        // What containerd sends: the sandbox's creation-time resources.
        pod_resources: MessageField::some(pb_resources(200, 64 << 20)),
        ..Default::default()
    });
    p
}

/// The handlers served over the NRI wire to an in-process runtime peer (the same mux and
/// ttrpc parts containerd uses), configured as an NRI v0.12 runtime.
struct Wire {
    plugin: PluginClient,
    cancel: CancellationToken,
    session: tokio::task::JoinHandle<Result<SessionEnd, nri::TransportError>>,
    server: Server,
}

impl Wire {
    async fn connect(h: ModelHandler) -> Self {
        Self::connect_with_request_timeout(h, 0).await
    }

    /// Connected to a runtime that announces `request_timeout_ms` as its per-request deadline
    /// (0: none announced, NRI's default).
    async fn connect_with_request_timeout(h: ModelHandler, request_timeout_ms: i64) -> Self {
        let (plugin_end, runtime_end) = tokio::io::duplex(1 << 20);
        let (link, cancel) = (RuntimeLink::default(), CancellationToken::new());
        let session = {
            let (h, l, c) = (Arc::new(h), link.clone(), cancel.clone());
            tokio::spawn(async move {
                let id = PluginIdentity {
                    socket: "/test".into(),
                    name: "nri-resize".into(),
                    idx: "42".into(),
                };
                nri::serve_trunk(plugin_end, &id, h, &l, None, &c).await
            })
        };
        let mut mux = Mux::start(runtime_end, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let plugin = PluginClient::new(Client::new(Socket::new(
            mux.take(PLUGIN_SERVICE_CONN).expect("conn 1"),
        )));
        let mut server = Server::new()
            .add_listener(nri::one_shot_listener(
                mux.take(RUNTIME_SERVICE_CONN).expect("conn 2"),
            ))
            .register_service(create_runtime(Arc::new(Peer)));
        server.start().await.expect("runtime server");
        let conf = pb::ConfigureRequest {
            runtime_name: "fake".into(),
            runtime_version: "2.3".into(),
            NRI_version: "v0.12.0".into(),
            request_timeout: request_timeout_ms,
            ..Default::default()
        };
        let events = plugin
            .configure(ctx(), &conf)
            .await
            .expect("configure")
            .events;
        let bit = 1 << (crate::model::EventKind::UpdatePodSandbox as u32 - 1);
        assert_ne!(events & bit, 0, "UpdatePodSandbox subscribed: {events:b}");
        Self {
            plugin,
            cancel,
            session,
            server,
        }
    }

    async fn close(mut self) {
        self.cancel.cancel();
        let _ = self.session.await;
        let _ = self.server.shutdown().await;
    }
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(5_000_000_000)
}

fn update_request(cpu_millis: i64, memory: i64) -> pb::UpdatePodSandboxRequest {
    pb::UpdatePodSandboxRequest {
        pod: MessageField::some(pb_pod()),
        linux_resources: MessageField::some(pb_resources(cpu_millis, memory)),
        overhead_linux_resources: MessageField::some(pb_resources(100, 16 << 20)),
        ..Default::default()
    }
}

#[tokio::test]
async fn update_and_post_update_pod_sandbox_over_the_wire() {
    let f = Fixture::new();
    let (state, h) = f.handler(Mode::Enforce);
    let wire = Wire::connect(h).await;
    let plugin = &wire.plugin;

    // Refused: a pod memory limit below what the pod uses.
    f.pod_cgroup("max 100000", "max", 301 * MI);
    let req = pb::UpdatePodSandboxRequest {
        pod: MessageField::some(pb_pod()),
        linux_resources: MessageField::some(pb_resources(500, 100 << 20)),
        ..Default::default()
    };
    let err = plugin
        .update_pod_sandbox(ctx(), &req)
        .await
        .expect_err("refused");
    assert!(
        err.to_string()
            .contains("usage 301Mi above requested pod limit 100Mi"),
        "{err}"
    );
    assert_eq!(record(&state).state, Some(ResizeState::Deferred));

    // Admitted, kubelet's write in place, then the post-update read-back.
    f.pod_cgroup("60000 100000", &(144 * MI).to_string(), 60 * MI);
    plugin
        .update_pod_sandbox(ctx(), &update_request(500, 128 << 20))
        .await
        .expect("admitted");
    let post = pb::PostUpdatePodSandboxRequest {
        pod: MessageField::some(pb_pod()),
        ..Default::default()
    };
    plugin
        .post_update_pod_sandbox(ctx(), &post)
        .await
        .expect("post update");
    let r = record(&state);
    assert_eq!((r.matches, r.state), (Some(true), None), "{r:?}");
    let model = state.read_model(|m| m.pod("pA").cloned()).expect("pod");
    assert_eq!(
        model
            .resources
            .map(|r| limits_text(&PodLimits::from_linux(&r))),
        Some("500m/128Mi".into())
    );
    wire.close().await;
}

/// kubelet 1.36: `UpdatePodSandbox` before the pod cgroup write; the write fails, and kubelet
/// calls again with the previous resources. The plugin admits both, its one record of the pod
/// ends at the previous resources and is confirmed against the pod cgroup that never changed.
#[tokio::test]
async fn kubelet_1_36_calls_before_writing_and_reverts_a_failed_write() {
    let f = Fixture::new();
    // The pod as it runs: 200m/64Mi plus the 100m/16Mi overhead in its cgroup.
    f.pod_cgroup("30000 100000", &(80 * MI).to_string(), 40 * MI);
    let (state, h) = f.handler_reading_back(Mode::Enforce);
    let wire = Wire::connect(h).await;
    let plugin = &wire.plugin;

    // Admitted before kubelet writes anything: desired recorded, not confirmed yet.
    plugin
        .update_pod_sandbox(ctx(), &update_request(500, 128 << 20))
        .await
        .expect("admitted before the write");
    let r = record(&state);
    assert_eq!(limits_text(&r.desired), "600m/144Mi", "{r:?}");
    assert_ne!(r.matches, Some(true), "{r:?}");

    // The pod cgroup write failed; the revert.
    plugin
        .update_pod_sandbox(ctx(), &update_request(200, 64 << 20))
        .await
        .expect("the revert is admitted");
    let r = record(&state);
    assert_eq!(limits_text(&r.desired), "300m/80Mi", "{r:?}");
    assert_eq!(state.pod_levels().len(), 1, "one record for the pod");
    let model = state.read_model(|m| m.pod("pA").cloned()).expect("pod");
    assert_eq!(
        model
            .resources
            .map(|r| limits_text(&PodLimits::from_linux(&r))),
        Some("200m/64Mi".into()),
        "the model is back at the previous resources"
    );
    // The read-back after the revert's answer finds the pod cgroup where it always was.
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        let r = record(&state);
        if r.matches.is_some() {
            break r;
        }
        assert!(Instant::now() < deadline, "no read-back: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((r.matches, r.state), (Some(true), None), "{r:?}");
    assert_eq!(
        r.actual.map(|a| limits_text(&a)).as_deref(),
        Some("300m/80Mi")
    );
    wire.close().await;
}

#[tokio::test]
async fn page_cache_in_the_way_of_a_pod_decrease_is_reclaimed_first_and_the_figures_say_so() {
    let f = Fixture::new();
    // 300Mi used: 40Mi anonymous, 260Mi page cache; the fixture's "kernel" reclaims nothing.
    f.pod_cgroup("max 100000", "max", 300 * MI);
    f.pod_memory(40 * MI, 0, 260 * MI);
    for (mode, refused) in [(Mode::Observe, false), (Mode::Enforce, true)] {
        let (state, h) = f.handler(mode);
        h.run_pod_sandbox(pod()).await.expect("run");
        let out = h
            .update_pod_sandbox(pod(), None, Some(limits(500, 100 * MI)), Deadline::none())
            .await;
        assert_eq!(out.is_err(), refused, "{mode:?}: {out:?}");
        let r = record(&state);
        assert_eq!(r.state, Some(ResizeState::Deferred), "{r:?}");
        assert_eq!(
            r.reason,
            "usage 300Mi above requested pod limit 100Mi (260Mi of page cache still charged); the limit is written once usage fits"
        );
        // Observe changes nothing; Enforce asked the kernel for page cache, in a short pass.
        let written = f.reclaim_written();
        match mode {
            Mode::Observe => assert_eq!(written, "", "observe reclaims nothing"),
            Mode::Enforce => assert_eq!(written, (16 * MI).to_string()),
        }
    }
    // Below the anonymous memory: refused without a reclaim.
    f.pod_memory(40 * MI, 0, 260 * MI);
    let (state, h) = f.handler(Mode::Enforce);
    let out = h
        .update_pod_sandbox(pod(), None, Some(limits(500, 32 * MI)), Deadline::none())
        .await;
    assert!(out.is_err());
    assert_eq!(
        record(&state).reason,
        "usage 300Mi above requested pod limit 32Mi: 40Mi of anonymous memory cannot be reclaimed without swap"
    );
    assert_eq!(f.reclaim_written(), "", "nothing to reclaim for");
}

#[tokio::test]
async fn a_pod_decrease_below_the_working_set_trimming_found_is_refused() {
    let f = Fixture::new();
    f.pod_cgroup("max 100000", "max", 300 * MI);
    f.pod_memory(40 * MI, 0, 260 * MI);
    // The container's cgroup: 200Mi charged, no page cache left to drop, so trimming converges
    // on a working set of 200Mi.
    let ctr_dir = f.cg.path().join("kubepods/podA/ctr");
    std::fs::create_dir_all(&ctr_dir).expect("mkdir");
    for (file, text) in [
        ("memory.current", (200 * MI).to_string()),
        (
            "memory.stat",
            format!("anon {}\nfile 0\nshmem 0\nactive_file 0\ninactive_file 0\nworkingset_refault_file 0\n", 200 * MI),
        ),
        ("memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n".to_owned()),
        ("io.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n".to_owned()),
        ("memory.reclaim", String::new()),
    ] {
        std::fs::write(ctr_dir.join(file), text).expect("write");
    }
    let (state, h) = f.handler(Mode::Enforce);
    crate::sync::ReadWriteLocked::write_locked(&state.config)
        .trim
        .interval = Duration::from_millis(50);
    let cancel = CancellationToken::new();
    let trimmer = Trimmer::start_with(state.clone(), &cancel, || false);
    let h = h.with_trimmer(trimmer.clone());
    let mut app = container("app", limits(500, 100 * MI));
    app.cgroups_path = "/kubepods/podA/ctr".into();
    h.create_container(pod(), app.clone())
        .await
        .expect("create");
    trimmer.watch(
        &app.id,
        crate::trim::TrimTarget {
            labels: metrics::ContainerLabels {
                namespace: "ns".into(),
                pod: "web".into(),
                container: "app".into(),
            },
            cgroup: "/kubepods/podA/ctr".into(),
            annotations: [(crate::policy::TRIM_ANNOTATION.to_owned(), "on".to_owned())].into(),
        },
    );
    for _ in 0..400 {
        if trimmer.working_set(&app.id).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        trimmer.working_set(&app.id),
        Some(200 * MI),
        "{:?}",
        trimmer.state(&app.id)
    );
    let out = h
        .update_pod_sandbox(pod(), None, Some(limits(500, 128 * MI)), Deadline::none())
        .await;
    assert!(out.is_err(), "{out:?}");
    assert_eq!(
        record(&state).reason,
        "requested pod limit 128Mi is below the working set trimming found for the pod's containers (200Mi; usage 300Mi): reclaiming below it would evict memory they use"
    );
    assert_eq!(
        f.reclaim_written(),
        "",
        "trimming's working set is not reclaimed into"
    );
    // Above the working set: page cache is reclaimed first (and, the fixture's kernel
    // reclaiming nothing, the limit waits).
    let out = h
        .update_pod_sandbox(pod(), None, Some(limits(500, 256 * MI)), Deadline::none())
        .await;
    assert!(out.is_err(), "{out:?}");
    assert_eq!(f.reclaim_written(), (16 * MI).to_string());
    trimmer.shutdown().await;
}

#[tokio::test]
async fn a_pod_whose_memory_stat_cannot_be_read_is_judged_by_its_usage_alone() {
    let f = Fixture::new();
    f.pod_cgroup("max 100000", "max", 300 * MI);
    // A directory where memory.stat should be: reading it fails (EISDIR).
    let dir = f.cg.path().join(POD_CG.trim_start_matches('/'));
    std::fs::create_dir_all(dir.join("memory.stat")).expect("mkdir");
    let (state, h) = f.handler(Mode::Enforce);
    let out = h
        .update_pod_sandbox(pod(), None, Some(limits(500, 100 * MI)), Deadline::none())
        .await;
    assert!(out.is_err(), "{out:?}");
    assert_eq!(
        record(&state).reason,
        "usage 300Mi above requested pod limit 100Mi: memory.stat gives no breakdown, so all of it counts as memory that cannot be reclaimed"
    );
    // A raise needs no breakdown.
    h.update_pod_sandbox(pod(), None, Some(limits(500, 512 * MI)), Deadline::none())
        .await
        .expect("a raise is admitted");
}

/// What the pod-level handler holds against a pod memory limit it could not check in time:
/// `UpdatePodSandbox` overran the runtime's deadline.
fn pod_asking(memory: Option<u64>) -> LinuxResources {
    LinuxResources {
        memory: memory.map(|m| MemoryResources {
            limit: Some(i64::try_from(m).expect("fits")),
            ..MemoryResources::default()
        }),
        ..limits(500, 0)
    }
}

/// `UpdatePodSandbox` not decided within the runtime's deadline (the transport asks the
/// handler before it answers fail-open): a pod memory limit below the one nri-resize knows, one
/// set where the pod had none, or one for a pod it knows nothing of is refused when enforcing,
/// recorded Deferred with the reason and counted; a raise, an equal limit (a CPU-only change)
/// and no limit at all are let through; observing, the decrease is recorded and let through.
#[tokio::test]
async fn a_pod_memory_decrease_not_decided_in_time_is_refused_recorded_and_counted() {
    let f = Fixture::new();
    let (state, h) = f.handler(Mode::Enforce);
    let mut known = pod();
    known.resources = Some(limits(500, 256 * MI));
    h.run_pod_sandbox(known.clone()).await.expect("run");

    for (asked, what) in [
        (Some(512 * MI), "a raise"),
        (Some(256 * MI), "a CPU-only change"),
        (None, "no memory limit"),
    ] {
        assert_eq!(
            h.undecided_pod_memory_decrease(&known, None, &pod_asking(asked)),
            None,
            "{what} is let through"
        );
    }
    assert!(state.pod_levels().is_empty(), "nothing to record");

    let refused = h
        .undecided_pod_memory_decrease(&known, None, &pod_asking(Some(128 * MI)))
        .expect("a decrease nobody checked is refused");
    for part in [
        "pod-level resize of ns/web refused",
        "pod memory limit 128Mi not checked against the pod's usage",
        "within the runtime's deadline",
        "kubelet asks again",
    ] {
        assert!(refused.0.contains(part), "{part:?} missing: {refused}");
    }
    let r = record(&state);
    assert_eq!(r.state, Some(ResizeState::Deferred), "{r:?}");
    assert!(r.reason.contains("within the runtime's deadline"), "{r:?}");
    assert_eq!(limits_text(&r.desired), "500m/128Mi");
    let text = state.metrics.encode().expect("encode");
    let counted = r#"nri_resize_resize_outcomes_total{outcome="deferred"} 1"#;
    assert!(text.contains(counted), "{counted} missing:\n{text}");

    // Overhead counts: 112Mi asked plus 16Mi overhead is the pod cgroup's 128Mi, below 256Mi.
    assert!(h
        .undecided_pod_memory_decrease(
            &known,
            Some(&pod_asking(Some(16 * MI))),
            &pod_asking(Some(112 * MI))
        )
        .is_some());
    // Where the pod had no memory limit, or nothing is known of it: it cannot be checked.
    let mut unlimited = pod();
    unlimited.id = "pB".into();
    unlimited.resources = Some(pod_asking(None));
    h.run_pod_sandbox(unlimited.clone()).await.expect("run");
    let mut unknown = pod();
    unknown.id = "pC".into();
    for p in [&unlimited, &unknown] {
        assert!(
            h.undecided_pod_memory_decrease(p, None, &pod_asking(Some(512 * MI)))
                .is_some(),
            "{}: a limit set unchecked is refused",
            p.id
        );
    }

    // Observing: recorded, let through.
    let (state, h) = f.handler(Mode::Observe);
    h.run_pod_sandbox(known.clone()).await.expect("run");
    assert_eq!(
        h.undecided_pod_memory_decrease(&known, None, &pod_asking(Some(128 * MI))),
        None
    );
    assert_eq!(record(&state).state, Some(ResizeState::Deferred));
}

/// kubelet 1.36 calls `UpdatePodSandbox` before it writes the pod cgroup. The pod cgroup read
/// is held (a stuck cgroupfs) past the deadline of a runtime that gives plugins 200 ms: a pod
/// memory decrease is answered with a refusal while the read is still held, never let
/// through; a CPU-only change and a raise under the same held read are answered OK.
#[tokio::test]
async fn a_pod_memory_decrease_whose_read_is_held_past_the_deadline_is_refused_over_the_wire() {
    let f = Fixture::new();
    let (state, h, gate) = f.handler_gated(Mode::Enforce);
    let _open = gate.open_on_drop();
    let wire = Wire::connect_with_request_timeout(h, 200).await;
    let plugin = &wire.plugin;
    // The pod as it runs: 200m/64Mi (pb_pod's resources), no overhead.
    let run = pb::RunPodSandboxRequest {
        pod: MessageField::some(pb_pod()),
        ..Default::default()
    };
    plugin.run_pod_sandbox(ctx(), &run).await.expect("run");
    let asking = |cpu_millis, memory| pb::UpdatePodSandboxRequest {
        pod: MessageField::some(pb_pod()),
        linux_resources: MessageField::some(pb_resources(cpu_millis, memory)),
        ..Default::default()
    };

    let err = plugin
        .update_pod_sandbox(ctx(), &asking(200, 32 << 20))
        .await
        .expect_err("a decrease nobody checked is refused");
    assert!(gate.held() > 0, "answered while the read was still held");
    let msg = err.to_string();
    for part in [
        "ns/web",
        "pod memory limit 32Mi not checked against the pod's usage",
        "within the runtime's deadline",
    ] {
        assert!(msg.contains(part), "{part:?} missing: {msg}");
    }
    let r = record(&state);
    assert_eq!(r.state, Some(ResizeState::Deferred), "{r:?}");
    assert!(r.reason.contains("within the runtime's deadline"), "{r:?}");
    let kept = state.read_model(|m| m.pod("pA").cloned()).expect("pod");
    assert_eq!(
        kept.resources
            .map(|r| limits_text(&PodLimits::from_linux(&r))),
        Some("200m/64Mi".into()),
        "the model keeps the pod as it was"
    );

    plugin
        .update_pod_sandbox(ctx(), &asking(500, 64 << 20))
        .await
        .expect("a CPU-only change is answered OK");
    plugin
        .update_pod_sandbox(ctx(), &asking(500, 128 << 20))
        .await
        .expect("a raise is answered OK");
    assert!(gate.held() > 0, "the reads were still held");
    gate.open();
    wire.close().await;
}
