//! The resize vocabulary: resources, directions, resize states, and the CPU/memory quantities a
//! container has (desired / allocated / actual), derived from the runtime's [`LinuxResources`].
//!
//! CPU is counted in millicores, memory in bytes. A *limit* is either [`Limit::Limited`] or
//! [`Limit::Unlimited`] (no CFS quota / no memory limit), and `Limited(_) < Unlimited`.
//! A *request* is `None` when it is unknown or unspecified.

use std::fmt;

use crate::model::LinuxResources;

/// Default CFS period (µs) when the runtime does not say.
pub const DEFAULT_CFS_PERIOD_US: u64 = 100_000;
/// The smallest CPU shares value the kernel (and kubelet) uses; it means "no CPU request".
pub const MIN_CPU_SHARES: u64 = 2;

/// A resource that can be resized in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// CPU, in millicores.
    Cpu,
    /// Memory, in bytes.
    Memory,
}

impl Resource {
    /// Both resources, CPU first.
    pub const ALL: [Resource; 2] = [Resource::Cpu, Resource::Memory];

    /// The lowercase name used in annotations and Kubernetes (`cpu`, `memory`).
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Memory => "memory",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which way a quantity moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// The new value is larger (or becomes unlimited).
    Increase,
    /// The new value is smaller (or becomes limited).
    Decrease,
}

impl Direction {
    /// Both directions, increase first.
    pub const ALL: [Direction; 2] = [Direction::Increase, Direction::Decrease];

    /// The lowercase name used in annotations (`increase`, `decrease`).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Increase => "increase",
            Direction::Decrease => "decrease",
        }
    }

    /// The direction from `from` to `to`, `None` when equal.
    pub fn between<T: Ord>(from: &T, to: &T) -> Option<Direction> {
        match to.cmp(from) {
            std::cmp::Ordering::Greater => Some(Direction::Increase),
            std::cmp::Ordering::Less => Some(Direction::Decrease),
            std::cmp::Ordering::Equal => None,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// KEP-1287's `Pod.Status.Resize` values, plus `Error` for a resize that failed while being
/// actuated. "No resize pending" is `Option::<ResizeStatus>::None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ResizeState {
    /// Seen, not yet accepted or rejected.
    Proposed,
    /// Accepted and being actuated.
    InProgress,
    /// Fits the node in theory but not right now; re-evaluated later.
    Deferred,
    /// Can never fit this node (or is not allowed); not re-evaluated.
    Infeasible,
    /// Actuation failed (a write was refused); retried with backoff.
    Error,
}

impl ResizeState {
    /// The KEP's spelling (`Proposed`, `InProgress`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ResizeState::Proposed => "Proposed",
            ResizeState::InProgress => "InProgress",
            ResizeState::Deferred => "Deferred",
            ResizeState::Infeasible => "Infeasible",
            ResizeState::Error => "Error",
        }
    }
}

impl fmt::Display for ResizeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A resize state with the human reason behind it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResizeStatus {
    /// Where the resize stands.
    pub state: ResizeState,
    /// Why, for people (events, the status API); empty when there is nothing to add.
    pub reason: String,
}

impl ResizeStatus {
    /// A status with a reason.
    pub fn new(state: ResizeState, reason: impl Into<String>) -> Self {
        Self {
            state,
            reason: reason.into(),
        }
    }
}

/// A resource limit: a value, or no limit at all. `Limited(_) < Unlimited`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Limit {
    /// Limited to this many millicores (CPU) or bytes (memory).
    Limited(u64),
    /// No limit (CFS quota -1 or absent; memory limit absent or negative).
    #[default]
    Unlimited,
}

impl Limit {
    /// The value, `None` when unlimited.
    pub fn value(self) -> Option<u64> {
        match self {
            Limit::Limited(v) => Some(v),
            Limit::Unlimited => None,
        }
    }

    /// `Limited(v)` for `Some(v)`, `Unlimited` for `None`.
    pub fn from_option(v: Option<u64>) -> Self {
        v.map_or(Limit::Unlimited, Limit::Limited)
    }

    /// Saturating sum; anything plus `Unlimited` is `Unlimited`.
    #[must_use]
    pub fn saturating_add(self, other: Limit) -> Limit {
        match (self, other) {
            (Limit::Limited(a), Limit::Limited(b)) => Limit::Limited(a.saturating_add(b)),
            _ => Limit::Unlimited,
        }
    }

    /// `self - other` for limited values (saturating at zero); `None` when either is unlimited.
    pub fn checked_sub(self, other: Limit) -> Option<u64> {
        Some(self.value()?.saturating_sub(other.value()?))
    }

    /// Whether this is a limit at all.
    pub fn is_limited(self) -> bool {
        matches!(self, Limit::Limited(_))
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Limited(v) => write!(f, "{v}"),
            Limit::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// Request and limit of one resource of one container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ResourceQuantity {
    /// The request (millicores or bytes); `None` when unknown or unspecified.
    pub request: Option<u64>,
    /// The limit.
    pub limit: Limit,
}

impl ResourceQuantity {
    /// A quantity with both request and limit set.
    pub fn new(request: u64, limit: u64) -> Self {
        Self {
            request: Some(request),
            limit: Limit::Limited(limit),
        }
    }

    /// The directions in which this quantity moves from `self` to `to`: a request can go up while
    /// the limit goes down, so both may be present. An unknown request counts as zero.
    pub fn directions_to(&self, to: &ResourceQuantity) -> Directions {
        let mut d = Directions::default();
        for dir in [
            Direction::between(&self.request.unwrap_or(0), &to.request.unwrap_or(0)),
            Direction::between(&self.limit, &to.limit),
        ]
        .into_iter()
        .flatten()
        {
            d.insert(dir);
        }
        d
    }
}

/// A set of [`Direction`]s (empty = unchanged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Directions {
    /// Some quantity increases.
    pub increase: bool,
    /// Some quantity decreases.
    pub decrease: bool,
}

impl Directions {
    /// Adds a direction.
    pub fn insert(&mut self, d: Direction) {
        match d {
            Direction::Increase => self.increase = true,
            Direction::Decrease => self.decrease = true,
        }
    }

    /// Whether nothing changes.
    pub fn is_empty(self) -> bool {
        !self.increase && !self.decrease
    }

    /// The directions present, increase first.
    pub fn iter(self) -> impl Iterator<Item = Direction> {
        Direction::ALL.into_iter().filter(move |d| match d {
            Direction::Increase => self.increase,
            Direction::Decrease => self.decrease,
        })
    }
}

/// CPU (millicores) and memory (bytes) of one container: what it asks for or holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Quantities {
    /// CPU, in millicores.
    pub cpu: ResourceQuantity,
    /// Memory, in bytes.
    pub memory: ResourceQuantity,
}

impl Quantities {
    /// The quantity of one resource.
    pub fn get(&self, resource: Resource) -> &ResourceQuantity {
        match resource {
            Resource::Cpu => &self.cpu,
            Resource::Memory => &self.memory,
        }
    }

    /// Derives quantities from the runtime's Linux resources, the way kubelet reads them back:
    ///
    /// - CPU limit = `quota * 1000 / period` (period defaults to 100 ms); quota `None` or
    ///   negative = unlimited.
    /// - CPU request = `ceil(shares * 1000 / 1024)`, the inverse of kubelet's
    ///   `MilliCPUToShares` (exact for every request ≥ 3m; 0-2m all map to shares 2); shares ≤ 2 (kubelet's minimum, what it
    ///   writes for "no request") = request 0; shares absent = unknown.
    /// - Memory limit = `memory.limit`; absent or negative (`-1`) = unlimited.
    /// - Memory request = `memory.reservation` when set and positive, else unknown: kubelet does
    ///   not pass memory requests through the OCI `LinuxResources`.
    pub fn from_linux(r: &LinuxResources) -> Self {
        let cpu_request = r.cpu_shares().map(shares_to_millis);
        let cpu_limit = Limit::from_option(r.cpu_limit_millis());
        let memory_limit = Limit::from_option(r.memory_limit().and_then(positive));
        let memory_request = r
            .memory
            .as_ref()
            .and_then(|m| m.reservation)
            .and_then(positive);
        Self {
            cpu: ResourceQuantity {
                request: cpu_request,
                limit: cpu_limit,
            },
            memory: ResourceQuantity {
                request: memory_request,
                limit: memory_limit,
            },
        }
    }
}

fn positive(v: i64) -> Option<u64> {
    u64::try_from(v).ok().filter(|v| *v > 0)
}

/// CPU shares to a millicore request (kubelet's `sharesToMilliCPU`, rounding up).
pub fn shares_to_millis(shares: u64) -> u64 {
    if shares <= MIN_CPU_SHARES {
        0
    } else {
        shares.saturating_mul(1000).div_ceil(1024)
    }
}

/// A millicore request to CPU shares (kubelet's `MilliCPUToShares`).
pub fn millis_to_shares(millis: u64) -> u64 {
    (millis.saturating_mul(1024) / 1000).max(MIN_CPU_SHARES)
}

/// The three views of one container's resources that KEP-1287 distinguishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ContainerQuantities {
    /// What the pod spec asks for now.
    pub desired: Quantities,
    /// What the node has admitted (may lag `desired` while a resize is pending).
    pub allocated: Quantities,
    /// What the cgroups hold (may lag `allocated` while a resize is being actuated).
    pub actual: Quantities,
}

impl ContainerQuantities {
    /// Whether a resize is pending (desired differs from allocated) or in flight (allocated
    /// differs from actual).
    pub fn resize_pending(&self) -> bool {
        self.desired != self.allocated || self.allocated != self.actual
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::model::{CpuResources, MemoryResources};

    fn linux(shares: Option<u64>, quota: Option<i64>, mem: Option<i64>) -> LinuxResources {
        LinuxResources {
            cpu: Some(CpuResources {
                shares,
                quota,
                period: Some(100_000),
                ..Default::default()
            }),
            memory: Some(MemoryResources {
                limit: mem,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn shares_round_trip_for_every_request() {
        for m in 3..=64_000 {
            assert_eq!(shares_to_millis(millis_to_shares(m)), m, "{m}m");
        }
        assert_eq!(shares_to_millis(2), 0);
        assert_eq!(millis_to_shares(0), 2);
    }

    #[test]
    fn from_linux_table() {
        let cases = [
            (
                linux(Some(1536), Some(150_000), Some(1 << 30)),
                ResourceQuantity::new(1500, 1500),
                ResourceQuantity {
                    request: None,
                    limit: Limit::Limited(1 << 30),
                },
            ),
            (
                linux(Some(2), Some(-1), Some(-1)),
                ResourceQuantity {
                    request: Some(0),
                    limit: Limit::Unlimited,
                },
                ResourceQuantity::default(),
            ),
            (
                linux(None, None, None),
                ResourceQuantity::default(),
                ResourceQuantity::default(),
            ),
        ];
        for (i, (r, cpu, mem)) in cases.into_iter().enumerate() {
            let q = Quantities::from_linux(&r);
            assert_eq!(q.cpu, cpu, "case {i}");
            assert_eq!(q.memory, mem, "case {i}");
        }
    }

    #[test]
    fn memory_request_from_reservation() {
        let mut r = linux(None, None, Some(100));
        r.memory.as_mut().unwrap().reservation = Some(50);
        assert_eq!(
            Quantities::from_linux(&r).memory,
            ResourceQuantity::new(50, 100)
        );
    }

    #[test]
    fn limit_order_and_directions() {
        assert!(Limit::Limited(u64::MAX) < Limit::Unlimited);
        let a = ResourceQuantity::new(100, 200);
        let b = ResourceQuantity::new(150, 150);
        let d = a.directions_to(&b);
        assert!(d.increase && d.decrease);
        assert!(a.directions_to(&a).is_empty());
        let unl = ResourceQuantity {
            request: Some(100),
            limit: Limit::Unlimited,
        };
        assert_eq!(
            a.directions_to(&unl).iter().collect::<Vec<_>>(),
            [Direction::Increase]
        );
    }
}
