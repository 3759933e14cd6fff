//! CRI `CreateContainer` and `UpdateContainerResources` latency against real containerd, with the
//! plugin attached vs not, side by side in one run. Target: the plugin adds < 2 ms at p99.
//!
//! Run: `cargo bench -p nri-resize-tests --bench cri_latency` (part of `cargo xtask bench`).
//! `NRI_RESIZE_BENCH_ITERS` sets the samples per measurement (default 60).

use std::time::{Duration, Instant};

use nri_resize_tests::{
    ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, PluginProcess, Pod, PodSpec,
    Resources,
};

const MIB: i64 = 1 << 20;

struct Sample {
    create: Vec<Duration>,
    update: Vec<Duration>,
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "index of a small slice"
    )]
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

async fn measure(ctrd: &Containerd, pod: &Pod, iters: usize, tag: &str) -> Sample {
    let mut s = Sample {
        create: Vec::new(),
        update: Vec::new(),
    };
    let mut c = ContainerSpec::new(&format!("upd-{tag}"), &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 64 * MIB);
    let target = Box::pin(ctrd.create_container(pod, c))
        .await
        .expect("create update target");
    ctrd.start_container(&target)
        .await
        .expect("start update target");
    for i in 0..iters {
        let mut c = ContainerSpec::new(&format!("c-{tag}-{i}"), &["sleep", "3600"]);
        c.resources = Resources::limits(50_000, 64 * MIB);
        let t = Instant::now();
        let id = Box::pin(ctrd.create_container(pod, c))
            .await
            .expect("CreateContainer");
        s.create.push(t.elapsed());
        ctrd.remove_container(&id).await.expect("RemoveContainer");

        let quota = if i % 2 == 0 { 60_000 } else { 50_000 };
        let t = Instant::now();
        ctrd.update_container_resources(&target, &Resources::limits(quota, 64 * MIB))
            .await
            .expect("UpdateContainerResources");
        s.update.push(t.elapsed());
    }
    ctrd.stop_container(&target, 0).await.expect("stop");
    ctrd.remove_container(&target).await.expect("remove");
    s
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn row(name: &str, base: &mut [Duration], ours: &mut [Duration]) {
    let (b50, b99, o50, o99) = (
        pct(base, 0.5),
        pct(base, 0.99),
        pct(ours, 0.5),
        pct(ours, 0.99),
    );
    let added = o99.saturating_sub(b99);
    println!(
        "{name:<34} {:>10} {:>10} {:>10} {:>10} {:>8.2}x {:>10} {}",
        ms(b50),
        ms(b99),
        ms(o50),
        ms(o99),
        o99.as_secs_f64() / b99.as_secs_f64(),
        ms(added),
        if added < Duration::from_millis(2) {
            "ok"
        } else {
            "OVER TARGET"
        }
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let iters: usize = std::env::var("NRI_RESIZE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    println!("CRI latency, {iters} samples each; baseline = containerd without plugin, ours = nri-resize attached (target: added p99 < 2 ms)");
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10}",
        "measure", "base p50", "base p99", "ours p50", "ours p99", "p99 ratio", "added p99"
    );
    for version in ContainerdVersion::all() {
        let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
        let mut spec = PodSpec::new("bench");
        spec.resources = Resources::limits(400_000, 2048 * MIB);
        let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
        // Warm-up: image unpack, shim start.
        drop(measure(&ctrd, &pod, 3, "warm").await);
        // Interleaved rounds (without, with, without, with, ...) so that drift in machine load
        // hits both sides alike.
        let rounds = 3;
        let mut base = Sample {
            create: Vec::new(),
            update: Vec::new(),
        };
        let mut ours = Sample {
            create: Vec::new(),
            update: Vec::new(),
        };
        for round in 0..rounds {
            let b = measure(&ctrd, &pod, iters / rounds, &format!("base{round}")).await;
            base.create.extend(b.create);
            base.update.extend(b.update);
            let mut plugin = PluginProcess::start(&ctrd, &format!("nri-resize-bench{round}"), &[]);
            plugin.wait_ready(Duration::from_secs(15)).await;
            let o = measure(&ctrd, &pod, iters / rounds, &format!("ours{round}")).await;
            ours.create.extend(o.create);
            ours.update.extend(o.update);
            plugin.stop();
        }
        row(
            &format!("{version} CreateContainer"),
            &mut base.create,
            &mut ours.create,
        );
        row(
            &format!("{version} UpdateContainerResources"),
            &mut base.update,
            &mut ours.update,
        );
        ctrd.stop_pod(&pod).await.expect("stop pod");
        ctrd.remove_pod(&pod).await.expect("remove pod");
    }
}
