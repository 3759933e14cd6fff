//! Handler time per NRI event with 1,000 containers in the model, p50/p99, side by side with a
//! baseline handler that does nothing (the floor: the async call itself). The measured handler is
//! the daemon's, with the resize engine deciding updates and doing its real cgroup I/O: the pod
//! and container cgroups are real cgroups this bench creates (`nri-resize-bench-handler-<pid>`
//! under the node's cpu and memory hierarchies, removed on exit; no other cgroup is touched), so
//! a memory decrease reads the container's usage (`memory.usage_in_bytes` + `memory.stat` on v1)
//! and an increase reads the pod cgroup and raises it first (the KEP ordering writes).
//! `PostUpdateContainer` answers from memory and leaves the confirmation read-back (a cgroup read
//! on a blocking thread) to run after its answer, as the daemon does: its row is that in-memory
//! work, and the read-backs it left are drained (waited for, not timed) before the next event is
//! measured, so they never land in another event's row.
//! Target: p99 < 1 ms. Needs root (it creates cgroups).
//!
//! Run: `cargo bench -p nri-resize --bench handler` (part of `cargo xtask bench`).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nri_resize::config::Config;
use nri_resize::daemon::ModelHandler;
use nri_resize::model::{
    Container, ContainerState, CpuResources, EventKind, LinuxResources, MemoryResources, Pod,
};
use nri_resize::nri::{Deadline, EventSet, Handler};
use nri_resize::observer::CgroupLayout;
use nri_resize::state::NodeState;

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

fn pod(top: &str, i: usize) -> Pod {
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
        cgroup_parent: format!("/{top}/pod{i}"),
        ..Pod::default()
    }
}

fn container(top: &str, i: usize, pod: usize) -> Container {
    Container {
        id: format!("{i:064x}"),
        pod_id: format!("pod-{pod:06}"),
        name: format!("c{}", i % 3),
        state: ContainerState::Running,
        pid: Some(1000 + u32::try_from(i).expect("small")),
        cgroups_path: format!("/{top}/pod{pod}/{i:064x}"),
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

/// The `n`-th update of the bench: even samples raise CPU and memory (the pod cgroup is read
/// and raised first), odd ones lower memory by 1 MiB (the container's usage is read).
fn update(n: usize) -> LinuxResources {
    let i = n % MODEL_CONTAINERS;
    let mut r = resources(i);
    let step = i64::try_from(n / MODEL_CONTAINERS + 1).expect("small");
    if n % 2 == 0 {
        if let Some(cpu) = r.cpu.as_mut() {
            cpu.quota = cpu.quota.map(|q| q + 1000 * step);
        }
        if let Some(mem) = r.memory.as_mut() {
            mem.limit = mem.limit.map(|l| l + step * (1 << 20));
        }
    } else if let Some(mem) = r.memory.as_mut() {
        mem.limit = mem.limit.map(|l| l - (1 << 20));
    }
    r
}

async fn measure<H: Handler>(top: &str, h: &H, event: EventKind) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(SAMPLES);
    for n in 0..SAMPLES {
        let i = n % MODEL_CONTAINERS;
        let p = pod(top, i / 3);
        let c = container(top, i, i / 3);
        let start = Instant::now();
        match event {
            EventKind::CreateContainer => drop(black_box(h.create_container(p, c).await)),
            EventKind::UpdateContainer => {
                drop(black_box(
                    h.update_container(p, c, update(n), Deadline::none()).await,
                ));
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

/// The pod and container cgroups of the model, real cgroups of our own (created here, removed on
/// drop), pod limits set to the sum of their containers' as kubelet does.
struct BenchCgroups {
    top: String,
    /// Created directories, parents first.
    made: Vec<PathBuf>,
    version: &'static str,
}

impl BenchCgroups {
    fn create(layout: &CgroupLayout, containers: &[Container]) -> Self {
        let top = format!("nri-resize-bench-handler-{}", std::process::id());
        let (roots, version): (Vec<PathBuf>, _) = match layout {
            CgroupLayout::V1 { cpu, memory } => (vec![cpu.join(&top), memory.join(&top)], "v1"),
            CgroupLayout::V2 { root } => (vec![root.join(&top)], "v2"),
        };
        let mut made = BenchCgroups {
            top,
            made: Vec::new(),
            version,
        };
        let mut mkdir = |dir: PathBuf| {
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            made.made.push(dir);
        };
        for r in &roots {
            mkdir(r.clone());
        }
        if matches!(layout, CgroupLayout::V2 { .. }) {
            // Our own top only: the pods below it get cpu and memory files.
            std::fs::write(roots[0].join("cgroup.subtree_control"), "+cpu +memory")
                .expect("enable cpu and memory below our own cgroup");
        }
        let write = |dir: &Path, file: &str, value: String| {
            std::fs::write(dir.join(file), &value)
                .unwrap_or_else(|e| panic!("write {value} to {}/{file}: {e}", dir.display()));
        };
        for p in 0..=(MODEL_CONTAINERS / 3) {
            let ctrs: Vec<&Container> = containers
                .iter()
                .filter(|c| c.pod_id == format!("pod-{p:06}"))
                .collect();
            let quota: i64 = ctrs.iter().map(|c| 50_000 + id_index(c)).sum();
            let memory: i64 = ctrs.iter().map(|c| (64 << 20) + id_index(c)).sum();
            for r in &roots {
                let dir = r.join(format!("pod{p}"));
                mkdir(dir.clone());
                match layout {
                    CgroupLayout::V1 { cpu, .. } if r.starts_with(cpu) => {
                        write(&dir, "cpu.cfs_quota_us", quota.to_string());
                    }
                    CgroupLayout::V1 { .. } => {
                        write(&dir, "memory.limit_in_bytes", memory.to_string());
                    }
                    CgroupLayout::V2 { .. } => {
                        write(&dir, "cgroup.subtree_control", "+cpu +memory".into());
                        write(&dir, "cpu.max", format!("{quota} 100000"));
                        write(&dir, "memory.max", memory.to_string());
                    }
                }
                for c in &ctrs {
                    mkdir(dir.join(format!("{:064x}", id_index(c))));
                }
            }
        }
        made
    }
}

impl Drop for BenchCgroups {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            if let Err(e) = std::fs::remove_dir(dir) {
                eprintln!("could not remove {}: {e}", dir.display());
            }
        }
    }
}

fn id_index(c: &Container) -> i64 {
    i64::from_str_radix(&c.id, 16).expect("hex id")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the handler bench needs root: it creates the model's pod and container cgroups"
    );
    let layout = CgroupLayout::detect(Path::new("/sys/fs/cgroup"));
    let top = format!("nri-resize-bench-handler-{}", std::process::id());
    let pods: Vec<Pod> = (0..=(MODEL_CONTAINERS / 3)).map(|i| pod(&top, i)).collect();
    let containers: Vec<Container> = (0..MODEL_CONTAINERS)
        .map(|i| container(&top, i, i / 3))
        .collect();
    let cgroups = BenchCgroups::create(&layout, &containers);
    assert_eq!(cgroups.top, top);
    let state = NodeState::new(Config::default());
    // The handler as the daemon runs it: with the resize engine deciding every update (policy,
    // admission against node capacity read from /sys and /proc) and its cgroup I/O on the real
    // cgroups created above (usage reads, the pod cgroup raised before an increase).
    let engine = std::sync::Arc::new(nri_resize::resize::Engine::new(
        state.clone(),
        nri_resize::nri::RuntimeLink::default(),
        Some(nri_resize::cgroup::Cgroups::from_layout(&layout)),
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
        let (b50, b99) = measure(&top, &NoopHandler, event).await;
        let (o50, o99) = measure(&top, &handler, event).await;
        // The read-backs `post_update_container` started run on after it: drained here, off
        // the clock, so that they do not slow the next event's samples (`stop_container` waits
        // for its container's latest read-back).
        handler.settle(Duration::from_secs(600)).await;
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
        let io = match event {
            EventKind::UpdateContainer => format!(
                "its cgroup I/O on real cgroup {} files the bench creates",
                cgroups.version
            ),
            EventKind::PostUpdateContainer => {
                "in-memory work only (the confirmation read-back runs after the answer, drained before the next event)".to_string()
            }
            EventKind::StopContainer => {
                "a hop to a blocking thread (ends a staged decrease, if any); no cgroup I/O".to_string()
            }
            _ => "in-memory work only".to_string(),
        };
        nri_resize::bench_table::row(
            &format!(
                "NRI handler, `{}`, {MODEL_CONTAINERS} containers in the model, {io}",
                event.as_str(),
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
    drop(handler);
    drop(cgroups);
}
