//! Handler time per NRI event with 1,000 containers in the model, p50/p99, side by side with a
//! baseline handler that does nothing (the floor: the async call itself). The measured handler is
//! the daemon's, with the resize engine deciding updates. Target: p99 < 1 ms.
//!
//! Run: `cargo bench -p nri-resize --bench handler` (part of `cargo xtask bench`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nri_resize::config::Config;
use nri_resize::daemon::{ModelHandler, NodeState};
use nri_resize::model::{
    Container, ContainerState, CpuResources, EventKind, LinuxResources, MemoryResources, Pod,
};
use nri_resize::nri::{EventSet, Handler};

const MODEL_CONTAINERS: usize = 1000;
const SAMPLES: usize = 20_000;

/// The baseline: implements the events with empty bodies.
#[derive(Debug)]
struct NoopHandler;

#[async_trait]
impl Handler for NoopHandler {
    fn events(&self) -> EventSet {
        EventKind::ALL.into_iter().collect()
    }
}

fn resources(i: usize) -> LinuxResources {
    let i = i64::try_from(i).expect("small");
    LinuxResources {
        cpu: Some(CpuResources {
            shares: Some(512),
            quota: Some(50_000 + i),
            period: Some(100_000),
            ..Default::default()
        }),
        memory: Some(MemoryResources {
            limit: Some((64 << 20) + i),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod(i: usize) -> Pod {
    Pod {
        id: format!("pod-{i:06}"),
        name: format!("web-{i}"),
        namespace: "default".into(),
        uid: format!("uid-{i}"),
        annotations: [(
            "resize-policy.nri-resize.io/pod".to_string(),
            "cpu=NotRequired".to_string(),
        )]
        .into(),
        cgroup_parent: format!("/kubepods/pod{i}"),
        ..Pod::default()
    }
}

fn container(i: usize, pod: usize) -> Container {
    Container {
        id: format!("{i:064x}"),
        pod_id: format!("pod-{pod:06}"),
        name: format!("c{}", i % 3),
        state: ContainerState::Running,
        pid: Some(1000 + u32::try_from(i).expect("small")),
        cgroups_path: format!("/kubepods/pod{pod}/{i:064x}"),
        resources: Some(resources(i)),
        ..Container::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "index of a small slice"
    )]
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

async fn measure<H: Handler>(h: &H, event: EventKind) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(SAMPLES);
    for n in 0..SAMPLES {
        let i = n % MODEL_CONTAINERS;
        let p = pod(i / 3);
        let c = container(i, i / 3);
        let start = Instant::now();
        match event {
            EventKind::CreateContainer => drop(black_box(h.create_container(p, c).await)),
            EventKind::UpdateContainer => {
                drop(black_box(h.update_container(p, c, resources(n)).await));
            }
            EventKind::PostUpdateContainer => h.post_update_container(p, c).await,
            EventKind::StartContainer => h.start_container(p, c).await,
            EventKind::StopContainer => drop(black_box(h.stop_container(p, c).await)),
            _ => unreachable!("not measured"),
        }
        samples.push(start.elapsed());
    }
    samples.sort_unstable();
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

fn us(d: Duration) -> String {
    format!("{:.2} µs", d.as_secs_f64() * 1e6)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let state = NodeState::new(Config::default());
    let pods: Vec<Pod> = (0..=(MODEL_CONTAINERS / 3)).map(pod).collect();
    let containers: Vec<Container> = (0..MODEL_CONTAINERS).map(|i| container(i, i / 3)).collect();
    // The handler as the daemon runs it: with the resize engine deciding every update (policy,
    // admission against node capacity read from /sys and /proc); cgroup access off, so no writes.
    let engine = std::sync::Arc::new(nri_resize::resize::Engine::new(
        state.clone(),
        nri_resize::nri::RuntimeLink::default(),
        None,
        nri_resize::resize::node::NodeReader::new("/"),
        None,
    ));
    let handler = ModelHandler::new(state.clone()).with_engine(engine);
    handler
        .synchronize(pods, containers)
        .await
        .expect("synchronize");
    assert_eq!(
        state.read_model(nri_resize::model::Model::container_count),
        MODEL_CONTAINERS
    );

    println!("handler time per event, {MODEL_CONTAINERS} containers in the model, {SAMPLES} samples each (target: p99 < 1 ms)");
    println!(
        "{:<24} {:>14} {:>14} {:>14} {:>14} {:>10}",
        "event", "baseline p50", "baseline p99", "ours p50", "ours p99", "p99 ratio"
    );
    for event in [
        EventKind::CreateContainer,
        EventKind::StartContainer,
        EventKind::UpdateContainer,
        EventKind::PostUpdateContainer,
        EventKind::StopContainer,
    ] {
        let (b50, b99) = measure(&NoopHandler, event).await;
        let (o50, o99) = measure(&handler, event).await;
        println!(
            "{:<24} {:>14} {:>14} {:>14} {:>14} {:>9.1}x  {}",
            event.as_str(),
            us(b50),
            us(b99),
            us(o50),
            us(o99),
            o99.as_secs_f64() / b99.as_secs_f64().max(1e-9),
            if o99 < Duration::from_millis(1) {
                "ok"
            } else {
                "OVER TARGET"
            }
        );
        nri_resize::bench_table::row(
            &format!(
                "NRI handler, `{}`, {MODEL_CONTAINERS} containers in the model",
                event.as_str()
            ),
            &format!("no-op handler: {} p99", us(b99)),
            &format!("{} p50 / {} p99", us(o50), us(o99)),
            Some(o99.as_secs_f64() / b99.as_secs_f64().max(1e-9)),
            &format!(
                "p99 < 1 ms: {}",
                nri_resize::bench_table::verdict(o99 < Duration::from_millis(1))
            ),
        );
    }
}
