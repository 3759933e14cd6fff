//! The node reserve as kubelet computes it, and how it compares with admission's.
//!
//! kubelet's allocatable (what the scheduler and kubelet's own admission fit pods into) is
//! `capacity − systemReserved − kubeReserved − the hard eviction threshold` (memory;
//! `memory.available` of `evictionHard`, 100Mi when `evictionHard` is not set); for CPU,
//! `capacity − systemReserved − kubeReserved`. Its pods cgroup (`kubepods`, `kubepods.slice`)
//! holds `capacity − systemReserved − kubeReserved`, without the eviction threshold, and CPU
//! shares for the same CPUs (`enforceNodeAllocatable: [pods]`, kubelet's default).
//!
//! This module reads those numbers from the text of a `KubeletConfiguration` (YAML or JSON, as
//! kubeadm, EKS and GKE write it) and from what a pods cgroup holds, and says where they and
//! admission's `[resize]` reserve disagree. It does no I/O: `daemon/reserve.rs` reads the file
//! and the cgroup.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

use super::quantity::millis_to_shares;
use super::units::{bytes_quantity, cpu_text, parse_cpu, parse_memory, QuantityError};

/// kubelet's `evictionHard` default for `memory.available` (`DefaultEvictionHard`).
pub const DEFAULT_EVICTION_HARD_MEMORY: u64 = 100 << 20;

/// Why a `KubeletConfiguration` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KubeletConfigError {
    #[error("not a KubeletConfiguration (YAML or JSON): {0}")]
    Syntax(#[from] serde_norway::Error),
    #[error("kind is {0:?}, not KubeletConfiguration")]
    Kind(String),
    #[error("{key}: {source}")]
    Quantity {
        key: String,
        #[source]
        source: QuantityError,
    },
    #[error("{key}: {value:?} is not a percentage (e.g. 5%)")]
    Percentage { key: String, value: String },
}

/// The hard eviction threshold on `memory.available`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvictionThreshold {
    Bytes(u64),
    /// A fraction of the node's memory capacity (`"5%"` = 0.05).
    Fraction(f64),
}

impl EvictionThreshold {
    /// In bytes, for a node with `capacity` bytes of memory (kubelet rounds a percentage down).
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            Self::Bytes(b) => b,
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_precision_loss,
                reason = "a fraction in [0, 1] of a byte count: the product fits and is not negative"
            )]
            Self::Fraction(f) => (capacity as f64 * f) as u64,
        }
    }
}

impl fmt::Display for EvictionThreshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes(b) => f.write_str(&bytes_quantity(*b)),
            Self::Fraction(x) => write!(f, "{}%", x * 100.0),
        }
    }
}

/// What a `KubeletConfiguration` reserves.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletReserve {
    pub system_memory: u64,
    pub system_cpu_millis: u64,
    pub kube_memory: u64,
    pub kube_cpu_millis: u64,
    pub eviction_hard_memory: EvictionThreshold,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    system_reserved: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    kube_reserved: BTreeMap<String, serde_norway::Value>,
    #[serde(default)]
    eviction_hard: Option<BTreeMap<String, serde_norway::Value>>,
    #[serde(default)]
    merge_default_eviction_settings: bool,
}

/// A scalar as the quantity text it stands for (YAML may give `1073741824` as a number).
fn scalar(v: &serde_norway::Value) -> Option<String> {
    match v {
        serde_norway::Value::String(s) => Some(s.trim().to_owned()),
        serde_norway::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn quantity(
    map: &BTreeMap<String, serde_norway::Value>,
    section: &str,
    key: &str,
    parse: fn(&str) -> Result<u64, QuantityError>,
) -> Result<u64, KubeletConfigError> {
    let Some(v) = map.get(key) else {
        return Ok(0);
    };
    let text = scalar(v).unwrap_or_default();
    parse(&text).map_err(|source| KubeletConfigError::Quantity {
        key: format!("{section}.{key}"),
        source,
    })
}

impl KubeletReserve {
    /// Reads `systemReserved`, `kubeReserved` and `evictionHard` from a `KubeletConfiguration`
    /// (YAML or JSON). Absent reserves are zero; an absent `evictionHard` is kubelet's default
    /// (100Mi); an `evictionHard` without `memory.available` has none, unless
    /// `mergeDefaultEvictionSettings` asks for kubelet's defaults.
    pub fn parse(text: &str) -> Result<Self, KubeletConfigError> {
        let raw: RawConfig = serde_norway::from_str(text)?;
        if let Some(kind) = raw.kind.filter(|k| k != "KubeletConfiguration") {
            return Err(KubeletConfigError::Kind(kind));
        }
        let eviction_hard_memory = match &raw.eviction_hard {
            None => EvictionThreshold::Bytes(DEFAULT_EVICTION_HARD_MEMORY),
            Some(map) => match map.get("memory.available").and_then(scalar) {
                None if raw.merge_default_eviction_settings => {
                    EvictionThreshold::Bytes(DEFAULT_EVICTION_HARD_MEMORY)
                }
                None => EvictionThreshold::Bytes(0),
                Some(text) => threshold(&text)?,
            },
        };
        Ok(KubeletReserve {
            system_memory: quantity(
                &raw.system_reserved,
                "systemReserved",
                "memory",
                parse_memory,
            )?,
            system_cpu_millis: quantity(&raw.system_reserved, "systemReserved", "cpu", parse_cpu)?,
            kube_memory: quantity(&raw.kube_reserved, "kubeReserved", "memory", parse_memory)?,
            kube_cpu_millis: quantity(&raw.kube_reserved, "kubeReserved", "cpu", parse_cpu)?,
            eviction_hard_memory,
        })
    }

    /// Memory kept from pods: both reserves and the hard eviction threshold.
    pub fn memory_bytes(&self, capacity: u64) -> u64 {
        self.system_memory
            .saturating_add(self.kube_memory)
            .saturating_add(self.eviction_hard_memory.bytes(capacity))
    }

    /// CPU kept from pods, in millicores.
    pub fn cpu_millis(&self) -> u64 {
        self.system_cpu_millis.saturating_add(self.kube_cpu_millis)
    }

    /// How the memory reserve is made up, for a person: `1Gi system + 512Mi kube + 100Mi
    /// eviction`.
    pub fn memory_parts(&self) -> String {
        format!(
            "{} system + {} kube + {} eviction",
            bytes_quantity(self.system_memory),
            bytes_quantity(self.kube_memory),
            self.eviction_hard_memory
        )
    }

    /// How the CPU reserve is made up: `500m system + 500m kube`.
    pub fn cpu_parts(&self) -> String {
        format!(
            "{} system + {} kube",
            cpu_text(self.system_cpu_millis),
            cpu_text(self.kube_cpu_millis)
        )
    }
}

fn threshold(text: &str) -> Result<EvictionThreshold, KubeletConfigError> {
    let key = "evictionHard.memory.available";
    if let Some(pct) = text.strip_suffix('%') {
        let bad = || KubeletConfigError::Percentage {
            key: key.to_owned(),
            value: text.to_owned(),
        };
        let p: f64 = pct.trim().parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&p) {
            return Err(bad());
        }
        return Ok(EvictionThreshold::Fraction(p / 100.0));
    }
    parse_memory(text)
        .map(EvictionThreshold::Bytes)
        .map_err(|source| KubeletConfigError::Quantity {
            key: key.to_owned(),
            source,
        })
}

/// What kubelet's pods cgroup holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodsCgroup {
    /// The memory limit in bytes; `None`: unlimited (allocatable not enforced) or unknown.
    pub memory_limit: Option<u64>,
    /// `cpu.shares` (cgroup v1). On v2 `cpu.weight` is converted from shares by a formula that
    /// differs between runc versions, so it is not compared.
    pub cpu_shares: Option<u64>,
}

/// Which resource a [`Mismatch`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReserveResource {
    Memory,
    Cpu,
}

impl ReserveResource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Cpu => "cpu",
        }
    }
}

/// A disagreement between admission's reserve and kubelet's, said for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub resource: ReserveResource,
    pub message: String,
}

/// The node as the comparison needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeTotals {
    /// `MemTotal`, bytes (kubelet's memory capacity).
    pub memory_bytes: u64,
    /// Online CPUs, millicores (kubelet's CPU capacity).
    pub cpu_millis: u64,
}

/// `[resize] reserved_memory` / `reserved_cpu`; zero means not set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Configured {
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

/// Where admission's reserve comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effective {
    /// kubelet's configuration was read: its reserve is admission's.
    Kubelet,
    /// `[resize]`'s.
    Configured,
}

/// Compares the reserves. With `kubelet` read, admission uses kubelet's and a different
/// non-zero `[resize]` value is reported; the pods cgroup, where it holds a limit, must then
/// hold `capacity − systemReserved − kubeReserved` (else kubelet runs with other settings than
/// the file's, e.g. flags or a drop-in). Without `kubelet`, the pods cgroup says how much kubelet
/// keeps back at least (its eviction threshold comes on top): a smaller `[resize]` reserve lets
/// admission fit more than kubelet does.
pub fn compare(
    node: NodeTotals,
    configured: Configured,
    kubelet: Option<&KubeletReserve>,
    pods: Option<&PodsCgroup>,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let mut push = |resource, message| out.push(Mismatch { resource, message });
    if let Some(k) = kubelet {
        let memory = k.memory_bytes(node.memory_bytes);
        if configured.memory_bytes != 0 && configured.memory_bytes != memory {
            push(
                ReserveResource::Memory,
                format!(
                    "[resize] reserved_memory is {} but kubelet reserves {} ({}); admission uses kubelet's",
                    bytes_quantity(configured.memory_bytes),
                    bytes_quantity(memory),
                    k.memory_parts()
                ),
            );
        }
        if configured.cpu_millis != 0 && configured.cpu_millis != k.cpu_millis() {
            push(
                ReserveResource::Cpu,
                format!(
                    "[resize] reserved_cpu is {} but kubelet reserves {} ({}); admission uses kubelet's",
                    cpu_text(configured.cpu_millis),
                    cpu_text(k.cpu_millis()),
                    k.cpu_parts()
                ),
            );
        }
    }
    let Some(pods) = pods else {
        return out;
    };
    if let Some(limit) = pods.memory_limit.filter(|l| *l < node.memory_bytes) {
        let held_back = node.memory_bytes - limit;
        match kubelet {
            Some(k) if held_back != k.system_memory.saturating_add(k.kube_memory) => push(
                ReserveResource::Memory,
                format!(
                    "kubelet's pods cgroup holds {} of {} (keeps {} back) but its configuration reserves {} + {} (system + kube): kubelet runs with other settings than the file's (flags, a drop-in, a restart pending)",
                    bytes_quantity(limit),
                    bytes_quantity(node.memory_bytes),
                    bytes_quantity(held_back),
                    bytes_quantity(k.system_memory),
                    bytes_quantity(k.kube_memory)
                ),
            ),
            None if configured.memory_bytes < held_back => push(
                ReserveResource::Memory,
                format!(
                    "[resize] reserved_memory is {} but kubelet's pods cgroup keeps {} back (plus kubelet's eviction threshold): admission can fit pods kubelet cannot; set reserved_memory or [kubelet] config_file",
                    bytes_quantity(configured.memory_bytes),
                    bytes_quantity(held_back)
                ),
            ),
            _ => {}
        }
    }
    if let Some(shares) = pods.cpu_shares {
        let reserve = match kubelet {
            Some(k) => k.cpu_millis(),
            None => configured.cpu_millis,
        };
        let expected = millis_to_shares(node.cpu_millis.saturating_sub(reserve));
        // One share is ~1m; kubelet rounds down: a smaller reserve than kubelet's shows as
        // more shares expected than held.
        let too_small = match kubelet {
            Some(_) => shares != expected,
            None => expected > shares,
        };
        if too_small {
            let from = if kubelet.is_some() {
                "its configuration"
            } else {
                "[resize] reserved_cpu"
            };
            push(
                ReserveResource::Cpu,
                format!(
                    "kubelet's pods cgroup has cpu.shares {shares} (about {} allocatable of {}) but {from} makes {} allocatable (shares {expected})",
                    cpu_text(crate::policy::shares_to_millis(shares)),
                    cpu_text(node.cpu_millis),
                    cpu_text(node.cpu_millis.saturating_sub(reserve)),
                ),
            );
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    const NODE: NodeTotals = NodeTotals {
        memory_bytes: 16 * GI,
        cpu_millis: 4000,
    };

    #[test]
    fn reads_kubeadm_yaml() {
        let k = KubeletReserve::parse(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nsystemReserved:\n  cpu: 500m\n  memory: 1Gi\n  ephemeral-storage: 1Gi\nkubeReserved:\n  cpu: \"1\"\n  memory: 512Mi\nevictionHard:\n  memory.available: 200Mi\n  nodefs.available: 10%\n",
        )
        .unwrap();
        assert_eq!(k.memory_bytes(NODE.memory_bytes), GI + 512 * MI + 200 * MI);
        assert_eq!(k.cpu_millis(), 1500);
        assert_eq!(k.memory_parts(), "1Gi system + 512Mi kube + 200Mi eviction");
        assert_eq!(k.cpu_parts(), "500m system + 1000m kube");
    }

    #[test]
    fn reads_eks_json_with_a_percentage_threshold() {
        let k = KubeletReserve::parse(
            r#"{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","kubeReserved":{"cpu":"70m","memory":"574Mi","ephemeral-storage":"1Gi"},"evictionHard":{"memory.available":"5%"}}"#,
        )
        .unwrap();
        assert_eq!(k.kube_cpu_millis, 70);
        assert_eq!(k.system_memory, 0);
        assert_eq!(
            k.memory_bytes(NODE.memory_bytes),
            574 * MI + 16 * GI / 20,
            "5% of 16Gi"
        );
        assert_eq!(k.memory_parts(), "0 system + 574Mi kube + 5% eviction");
    }

    #[test]
    fn eviction_defaults_follow_kubelet() {
        let none = KubeletReserve::parse("kind: KubeletConfiguration\n").unwrap();
        assert_eq!(
            none.memory_bytes(GI),
            DEFAULT_EVICTION_HARD_MEMORY,
            "absent: 100Mi"
        );
        let other = KubeletReserve::parse("evictionHard:\n  nodefs.available: 5%\n").unwrap();
        assert_eq!(
            other.memory_bytes(GI),
            0,
            "set without memory.available: none"
        );
        let merged = KubeletReserve::parse(
            "mergeDefaultEvictionSettings: true\nevictionHard:\n  nodefs.available: 5%\n",
        )
        .unwrap();
        assert_eq!(merged.memory_bytes(GI), DEFAULT_EVICTION_HARD_MEMORY);
        let number = KubeletReserve::parse("systemReserved:\n  memory: 1073741824\n").unwrap();
        assert_eq!(number.system_memory, GI, "a YAML number is a quantity too");
    }

    #[test]
    fn bad_input_names_the_key() {
        let e = KubeletReserve::parse("kubeReserved:\n  memory: lots\n").unwrap_err();
        assert!(
            e.to_string().starts_with("kubeReserved.memory: \"lots\""),
            "{e}"
        );
        let e = KubeletReserve::parse("evictionHard:\n  memory.available: 150%\n").unwrap_err();
        assert!(
            e.to_string().contains("evictionHard.memory.available"),
            "{e}"
        );
        let e = KubeletReserve::parse("kind: Pod\n").unwrap_err();
        assert!(e.to_string().contains("not KubeletConfiguration"), "{e}");
        assert!(KubeletReserve::parse("{not yaml: [").is_err());
    }

    fn kubelet() -> KubeletReserve {
        KubeletReserve {
            system_memory: GI,
            system_cpu_millis: 500,
            kube_memory: 512 * MI,
            kube_cpu_millis: 500,
            eviction_hard_memory: EvictionThreshold::Bytes(100 * MI),
        }
    }

    fn matching_pods() -> PodsCgroup {
        PodsCgroup {
            memory_limit: Some(16 * GI - GI - 512 * MI),
            cpu_shares: Some(millis_to_shares(3000)),
        }
    }

    #[test]
    fn agreeing_reserves_report_nothing() {
        let k = kubelet();
        let same = Configured {
            memory_bytes: k.memory_bytes(NODE.memory_bytes),
            cpu_millis: 1000,
        };
        assert!(compare(NODE, same, Some(&k), Some(&matching_pods())).is_empty());
        assert!(
            compare(NODE, Configured::default(), Some(&k), None).is_empty(),
            "[resize] not set: nothing to disagree with"
        );
        let unlimited = PodsCgroup {
            memory_limit: None,
            cpu_shares: None,
        };
        assert!(compare(NODE, Configured::default(), Some(&k), Some(&unlimited)).is_empty());
    }

    #[test]
    fn a_configured_reserve_unlike_kubelets_is_reported() {
        let k = kubelet();
        let m = compare(
            NODE,
            Configured {
                memory_bytes: GI,
                cpu_millis: 250,
            },
            Some(&k),
            None,
        );
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[0].resource, ReserveResource::Memory);
        assert_eq!(
            m[0].message,
            "[resize] reserved_memory is 1Gi but kubelet reserves 1636Mi (1Gi system + 512Mi kube + 100Mi eviction); admission uses kubelet's"
        );
        assert_eq!(m[1].resource, ReserveResource::Cpu);
        assert!(
            m[1].message.contains(
                "reserved_cpu is 250m but kubelet reserves 1000m (500m system + 500m kube)"
            ),
            "{}",
            m[1].message
        );
    }

    #[test]
    fn a_pods_cgroup_unlike_the_file_is_reported() {
        let k = kubelet();
        let pods = PodsCgroup {
            memory_limit: Some(16 * GI - 2 * GI),
            cpu_shares: Some(millis_to_shares(2000)),
        };
        let m = compare(NODE, Configured::default(), Some(&k), Some(&pods));
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(m[0].message.contains("keeps 2Gi back"), "{}", m[0].message);
        assert!(
            m[0].message.contains("1Gi + 512Mi (system + kube)"),
            "{}",
            m[0].message
        );
        assert!(m[1].message.contains("cpu.shares 2048"), "{}", m[1].message);
        assert!(
            m[1].message.contains("makes 3000m allocatable"),
            "{}",
            m[1].message
        );
    }

    #[test]
    fn without_kubelets_file_a_reserve_smaller_than_the_pods_cgroup_is_reported() {
        let pods = matching_pods();
        let small = Configured {
            memory_bytes: GI,
            cpu_millis: 0,
        };
        let m = compare(NODE, small, None, Some(&pods));
        assert_eq!(m.len(), 2, "{m:?}");
        assert!(
            m[0].message.contains("keeps 1536Mi back"),
            "{}",
            m[0].message
        );
        assert_eq!(m[1].resource, ReserveResource::Cpu);
        let enough = Configured {
            memory_bytes: 2 * GI,
            cpu_millis: 1000,
        };
        assert!(
            compare(NODE, enough, None, Some(&pods)).is_empty(),
            "a reserve at least kubelet's is fine (it includes the eviction threshold)"
        );
    }
}
