//! CRI `CreateContainer` and `UpdateContainerResources` latency against real containerd, with the
//! plugin attached vs not, side by side in one run. Target: the plugin adds < 2 ms at p99.
//!
//! Run: `cargo bench -p nri-resize-tests --bench cri_latency` (part of `cargo xtask bench`).
//! `NRI_RESIZE_BENCH_ITERS` sets the samples per measurement (default 60).

use std::time::{Duration, Instant};

use nri_resize_tests::{
    percentile, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, PluginProcess,
    Pod, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;

struct Sample {
    create: Vec<Duration>,
    update: Vec<Duration>,
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

fn row(name: &str, base: &mut [Duration], null: &mut [Duration], ours: &mut [Duration]) {
    let (b50, b99) = (percentile(base, 0.5), percentile(base, 0.99));
    let (n50, n99) = (percentile(null, 0.5), percentile(null, 0.99));
    let (o50, o99) = (percentile(ours, 0.5), percentile(ours, 0.99));
    let added = o99.saturating_sub(b99);
    println!(
        "{name:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {}",
        ms(b50),
        ms(b99),
        ms(n50),
        ms(n99),
        ms(o50),
        ms(o99),
        ms(added),
        ms(o50.saturating_sub(n50)),
        if added < Duration::from_millis(2) {
            "ok"
        } else {
            "OVER TARGET"
        }
    );
    nri_resize::bench_table::row(
        &format!("CRI latency: {name}"),
        &format!(
            "no plugin: {} p50 / {} p99; do-nothing plugin: {} p50",
            ms(b50),
            ms(b99),
            ms(n50)
        ),
        &format!("{} p50 / {} p99 (+{} p99)", ms(o50), ms(o99), ms(added)),
        Some(o99.as_secs_f64() / b99.as_secs_f64().max(1e-9)),
        &format!(
            "added < 2 ms at p99: {}",
            nri_resize::bench_table::verdict(added < Duration::from_millis(2))
        ),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let iters: usize = std::env::var("NRI_RESIZE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    println!("CRI latency, {iters} samples each, interleaved rounds; base = containerd without plugin, null = a do-nothing plugin on our transport, ours = nri-resize (target: ours - base < 2 ms at p99)");
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "measure",
        "base p50",
        "base p99",
        "null p50",
        "null p99",
        "ours p50",
        "ours p99",
        "added p99",
        "ours-null p50"
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
        let mut null = Sample {
            create: Vec::new(),
            update: Vec::new(),
        };
        for round in 0..rounds {
            let b = measure(&ctrd, &pod, iters / rounds, &format!("base{round}")).await;
            base.create.extend(b.create);
            base.update.extend(b.update);
            // Second baseline: a do-nothing plugin on the same transport.
            let mut np = std::process::Command::new(env!("CARGO_BIN_EXE_null_plugin"))
                .arg(ctrd.nri_socket())
                .spawn()
                .expect("start null plugin");
            tokio::time::sleep(Duration::from_millis(500)).await;
            let n = measure(&ctrd, &pod, iters / rounds, &format!("null{round}")).await;
            null.create.extend(n.create);
            null.update.extend(n.update);
            let _ = np.kill();
            let _ = np.wait();
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
            &mut null.create,
            &mut ours.create,
        );
        row(
            &format!("{version} UpdateContainerResources"),
            &mut base.update,
            &mut null.update,
            &mut ours.update,
        );
        ctrd.stop_pod(&pod).await.expect("stop pod");
        ctrd.remove_pod(&pod).await.expect("remove pod");
    }
}
