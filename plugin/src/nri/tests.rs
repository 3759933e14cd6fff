//! Transport tests against a runtime peer made of the same parts containerd uses: the mux framing
//! and a ttrpc client (conn 1) and server (conn 2) over an in-memory trunk. The real runtime is
//! exercised by the integration tests in `tests/`.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use nri_resize_proto::api as pb;
use nri_resize_proto::api_ttrpc::{create_runtime, PluginClient, Runtime};
use protobuf::{EnumOrUnknown, MessageField};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use ttrpc::r#async::TtrpcContext;

use super::*;
use crate::model::{Container, EventKind, LinuxResources, Pod};

#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    sync_sizes: Mutex<Vec<(usize, usize)>>,
    slow: bool,
    /// `update_pod_sandbox` never answers within the deadline.
    slow_pod_update: bool,
    /// Blocks the thread this long in `synchronize`: a starved process, which no timer can cut.
    starve_sync: Option<Duration>,
    reject_config: bool,
}

impl Recorder {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl Handler for Recorder {
    fn events(&self) -> EventSet {
        EventKind::ALL.into_iter().collect()
    }
    async fn configure(&self, rt: &RuntimeInfo, config: &str) -> Result<(), Rejection> {
        self.log(format!("configure {} {} {config:?}", rt.name, rt.version));
        if self.reject_config {
            return Err(Rejection("bad config".into()));
        }
        Ok(())
    }
    async fn synchronize(
        &self,
        pods: Vec<Pod>,
        containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, Rejection> {
        self.sync_sizes
            .lock()
            .unwrap()
            .push((pods.len(), containers.len()));
        self.log("synchronize".into());
        if let Some(d) = self.starve_sync {
            std::thread::sleep(d);
        }
        Ok(vec![])
    }
    async fn run_pod_sandbox(&self, pod: Pod) -> Result<(), Rejection> {
        self.log(format!("run_pod_sandbox {}", pod.full_name()));
        Ok(())
    }
    async fn update_pod_sandbox(
        &self,
        pod: Pod,
        _overhead: Option<LinuxResources>,
        resources: Option<LinuxResources>,
        _deadline: Deadline,
    ) -> Result<(), Rejection> {
        self.log(format!(
            "update_pod_sandbox {} mem={:?}",
            pod.full_name(),
            resources.as_ref().and_then(LinuxResources::memory_limit)
        ));
        if self.slow_pod_update {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(())
    }
    fn undecided_pod_memory_decrease(
        &self,
        pod: &Pod,
        _overhead: Option<&LinuxResources>,
        resources: &LinuxResources,
    ) -> Option<Rejection> {
        let mem = resources.memory_limit();
        self.log(format!("undecided {} mem={mem:?}", pod.full_name()));
        // This double takes every pod memory limit for a decrease.
        mem.map(|m| Rejection(format!("pod memory limit {m} not checked in time")))
    }
    async fn stop_pod_sandbox(&self, pod: Pod) {
        self.log(format!("stop_pod_sandbox {}", pod.full_name()));
    }
    async fn create_container(&self, pod: Pod, c: Container) -> Result<CreateReply, Rejection> {
        self.log(format!(
            "create_container {} {} quota={:?}",
            pod.full_name(),
            c.name,
            c.resources.as_ref().and_then(LinuxResources::cpu_quota)
        ));
        if self.slow {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        let adjust = LinuxResources {
            pids_limit: Some(77),
            ..Default::default()
        };
        Ok(CreateReply {
            adjust: Some(adjust),
            ..Default::default()
        })
    }
    async fn update_container(
        &self,
        _pod: Pod,
        c: Container,
        r: LinuxResources,
        _deadline: Deadline,
    ) -> Result<UpdateReply, Rejection> {
        self.log(format!(
            "update_container {} mem={:?}",
            c.name,
            r.memory_limit()
        ));
        if r.memory_limit() == Some(1) {
            return Err(Rejection("memory limit of 1 byte refused".into()));
        }
        Ok(UpdateReply {
            evictions: vec![Eviction {
                container_id: c.id,
                reason: "testing".into(),
            }],
            ..Default::default()
        })
    }
    async fn start_container(&self, _pod: Pod, c: Container) {
        self.log(format!("start_container {}", c.name));
    }
    async fn post_update_container(&self, _pod: Pod, c: Container) {
        self.log(format!("post_update_container {}", c.name));
    }
    async fn remove_container(&self, _pod: Pod, c: Container) {
        self.log(format!("remove_container {}", c.name));
    }
    async fn validate_container_adjustment(
        &self,
        _pod: Pod,
        c: Container,
        adj: Option<LinuxResources>,
    ) -> Result<(), Rejection> {
        self.log(format!("validate {}", c.name));
        if adj.and_then(|a| a.memory_limit()).is_some() {
            return Err(Rejection("memory adjustments not allowed".into()));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct FakeRuntimeService {
    registered: Mutex<Vec<(String, String, String)>>,
    updates: Mutex<Vec<pb::UpdateContainersRequest>>,
}

#[async_trait]
impl Runtime for FakeRuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: pb::RegisterPluginRequest,
    ) -> ttrpc::Result<pb::Empty> {
        self.registered
            .lock()
            .unwrap()
            .push((req.plugin_name, req.plugin_idx, req.NRI_version));
        Ok(pb::Empty::new())
    }
    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: pb::UpdateContainersRequest,
    ) -> ttrpc::Result<pb::UpdateContainersResponse> {
        let failed = req
            .update
            .iter()
            .filter(|u| u.container_id == "missing")
            .cloned()
            .collect();
        self.updates.lock().unwrap().push(req);
        Ok(pb::UpdateContainersResponse {
            failed,
            ..Default::default()
        })
    }
}

/// The runtime end of a trunk: a ttrpc client for the plugin service, a ttrpc server for ours.
struct FakeRuntime {
    plugin: PluginClient,
    raw: Client,
    service: Arc<FakeRuntimeService>,
    _server: Server,
    mux: Mux,
}

impl FakeRuntime {
    async fn start(trunk: DuplexStream) -> FakeRuntime {
        let mut mux = Mux::start(trunk, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let c1 = mux.take(PLUGIN_SERVICE_CONN).unwrap();
        let c2 = mux.take(RUNTIME_SERVICE_CONN).unwrap();
        let service = Arc::new(FakeRuntimeService::default());
        let mut server = Server::new()
            .add_listener(one_shot_listener(c2))
            .register_service(create_runtime(service.clone()));
        server.start().await.unwrap();
        let raw = Client::new(Socket::new(c1));
        FakeRuntime {
            plugin: PluginClient::new(raw.clone()),
            raw,
            service,
            _server: server,
            mux,
        }
    }
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(5_000_000_000)
}

fn pb_pod(id: &str) -> pb::PodSandbox {
    let mut p = pb::PodSandbox::new();
    p.id = id.into();
    p.name = format!("pod-{id}");
    p.namespace = "default".into();
    p
}

fn pb_ctr(id: &str, pod: &str, name: &str) -> pb::Container {
    let mut c = pb::Container::new();
    c.id = id.into();
    c.pod_sandbox_id = pod.into();
    c.name = name.into();
    c.state = EnumOrUnknown::new(pb::ContainerState::CONTAINER_CREATED);
    let mut cpu = pb::LinuxCPU::new();
    cpu.quota = MessageField::some(pb::OptionalInt64 {
        value: 50_000,
        ..Default::default()
    });
    let mut res = pb::LinuxResources::new();
    res.cpu = MessageField::some(cpu);
    c.linux = MessageField::some(pb::LinuxContainer {
        resources: MessageField::some(res),
        ..Default::default()
    });
    c
}

struct Setup {
    rt: FakeRuntime,
    handler: Arc<Recorder>,
    link: RuntimeLink,
    cancel: CancellationToken,
    session: tokio::task::JoinHandle<Result<SessionEnd, TransportError>>,
}

async fn setup(handler: Recorder) -> Setup {
    let (plugin_end, runtime_end) = tokio::io::duplex(1 << 20);
    let handler = Arc::new(handler);
    let link = RuntimeLink::default();
    let cancel = CancellationToken::new();
    let id = PluginIdentity {
        socket: "/test".into(),
        name: "nri-resize".into(),
        idx: "42".into(),
    };
    let session = {
        let (h, l, c) = (handler.clone(), link.clone(), cancel.clone());
        tokio::spawn(async move { serve_trunk(plugin_end, &id, h, &l, None, &c).await })
    };
    let rt = FakeRuntime::start(runtime_end).await;
    assert!(
        link.wait_connected(Duration::from_secs(1)).await,
        "plugin did not register"
    );
    assert!(link.status().connected);
    Setup {
        rt,
        handler,
        link,
        cancel,
        session,
    }
}

fn configure_req(nri_version: &str, config: &str) -> pb::ConfigureRequest {
    pb::ConfigureRequest {
        config: config.into(),
        runtime_name: "fake".into(),
        runtime_version: "0.0".into(),
        request_timeout: 2000,
        NRI_version: nri_version.into(),
        ..Default::default()
    }
}

#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "one protocol conversation, step by step"
)]
async fn full_v0_6_flow_registration_config_split_sync_events_and_updates() {
    let s = setup(Recorder::default()).await;
    assert_eq!(
        s.rt.service.registered.lock().unwrap().clone(),
        vec![(
            "nri-resize".to_string(),
            "42".to_string(),
            "v0.12.0".to_string()
        )],
        "the plugin registers with the NRI version it speaks"
    );

    // An old runtime (no NRI_version) gets only events it knows.
    let conf =
        s.rt.plugin
            .configure(ctx(), &configure_req("", "journal_size = 5"))
            .await
            .unwrap();
    assert_eq!(conf.events, (1 << 11) - 1);

    // Split synchronize: the plugin answers `more` with no updates until the last part.
    let part = pb::SynchronizeRequest {
        pods: vec![pb_pod("p1")],
        containers: vec![pb_ctr("c1", "p1", "a")],
        more: true,
        ..Default::default()
    };
    let r = s.rt.plugin.synchronize(ctx(), &part).await.unwrap();
    assert!(r.more && r.update.is_empty());
    assert!(!s.link.status().synchronized);
    let last = pb::SynchronizeRequest {
        pods: vec![pb_pod("p2")],
        containers: vec![pb_ctr("c2", "p2", "b"), pb_ctr("c3", "p2", "c")],
        more: false,
        ..Default::default()
    };
    let r = s.rt.plugin.synchronize(ctx(), &last).await.unwrap();
    assert!(!r.more);
    assert_eq!(s.handler.sync_sizes.lock().unwrap().clone(), vec![(2, 3)]);
    assert!(s.link.status().synchronized);

    // Parts beyond the cap: refused with the reason, nothing buffered or handed on.
    let huge = pb::SynchronizeRequest {
        containers: (0..=service::MAX_SYNC_OBJECTS)
            .map(|i| pb_ctr(&format!("x{i}"), "p1", "x"))
            .collect(),
        more: true,
        ..Default::default()
    };
    let err =
        s.rt.plugin
            .synchronize(ctx(), &huge)
            .await
            .expect_err("over the cap");
    assert!(err.to_string().contains("more than the 100000"), "{err}");
    assert_eq!(
        s.handler.sync_sizes.lock().unwrap().len(),
        1,
        "nothing handed on"
    );

    // Dedicated CreateContainer: the handler's adjustment reaches the wire.
    let req = pb::CreateContainerRequest {
        pod: MessageField::some(pb_pod("p3")),
        container: MessageField::some(pb_ctr("c4", "p3", "app")),
        ..Default::default()
    };
    let r = s.rt.plugin.create_container(ctx(), &req).await.unwrap();
    assert_eq!(r.adjust.linux.resources.pids.limit, 77);

    // UpdateContainer: eviction answer; rejection becomes an error status with the reason.
    let mut mem = pb::LinuxMemory::new();
    mem.limit = MessageField::some(pb::OptionalInt64 {
        value: 1 << 30,
        ..Default::default()
    });
    let mut res = pb::LinuxResources::new();
    res.memory = MessageField::some(mem.clone());
    let upd = pb::UpdateContainerRequest {
        pod: MessageField::some(pb_pod("p3")),
        container: MessageField::some(pb_ctr("c4", "p3", "app")),
        linux_resources: MessageField::some(res.clone()),
        ..Default::default()
    };
    let r = s.rt.plugin.update_container(ctx(), &upd).await.unwrap();
    assert_eq!(r.evict[0].container_id, "c4");
    mem.limit = MessageField::some(pb::OptionalInt64 {
        value: 1,
        ..Default::default()
    });
    res.memory = MessageField::some(mem);
    let mut bad = upd.clone();
    bad.linux_resources = MessageField::some(res);
    let err = s.rt.plugin.update_container(ctx(), &bad).await.unwrap_err();
    assert!(
        err.to_string().contains("memory limit of 1 byte refused"),
        "{err}"
    );

    // StateChange path (NRI v0.6/v0.8) reaches the same handler methods; a pod event that
    // carries an empty container (as containerd sends) is still a pod event.
    for (event, ctr) in [
        (pb::Event::RUN_POD_SANDBOX, None),
        (pb::Event::START_CONTAINER, Some("c4")),
        (pb::Event::POST_UPDATE_CONTAINER, Some("c4")),
        (pb::Event::REMOVE_CONTAINER, Some("c4")),
        (pb::Event::STOP_POD_SANDBOX, Some("")),
    ] {
        let ev = pb::StateChangeEvent {
            event: EnumOrUnknown::new(event),
            pod: MessageField::some(pb_pod("p3")),
            container: ctr.map_or_else(MessageField::none, |id| {
                MessageField::some(pb_ctr(id, "p3", "app"))
            }),
            ..Default::default()
        };
        s.rt.plugin.state_change(ctx(), &ev).await.unwrap();
    }
    // An unknown event number is ignored, not an error.
    let unknown = pb::StateChangeEvent {
        event: EnumOrUnknown::from_i32(99),
        pod: MessageField::some(pb_pod("p3")),
        ..Default::default()
    };
    s.rt.plugin.state_change(ctx(), &unknown).await.unwrap();
    // A container event without its pod is malformed: an error, no panic.
    let no_pod = pb::StateChangeEvent {
        event: EnumOrUnknown::new(pb::Event::START_CONTAINER),
        container: MessageField::some(pb_ctr("c4", "p3", "app")),
        ..Default::default()
    };
    assert!(s.rt.plugin.state_change(ctx(), &no_pod).await.is_err());

    // Unsolicited UpdateContainers through the link reaches the runtime; failures come back.
    let upd = ContainerUpdate {
        container_id: "c1".into(),
        resources: LinuxResources {
            pids_limit: Some(9),
            ..Default::default()
        },
        ignore_failure: false,
    };
    let missing = ContainerUpdate {
        container_id: "missing".into(),
        ..upd.clone()
    };
    let failed = s
        .link
        .update_containers(
            &[upd, missing],
            &[Eviction {
                container_id: "c2".into(),
                reason: "why".into(),
            }],
        )
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].container_id, "missing");
    let seen = s.rt.service.updates.lock().unwrap().clone();
    assert_eq!(seen[0].update[0].linux.resources.pids.limit, 9);
    assert_eq!(seen[0].evict[0].reason, "why");

    assert_eq!(
        s.handler.calls(),
        [
            "configure fake 0.0 \"journal_size = 5\"",
            "synchronize",
            "create_container default/pod-p3 app quota=Some(50000)",
            "update_container app mem=Some(1073741824)",
            "update_container app mem=Some(1)",
            "run_pod_sandbox default/pod-p3",
            "start_container app",
            "post_update_container app",
            "remove_container app",
            "stop_pod_sandbox default/pod-p3",
        ]
    );

    // The runtime going away ends the session cleanly and the link says so.
    drop(s.rt);
    let end = tokio::time::timeout(Duration::from_secs(5), s.session)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(end, SessionEnd::RuntimeClosed);
    assert!(!s.link.status().connected);
    assert!(matches!(
        s.link.update_containers(&[], &[]).await,
        Err(LinkError::NotConnected)
    ));
}

/// Runtimes of NRI v0.10 and v0.11 (CRI-O 1.34–1.36, containerd 2.2) accept the pod-level
/// events but do not announce their NRI version: it is inferred from their release.
#[tokio::test]
async fn a_runtime_that_announces_no_nri_version_is_known_by_its_release() {
    let s = setup(Recorder::default()).await;
    for (name, release, events) in [
        ("cri-o", "1.36.3", (1 << 14) - 1),
        ("containerd", "v2.2.7", (1 << 14) - 1),
        ("containerd", "2.1.9+unknown", (1 << 11) - 1),
        ("cri-o", "1.33.4", (1 << 11) - 1),
    ] {
        let mut req = configure_req("", "");
        req.runtime_name = name.into();
        req.runtime_version = release.into();
        let conf = s.rt.plugin.configure(ctx(), &req).await.unwrap();
        assert_eq!(conf.events, events, "{name} {release}");
    }
    let status = s.link.status();
    let runtime = status.runtime.expect("configured");
    assert_eq!(
        runtime.nri_description(),
        "v0.9.1 (inferred from cri-o 1.33.4)"
    );
}

#[tokio::test]
async fn v0_10_dedicated_rpcs_and_validation() {
    let s = setup(Recorder::default()).await;
    let conf =
        s.rt.plugin
            .configure(ctx(), &configure_req("v0.10.0", ""))
            .await
            .unwrap();
    assert_eq!(
        conf.events,
        (1 << 14) - 1,
        "a v0.10 runtime gets the full mask"
    );

    s.rt.plugin
        .run_pod_sandbox(
            ctx(),
            &pb::RunPodSandboxRequest {
                pod: MessageField::some(pb_pod("p9")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    s.rt.plugin
        .stop_pod_sandbox(
            ctx(),
            &pb::StopPodSandboxRequest {
                pod: MessageField::some(pb_pod("p9")),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let start = pb::StartContainerRequest {
        pod: MessageField::some(pb_pod("p9")),
        container: MessageField::some(pb_ctr("c9", "p9", "web")),
        ..Default::default()
    };
    s.rt.plugin.start_container(ctx(), &start).await.unwrap();

    let mut adjust = pb::ContainerAdjustment::new();
    let mut res = pb::LinuxResources::new();
    let mut mem = pb::LinuxMemory::new();
    mem.limit = MessageField::some(pb::OptionalInt64 {
        value: 5,
        ..Default::default()
    });
    res.memory = MessageField::some(mem);
    adjust.linux = MessageField::some(pb::LinuxContainerAdjustment {
        resources: MessageField::some(res),
        ..Default::default()
    });
    let v = pb::ValidateContainerAdjustmentRequest {
        pod: MessageField::some(pb_pod("p9")),
        container: MessageField::some(pb_ctr("c9", "p9", "web")),
        adjust: MessageField::some(adjust),
        ..Default::default()
    };
    let verdict =
        s.rt.plugin
            .validate_container_adjustment(ctx(), &v)
            .await
            .unwrap();
    assert!(verdict.reject);
    assert_eq!(verdict.reason, "memory adjustments not allowed");

    // Requests missing their pod are malformed: an INVALID_ARGUMENT error, the session lives on.
    let err =
        s.rt.plugin
            .run_pod_sandbox(ctx(), &pb::RunPodSandboxRequest::new())
            .await
            .unwrap_err();
    assert!(err.to_string().contains("lacks pod"), "{err}");

    assert_eq!(
        s.handler.calls()[1..],
        [
            "run_pod_sandbox default/pod-p9",
            "stop_pod_sandbox default/pod-p9",
            "start_container web",
            "validate web"
        ]
    );

    // Shutdown, then close: reported as a runtime shutdown.
    s.rt.plugin
        .shutdown(ctx(), &pb::Empty::new())
        .await
        .unwrap();
    drop(s.rt);
    let end = tokio::time::timeout(Duration::from_secs(5), s.session)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(end, SessionEnd::RuntimeShutdown);
}

#[tokio::test]
async fn rejected_config_is_an_error_answer() {
    let s = setup(Recorder {
        reject_config: true,
        ..Default::default()
    })
    .await;
    let err =
        s.rt.plugin
            .configure(ctx(), &configure_req("", "nonsense"))
            .await
            .unwrap_err();
    assert!(err.to_string().contains("bad config"), "{err}");
    s.cancel.cancel();
    assert_eq!(s.session.await.unwrap().unwrap(), SessionEnd::Cancelled);
}

#[tokio::test]
async fn a_handler_past_the_deadline_is_answered_fail_open() {
    let s = setup(Recorder {
        slow: true,
        ..Default::default()
    })
    .await;
    // The runtime announces a 200 ms deadline: the plugin cuts its handler at 150 ms.
    let mut conf = configure_req("", "");
    conf.request_timeout = 200;
    s.rt.plugin.configure(ctx(), &conf).await.unwrap();
    let req = pb::CreateContainerRequest {
        pod: MessageField::some(pb_pod("p1")),
        container: MessageField::some(pb_ctr("c1", "p1", "slow")),
        ..Default::default()
    };
    let r =
        s.rt.plugin
            .create_container(ttrpc::context::with_timeout(1_000_000_000), &req)
            .await
            .expect("answered before the runtime's deadline");
    assert!(r.adjust.is_none(), "fail-open answer adjusts nothing");
    s.cancel.cancel();
}

/// `UpdatePodSandbox` past the deadline: the transport asks the handler about the request it
/// could not decide before answering, and delivers its refusal (a pod memory decrease);
/// a request the handler lets through, or one without resources, is answered fail-open.
#[tokio::test]
async fn a_pod_update_past_the_deadline_is_refused_when_the_handler_says_so() {
    let s = setup(Recorder {
        slow_pod_update: true,
        ..Default::default()
    })
    .await;
    let mut conf = configure_req("v0.12.0", "");
    conf.request_timeout = 200;
    s.rt.plugin.configure(ctx(), &conf).await.unwrap();
    let asking = |memory: Option<i64>| {
        let mut r = pb::LinuxResources::new();
        let mut cpu = pb::LinuxCPU::new();
        cpu.quota = MessageField::some(pb::OptionalInt64 {
            value: 50_000,
            ..Default::default()
        });
        r.cpu = MessageField::some(cpu);
        if let Some(m) = memory {
            let mut mem = pb::LinuxMemory::new();
            mem.limit = MessageField::some(pb::OptionalInt64 {
                value: m,
                ..Default::default()
            });
            r.memory = MessageField::some(mem);
        }
        pb::UpdatePodSandboxRequest {
            pod: MessageField::some(pb_pod("p1")),
            linux_resources: MessageField::some(r),
            ..Default::default()
        }
    };
    let err =
        s.rt.plugin
            .update_pod_sandbox(ctx(), &asking(Some(1 << 20)))
            .await
            .expect_err("refused by the handler after the deadline");
    assert!(
        err.to_string()
            .contains("nri-resize: pod memory limit 1048576 not checked in time"),
        "{err}"
    );
    s.rt.plugin
        .update_pod_sandbox(ctx(), &asking(None))
        .await
        .expect("let through by the handler: fail-open");
    let bare = pb::UpdatePodSandboxRequest {
        pod: MessageField::some(pb_pod("p1")),
        ..Default::default()
    };
    s.rt.plugin
        .update_pod_sandbox(ctx(), &bare)
        .await
        .expect("no resources asked: fail-open");
    assert_eq!(
        s.handler.calls()[1..],
        [
            "update_pod_sandbox default/pod-p1 mem=Some(1048576)",
            "undecided default/pod-p1 mem=Some(1048576)",
            "update_pod_sandbox default/pod-p1 mem=None",
            "undecided default/pod-p1 mem=None",
            "update_pod_sandbox default/pod-p1 mem=None",
        ],
        "the handler is asked after its call overran, and only about a request with resources"
    );
    s.cancel.cancel();
}

/// containerd 1.7 drops a plugin whose `Synchronize` answer misses its deadline but leaves the
/// connection open and never sends it another event: the plugin ends the session (to register
/// again) instead of counting itself synchronized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronize_answered_after_the_deadline_ends_the_session() {
    let s = setup(Recorder {
        starve_sync: Some(Duration::from_millis(300)),
        ..Default::default()
    })
    .await;
    let mut conf = configure_req("", "");
    conf.request_timeout = 200;
    s.rt.plugin.configure(ctx(), &conf).await.unwrap();
    let req = pb::SynchronizeRequest {
        pods: vec![pb_pod("p1")],
        ..Default::default()
    };
    // The fake runtime waits longer than the deadline it announced, to see what the plugin says.
    let r = s.rt.plugin.synchronize(ctx(), &req).await;
    let end = tokio::time::timeout(Duration::from_secs(5), s.session)
        .await
        .expect("the session ends")
        .unwrap()
        .unwrap();
    assert_eq!(end, SessionEnd::SynchronizedLate, "answer: {r:?}");
    assert!(!s.link.status().synchronized);
    assert!(!s.link.status().connected);
}

#[tokio::test]
async fn unknown_method_gets_an_error_status() {
    let s = setup(Recorder::default()).await;
    let mut req = ttrpc::Request::new();
    req.set_service("nri.pkg.api.v1alpha1.Plugin".into());
    req.set_method("NoSuchMethod".into());
    req.set_timeout_nano(1_000_000_000);
    let resp = s.rt.raw.request(req).await;
    let err = resp.expect_err("unknown method must fail");
    let msg = err.to_string();
    assert!(
        msg.contains("NoSuchMethod") || msg.to_lowercase().contains("not"),
        "{msg}"
    );
    // The session still serves.
    s.rt.plugin
        .configure(ctx(), &configure_req("", ""))
        .await
        .unwrap();
    s.cancel.cancel();
}

#[tokio::test]
async fn garbage_payload_for_a_real_method_is_an_error_not_a_panic() {
    let s = setup(Recorder::default()).await;
    let mut req = ttrpc::Request::new();
    req.set_service("nri.pkg.api.v1alpha1.Plugin".into());
    req.set_method("CreateContainer".into());
    req.set_payload(vec![0xff, 0xff, 0xff, 0xff, 0x0f, 0x01]);
    req.set_timeout_nano(1_000_000_000);
    let err =
        s.rt.raw
            .request(req)
            .await
            .expect_err("undecodable request must fail");
    assert!(!err.to_string().is_empty());
    assert!(
        s.handler.calls().is_empty(),
        "handler must not see a garbage request"
    );
    s.rt.plugin
        .configure(ctx(), &configure_req("", ""))
        .await
        .unwrap();
    s.cancel.cancel();
}

/// Raw trunk bytes from a broken runtime: every case ends the session with an error, promptly.
#[tokio::test]
async fn malformed_frames_end_the_session_with_a_clear_error() {
    async fn feed(bytes: &[u8], close: bool) -> Result<SessionEnd, TransportError> {
        let (plugin_end, mut runtime_end) = tokio::io::duplex(1 << 16);
        let handler = Arc::new(Recorder::default());
        let link = RuntimeLink::default();
        let cancel = CancellationToken::new();
        let id = PluginIdentity {
            socket: "/test".into(),
            name: "x".into(),
            idx: "00".into(),
        };
        let task = tokio::spawn(async move {
            serve_trunk(plugin_end, &id, handler, &link, None, &cancel).await
        });
        // Swallow the plugin's registration request, then send the bad bytes.
        let mut hdr = [0u8; 8];
        runtime_end.read_exact(&mut hdr).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(hdr[4..].try_into().unwrap()) as usize];
        runtime_end.read_exact(&mut body).await.unwrap();
        runtime_end.write_all(bytes).await.unwrap();
        if close {
            drop(runtime_end);
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .unwrap()
                .unwrap()
        } else {
            let r = tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .unwrap()
                .unwrap();
            drop(runtime_end);
            r
        }
    }
    let oversized = [&1u32.to_be_bytes()[..], &u32::MAX.to_be_bytes()[..]].concat();
    let err = feed(&oversized, false).await.unwrap_err().to_string();
    assert!(err.contains("more than"), "{err}");

    let unknown = [&9u32.to_be_bytes()[..], &3u32.to_be_bytes()[..], b"abc"].concat();
    let err = feed(&unknown, false).await.unwrap_err().to_string();
    assert!(err.contains("unknown connection id 9"), "{err}");

    let truncated = [&2u32.to_be_bytes()[..], &100u32.to_be_bytes()[..], b"abc"].concat();
    let err = feed(&truncated, true).await.unwrap_err().to_string();
    assert!(
        err.contains("registration") || err.contains("middle of a frame"),
        "{err}"
    );
}

#[tokio::test]
async fn cancel_ends_a_live_session() {
    let s = setup(Recorder::default()).await;
    s.cancel.cancel();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), s.session)
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        SessionEnd::Cancelled
    );
    assert!(!s.link.status().connected);
    drop(s.rt.mux);
}

#[test]
fn every_served_request_is_decodable_by_the_fuzzed_decoder() {
    for method in DECODED_METHODS {
        decode_plugin_request(method, &[])
            .unwrap_or_else(|e| panic!("{method}: an empty payload is a valid message: {e}"));
    }
}
