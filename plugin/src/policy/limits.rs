//! The cgroup values an ordering plan moves between and the invariants check: one cgroup's
//! limits, a pod with its containers, an update of one cgroup, and the node facts that change
//! the rules (cgroup v1).
//!
//! Below the planner (`planner.rs`) and the invariants (`invariants.rs`); imports neither.

use std::collections::BTreeMap;

use super::quantity::{Limit, Quantities, Resource};
use crate::model::LinuxResources;

/// The values of one cgroup (pod or container) the planner orders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Limits {
    /// CPU limit, in millicores (CFS quota × 1000 / period).
    pub cpu: Limit,
    /// Memory limit, in bytes.
    pub memory: Limit,
    /// CPU shares; `None` = not managed (never written).
    pub cpu_shares: Option<u64>,
}

impl Limits {
    /// CPU and memory limits, shares unmanaged.
    pub fn new(cpu: Limit, memory: Limit) -> Self {
        Self {
            cpu,
            memory,
            cpu_shares: None,
        }
    }

    /// The limit of one resource.
    pub fn get(&self, r: Resource) -> Limit {
        match r {
            Resource::Cpu => self.cpu,
            Resource::Memory => self.memory,
        }
    }

    /// From the runtime's Linux resources (quota `None`/negative = unlimited, and so on).
    pub fn from_linux(r: &LinuxResources) -> Self {
        let q = Quantities::from_linux(r);
        Self {
            cpu: q.cpu.limit,
            memory: q.memory.limit,
            cpu_shares: r.cpu_shares(),
        }
    }

    /// Applies an update.
    pub fn apply(&mut self, u: &LimitsUpdate) {
        if let Some(v) = u.cpu {
            self.cpu = v;
        }
        if let Some(v) = u.memory {
            self.memory = v;
        }
        if let Some(v) = u.cpu_shares {
            self.cpu_shares = Some(v);
        }
    }
}

/// The cgroup values of a pod and its containers (by name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PodResources {
    /// The pod cgroup.
    pub pod: Limits,
    /// The containers, by name.
    pub containers: BTreeMap<String, Limits>,
}

/// What one step writes; `None` fields are left alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LimitsUpdate {
    /// New CPU limit (millicores).
    pub cpu: Option<Limit>,
    /// New memory limit (bytes).
    pub memory: Option<Limit>,
    /// New CPU shares.
    pub cpu_shares: Option<u64>,
}

impl LimitsUpdate {
    /// Whether the update writes nothing.
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none() && self.cpu_shares.is_none()
    }

    pub(super) fn set(&mut self, r: Resource, v: Limit) {
        match r {
            Resource::Cpu => self.cpu = Some(v),
            Resource::Memory => self.memory = Some(v),
        }
    }

    /// Whether two updates write disjoint fields.
    pub(super) fn disjoint(&self, o: &LimitsUpdate) -> bool {
        !(self.cpu.is_some() && o.cpu.is_some()
            || self.memory.is_some() && o.memory.is_some()
            || self.cpu_shares.is_some() && o.cpu_shares.is_some())
    }

    pub(super) fn merge(&mut self, o: &LimitsUpdate) {
        self.cpu = self.cpu.or(o.cpu);
        self.memory = self.memory.or(o.memory);
        self.cpu_shares = self.cpu_shares.or(o.cpu_shares);
    }
}

/// Node facts the planner needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PlanOptions {
    /// The node runs cgroup v1, where a child CPU quota above its parent's fails with `EINVAL`.
    pub cgroup_v1: bool,
}
