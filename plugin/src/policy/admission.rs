//! Admission of a resize: does the desired size fit this node now (`Fits`), later (`Deferred`),
//! or never (`Infeasible`)? KEP-1287 "Kubelet and API Server Interaction", seen from the runtime.
//!
//! # Approximations
//!
//! NRI hands the runtime limits and CPU shares, not Kubernetes requests, so:
//!
//! - **CPU request** = `ceil(shares * 1000 / 1024)` (exact inverse of kubelet's conversion for
//!   requests ≥ 3m); shares 2 (kubelet's minimum) = no request.
//! - **Memory request** = `memory.reservation` when the runtime has one, else *assumed equal to
//!   the memory limit* (what the API server defaults a request to when only a limit is given;
//!   for Burstable containers with request < limit this over-counts, i.e. errs towards
//!   `Deferred`), else none.
//! - **`QoS` class** follows kubelet's `GetPodQOS` on those derived values: `BestEffort` when no
//!   container has a non-zero request or limit; `Guaranteed` when every container has CPU and
//!   memory limits and the pod's summed requests equal its summed limits; else `Burstable`. With
//!   unknown memory requests assumed equal to limits, a `Burstable` pod whose only difference is a
//!   memory request below its limit reads as `Guaranteed`. **Admission compares classes by which
//!   limits are set** (a set limit stands for its request): CPU requests are only seen through
//!   `cpu.shares`, which runtimes may not update in place, and the API server already refuses
//!   resizes that change the class through requests alone.
//! - **Exclusive CPUs** (static CPU manager): a container is taken to hold exclusive CPUs when its
//!   cpuset is a non-empty *strict* subset of the node's online CPUs, its CPU limit is integral,
//!   and the cpuset has exactly that many CPUs. (A shared-pool container's cpuset is the whole
//!   shared pool, which matches its limit only by coincidence; containers whose quota kubelet
//!   removed for exclusive CPUs are not recognised.)
//! - Demand (what is summed against capacity) is the request; pod overhead is added once per pod.
//! - A resize that does not grow the pod's demand in either resource is never `Deferred`.

use std::collections::BTreeMap;
use std::fmt;

use super::quantity::{Limit, Quantities, ResizeState, ResizeStatus};

/// Highest CPU number a [`CpuSet`] accepts (the kernel's largest `NR_CPUS`).
pub const MAX_CPU_ID: u32 = 8191;

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// A cpuset list (`0-3,8`) could not be parsed.
    #[error("invalid cpuset {input:?}: {reason}")]
    CpuSet {
        /// The input (truncated to 64 characters).
        input: String,
        /// What is wrong.
        reason: &'static str,
    },
}

/// A set of CPU numbers, as in `cpuset.cpus` / `/sys/devices/system/cpu/online`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    words: Vec<u64>,
}

impl CpuSet {
    /// Parses the kernel's list format (`0-3,8,10-11`; empty = no CPUs).
    pub fn parse(s: &str) -> Result<Self, AdmissionError> {
        let err = |reason| AdmissionError::CpuSet {
            input: s.chars().take(64).collect(),
            reason,
        };
        let mut set = CpuSet::default();
        let s = s.trim();
        if s.is_empty() {
            return Ok(set);
        }
        for part in s.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let lo: u32 = lo.trim().parse().map_err(|_| err("not a number"))?;
            let hi: u32 = hi.trim().parse().map_err(|_| err("not a number"))?;
            if lo > hi {
                return Err(err("range goes backwards"));
            }
            if hi > MAX_CPU_ID {
                return Err(err("CPU number too large"));
            }
            for cpu in lo..=hi {
                set.insert(cpu);
            }
        }
        Ok(set)
    }

    /// CPUs `0..n`.
    pub fn first_n(n: u32) -> Self {
        let mut set = CpuSet::default();
        for cpu in 0..n.min(MAX_CPU_ID + 1) {
            set.insert(cpu);
        }
        set
    }

    fn insert(&mut self, cpu: u32) {
        let (w, b) = ((cpu / 64) as usize, cpu % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }

    /// Number of CPUs.
    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// Whether every CPU of `self` is in `other`.
    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// Whether `self` is a subset of `other` and smaller.
    pub fn is_strict_subset(&self, other: &CpuSet) -> bool {
        self.is_subset(other) && self.count() < other.count()
    }

    /// The CPUs, in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, w)| {
            (0..64u32)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| u32::try_from(i).unwrap_or(u32::MAX / 64) * 64 + b)
        })
    }

    /// The CPUs of `self` that are not in `other`.
    #[must_use]
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet {
            words: self
                .words
                .iter()
                .enumerate()
                .map(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0))
                .collect(),
        }
    }
}

/// The kernel's list format (`0-3,8`), as `CpuSet::parse` reads it.
impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut cpus = self.iter().peekable();
        while let Some(lo) = cpus.next() {
            let mut hi = lo;
            while cpus.peek() == Some(&(hi + 1)) {
                hi += 1;
                cpus.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if hi == lo {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// What the node offers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCapacity {
    /// Online CPUs, in millicores.
    pub online_cpus_millis: u64,
    /// Total memory, in bytes.
    pub memory_bytes: u64,
    /// Memory held back for the system and kubelet (`system-reserved` + `kube-reserved` +
    /// eviction threshold), in bytes.
    pub reserved_memory_bytes: u64,
    /// The online CPUs (for the exclusive-CPU heuristic); empty = unknown.
    pub online_cpus: CpuSet,
    /// CPU held back for the system and kubelet, in millicores (requests are admitted against
    /// online CPUs minus this).
    pub reserved_cpu_millis: u64,
}

impl NodeCapacity {
    /// CPU that pods may request: online CPUs minus reserved, in millicores.
    pub fn allocatable_cpu_millis(&self) -> u64 {
        self.online_cpus_millis
            .saturating_sub(self.reserved_cpu_millis)
    }

    /// Memory that pods may have: total minus reserved.
    pub fn allocatable_memory_bytes(&self) -> u64 {
        self.memory_bytes.saturating_sub(self.reserved_memory_bytes)
    }
}

/// A sum of demands (requests), e.g. of all pods but the one being resized.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Allocated {
    /// CPU, in millicores.
    pub cpu_millis: u64,
    /// Memory, in bytes.
    pub memory_bytes: u64,
}

impl Allocated {
    /// The demand of one container's (or overhead's) quantities; see the module docs.
    pub fn of(q: &Quantities) -> Self {
        Self {
            cpu_millis: q.cpu.request.unwrap_or(0),
            memory_bytes: q.memory.request.or(q.memory.limit.value()).unwrap_or(0),
        }
    }

    /// Saturating sum.
    #[must_use]
    pub fn saturating_add(self, other: Allocated) -> Self {
        Self {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }
}

/// One container as admission sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerAllocation {
    /// The allocated quantities.
    pub quantities: Quantities,
    /// The container's current cpuset (empty = all / unknown).
    pub cpuset: CpuSet,
}

/// The pod being resized, as currently allocated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAllocation {
    /// Containers by name.
    pub containers: BTreeMap<String, ContainerAllocation>,
    /// Pod overhead (`RuntimeClass`); counted once.
    pub overhead: Quantities,
}

impl PodAllocation {
    /// The pod's demand: its containers' plus overhead.
    pub fn demand(&self) -> Allocated {
        self.containers
            .values()
            .map(|c| Allocated::of(&c.quantities))
            .fold(Allocated::of(&self.overhead), Allocated::saturating_add)
    }
}

/// Kubernetes `QoS` class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Requests equal limits for CPU and memory in every container.
    Guaranteed,
    /// Anything in between.
    Burstable,
    /// No requests or limits at all.
    BestEffort,
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        })
    }
}

/// The `QoS` class of a pod's containers, as kubelet's `GetPodQOS` computes it from the
/// derived requests and limits (see the module docs for the approximation).
pub fn qos_class<'a>(containers: impl IntoIterator<Item = &'a Quantities>) -> QosClass {
    // [cpu, memory] sums; None = no container set it.
    let mut requests: [Option<u64>; 2] = [None, None];
    let mut limits: [Option<u64>; 2] = [None, None];
    let mut guaranteed = true;
    for q in containers {
        for (i, rq) in [q.cpu, q.memory].iter().enumerate() {
            let limit = rq.limit.value().filter(|v| *v > 0);
            // Unknown memory request: the API server defaults it to the limit.
            let request = if i == 1 {
                rq.request.or(limit)
            } else {
                rq.request
            };
            if let Some(r) = request.filter(|v| *v > 0) {
                requests[i] = Some(requests[i].unwrap_or(0).saturating_add(r));
            }
            match limit {
                Some(l) => limits[i] = Some(limits[i].unwrap_or(0).saturating_add(l)),
                None => guaranteed = false,
            }
        }
    }
    if requests.iter().chain(&limits).all(Option::is_none) {
        return QosClass::BestEffort;
    }
    // requests[i] must equal limits[i] wherever a request is set, and every resource with a
    // limit must have a request (kubelet: len(requests) == len(limits)).
    if guaranteed && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// Whether a container holds exclusive CPUs (heuristic; see the module docs).
pub fn holds_exclusive_cpus(node: &NodeCapacity, c: &ContainerAllocation) -> bool {
    let Limit::Limited(millis) = c.quantities.cpu.limit else {
        return false;
    };
    !c.cpuset.is_empty()
        && !node.online_cpus.is_empty()
        && millis % 1000 == 0
        && u64::from(c.cpuset.count()) == millis / 1000
        && c.cpuset.is_strict_subset(&node.online_cpus)
}

/// What the `QoS` check compares: a set limit stands for its request too. CPU requests are only
/// seen through `cpu.shares`, which runtimes may not update in place (containerd 1.7 ignores
/// shares in NRI updates), so request-vs-limit equality is not observable reliably here; the API
/// server already refuses resizes that change a pod's `QoS` class by requests alone.
fn qos_shape(q: &Quantities) -> Quantities {
    let mut n = *q;
    if let Limit::Limited(v) = n.cpu.limit {
        n.cpu.request = Some(v);
    }
    if let Limit::Limited(v) = n.memory.limit {
        n.memory.request = Some(v);
    }
    n
}

/// The admission verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use]
pub enum Admission {
    /// Accept now.
    Fits,
    /// Fits the node, not the current allocations; re-evaluate later.
    Deferred {
        /// Why, for people.
        reason: String,
    },
    /// Can never fit (or is not allowed) on this node.
    Infeasible {
        /// Why, for people.
        reason: String,
    },
}

impl Admission {
    /// The KEP resize status this verdict leads to (`Fits` starts actuation: `InProgress`).
    pub fn resize_status(&self) -> ResizeStatus {
        match self {
            Admission::Fits => ResizeStatus::new(ResizeState::InProgress, ""),
            Admission::Deferred { reason } => {
                ResizeStatus::new(ResizeState::Deferred, reason.clone())
            }
            Admission::Infeasible { reason } => {
                ResizeStatus::new(ResizeState::Infeasible, reason.clone())
            }
        }
    }

    /// The outcome label (`nri_resize_resize_outcomes_total`, the resize timer) of a verdict that stops
    /// the resize; `None` for `Fits`.
    pub fn outcome(&self) -> Option<&'static str> {
        match self {
            Admission::Fits => None,
            Admission::Deferred { .. } => Some("deferred"),
            Admission::Infeasible { .. } => Some("infeasible"),
        }
    }
}

/// Admits a resize of `pod` to `desired` (container name → desired quantities; containers not
/// named keep their allocation) on `node`, where `others` is the demand of every other pod.
///
/// Infeasible, in this order: `QoS` class change; a container's CPU limit above the online CPUs; a
/// container's memory limit above allocatable memory; a non-integral CPU limit or request for a
/// container holding exclusive CPUs; the pod's demand alone above the node. Deferred: the pod's
/// new demand plus `others` above the node (unless the resize does not grow the demand).
pub fn admit(
    node: &NodeCapacity,
    others: &Allocated,
    pod: &PodAllocation,
    desired: &BTreeMap<String, Quantities>,
) -> Admission {
    let mut next = pod.clone();
    for (name, q) in desired {
        next.containers.entry(name.clone()).or_default().quantities = *q;
    }

    let shape = |p: &PodAllocation| -> Vec<Quantities> {
        p.containers
            .values()
            .map(|c| qos_shape(&c.quantities))
            .collect()
    };
    let before = qos_class(&shape(pod));
    let after = qos_class(&shape(&next));
    if before != after {
        return Admission::Infeasible {
            reason: format!(
                "QoS class would change from {before} to {after}, which cannot happen in place"
            ),
        };
    }

    let allocatable_memory = node.allocatable_memory_bytes();
    for (name, q) in desired {
        if let Limit::Limited(cpu) = q.cpu.limit {
            if cpu > node.online_cpus_millis {
                return Admission::Infeasible {
                    reason: format!(
                        "container {name}: CPU limit {cpu}m exceeds the node's {}m online CPUs",
                        node.online_cpus_millis
                    ),
                };
            }
        }
        if let Limit::Limited(mem) = q.memory.limit {
            if mem > allocatable_memory {
                return Admission::Infeasible {
                    reason: format!(
                        "container {name}: memory limit {mem} bytes exceeds the node's {allocatable_memory} allocatable bytes"
                    ),
                };
            }
        }
        if let Some(current) = pod.containers.get(name) {
            let fractional = q.cpu.limit.value().is_some_and(|v| v % 1000 != 0)
                || q.cpu.request.is_some_and(|v| v % 1000 != 0);
            if fractional && holds_exclusive_cpus(node, current) {
                return Admission::Infeasible {
                    reason: format!(
                        "container {name} holds exclusive CPUs, so only whole CPUs can be resized to (asked for limit {} / request {}m)",
                        q.cpu.limit,
                        q.cpu.request.unwrap_or(0)
                    ),
                };
            }
        }
    }

    let demand = next.demand();
    let allocatable_cpu = node.allocatable_cpu_millis();
    if demand.cpu_millis > allocatable_cpu {
        return Admission::Infeasible {
            reason: format!(
                "pod CPU requests {}m exceed the node's {allocatable_cpu}m allocatable CPU",
                demand.cpu_millis
            ),
        };
    }
    if demand.memory_bytes > allocatable_memory {
        return Admission::Infeasible {
            reason: format!(
                "pod memory requests {} bytes exceed the node's {allocatable_memory} allocatable bytes",
                demand.memory_bytes
            ),
        };
    }

    let old = pod.demand();
    if demand.cpu_millis <= old.cpu_millis && demand.memory_bytes <= old.memory_bytes {
        return Admission::Fits;
    }
    let total = others.saturating_add(demand);
    if total.cpu_millis > allocatable_cpu {
        return Admission::Deferred {
            reason: format!(
                "CPU requests would be {}m of the node's {allocatable_cpu}m allocatable ({}m held by other pods)",
                total.cpu_millis, others.cpu_millis
            ),
        };
    }
    if total.memory_bytes > allocatable_memory {
        return Admission::Deferred {
            reason: format!(
                "memory requests would be {} of the node's {allocatable_memory} allocatable bytes ({} held by other pods)",
                total.memory_bytes, others.memory_bytes
            ),
        };
    }
    Admission::Fits
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::policy::quantity::ResourceQuantity;

    const GI: u64 = 1 << 30;

    fn guaranteed(cpu: u64, mem: u64) -> Quantities {
        Quantities {
            cpu: ResourceQuantity::new(cpu, cpu),
            memory: ResourceQuantity {
                request: None,
                limit: Limit::Limited(mem),
            },
        }
    }

    fn burstable(cpu_req: u64, cpu_lim: u64, mem: u64) -> Quantities {
        Quantities {
            cpu: ResourceQuantity::new(cpu_req, cpu_lim),
            memory: ResourceQuantity {
                request: None,
                limit: Limit::Limited(mem),
            },
        }
    }

    fn node() -> NodeCapacity {
        NodeCapacity {
            online_cpus_millis: 8000,
            memory_bytes: 16 * GI,
            reserved_memory_bytes: GI,
            online_cpus: CpuSet::first_n(8),
            reserved_cpu_millis: 0,
        }
    }

    #[test]
    fn cpu_reserve_shrinks_what_requests_may_take() {
        let mut n = node();
        n.reserved_cpu_millis = 2000;
        assert_eq!(n.allocatable_cpu_millis(), 6000);
        let p = pod(&[("app", guaranteed(1000, GI), "")]);
        let grow = BTreeMap::from([("app".to_string(), guaranteed(7000, GI))]);
        assert!(matches!(
            admit(&n, &Allocated::default(), &p, &grow),
            Admission::Infeasible { ref reason } if reason.contains("6000m allocatable")
        ));
        let others = Allocated {
            cpu_millis: 3000,
            memory_bytes: 0,
        };
        let grow = BTreeMap::from([("app".to_string(), guaranteed(4000, GI))]);
        assert!(matches!(
            admit(&n, &others, &p, &grow),
            Admission::Deferred { .. }
        ));
        assert_eq!(admit(&node(), &others, &p, &grow), Admission::Fits);
    }

    #[test]
    fn cpu_sets_print_in_the_kernel_list_format() {
        for text in ["0-3,8,10-11", "5", "", "0,2,4", "62-65"] {
            assert_eq!(CpuSet::parse(text).unwrap().to_string(), text);
        }
        let all = CpuSet::parse("0-7").unwrap();
        let online = CpuSet::parse("0-2,5-7").unwrap();
        assert_eq!(all.difference(&online).to_string(), "3-4");
        assert_eq!(online.iter().collect::<Vec<_>>(), [0, 1, 2, 5, 6, 7]);
    }

    fn pod(containers: &[(&str, Quantities, &str)]) -> PodAllocation {
        PodAllocation {
            containers: containers
                .iter()
                .map(|(n, q, cpus)| {
                    (
                        (*n).to_string(),
                        ContainerAllocation {
                            quantities: *q,
                            cpuset: CpuSet::parse(cpus).unwrap(),
                        },
                    )
                })
                .collect(),
            overhead: Quantities::default(),
        }
    }

    fn want(pairs: &[(&str, Quantities)]) -> BTreeMap<String, Quantities> {
        pairs.iter().map(|(n, q)| ((*n).to_string(), *q)).collect()
    }

    #[test]
    fn cpuset_parsing() {
        let s = CpuSet::parse("0-3, 8,10-11").unwrap();
        assert_eq!(s.count(), 7);
        assert!(CpuSet::parse("2-3").unwrap().is_strict_subset(&s));
        assert!(!s.is_strict_subset(&s));
        assert!(!CpuSet::parse("4").unwrap().is_subset(&s));
        assert!(CpuSet::parse("").unwrap().is_empty());
        for bad in ["a", "3-1", "0-99999", "1,,2", "-1"] {
            assert!(CpuSet::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn qos_table() {
        let be = Quantities {
            cpu: ResourceQuantity {
                request: Some(0),
                limit: Limit::Unlimited,
            },
            memory: ResourceQuantity::default(),
        };
        let cpu_only = Quantities {
            cpu: ResourceQuantity::new(500, 500),
            memory: ResourceQuantity::default(),
        };
        let cases = [
            (vec![guaranteed(1000, GI)], QosClass::Guaranteed),
            (
                vec![guaranteed(1000, GI), guaranteed(500, GI)],
                QosClass::Guaranteed,
            ),
            (vec![burstable(500, 1000, GI)], QosClass::Burstable),
            (vec![guaranteed(1000, GI), be], QosClass::Burstable),
            (vec![cpu_only], QosClass::Burstable),
            (vec![be, be], QosClass::BestEffort),
            (vec![Quantities::default()], QosClass::BestEffort),
        ];
        for (i, (cs, want)) in cases.into_iter().enumerate() {
            assert_eq!(qos_class(&cs), want, "case {i}");
        }
        let mut explicit = guaranteed(1000, GI);
        explicit.memory.request = Some(GI / 2);
        assert_eq!(qos_class(&[explicit]), QosClass::Burstable);
    }

    #[derive(Debug)]
    enum W {
        Fits,
        Deferred(&'static str),
        Infeasible(&'static str),
    }

    #[test]
    fn admission_table() {
        let p = pod(&[
            ("app", guaranteed(1000, GI), ""),
            ("side", guaranteed(500, GI), ""),
        ]);
        let none = Allocated::default();
        let busy = Allocated {
            cpu_millis: 6000,
            memory_bytes: 10 * GI,
        };
        let cases = [
            (want(&[("app", guaranteed(2000, 2 * GI))]), none, W::Fits),
            (
                want(&[("app", guaranteed(9000, GI))]),
                none,
                W::Infeasible("exceeds the node's 8000m"),
            ),
            (
                want(&[("app", guaranteed(1000, 16 * GI))]),
                none,
                W::Infeasible("allocatable"),
            ),
            (
                // Dropping the CPU limit turns the Guaranteed pod Burstable.
                want(&[(
                    "app",
                    Quantities {
                        cpu: ResourceQuantity {
                            request: Some(500),
                            limit: Limit::Unlimited,
                        },
                        memory: ResourceQuantity {
                            request: None,
                            limit: Limit::Limited(GI),
                        },
                    },
                )]),
                none,
                W::Infeasible("QoS class would change from Guaranteed to Burstable"),
            ),
            (
                want(&[
                    ("app", guaranteed(7000, GI)),
                    ("side", guaranteed(2000, GI)),
                ]),
                none,
                W::Infeasible("pod CPU requests 9000m"),
            ),
            (
                want(&[("app", guaranteed(2000, GI))]),
                busy,
                W::Deferred("CPU requests would be 8500m"),
            ),
            (
                want(&[("app", guaranteed(1000, 5 * GI))]),
                busy,
                W::Deferred("memory requests"),
            ),
            // A shrink is never deferred, however busy the node.
            (want(&[("app", guaranteed(500, GI))]), busy, W::Fits),
        ];
        for (i, (d, others, w)) in cases.into_iter().enumerate() {
            let got = admit(&node(), &others, &p, &d);
            match (&got, &w) {
                (Admission::Fits, W::Fits) => {}
                (Admission::Deferred { reason }, W::Deferred(n))
                | (Admission::Infeasible { reason }, W::Infeasible(n)) => {
                    assert!(reason.contains(n), "case {i}: {reason}");
                }
                _ => panic!("case {i}: got {got:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn exclusive_cpus_need_whole_cpus() {
        // "app" holds CPUs 2-3 exclusively; "shared" runs on the shared pool 0-1,4-7.
        let p = pod(&[
            ("app", guaranteed(2000, GI), "2-3"),
            ("shared", guaranteed(2000, GI), "0-1,4-7"),
        ]);
        let n = node();
        assert!(holds_exclusive_cpus(&n, &p.containers["app"]));
        assert!(!holds_exclusive_cpus(&n, &p.containers["shared"]));
        let got = admit(
            &n,
            &Allocated::default(),
            &p,
            &want(&[("app", guaranteed(2500, GI))]),
        );
        assert!(
            matches!(&got, Admission::Infeasible { reason } if reason.contains("exclusive")),
            "{got:?}"
        );
        assert_eq!(
            admit(
                &n,
                &Allocated::default(),
                &p,
                &want(&[("app", guaranteed(3000, GI))])
            ),
            Admission::Fits
        );
        assert_eq!(
            admit(
                &n,
                &Allocated::default(),
                &p,
                &want(&[("shared", guaranteed(2500, GI))])
            ),
            Admission::Fits
        );
    }

    #[test]
    fn overhead_counts_once() {
        let mut p = pod(&[("app", guaranteed(1000, GI), "")]);
        p.overhead = guaranteed(7000, 0);
        let got = admit(
            &node(),
            &Allocated::default(),
            &p,
            &want(&[("app", guaranteed(1500, GI))]),
        );
        assert!(matches!(got, Admission::Infeasible { .. }), "{got:?}");
        assert_eq!(got.resize_status().state, ResizeState::Infeasible);
        assert_eq!(
            Admission::Fits.resize_status().state,
            ResizeState::InProgress
        );
    }
}
