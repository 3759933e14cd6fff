//! The daemon from its OCI image (`cargo xtask image`), run in a private containerd the way the
//! `DaemonSet` in `deploy/` runs it on a node: imported with `ctr -n k8s.io images import`, its
//! pod and container created through CRI with the security context, `hostPID`, args, env and
//! mounts of the rendered `DaemonSet` (`kustomize build`), translated as kubelet translates them.
//! What the runtime applied is read back (OCI spec, the process's `/proc/<pid>/status`). A real
//! pod created through CRI must show up in `/metrics` (classic and `OpenMetrics`) and in
//! `nri-resize status` read through the API socket inside the container, with every eBPF
//! program loaded (no fallback to polling but where the kernel lacks the tracepoint). On a node
//! whose `/sys/kernel` has no `btf` the same `DaemonSet` starts and polls, and loads its eBPF
//! programs again with `--btf-path` (`daemon_image_on_a_node_without_kernel_btf`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nri_resize_tests::cri::{
    Capability, Int64Value, LinuxContainerSecurityContext, SecurityProfile,
};
use nri_resize_tests::{
    daemon_image_archive, free_port, http_get, AsDeployed, ContainerSpec, Containerd,
    ContainerdOptions, ContainerdVersion, DaemonContainer, PodSpec, Resources, SysKernelWithoutBtf,
    LEAST_PRIVILEGE_CAPS,
};
use serde_yaml::Value;

/// The `DaemonSet` of `kustomize build <dir>` (relative to the workspace).
fn rendered_daemonset(dir: &str) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf();
    let out = Command::new("kustomize")
        .arg("build")
        .arg(root.join(dir))
        .output()
        .unwrap_or_else(|e| panic!("run kustomize ({e}); `cargo xtask setup` installs it"));
    assert!(
        out.status.success(),
        "kustomize build {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let ds = serde_yaml::Deserializer::from_str(&text)
        .map(|d| -> Value { serde::Deserialize::deserialize(d).expect("rendered YAML parses") })
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .unwrap_or_else(|| panic!("no DaemonSet in {dir}"));
    ds
}

/// kubelet's default masked and read-only paths for a container that is not privileged
/// (`procMount: Default`), as it sends them in CRI.
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A Kubernetes seccomp/AppArmor profile in CRI terms.
fn profile(v: &Value) -> Option<SecurityProfile> {
    use nri_resize_tests::cri::security_profile::ProfileType;
    let kind = v["type"].as_str()?;
    let profile_type = match kind {
        "RuntimeDefault" => ProfileType::RuntimeDefault,
        "Unconfined" => ProfileType::Unconfined,
        "Localhost" => ProfileType::Localhost,
        other => panic!("unknown profile type {other}"),
    };
    Some(SecurityProfile {
        profile_type: profile_type.into(),
        localhost_ref: v["localhostProfile"].as_str().unwrap_or_default().into(),
    })
}

/// The container's `securityContext` as kubelet sends it in CRI.
fn cri_security(sc: &Value) -> LinuxContainerSecurityContext {
    let strings = |v: &Value| -> Vec<String> {
        v.as_sequence()
            .into_iter()
            .flatten()
            .map(|c| c.as_str().expect("a string").to_string())
            .collect()
    };
    let privileged = sc["privileged"].as_bool().unwrap_or(false);
    let caps = &sc["capabilities"];
    LinuxContainerSecurityContext {
        capabilities: (!caps.is_null()).then(|| Capability {
            add_capabilities: strings(&caps["add"]),
            drop_capabilities: strings(&caps["drop"]),
            ..Default::default()
        }),
        privileged,
        readonly_rootfs: sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        run_as_user: sc["runAsUser"].as_i64().map(|value| Int64Value { value }),
        run_as_group: sc["runAsGroup"].as_i64().map(|value| Int64Value { value }),
        no_new_privs: sc["allowPrivilegeEscalation"].as_bool() == Some(false),
        seccomp: profile(&sc["seccompProfile"]),
        apparmor: profile(&sc["appArmorProfile"]),
        masked_paths: if privileged {
            Vec::new()
        } else {
            MASKED_PATHS.iter().map(ToString::to_string).collect()
        },
        readonly_paths: if privileged {
            Vec::new()
        } else {
            READONLY_PATHS.iter().map(ToString::to_string).collect()
        },
        ..Default::default()
    }
}

/// kubelet's check of a hostPath volume's `type` before the pod's containers are created
/// (`pkg/volume/hostpath`): `Directory` and `File` must exist as such, `DirectoryOrCreate` is
/// created (`MkdirAll`, 0755) where absent, an unset type is not checked. `Err` is what kubelet
/// reports in the pod's events while the pod stays in `ContainerCreating`.
fn kubelet_host_path_check(path: &Path, kind: &str) -> Result<(), String> {
    let shown = path.display();
    match kind {
        "" => Ok(()),
        "Directory" | "DirectoryOrCreate" if path.is_dir() => Ok(()),
        "Directory" => Err(format!(
            "hostPath type check failed: {shown} is not a directory"
        )),
        "File" if path.is_file() => Ok(()),
        "File" => Err(format!("hostPath type check failed: {shown} is not a file")),
        "DirectoryOrCreate" => {
            std::fs::create_dir_all(path).map_err(|e| format!("mkdir {shown}: {e}"))
        }
        other => Err(format!("hostPath type {other} is not checked by this test")),
    }
}

/// The rendered `DaemonSet`'s container for this test's containerd: every volume mount mapped
/// to the host path a node would have (the private containerd's NRI socket, directories of
/// the test named after `tag` for state, API socket and the `ConfigMap`; any other hostPath
/// through `host_path`, checked as kubelet checks its type), `--metrics-addr` on a free
/// loopback port; everything else as rendered. `recursiveReadOnly: IfPossible` is sent as a
/// plain read-only mount (what kubelet sends to a runtime without recursive read-only mounts).
fn as_deployed(
    ctrd: &Containerd,
    ds: &Value,
    tag: &str,
    host_path: &dyn Fn(&str) -> PathBuf,
) -> AsDeployed {
    let pod = &ds["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let base = ctrd.base_dir();
    let dir = |name: &str| -> PathBuf {
        let d = base.join(format!("image-daemon-{tag}-{name}"));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        d
    };
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let args = c["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("arg");
            if a.starts_with("--metrics-addr=") {
                format!("--metrics-addr={metrics_addr}")
            } else {
                a.to_string()
            }
        })
        .collect();
    let env = c["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|e| {
            (
                e["name"].as_str().expect("env name").to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut api_dir = PathBuf::new();
    let mut mounts = Vec::new();
    for m in c["volumeMounts"].as_sequence().expect("volumeMounts") {
        let name = m["name"].as_str().expect("mount name");
        let inside = m["mountPath"].as_str().expect("mountPath").to_string();
        let readonly = m["readOnly"].as_bool().unwrap_or(false);
        let volume = pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"));
        let (host, inside) = match name {
            // The private containerd's socket file (its directory also holds rootfs mounts).
            "nri-socket" => (ctrd.nri_socket(), format!("{inside}/nri.sock")),
            "state" => (dir("state"), inside),
            "api" => {
                api_dir = dir("api");
                (api_dir.clone(), inside)
            }
            "config" => {
                let cm = volume["configMap"]["name"].as_str().expect("configMap");
                let d = dir("config");
                let rendered = rendered_configmap(cm);
                for (k, v) in rendered["data"].as_mapping().expect("data") {
                    std::fs::write(d.join(k.as_str().expect("key")), v.as_str().expect("value"))
                        .expect("write the ConfigMap's file");
                }
                (d, inside)
            }
            _ => {
                let declared = volume["hostPath"]["path"]
                    .as_str()
                    .unwrap_or_else(|| panic!("volume {name}: only hostPath is mapped here"));
                let host = host_path(declared);
                let kind = volume["hostPath"]["type"].as_str().unwrap_or_default();
                kubelet_host_path_check(&host, kind).unwrap_or_else(|e| {
                    panic!("kubelet would not start the pod: volume {name} ({declared}): {e}")
                });
                if declared == "/sys/kernel" {
                    assert!(
                        host.join("tracing/events").is_dir(),
                        "no tracefs at {}/tracing on this host: mount -t tracefs tracefs \
                         /sys/kernel/tracing",
                        host.display()
                    );
                }
                (host, inside)
            }
        };
        mounts.push((host, inside, readonly));
    }
    assert!(!api_dir.as_os_str().is_empty(), "no api volume");
    let memory_limit = c["resources"]["limits"]["memory"].as_str().map(|q| {
        let bytes = nri_resize::policy::parse_memory(q)
            .unwrap_or_else(|e| panic!("the DaemonSet's memory limit: {e}"));
        i64::try_from(bytes).expect("memory limit fits i64")
    });
    AsDeployed {
        memory_limit,
        args,
        env,
        host_pid: pod["hostPID"].as_bool().unwrap_or(false),
        mounts,
        security: cri_security(&c["securityContext"]),
        api_dir,
        metrics_addr,
    }
}

fn rendered_configmap(name: &str) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .join("deploy/base");
    let out = Command::new("kustomize")
        .arg("build")
        .arg(root)
        .output()
        .expect("kustomize");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let cm = serde_yaml::Deserializer::from_str(&text)
        .map(|d| -> Value { serde::Deserialize::deserialize(d).expect("YAML") })
        .find(|d| {
            d["kind"].as_str() == Some("ConfigMap") && d["metadata"]["name"].as_str() == Some(name)
        })
        .unwrap_or_else(|| panic!("no ConfigMap {name}"));
    cm
}

/// What the runtime applied, read back: for the default `DaemonSet`, exactly the listed
/// capabilities, a seccomp filter in force (the runtime's default profile), no new privileges,
/// a read-only root and read-only kernel interfaces; privileged: every capability, no filter.
fn assert_applied(daemon: &DaemonContainer, ds: &Value) {
    let sc = &ds["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    let spec = daemon.oci_spec();
    let status = daemon.process_status();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map_or_else(|| panic!("no {name} in\n{status}"), str::trim)
            .to_string()
    };
    let effective: BTreeSet<&str> = spec["process"]["capabilities"]["effective"]
        .as_sequence_json()
        .into_iter()
        .collect();
    eprintln!(
        "applied: effective capabilities {effective:?}; CapEff {}; Seccomp {}; NoNewPrivs {}; \
         seccomp default action {}; apparmor profile {:?}",
        field("CapEff"),
        field("Seccomp"),
        field("NoNewPrivs"),
        spec["linux"]["seccomp"]["defaultAction"],
        spec["process"]["apparmorProfile"],
    );
    if sc["privileged"].as_bool() == Some(true) {
        assert!(effective.contains("CAP_SYS_ADMIN"), "{effective:?}");
        assert_eq!(field("Seccomp"), "0", "privileged: no seccomp filter");
        return;
    }
    let want: BTreeSet<&str> = LEAST_PRIVILEGE_CAPS.iter().copied().collect();
    assert_eq!(effective, want, "the container's effective capabilities");
    // CapEff as the kernel sees it: CAP_KILL (5), CAP_PERFMON (38), CAP_BPF (39).
    assert_eq!(
        u64::from_str_radix(&field("CapEff"), 16).expect("CapEff hex"),
        (1 << 5) | (1 << 38) | (1 << 39),
        "CapEff of the daemon's process"
    );
    assert_eq!(
        sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    assert!(
        !spec["linux"]["seccomp"].is_null(),
        "RuntimeDefault gives a seccomp filter: {}",
        spec["linux"]
    );
    assert_eq!(
        field("Seccomp"),
        "2",
        "a seccomp filter is in force (mode 2)"
    );
    assert_eq!(field("NoNewPrivs"), "1");
    assert_eq!(spec["root"]["readonly"].as_bool(), Some(true));
    let path = "/sys/kernel";
    let m = spec["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|m| m["destination"].as_str() == Some(path))
        .unwrap_or_else(|| panic!("{path} not mounted"));
    assert!(
        m["options"]
            .as_array()
            .is_some_and(|o| o.iter().any(|o| o.as_str() == Some("ro"))),
        "{path} mounted read-only: {m}"
    );
    assert!(
        !spec["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["destination"].as_str() == Some("/sys/fs/bpf")),
        "bpffs is not mounted"
    );
}

/// `serde_json` arrays of strings as `&str`s.
trait AsSequenceJson {
    fn as_sequence_json(&self) -> Vec<&str>;
}

impl AsSequenceJson for serde_json::Value {
    fn as_sequence_json(&self) -> Vec<&str> {
        self.as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .collect()
    }
}

/// A kubelet-style resize through CRI: counted by resource and direction, timed, confirmed.
async fn resize_is_counted_and_confirmed(ctrd: &Containerd, daemon: &DaemonContainer, id: &str) {
    ctrd.update_container_resources(id, &Resources::limits(80_000, 64 << 20))
        .await
        .expect("resize the container's CPU through CRI");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, _, body) = http_get(&daemon.metrics_addr, "/metrics", None).expect("scrape");
        let want = [
            r#"nri_resize_resize_requests_total{direction="increase",outcome="in_place",resource="cpu"} 1"#,
            r#"nri_resize_resize_duration_seconds_count{direction="increase",resource="cpu"} 1"#,
            r#"nri_resize_resize_outcomes_total{outcome="in_place"} 1"#,
            r#"nri_resize_container_actual_cpu_cores{container="app",namespace="default",pod="imaged"} 0.8"#,
        ];
        if want.iter().all(|w| body.contains(w)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after a CPU increase, want {want:?} in\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn daemon_from_image_sees_a_real_pod(version: ContainerdVersion, deploy: &str) {
    let archive = daemon_image_archive();
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let ds = rendered_daemonset(deploy);
    let spec = as_deployed(&ctrd, &ds, "node", &|p| PathBuf::from(p));
    let daemon = DaemonContainer::start_as_deployed(&ctrd, &archive, spec).await;
    daemon.wait_ready(Duration::from_secs(60));
    assert_applied(&daemon, &ds);

    let mut spec = PodSpec::new("imaged");
    spec.resources = Resources::limits(100_000, 256 << 20);
    let pod = ctrd.run_pod(spec).await.expect("run pod");
    let mut c = ContainerSpec::new("app", &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 64 << 20);
    let id = ctrd
        .create_container(&pod, c)
        .await
        .expect("create container");
    ctrd.start_container(&id).await.expect("start container");

    // Desired vs actual is read back once the container started; the observer's counters come on
    // its interval (1 s): wait for both.
    let want = r#"nri_resize_container_actual_cpu_cores{container="app",namespace="default",pod="imaged"} 0.5"#;
    let counters = r#"nri_resize_container_cpu_cfs_throttled_periods_total{container="app",namespace="default",pod="imaged"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, headers, body) =
            http_get(&daemon.metrics_addr, "/metrics", None).expect("scrape /metrics");
        assert_eq!(code, 200, "{body}");
        assert!(headers.contains("text/plain; version=0.0.4"), "{headers}");
        if body.contains(want) && body.contains(counters) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no series for the pod's container after 30 s; want {want}\n/metrics:\n{body}\nlog:\n{}",
            daemon.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for series in [
        "nri_resize_nri_connected 1",
        r#"nri_resize_container_desired_memory_bytes{container="app",namespace="default",pod="imaged"} 67108864"#,
        r#"nri_resize_container_allocated_memory_bytes{container="app",namespace="default",pod="imaged"} 67108864"#,
        r#"nri_resize_container_cpu_cfs_throttled_periods_total{container="app",namespace="default",pod="imaged"}"#,
        // The eBPF programs load with either privilege: no measurement fell back to polling
        // (throttling: what this kernel gives; reclaim: see below).
        r#"nri_resize_observer_strategy{program="oom",strategy="memory_events_polling"} 0"#,
        &strategy("throttle", &expected_throttle(), true),
    ] {
        assert!(body.contains(series), "missing {series} in\n{body}");
    }
    // Reclaim: what the VM tier names in NRI_RESIZE_EXPECT_RECLAIM (`fexit`: its kernels allow
    // trampolines), else the memcg tracepoints where the kernel has `memcg/count_memcg_events`
    // (6.18 here, which refuses trampolines), with either privilege.
    let expected = std::env::var("NRI_RESIZE_EXPECT_RECLAIM").unwrap_or_else(|_| {
        if Path::new("/sys/kernel/tracing/events/memcg/count_memcg_events").exists() {
            "memcg_tracepoints".into()
        } else {
            "memory_stat_polling".into()
        }
    });
    let reclaim =
        format!(r#"nri_resize_observer_strategy{{program="reclaim",strategy="{expected}"}} 1"#);
    assert!(body.contains(&reclaim), "missing {reclaim} in\n{body}");
    let (code, headers, om) = http_get(
        &daemon.metrics_addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    )
    .expect("scrape /metrics as OpenMetrics");
    assert_eq!(code, 200);
    assert!(
        headers.contains("application/openmetrics-text"),
        "{headers}"
    );
    assert!(
        om.ends_with("# EOF\n") && om.contains(r#"pod="imaged""#),
        "{om}"
    );

    // `kubectl exec ds/nri-resize -- nri-resize status`, here through ctr.
    let (code, out, err) = daemon.exec(&["/usr/bin/nri-resize", "status"]);
    assert_eq!(code, 0, "nri-resize status in the container: {out}{err}");
    assert!(out.contains("(connected)"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("default/imaged") && l.contains(" app "))
        .unwrap_or_else(|| panic!("no row for default/imaged app in\n{out}"));
    assert!(
        row.contains("500m/64Mi"),
        "desired/allocated/actual shown: {row}"
    );
    let (code, json, err) = daemon.exec(&["/usr/bin/nri-resize", "status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    assert_eq!(v["runtime"]["connected"], true, "{json}");
    // And from the host, through the mounted socket directory.
    let status = nri_resize::api::ApiClient::new(daemon.api_dir.join("api.sock"))
        .status()
        .await
        .expect("status through the host-mounted API socket");
    assert!(
        status
            .pods
            .iter()
            .any(|p| p.pod.name == "imaged" && p.containers.iter().any(|c| c.name == "app")),
        "{status:?}"
    );
    eprintln!("{out}");

    resize_is_counted_and_confirmed(&ctrd, &daemon, &id).await;
}

/// The default `DaemonSet` (`deploy/`): least privilege, the runtime's default seccomp profile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_as_deployed_in_containerd_1_7() {
    daemon_from_image_sees_a_real_pod(ContainerdVersion::V1_7, "deploy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_as_deployed_in_containerd_2() {
    daemon_from_image_sees_a_real_pod(ContainerdVersion::V2, "deploy").await;
}

/// The privileged overlay (`deploy/overlays/privileged`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_privileged_overlay_in_containerd_1_7() {
    daemon_from_image_sees_a_real_pod(ContainerdVersion::V1_7, "deploy/overlays/privileged").await;
}

/// The `nri_resize_observer_strategy` series of `program` at `strategy`, on or off.
fn strategy(program: &str, strategy: &str, on: bool) -> String {
    format!(
        r#"nri_resize_observer_strategy{{program="{program}",strategy="{strategy}"}} {}"#,
        u8::from(on)
    )
}

/// The daemon's `/readyz` (code, body) and `/metrics` body.
fn readyz_and_metrics(daemon: &DaemonContainer) -> (u16, String, String) {
    let (code, _, ready) = http_get(&daemon.metrics_addr, "/readyz", None)
        .unwrap_or_else(|| panic!("no /readyz\nlog:\n{}", daemon.log_tail(40)));
    let (_, _, metrics) = http_get(&daemon.metrics_addr, "/metrics", None)
        .unwrap_or_else(|| panic!("no /metrics\nlog:\n{}", daemon.log_tail(40)));
    (code, ready, metrics)
}

/// Every `volumeMounts[].mountPath` of the rendered container is a mount of the running one
/// (the NRI socket's directory as its socket file): the pod runs with the `DaemonSet`'s mounts.
fn assert_mounted_as_rendered(daemon: &DaemonContainer, ds: &Value) {
    let spec = daemon.oci_spec();
    let mounted: Vec<&str> = spec["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .collect();
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    for m in c["volumeMounts"].as_sequence().expect("volumeMounts") {
        let path = m["mountPath"].as_str().expect("mountPath");
        assert!(
            mounted.iter().any(|d| Path::new(d).starts_with(path)),
            "{path} of the DaemonSet is not mounted in the container: {mounted:?}"
        );
    }
}

/// A node whose kernel has no BTF (issue 38). The default `DaemonSet` (`deploy/`), its host
/// paths checked as kubelet checks them, on a node whose `/sys/kernel` has no `btf`
/// ([`SysKernelWithoutBtf`] says what that shows and what it does not). The pod starts, the
/// daemon is ready and polls every measurement, saying why in its log, `/readyz` and
/// `nri-resize status`. Then the same with a copy of the kernel's BTF placed on the node and
/// named by `--btf-path`, mounted as the chart's `btfPath` mounts it: the eBPF programs load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_on_a_node_without_kernel_btf() {
    let archive = daemon_image_archive();
    let ctrd = Containerd::start(ContainerdVersion::V2, ContainerdOptions::default()).await;
    let ds = rendered_daemonset("deploy");
    let real_btf = Path::new("/sys/kernel/btf/vmlinux");
    assert!(
        real_btf.is_file(),
        "this test hides the kernel's BTF from the daemon, and needs it for --btf-path"
    );
    let node = SysKernelWithoutBtf::mount(&ctrd.base_dir().join("sys-kernel-without-btf"));
    // What the DaemonSet mounted before (`/sys/kernel/btf`, DirectoryOrCreate) is refused on
    // this node as on a kernel without BTF: the pod stayed in ContainerCreating.
    let former = kubelet_host_path_check(&node.host_path("/sys/kernel/btf"), "DirectoryOrCreate");
    eprintln!("the former /sys/kernel/btf DirectoryOrCreate volume on this node: {former:?}");
    assert!(
        former.is_err(),
        "a mkdir under {} must fail as under sysfs",
        node.path().display()
    );

    polls_and_says_why(&ctrd, &archive, &ds, &node).await;
    loads_ebpf_with_btf_path(&ctrd, &archive, &ds, &node).await;
}

/// The daemon as rendered on `node`: ready, polling every measurement, saying why.
async fn polls_and_says_why(
    ctrd: &Containerd,
    archive: &Path,
    ds: &Value,
    node: &SysKernelWithoutBtf,
) {
    let spec = as_deployed(ctrd, ds, "no-btf", &|p| node.host_path(p));
    let daemon = DaemonContainer::start_as_deployed(ctrd, archive, spec).await;
    daemon.wait_ready(Duration::from_secs(120));
    assert_mounted_as_rendered(&daemon, ds);
    let seen = PathBuf::from(format!("/proc/{}/root/sys/kernel", daemon.pid()));
    assert!(
        !seen.join("btf").exists(),
        "the container's /sys/kernel has no btf"
    );
    assert!(
        seen.join("tracing/events").is_dir(),
        "tracefs reaches the container through the /sys/kernel mount"
    );
    let (code, ready, metrics) = readyz_and_metrics(&daemon);
    eprintln!("without BTF: /readyz {code} {ready}");
    assert_eq!(code, 200, "{ready}");
    assert!(
        ready.contains("btf: no kernel BTF at /sys/kernel/btf/vmlinux")
            && ready.contains("--btf-path"),
        "/readyz says why the observer polls: {ready}"
    );
    for series in [
        strategy("throttle", "cpu_stat_polling", true),
        strategy("reclaim", "memory_stat_polling", true),
        strategy("oom", "memory_events_polling", true),
        strategy("hotplug", "unavailable", true),
    ] {
        assert!(metrics.contains(&series), "missing {series} in\n{metrics}");
    }
    let log = daemon.log_tail(200);
    assert!(
        log.contains("every measurement polls cgroup files")
            && log.contains("no kernel BTF at /sys/kernel/btf/vmlinux"),
        "one log line says the observer polls and why:\n{log}"
    );
    let (code, out, err) = daemon.exec(&["/usr/bin/nri-resize", "status"]);
    assert_eq!(code, 0, "nri-resize status in the container: {out}{err}");
    eprintln!("{out}");
    assert!(
        out.contains("observer: polling cgroup files: no kernel BTF at /sys/kernel/btf/vmlinux"),
        "{out}"
    );
}

/// The daemon as rendered on `node` plus an external BTF file for the same kernel (here a copy
/// of its own, where a BTF archive's would be used) where the chart's `btfPath` names it: the chart
/// mounts it at the same path (hostPath type File, read only) and passes `--btf-path`
/// (`deploy_manifests.rs` checks that render). The eBPF programs load.
async fn loads_ebpf_with_btf_path(
    ctrd: &Containerd,
    archive: &Path,
    ds: &Value,
    node: &SysKernelWithoutBtf,
) {
    let real_btf = Path::new("/sys/kernel/btf/vmlinux");
    let on_node = "/var/lib/nri-resize-btf/vmlinux";
    let copy = ctrd.base_dir().join("external-btf/vmlinux");
    std::fs::create_dir_all(copy.parent().expect("parent")).expect("create the BTF directory");
    std::fs::copy(real_btf, &copy).expect("copy the kernel's BTF");
    let mut with_btf = ds.clone();
    let pod = &mut with_btf["spec"]["template"]["spec"];
    let graft = |yaml: &str| -> Value { serde_yaml::from_str(yaml).expect("YAML") };
    pod["volumes"]
        .as_sequence_mut()
        .expect("volumes")
        .push(graft(&format!(
            "{{name: btf-file, hostPath: {{path: {on_node}, type: File}}}}"
        )));
    let c = &mut pod["containers"][0];
    c["volumeMounts"]
        .as_sequence_mut()
        .expect("volumeMounts")
        .push(graft(&format!(
            "{{name: btf-file, mountPath: {on_node}, readOnly: true}}"
        )));
    c["args"]
        .as_sequence_mut()
        .expect("args")
        .push(Value::from(format!("--btf-path={on_node}")));
    let spec = as_deployed(ctrd, &with_btf, "external-btf", &|p| {
        if p == on_node {
            copy.clone()
        } else {
            node.host_path(p)
        }
    });
    let daemon = DaemonContainer::start_as_deployed(ctrd, archive, spec).await;
    daemon.wait_ready(Duration::from_secs(180));
    assert_mounted_as_rendered(&daemon, &with_btf);
    assert!(
        !PathBuf::from(format!("/proc/{}/root/sys/kernel/btf", daemon.pid())).exists(),
        "still no /sys/kernel/btf in the container"
    );
    let (code, ready, metrics) = readyz_and_metrics(&daemon);
    eprintln!("with --btf-path: /readyz {code} {ready}");
    assert_eq!(code, 200, "{ready}");
    assert!(!ready.contains("btf:"), "no BTF fallback: {ready}");
    let mut want = vec![
        strategy("throttle", &expected_throttle(), true),
        strategy("oom", "mark_victim", true),
    ];
    // CPU hotplug is a classic tracepoint, read from tracefs through the /sys/kernel mount and
    // attached with perf_event_open: CAP_PERFMON suffices up to perf_event_paranoid 2; Debian's
    // kernels default to 3, which asks CAP_SYS_ADMIN of any perf_event_open (Debian's patch), so
    // the least-privilege container is refused there: by the kernel, not for want of tracefs.
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .expect("read perf_event_paranoid");
    let paranoid: i32 = paranoid.trim().parse().expect("perf_event_paranoid");
    eprintln!("perf_event_paranoid {paranoid}");
    if paranoid <= 2 {
        want.push(strategy("hotplug", "cpuhp_tracepoints", true));
    } else {
        assert!(
            ready.contains("cpuhp_enter: attach: `perf_event_open_trace_point` failed")
                && !ready.contains("tracing"),
            "with perf_event_paranoid {paranoid}, perf_event_open is refused, tracefs found: {ready}"
        );
    }
    for series in want {
        assert!(metrics.contains(&series), "missing {series} in\n{metrics}");
    }
    let log = daemon.log_tail(200);
    assert!(!log.contains("no kernel BTF"), "{log}");
}

/// `name` of the daemon's memory cgroup files: (bytes, or `None` when the file is missing).
fn memcg_value(dir: &Path, file: &str, key: Option<&str>) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    match key {
        None => text.trim().parse().ok(),
        Some(key) => text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        }),
    }
}

/// The throttling strategy this kernel gives by default: what the VM tier names in
/// `NRI_RESIZE_EXPECT_THROTTLE` (`fentry`: its kernels allow trampolines), else
/// `cpu_stat_polling` (6.18 here refuses trampolines, and `tp_btf_sched_switch`, which would run
/// on every context switch, is never chosen by default).
fn expected_throttle() -> String {
    std::env::var("NRI_RESIZE_EXPECT_THROTTLE").unwrap_or_else(|_| "cpu_stat_polling".into())
}

/// Every measurement of the observer on eBPF where this kernel allows it: no fallback to
/// polling beyond the kernel's (throttling: [`expected_throttle`]; reclaim: what the VM tier
/// names in `NRI_RESIZE_EXPECT_RECLAIM`, else what this kernel has).
fn assert_measured_on_ebpf(metrics: &str) {
    let expected_reclaim = std::env::var("NRI_RESIZE_EXPECT_RECLAIM").unwrap_or_else(|_| {
        if Path::new("/sys/kernel/tracing/events/memcg/count_memcg_events").exists() {
            "memcg_tracepoints".into()
        } else {
            "memory_stat_polling".into()
        }
    });
    let want = [
        strategy("throttle", &expected_throttle(), true),
        strategy("oom", "mark_victim", true),
        strategy("reclaim", &expected_reclaim, true),
    ];
    for series in &want {
        assert!(
            metrics.contains(series.as_str()),
            "missing {series} in\n{metrics}"
        );
    }
}

/// `nri_resize_bpf_map_memory_bytes` of each map: (map, bytes).
fn map_memory_series(metrics: &str) -> Vec<(String, u64)> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("nri_resize_bpf_map_memory_bytes{map=\"")?;
            let (name, value) = rest.split_once("\"} ")?;
            Some((name.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A memory cgroup's usage, its peak and how often it hit its limit or OOM-killed.
struct MemcgUse {
    current: Option<u64>,
    peak: Option<u64>,
    hits: Option<u64>,
    ooms: Option<u64>,
}

/// [`MemcgUse`] of the memory cgroup at `dir` (v2 or v1 files).
fn memcg_use(dir: &Path) -> MemcgUse {
    if dir.join("memory.current").exists() {
        MemcgUse {
            current: memcg_value(dir, "memory.current", None),
            peak: memcg_value(dir, "memory.peak", None),
            hits: memcg_value(dir, "memory.events", Some("max")),
            ooms: memcg_value(dir, "memory.events", Some("oom_kill")),
        }
    } else {
        MemcgUse {
            current: memcg_value(dir, "memory.usage_in_bytes", None),
            peak: memcg_value(dir, "memory.max_usage_in_bytes", None),
            hits: memcg_value(dir, "memory.failcnt", None),
            ooms: memcg_value(dir, "memory.oom_control", Some("oom_kill")),
        }
    }
}

/// `/readyz` and `nri-resize status` (in the container) say the maps' memory, the latter with
/// the node's possible CPUs (`possible`: `/sys/devices/system/cpu/possible`); returns the
/// status line.
fn assert_map_memory_said(daemon: &DaemonContainer, possible: &str) -> String {
    let (code, _, ready) = http_get(&daemon.metrics_addr, "/readyz", None).expect("/readyz");
    assert_eq!(code, 200, "{ready}");
    // Only the classic tracepoints (reclaim timing, CPU hotplug) may fall back: Debian's
    // `perf_event_paranoid` 3 refuses `perf_event_open` without `CAP_SYS_ADMIN`
    // (docs/deploying.md); throttling, reclaim and OOM kills stay on eBPF
    // (`assert_measured_on_ebpf`).
    assert!(ready.starts_with("ready (eBPF maps "), "/readyz: {ready}");
    let (code, status, err) = daemon.exec(&["/usr/bin/nri-resize", "status"]);
    assert_eq!(code, 0, "nri-resize status in the container: {status}{err}");
    let cpus = possible
        .rsplit(['-', ','])
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |n| n + 1);
    let line = status
        .lines()
        .find(|l| l.starts_with("observer: eBPF maps "))
        .unwrap_or_else(|| panic!("status shows no map memory:\n{status}"));
    assert!(line.contains(&format!(", {cpus} possible CPUs")), "{line}");
    line.to_owned()
}

/// The `DaemonSet` as deployed (its memory limit included) on a node whose kernel counts many
/// possible CPUs (the VM tier's `image_many_cpus@2.1`: 128, which
/// `NRI_RESIZE_EXPECT_POSSIBLE_CPUS` makes the test check; anywhere else, whatever the machine
/// has): every measurement runs on its eBPF programs, the maps' memory is exported and said by
/// `/readyz` and `status`, and the daemon's memory cgroup never reaches its limit. Per-CPU maps
/// took 276 MiB there (issue 37), above the 256 Mi limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_on_a_node_with_many_possible_cpus() {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .expect("read /sys/devices/system/cpu/possible");
    let possible = possible.trim();
    if let Ok(want) = std::env::var("NRI_RESIZE_EXPECT_POSSIBLE_CPUS") {
        assert_eq!(possible, want, "the guest's possible CPUs");
    }
    let archive = daemon_image_archive();
    let ctrd = Containerd::start(ContainerdVersion::V2, ContainerdOptions::default()).await;
    let ds = rendered_daemonset("deploy");
    let spec = as_deployed(&ctrd, &ds, "cpus", &|p| PathBuf::from(p));
    let limit = spec
        .memory_limit
        .and_then(|l| u64::try_from(l).ok())
        .expect("the DaemonSet sets a memory limit");
    let daemon = DaemonContainer::start_as_deployed(&ctrd, &archive, spec).await;
    daemon.wait_ready(Duration::from_secs(120));

    // A pod of four containers for the observer to watch.
    let mut pod_spec = PodSpec::new("cpus");
    pod_spec.resources = Resources::limits(200_000, 256 << 20);
    let pod = ctrd.run_pod(pod_spec).await.expect("run pod");
    for name in ["a", "b", "c", "d"] {
        let mut c = ContainerSpec::new(name, &["sleep", "3600"]);
        c.resources = Resources::limits(50_000, 32 << 20);
        let id = ctrd
            .create_container(&pod, c)
            .await
            .expect("create container");
        ctrd.start_container(&id).await.expect("start container");
    }
    let counters = r#"nri_resize_container_cpu_cfs_throttled_periods_total{container="d",namespace="default",pod="cpus"}"#;
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let (code, _, body) =
            http_get(&daemon.metrics_addr, "/metrics", None).expect("scrape /metrics");
        assert_eq!(code, 200, "{body}");
        if body.contains(counters) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the observer read no container after 60 s\n/metrics:\n{body}\nlog:\n{}",
            daemon.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    // What the daemon costs, printed before anything is asserted: the maps' memory (exported
    // per map), its memory cgroup (its pod's: the daemon is its only container), its RSS.
    let maps = map_memory_series(&metrics);
    let map_total: u64 = maps.iter().map(|(_, b)| b).sum();
    let memcg = ctrd.cgroups().dir_for("memory", &daemon.pod_cgroup);
    let MemcgUse {
        current,
        peak,
        hits,
        ooms,
    } = memcg_use(&memcg);
    let rss = daemon
        .process_status()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    // The node's per-CPU memory: where per-CPU map values go, charged to the daemon or not.
    let percpu = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Percpu:").map(|v| v.trim().to_owned()))
        .unwrap_or_default();
    eprintln!(
        "possible CPUs {possible}: eBPF maps {map_total} bytes {maps:?}; daemon memcg current \
         {current:?}, peak {peak:?}, limit hits {hits:?}, OOM kills {ooms:?}; RSS {rss}; limit \
         {limit}; node Percpu {percpu}"
    );

    assert_measured_on_ebpf(&metrics);
    // The maps: each counted, small, and not multiplied by the CPUs.
    for name in [
        "THROTTLE",
        "RECLAIM",
        "OOM",
        "THROTTLED_TASKS",
        "RECLAIM_START",
    ] {
        assert!(
            maps.iter().any(|(n, b)| n == name && *b > 0),
            "no nri_resize_bpf_map_memory_bytes for {name} in {maps:?}"
        );
    }
    assert!(
        map_total <= limit / 8,
        "the eBPF maps take {map_total} bytes of the daemon's {limit}-byte limit: {maps:?}"
    );
    let line = assert_map_memory_said(&daemon, possible);
    eprintln!("{line}");

    // The daemon's memory cgroup never reached the limit: no OOM kill, no hit of the limit,
    // and its peak below it.
    let current = current.unwrap_or_else(|| panic!("no memory usage in {}", memcg.display()));
    assert!(current < limit, "memory.current {current} ≥ limit {limit}");
    if let Some(peak) = peak {
        assert!(peak < limit, "peak {peak} ≥ limit {limit}");
    }
    assert_eq!(ooms.unwrap_or(0), 0, "the daemon was OOM-killed");
    assert_eq!(
        hits.unwrap_or(0),
        0,
        "the daemon's memory reached its limit"
    );
    // Still ready: nothing restarted it.
    let (code, _, ready) = http_get(&daemon.metrics_addr, "/readyz", None).expect("/readyz");
    assert_eq!(code, 200, "{ready}\nlog:\n{}", daemon.log_tail(40));
}
