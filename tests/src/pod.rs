//! Pods and containers driven through CRI the way kubelet drives them (cgroupfs driver).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerStatus, ContainerStatusRequest,
    CreateContainerRequest, ExecSyncRequest, ExecSyncResponse, ImageSpec, LinuxContainerConfig,
    LinuxContainerResources, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
    UpdateContainerResourcesRequest,
};
use tonic::Status;

use crate::cgroups::{CgroupLimits, CgroupMode};
use crate::containerd::Containerd;
use crate::images::BUSYBOX_IMAGE;
use crate::util::next_instance;

/// CPU and memory resources in CRI terms (`LinuxContainerResources`); 0 means "not set".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// CFS period in µs.
    pub cpu_period: i64,
    /// CFS quota in µs per period.
    pub cpu_quota: i64,
    /// CPU shares.
    pub cpu_shares: i64,
    /// Memory limit in bytes.
    pub memory_limit: i64,
}

impl Resources {
    /// A limit of `cpu_quota` µs per 100 ms period and `memory_limit` bytes, with shares
    /// matching the quota (as for a Guaranteed pod: `quota * 1024 / period`).
    pub fn limits(cpu_quota: i64, memory_limit: i64) -> Self {
        Self {
            cpu_period: 100_000,
            cpu_quota,
            cpu_shares: (cpu_quota * 1024 / 100_000).max(2),
            memory_limit,
        }
    }

    /// Burstable: limits as [`Resources::limits`] with the minimal CPU request (shares 2), so
    /// that many containers fit a small node's allocatable.
    pub fn burstable(cpu_quota: i64, memory_limit: i64) -> Self {
        Self {
            cpu_shares: 2,
            ..Self::limits(cpu_quota, memory_limit)
        }
    }

    /// As CRI `LinuxContainerResources`, the way kubelet sends them with swap off (its
    /// default, `ConfigureNoSwap`): where the kernel has the swap controller, the memory+swap
    /// limit equals the memory limit on cgroup v1, and `memory.swap.max` is 0 on v2.
    pub fn to_cri(&self) -> LinuxContainerResources {
        let mut r = LinuxContainerResources {
            cpu_period: self.cpu_period,
            cpu_quota: self.cpu_quota,
            cpu_shares: self.cpu_shares,
            memory_limit_in_bytes: self.memory_limit,
            ..Default::default()
        };
        match swap_controller() {
            Some(CgroupMode::V1) => r.memory_swap_limit_in_bytes = r.memory_limit_in_bytes,
            Some(CgroupMode::V2) => {
                r.unified.insert("memory.swap.max".into(), "0".into());
            }
            None => {}
        }
        r
    }

    /// These plus `overhead` (what kubelet writes to the pod cgroup: `ResourceConfigForPod`
    /// adds the pod overhead to each limit the pod has; an unlimited one stays unlimited).
    #[must_use]
    pub fn with_overhead(&self, overhead: &Resources) -> Resources {
        let add = |a: i64, b: i64| if a > 0 { a + b.max(0) } else { a };
        Resources {
            cpu_period: self.cpu_period,
            cpu_quota: add(self.cpu_quota, overhead.cpu_quota),
            cpu_shares: add(self.cpu_shares, overhead.cpu_shares),
            memory_limit: add(self.memory_limit, overhead.memory_limit),
        }
    }

    /// From CRI `LinuxContainerResources` (other fields are ignored).
    pub fn from_cri(r: &LinuxContainerResources) -> Self {
        Self {
            cpu_period: r.cpu_period,
            cpu_quota: r.cpu_quota,
            cpu_shares: r.cpu_shares,
            memory_limit: r.memory_limit_in_bytes,
        }
    }

    /// The pod cgroup limits kubelet would write for a pod with these (summed) resources.
    pub fn cgroup_limits(&self) -> CgroupLimits {
        CgroupLimits {
            cpu_quota: (self.cpu_quota > 0).then_some(self.cpu_quota),
            cpu_period: u64::try_from(self.cpu_period)
                .ok()
                .filter(|p| *p > 0)
                .unwrap_or(100_000),
            cpu_shares: u64::try_from(self.cpu_shares)
                .ok()
                .filter(|s| *s > 0)
                .unwrap_or(1024),
            memory_limit: u64::try_from(self.memory_limit).ok().filter(|m| *m > 0),
        }
    }
}

/// What to run a pod with.
#[derive(Debug, Clone, Default)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Namespace (`default` from [`PodSpec::new`]).
    pub namespace: String,
    /// Pod UID (a unique UUID-like string from [`PodSpec::new`]); the pod cgroup is `pod<uid>`.
    pub uid: String,
    /// Pod labels.
    pub labels: HashMap<String, String>,
    /// Pod annotations.
    pub annotations: HashMap<String, String>,
    /// Pod-level resources: written to the pod cgroup (see [`Resources::cgroup_limits`]) and
    /// passed as `LinuxPodSandboxConfig.resources`, like kubelet.
    pub resources: Resources,
    /// The pod overhead (a `RuntimeClass`'s): added to the pod cgroup's limits and passed as
    /// `LinuxPodSandboxConfig.overhead`, like kubelet; none by default.
    pub overhead: Resources,
}

impl PodSpec {
    /// A pod named `name` in namespace `default` with a fresh UID and no limits.
    pub fn new(name: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            std::process::id(),
            next_instance() & 0xffff,
            (nanos >> 48) & 0xfff,
            (nanos >> 36) & 0xfff,
            nanos & 0xffff_ffff_ffff
        );
        Self {
            name: name.to_owned(),
            namespace: "default".to_owned(),
            uid,
            ..Default::default()
        }
    }
}

/// A running pod sandbox.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Sandbox id.
    pub id: String,
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// `cgroup_parent` as sent to CRI: the pod cgroup's path (`/nri-resize-test-<pid>-<n>/pod<uid>`)
    /// with the cgroupfs driver, its slice (`nri_resize_test_<pid>_<n>-pod<uid>.slice`) with
    /// the systemd driver.
    pub cgroup_parent: String,
    /// The pod cgroup's absolute path (the same as `cgroup_parent` with the cgroupfs driver).
    pub cgroup_path: String,
    /// The sandbox config sent with `RunPodSandbox` (also sent with `CreateContainer`).
    pub config: PodSandboxConfig,
}

/// What to run a container with.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// Container name.
    pub name: String,
    /// Image; `None` = [`BUSYBOX_IMAGE`].
    pub image: Option<String>,
    /// Command (entrypoint override), e.g. `["sleep", "3600"]`.
    pub command: Vec<String>,
    /// Resources (`LinuxContainerConfig.resources`).
    pub resources: Resources,
    /// Container annotations.
    pub annotations: HashMap<String, String>,
    /// Container labels.
    pub labels: HashMap<String, String>,
}

impl ContainerSpec {
    /// A busybox container `name` running `command`.
    pub fn new(name: &str, command: &[&str]) -> Self {
        Self {
            name: name.to_owned(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }
}

fn host_network() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node.into(),
        pid: NamespaceMode::Container.into(),
        ipc: NamespaceMode::Pod.into(),
        ..Default::default()
    }
}

impl Containerd {
    /// Creates and limits the pod cgroup, then `RunPodSandbox` with host networking.
    /// The pod cgroup is removed again if `RunPodSandbox` fails.
    pub async fn run_pod(&self, spec: PodSpec) -> Result<Pod, Status> {
        let (cgroup_parent, cgroup_path) = self.cgroups.pod_cgroup(&spec.uid);
        self.cgroups.create_cgroup(&cgroup_path);
        self.cgroups
            .set_limits(
                &cgroup_path,
                &spec.resources.with_overhead(&spec.overhead).cgroup_limits(),
            )
            .unwrap_or_else(|e| panic!("limit pod cgroup {cgroup_path}: {e}"));
        let log_dir = self
            .base_dir()
            .join("pods")
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid));
        std::fs::create_dir_all(&log_dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", log_dir.display()));
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: 0,
            }),
            hostname: String::new(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            labels: kubelet_labels(&spec.labels, &spec.name, &spec.namespace, &spec.uid, None),
            annotations: spec.annotations.clone(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.clone(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
                resources: Some(spec.resources.to_cri()),
                overhead: (spec.overhead != Resources::default()).then(|| spec.overhead.to_cri()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut client = self.runtime_client();
        let res = Box::pin(client.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        }))
        .await;
        match res {
            Ok(r) => Ok(Pod {
                id: r.into_inner().pod_sandbox_id,
                uid: spec.uid,
                name: spec.name,
                namespace: spec.namespace,
                cgroup_parent,
                cgroup_path,
                config,
            }),
            Err(e) => {
                let _ = self.cgroups.remove_cgroup(&cgroup_path);
                Err(e)
            }
        }
    }

    /// `CreateContainer` in `pod`; returns the container id. The config carries kubelet's
    /// labels (CRI-O names containers from them).
    pub async fn create_container(&self, pod: &Pod, spec: ContainerSpec) -> Result<String, Status> {
        let image = spec.image.unwrap_or_else(|| BUSYBOX_IMAGE.to_owned());
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: spec.name.clone(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: image.clone(),
                user_specified_image: image,
                ..Default::default()
            }),
            command: spec.command,
            log_path: format!("{}.log", spec.name),
            labels: kubelet_labels(
                &spec.labels,
                &pod.name,
                &pod.namespace,
                &pod.uid,
                Some(&spec.name),
            ),
            annotations: spec.annotations,
            linux: Some(LinuxContainerConfig {
                resources: Some(spec.resources.to_cri()),
                security_context: Some(LinuxContainerSecurityContext {
                    namespace_options: Some(host_network()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let mut client = self.runtime_client();
        let r = Box::pin(client.create_container(CreateContainerRequest {
            pod_sandbox_id: pod.id.clone(),
            config: Some(config),
            sandbox_config: Some(pod.config.clone()),
        }))
        .await?;
        Ok(r.into_inner().container_id)
    }

    /// `StartContainer`.
    pub async fn start_container(&self, id: &str) -> Result<(), Status> {
        self.runtime_client()
            .start_container(StartContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .map(|_| ())
    }

    /// `UpdateContainerResources` with `resources` (other fields unset, as kubelet sends them).
    pub async fn update_container_resources(
        &self,
        id: &str,
        resources: &Resources,
    ) -> Result<(), Status> {
        self.update_container_resources_raw(id, resources.to_cri())
            .await
    }

    /// `UpdateContainerResources` with full CRI resources.
    pub async fn update_container_resources_raw(
        &self,
        id: &str,
        linux: LinuxContainerResources,
    ) -> Result<(), Status> {
        self.runtime_client()
            .update_container_resources(UpdateContainerResourcesRequest {
                container_id: id.to_owned(),
                linux: Some(linux),
                ..Default::default()
            })
            .await
            .map(|_| ())
    }

    /// `ContainerStatus` (non-verbose).
    pub async fn container_status(&self, id: &str) -> Result<ContainerStatus, Status> {
        let r = self
            .runtime_client()
            .container_status(ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await?;
        r.into_inner()
            .status
            .ok_or_else(|| Status::not_found(format!("no status for container {id}")))
    }

    /// The Linux resources `ContainerStatus` reports (what kubelet takes as "actual"); `None` if
    /// the runtime reports none.
    pub async fn container_resources(
        &self,
        id: &str,
    ) -> Result<Option<LinuxContainerResources>, Status> {
        Ok(self
            .container_status(id)
            .await?
            .resources
            .and_then(|r| r.linux))
    }

    /// `ExecSync` `cmd` in the container (`timeout_secs` 0 = none).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: &[&str],
        timeout_secs: i64,
    ) -> Result<ExecSyncResponse, Status> {
        let r = self
            .runtime_client()
            .exec_sync(ExecSyncRequest {
                container_id: id.to_owned(),
                cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
                timeout: timeout_secs,
            })
            .await?;
        Ok(r.into_inner())
    }

    /// `StopContainer` with a grace period in seconds (0 = SIGKILL at once).
    pub async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<(), Status> {
        self.runtime_client()
            .stop_container(StopContainerRequest {
                container_id: id.to_owned(),
                timeout: timeout_secs,
            })
            .await
            .map(|_| ())
    }

    /// `RemoveContainer`.
    pub async fn remove_container(&self, id: &str) -> Result<(), Status> {
        self.runtime_client()
            .remove_container(RemoveContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .map(|_| ())
    }

    /// `StopPodSandbox`.
    pub async fn stop_pod(&self, pod: &Pod) -> Result<(), Status> {
        self.runtime_client()
            .stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            })
            .await
            .map(|_| ())
    }

    /// `RemovePodSandbox`, then removes the pod cgroup (as kubelet does). Panics if the pod
    /// cgroup cannot be removed.
    pub async fn remove_pod(&self, pod: &Pod) -> Result<(), Status> {
        self.runtime_client()
            .remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            })
            .await?;
        let tree = self.cgroups.clone();
        let cg = pod.cgroup_path.clone();
        tokio::task::spawn_blocking(move || {
            tree.remove_cgroup(&cg)
                .unwrap_or_else(|e| panic!("remove pod cgroup {cg}: {e}"));
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        Ok(())
    }

    /// A pod (CPU 2, memory 1 GiB) with one container `app` (CPU 1, memory 512 MiB) running
    /// `sh -c script`, returned once the container's memory usage reached `min_usage` bytes and
    /// settled: what the memory-decrease and fault tests resize. `annotations` go on the pod.
    ///
    /// # Panics
    /// If the pod or container cannot be created or started, or usage stays below `min_usage`
    /// without growing for a minute, or for ten minutes in all (the message says how far it
    /// got and what the machine's writeback was doing).
    pub async fn loaded_pod(
        &self,
        name: &str,
        annotations: &[(&str, &str)],
        script: &str,
        min_usage: i64,
    ) -> (Pod, String) {
        const MIB: i64 = 1 << 20;
        let mut spec = PodSpec::new(name);
        for (k, v) in annotations {
            spec.annotations.insert((*k).to_string(), (*v).to_string());
        }
        spec.resources = Resources::limits(200_000, 1024 * MIB);
        let pod = Box::pin(self.run_pod(spec)).await.expect("RunPodSandbox");
        let mut c = ContainerSpec::new("app", &["sh", "-c", script]);
        c.resources = Resources::limits(100_000, 512 * MIB);
        let id = Box::pin(self.create_container(&pod, c))
            .await
            .expect("CreateContainer");
        self.start_container(&id).await.expect("StartContainer");
        // Writing the page cache takes as long as the machine's disk does (a `conv=fsync` of
        // 400 MiB waits for writeback, throttled by every other writer of the machine): the
        // wait goes on while usage grows, and fails once it stood still for a minute (a
        // workload that stopped), or after ten minutes in all (only a hang guard).
        let started = Instant::now();
        let mut last = (self.container_memory_usage(&id), Instant::now());
        while self.container_memory_usage(&id) < min_usage {
            let now = self.container_memory_usage(&id);
            if now > last.0 {
                last = (now, Instant::now());
            }
            assert!(
                last.1.elapsed() < Duration::from_secs(60)
                    && started.elapsed() < Duration::from_secs(600),
                "{name}: usage stayed at {} MiB, below {} MiB ({} s in all, no growth for {} s); \
                 the machine's page cache waiting for the disk: {}",
                now / MIB,
                min_usage / MIB,
                started.elapsed().as_secs(),
                last.1.elapsed().as_secs(),
                writeback_now()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Let the writer finish and settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (pod, id)
    }

    /// Reads the pod cgroup's limits.
    pub fn pod_cgroup_limits(&self, pod: &Pod) -> io::Result<CgroupLimits> {
        self.cgroups.limits(&pod.cgroup_path)
    }

    /// Writes the pod cgroup's limits (what kubelet does when a pod is resized).
    pub fn set_pod_cgroup_limits(&self, pod: &Pod, limits: &CgroupLimits) -> io::Result<()> {
        self.cgroups.set_limits(&pod.cgroup_path, limits)
    }

    /// Directory of the container's cgroup in the hierarchy of `controller` (ignored on v2),
    /// if it exists. Container cgroups are `<pod cgroup>/<container id>` (containerd's
    /// cgroupfs driver) or `<pod cgroup>/crio-<container id>` (CRI-O's); with the systemd
    /// driver the scopes `<pod slice>/cri-containerd-<id>.scope` and `crio-<id>.scope`.
    pub fn container_cgroup_dir(&self, id: &str, controller: &str) -> Option<PathBuf> {
        [
            id.to_owned(),
            format!("crio-{id}"),
            format!("cri-containerd-{id}.scope"),
            format!("crio-{id}.scope"),
        ]
        .iter()
        .find_map(|name| self.cgroups.find_dir(controller, name))
    }

    /// The container's memory limit in bytes (`memory.limit_in_bytes` / `memory.max`; `-1`:
    /// unlimited). Panics if the cgroup is gone.
    pub fn container_memory_limit(&self, id: &str) -> i64 {
        let file = if self.cgroups.mode() == CgroupMode::V1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        self.read_container_cgroup(id, file).parse().unwrap_or(-1)
    }

    /// The container's CPU quota in µs per period (`cpu.cfs_quota_us` / the first field of
    /// `cpu.max`; `-1`: unlimited). Panics if the cgroup is gone.
    pub fn container_cpu_quota(&self, id: &str) -> i64 {
        if self.cgroups.mode() == CgroupMode::V1 {
            self.read_container_cgroup(id, "cpu.cfs_quota_us")
                .parse()
                .unwrap_or(-1)
        } else {
            self.read_container_cgroup(id, "cpu.max")
                .split_whitespace()
                .next()
                .and_then(|q| q.parse().ok())
                .unwrap_or(-1)
        }
    }

    /// The container's memory usage in bytes (`memory.usage_in_bytes` / `memory.current`).
    pub fn container_memory_usage(&self, id: &str) -> i64 {
        let file = if self.cgroups.mode() == CgroupMode::V1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        self.read_container_cgroup(id, file).parse().unwrap_or(0)
    }

    /// Reads (trimmed) `file` of the container's cgroup, e.g. `cpu.cfs_quota_us`,
    /// `memory.limit_in_bytes` (v1) or `cpu.max`, `memory.max` (v2). On v1 the hierarchy is
    /// chosen by the file's prefix (`cgroup.*` files are read from the `memory` hierarchy).
    /// Panics if the cgroup or file does not exist.
    pub fn read_container_cgroup(&self, id: &str, file: &str) -> String {
        let controller = match file.split_once('.').map(|(c, _)| c) {
            Some("cgroup") | None => "memory",
            Some(c) => c,
        };
        let controller = if self.cgroups.mode() == CgroupMode::V2 {
            ""
        } else {
            controller
        };
        let dir = self
            .container_cgroup_dir(id, controller)
            .unwrap_or_else(|| {
                panic!(
                    "no cgroup for container {id} under {} ({controller})",
                    self.cgroups.path()
                )
            });
        crate::cgroups::read_trim(&dir.join(file)).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The cgroup layout when the kernel has the swap controller (kubelet's
/// `swapControllerAvailable`: `memory.memsw.*` on v1, `memory.swap.max` below the root on v2).
fn swap_controller() -> Option<CgroupMode> {
    static SWAP: OnceLock<Option<CgroupMode>> = OnceLock::new();
    *SWAP.get_or_init(|| match CgroupMode::detect() {
        CgroupMode::V1 => Path::new("/sys/fs/cgroup/memory/memory.memsw.usage_in_bytes")
            .exists()
            .then_some(CgroupMode::V1),
        CgroupMode::V2 => std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("memory.swap.max").exists())
            .then_some(CgroupMode::V2),
    })
}

/// `labels` with the ones kubelet sets on every pod sandbox, and with `container`, on every
/// container (`pkg/kubelet/types/labels.go`): kubelet's win over the pod's own.
pub fn kubelet_labels(
    labels: &HashMap<String, String>,
    pod: &str,
    namespace: &str,
    uid: &str,
    container: Option<&str>,
) -> HashMap<String, String> {
    let mut all = labels.clone();
    all.insert("io.kubernetes.pod.name".into(), pod.into());
    all.insert("io.kubernetes.pod.namespace".into(), namespace.into());
    all.insert("io.kubernetes.pod.uid".into(), uid.into());
    if let Some(name) = container {
        all.insert("io.kubernetes.container.name".into(), name.into());
    }
    all
}

/// `Dirty` and `Writeback` of `/proc/meminfo`: how much of the machine's page cache waits for
/// the disk (said when a workload's page cache does not fill).
fn writeback_now() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let fields: Vec<String> = meminfo
        .lines()
        .filter(|l| l.starts_with("Dirty:") || l.starts_with("Writeback:"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    if fields.is_empty() {
        "unknown (/proc/meminfo unread)".into()
    } else {
        fields.join(", ")
    }
}
