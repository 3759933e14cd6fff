//! Load and soak against real containerd (issue 9): pods × 3 containers created, resized at a
//! steady rate and churned (pods removed and replaced), then all removed. At the end:
//!
//! - no missed event: the plugin's model equals the runtime's pods and containers, resources
//!   included (before the teardown), and is empty after it;
//! - RSS drift below 5 % between the end of the warm-up and the end of the load;
//! - no leaked file descriptors, eBPF maps or programs (the daemon's fds by kind), and no leaked
//!   cgroups (the harness tree is empty of container cgroups);
//! - the handler's p99 per event, from its own histogram, is printed (speed is proven by the
//!   benchmarks, not asserted here).
//!
//! CI runs a short version (20 pods, 40 s); the full one (200 pods × 3, 10 resizes/s, 10 min) is
//! `NRI_RESIZE_SOAK_PODS=200 NRI_RESIZE_SOAK_SECS=600 cargo test --release -p nri-resize-tests
//! --test soak -- --nocapture` (or `cargo xtask soak`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use nri_resize::api::ApiClient;
use nri_resize_tests::cri::{ListContainersRequest, ListPodSandboxRequest};
use nri_resize_tests::{
    ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, PluginProcess, Pod, PodSpec,
    Resources,
};

const MIB: i64 = 1 << 20;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The daemon's resident set in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The daemon's open fds by kind (`bpf-map`, `bpf-prog`, `socket`, `file`, ...).
fn fds(pid: u32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        let kind = if let Some(k) = t.strip_prefix("anon_inode:") {
            k.trim_matches(|c| c == '[' || c == ']').to_string()
        } else if t.starts_with("socket:") {
            "socket".into()
        } else if t.starts_with("pipe:") {
            "pipe".into()
        } else {
            "file".into()
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

async fn new_pod(ctrd: &Containerd, name: &str) -> (Pod, Vec<String>) {
    let mut spec = PodSpec::new(name);
    spec.resources = Resources::burstable(300_000, 128 * MIB);
    let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut ids = Vec::new();
    for c in ["a", "b", "c"] {
        let mut s = ContainerSpec::new(c, &["sleep", "3600"]);
        s.resources = Resources::burstable(50_000, 16 * MIB);
        let id = Box::pin(ctrd.create_container(&pod, s))
            .await
            .expect("CreateContainer");
        ctrd.start_container(&id).await.expect("StartContainer");
        ids.push(id);
    }
    (pod, ids)
}

async fn remove(ctrd: &Containerd, pod: &Pod) {
    ctrd.stop_pod(pod).await.expect("StopPodSandbox");
    ctrd.remove_pod(pod).await.expect("RemovePodSandbox");
}

/// Pods and containers (with memory limit and CPU quota) as the runtime and the plugin see them.
async fn model_matches_runtime(ctrd: &Containerd, api: &ApiClient) -> Result<usize, String> {
    let mut rt = ctrd.runtime_client();
    let pods: BTreeSet<String> = rt
        .list_pod_sandbox(ListPodSandboxRequest::default())
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items
        .into_iter()
        .map(|p| p.id)
        .collect();
    let mut runtime = BTreeMap::new();
    for c in rt
        .list_containers(ListContainersRequest::default())
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
    {
        let r = ctrd
            .container_resources(&c.id)
            .await
            .expect("ContainerStatus")
            .unwrap_or_default();
        runtime.insert(c.id, (r.memory_limit_in_bytes, r.cpu_quota));
    }
    let status = api.status().await.expect("status");
    let model_pods: BTreeSet<String> = status.pods.iter().map(|p| p.pod.id.clone()).collect();
    let model: BTreeMap<String, (i64, i64)> = status
        .pods
        .iter()
        .flat_map(|p| p.containers.iter())
        .map(|c| {
            let r = c.container.resources.clone().unwrap_or_default();
            (
                c.container.id.clone(),
                (
                    r.memory.and_then(|m| m.limit).unwrap_or(0),
                    r.cpu.and_then(|c| c.quota).unwrap_or(0),
                ),
            )
        })
        .collect();
    if pods != model_pods {
        return Err(format!(
            "pods differ: runtime {pods:?}, model {model_pods:?}"
        ));
    }
    if runtime != model {
        let diff: Vec<_> = runtime
            .iter()
            .filter(|(k, v)| model.get(*k) != Some(v))
            .map(|(k, v)| (k.clone(), *v, model.get(k).copied()))
            .chain(
                model
                    .iter()
                    .filter(|(k, _)| !runtime.contains_key(*k))
                    .map(|(k, v)| (k.clone(), (0, 0), Some(*v))),
            )
            .take(10)
            .collect();
        return Err(format!("containers differ (id, runtime, model): {diff:?}"));
    }
    Ok(model.len())
}

/// p99 upper bound per event from `nri_resize_nri_handler_duration_seconds` buckets.
async fn handler_p99(api: &ApiClient) -> BTreeMap<String, f64> {
    let body = nri_resize_tests::scrape_metrics(api).await;
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for l in body.lines() {
        let Some(rest) = l.strip_prefix("nri_resize_nri_handler_duration_seconds_bucket{") else {
            continue;
        };
        let (labels, value) = rest.split_once("} ").unwrap_or_default();
        let get = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(k))
                .map(|v| v.trim_matches('"').to_string())
        };
        let (Some(event), Some(le)) = (get("event="), get("le=")) else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        buckets
            .entry(event)
            .or_default()
            .push((le, value.trim().parse().unwrap_or(0.0)));
    }
    buckets
        .into_iter()
        .filter_map(|(event, mut b)| {
            b.sort_by(|x, y| x.0.total_cmp(&y.0));
            let total = b.last()?.1;
            (total > 0.0).then(|| {
                let p99 = b
                    .iter()
                    .find(|(_, n)| *n >= total * 0.99)
                    .map_or(f64::INFINITY, |(le, _)| *le);
                (format!("{event} (n={total})"), p99)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[expect(clippy::too_many_lines, reason = "one soak, phase by phase")]
async fn soak_create_resize_churn_remove() {
    let pods_n = env("NRI_RESIZE_SOAK_PODS", 20);
    let secs = env("NRI_RESIZE_SOAK_SECS", 40);
    let rate = env("NRI_RESIZE_SOAK_RATE", 10).max(1);
    let ctrd = Containerd::start(ContainerdVersion::V2, ContainerdOptions::default()).await;
    // A small journal: full during the warm-up, so it does not count as drift.
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", Some("journal_size = 64\n")).await;
    let api = plugin.api();
    let pid = plugin.pid().expect("pid");
    let fds_start = fds(pid);

    let started = Instant::now();
    let mut pods = Vec::new();
    for i in 0..pods_n {
        pods.push(new_pod(&ctrd, &format!("soak-{i}")).await);
    }
    eprintln!(
        "soak: {pods_n} pods × 3 containers created in {:?}",
        started.elapsed()
    );
    // Warm-up: a round of resizes so every per-container structure exists.
    for (_, ids) in &pods {
        for id in ids {
            ctrd.update_container_resources(id, &Resources::burstable(60_000, 24 * MIB))
                .await
                .expect("warm-up resize");
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_start = rss_kib(pid);
    let fds_warm = fds(pid);

    let period = Duration::from_millis(1000 / rate);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut resizes, mut churned, mut failed) = (0u64, 0u64, 0u64);
    let mut next_churn = Instant::now() + Duration::from_secs(3);
    let mut tick = tokio::time::interval(period);
    let mut k = 0usize;
    while Instant::now() < deadline {
        tick.tick().await;
        k += 1;
        let (_, ids) = &pods[k % pods.len()];
        let id = &ids[k % 3];
        let (quota, mem) = if k % 2 == 0 {
            (40_000, 20 * MIB)
        } else {
            (70_000, 28 * MIB)
        };
        match ctrd
            .update_container_resources(id, &Resources::burstable(quota, mem))
            .await
        {
            Ok(()) => resizes += 1,
            Err(e) => {
                failed += 1;
                eprintln!("soak: resize failed: {}", e.message());
            }
        }
        if Instant::now() >= next_churn {
            next_churn += Duration::from_secs(3);
            let slot = usize::try_from(churned).unwrap_or(0) % pods.len();
            let (old, _) = &pods[slot];
            remove(&ctrd, old).await;
            pods[slot] = new_pod(&ctrd, &format!("soak-churn-{churned}")).await;
            churned += 1;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_end = rss_kib(pid);
    let matched = model_matches_runtime(&ctrd, &api).await;
    let p99 = handler_p99(&api).await;

    for (pod, _) in &pods {
        remove(&ctrd, pod).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fds_end = fds(pid);
    let empty = model_matches_runtime(&ctrd, &api).await;
    let leftover: Vec<_> = ["cpu", "memory"]
        .iter()
        .filter_map(|c| {
            let root = ctrd.cgroups().dir_for(c, ctrd.cgroups().path());
            std::fs::read_dir(root).ok().map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| format!("{c}:{}", e.file_name().to_string_lossy()))
                    .collect::<Vec<_>>()
            })
        })
        .flatten()
        .collect();

    #[expect(clippy::cast_precision_loss, reason = "a ratio for people")]
    let drift = (rss_end as f64 - rss_start as f64) / rss_start.max(1) as f64 * 100.0;
    eprintln!(
        "\nsoak: {pods_n} pods × 3, {secs} s, {resizes} resizes ({failed} failed), {churned} pods churned"
    );
    eprintln!("  RSS {rss_start} KiB → {rss_end} KiB ({drift:+.1} %)");
    eprintln!("  fds at start {fds_start:?}, after warm-up {fds_warm:?}, at the end {fds_end:?}");
    for (event, p) in &p99 {
        eprintln!("  handler p99 {event}: ≤ {:.3} ms", p * 1000.0);
    }
    eprintln!("  model vs runtime: {matched:?}; after teardown: {empty:?}");

    assert_eq!(failed, 0, "no resize failed");
    assert!(resizes > 0 && churned > 0);
    let n = matched.expect("no missed event: model equals runtime");
    assert_eq!(n, usize::try_from(pods_n).expect("count") * 3);
    assert_eq!(empty.expect("model equals runtime after teardown"), 0);
    assert!(drift < 5.0, "RSS drift {drift:.1} % (≥ 5 %)");
    // The observer loads its programs after readiness and keeps each container's cgroup files
    // open while it lives: compare eBPF objects, sockets, pipes... with the warm-up, and the
    // files with the start (all containers gone).
    let without_files = |m: &BTreeMap<String, usize>| {
        m.iter()
            .filter(|(k, _)| k.as_str() != "file")
            .map(|(k, v)| (k.clone(), *v))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        without_files(&fds_end),
        without_files(&fds_warm),
        "no leaked bpf maps, programs, links, sockets or pipes"
    );
    let files = |m: &BTreeMap<String, usize>| m.get("file").copied().unwrap_or(0);
    assert!(
        files(&fds_end) <= files(&fds_start),
        "no leaked files: {} at the end, {} at the start",
        files(&fds_end),
        files(&fds_start)
    );
    assert!(leftover.is_empty(), "leaked cgroups: {leftover:?}");
}
