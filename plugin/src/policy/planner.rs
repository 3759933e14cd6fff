//! The ordering planner: in which order to write the pod cgroup and the containers so that every
//! intermediate state keeps the [invariants](super::invariants) (KEP-1287 "Container resource
//! limit update ordering").
//!
//! # The plan
//!
//! Per resource (CPU limit, memory limit) the KEP's rules give a safe order: a pod limit that
//! grows is written first, one that shrinks last; container decreases come before container
//! increases. During the container writes the pod limit is `max(current, desired)`, and the sum
//! of the container limits first only falls, then only rises to its desired value; so if the
//! current and the desired states keep the invariants, so does every state in between. Whether
//! the pod grows or shrinks is judged on the pod limit itself (kubelet sets it to the sum of the
//! container limits plus overhead, so this is the KEP's "net increase / decrease"); no pod change
//! means no pod write.
//!
//! The two resources' orders are merged into five phases, each in container-name order:
//!
//! 1. the pod, for every resource whose pod limit grows;
//! 2. containers whose changes all shrink, and the shrinking half of the *split* containers;
//! 3. the *combined* mixed containers, in one write each;
//! 4. containers whose changes all grow, and the growing half of the split containers;
//! 5. the pod, for every resource whose pod limit shrinks.
//!
//! A *mixed* container has one resource growing and the other shrinking. Mixed containers of one
//! kind (CPU up / memory down, or CPU down / memory up: whichever kind has more containers, CPU
//! up / memory down on a tie) are written in one go in phase 3; those of the other kind are
//! split into two writes (phases 2 and 4), an intermediate state that neither the current nor
//! the desired state has. This is needed: with tight pod limits, a container growing CPU while
//! shrinking memory and another doing the opposite cannot each be written once in any order
//! (see the test `mixed_swap_needs_an_intermediate_step`). Each resource still sees
//! "pod up, decreases, increases, pod down", so both invariants hold after every step.
//! Finally adjacent writes to the same cgroup touching different resources are merged.
//!
//! CPU shares (the request, a weight) have no ordering constraint; they ride along with the
//! cgroup's CPU-limit write, else its first write, else get a write of their own placed by their
//! own direction (a growing pod's shares first, a shrinking pod's last; a container's in phase 2
//! or 4).

use std::fmt;

use super::invariants::{check_invariants, Violation};
use super::limits::{Limits, LimitsUpdate, PlanOptions, PodResources};
use super::quantity::{Direction, Limit, Resource};

/// One write of an ordering plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Step {
    /// Write the pod cgroup.
    SetPod(LimitsUpdate),
    /// Write one container.
    SetContainer {
        /// The container's name.
        name: String,
        /// What to write.
        update: LimitsUpdate,
    },
}

impl Step {
    /// What the step writes.
    pub fn update(&self) -> &LimitsUpdate {
        match self {
            Step::SetPod(u) | Step::SetContainer { update: u, .. } => u,
        }
    }

    fn same_target(&self, o: &Step) -> bool {
        match (self, o) {
            (Step::SetPod(_), Step::SetPod(_)) => true,
            (Step::SetContainer { name: a, .. }, Step::SetContainer { name: b, .. }) => a == b,
            _ => false,
        }
    }

    fn update_mut(&mut self) -> &mut LimitsUpdate {
        match self {
            Step::SetPod(u) | Step::SetContainer { update: u, .. } => u,
        }
    }
}

/// Formats memory with a binary suffix when exact (`512Mi`), CPU as millicores (`1500m`).
impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let u = match self {
            Step::SetPod(u) => {
                f.write_str("pod")?;
                u
            }
            Step::SetContainer { name, update } => {
                f.write_str(name)?;
                update
            }
        };
        if let Some(c) = u.cpu {
            match c {
                Limit::Limited(m) => write!(f, " cpu={m}m")?,
                Limit::Unlimited => f.write_str(" cpu=unlimited")?,
            }
        }
        if let Some(m) = u.memory {
            match m {
                Limit::Limited(b) => write!(f, " memory={}", Bytes(b))?,
                Limit::Unlimited => f.write_str(" memory=unlimited")?,
            }
        }
        if let Some(s) = u.cpu_shares {
            write!(f, " shares={s}")?;
        }
        Ok(())
    }
}

struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, suffix) in [(30, "Gi"), (20, "Mi"), (10, "Ki")] {
            if self.0 != 0 && self.0 % (1 << shift) == 0 {
                return write!(f, "{}{suffix}", self.0 >> shift);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// An ordering plan: the writes, in order. Every prefix leaves a state that keeps the
/// invariants, so an executor that stops at a failed write (KEP failure handling) leaves a safe
/// state behind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[must_use]
pub struct Plan {
    /// The writes, in order.
    pub steps: Vec<Step>,
}

impl Plan {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.steps.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// Errors of planning and simulating.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A container named in the desired state or a step is not in the current state.
    #[error("container {name} is not part of the pod")]
    UnknownContainer {
        /// Its name.
        name: String,
    },
    /// The desired state itself breaks an invariant, so no plan can reach it safely.
    #[error("the desired state is not allowed: {0}")]
    DesiredViolates(#[source] Violation),
    /// Simulating a plan, the state after a step broke an invariant.
    #[error("step {step} ({text}) breaks an invariant: {violation}")]
    StepViolates {
        /// 0-based index of the step.
        step: usize,
        /// The step, formatted.
        text: String,
        /// What broke.
        #[source]
        violation: Violation,
    },
}

/// Plans the writes that take a pod from `current` to `desired`; see the module docs.
///
/// Containers of `current` absent from `desired` keep their values; a container of `desired`
/// absent from `current` is an error, as is a `desired` state that breaks the invariants. A
/// `current` state that already breaks them is planned anyway (the plan moves towards a valid
/// state; only the steps' relative safety is then guaranteed).
pub fn plan(
    current: &PodResources,
    desired: &PodResources,
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    use Direction::{Decrease as Dn, Increase as Up};

    // Per container: direction of CPU and memory.
    let mut kinds: Vec<(&str, [Option<Direction>; 2], &Limits, &Limits)> =
        Vec::with_capacity(desired.containers.len());
    let mut target = current.clone();
    target.pod = desired.pod;
    for (name, want) in &desired.containers {
        let (Some(have), Some(t)) = (
            current.containers.get(name),
            target.containers.get_mut(name),
        ) else {
            return Err(PlanError::UnknownContainer { name: name.clone() });
        };
        *t = *want;
        let dirs = Resource::ALL.map(|r| Direction::between(&have.get(r), &want.get(r)));
        kinds.push((name.as_str(), dirs, have, want));
    }
    check_invariants(&target, opts).map_err(PlanError::DesiredViolates)?;
    let cpu_up_mem_down = kinds.iter().filter(|k| k.1 == [Some(Up), Some(Dn)]).count();
    let cpu_down_mem_up = kinds.iter().filter(|k| k.1 == [Some(Dn), Some(Up)]).count();
    let combined = if cpu_up_mem_down >= cpu_down_mem_up {
        [Some(Up), Some(Dn)]
    } else {
        [Some(Dn), Some(Up)]
    };

    let mut pod_up = LimitsUpdate::default();
    let mut pod_down = LimitsUpdate::default();
    for r in Resource::ALL {
        match Direction::between(&current.pod.get(r), &desired.pod.get(r)) {
            Some(Up) => pod_up.set(r, desired.pod.get(r)),
            Some(Dn) => pod_down.set(r, desired.pod.get(r)),
            None => {}
        }
    }
    let pod_shares = changed_shares(&current.pod, &desired.pod);

    let mut decreases = Vec::new();
    let mut mixed = Vec::new();
    let mut increases = Vec::new();
    for (name, dirs, have, want) in kinds {
        let shares = changed_shares(have, want);
        let mut down = LimitsUpdate::default();
        let mut up = LimitsUpdate::default();
        for (i, r) in Resource::ALL.into_iter().enumerate() {
            match dirs[i] {
                Some(Up) => up.set(r, want.get(r)),
                Some(Dn) => down.set(r, want.get(r)),
                None => {}
            }
        }
        let step = |mut u: LimitsUpdate, with_shares: bool| {
            if with_shares {
                u.cpu_shares = shares;
            }
            Step::SetContainer {
                name: name.to_string(),
                update: u,
            }
        };
        if dirs == combined {
            let mut u = down;
            u.merge(&up);
            mixed.push(step(u, true));
            continue;
        }
        // Shares ride with the CPU write, else the first write, else go by their own direction.
        let shares_down = if down.cpu.is_some() || up.cpu.is_some() {
            down.cpu.is_some()
        } else if !down.is_empty() || !up.is_empty() {
            !down.is_empty()
        } else {
            shares_grow(have, want) == Some(Dn)
        };
        if !down.is_empty() || (shares_down && shares.is_some()) {
            decreases.push(step(down, shares_down));
        }
        if !up.is_empty() || (!shares_down && shares.is_some()) {
            increases.push(step(up, !shares_down));
        }
    }

    let mut steps = Vec::with_capacity(decreases.len() + mixed.len() + increases.len() + 2);
    let shares_with_up = if pod_up.cpu.is_some() || pod_down.cpu.is_some() {
        pod_up.cpu.is_some()
    } else {
        shares_grow(&current.pod, &desired.pod) == Some(Up)
    };
    if shares_with_up {
        pod_up.cpu_shares = pod_shares;
    } else {
        pod_down.cpu_shares = pod_shares;
    }
    if !pod_up.is_empty() {
        steps.push(Step::SetPod(pod_up));
    }
    steps.extend(decreases);
    steps.extend(mixed);
    steps.extend(increases);
    if !pod_down.is_empty() {
        steps.push(Step::SetPod(pod_down));
    }
    Ok(Plan {
        steps: merge_adjacent(steps),
    })
}

fn shares_grow(have: &Limits, want: &Limits) -> Option<Direction> {
    let want = want.cpu_shares?;
    Direction::between(&have.cpu_shares.unwrap_or(0), &want)
}

fn changed_shares(have: &Limits, want: &Limits) -> Option<u64> {
    want.cpu_shares.filter(|s| have.cpu_shares != Some(*s))
}

fn merge_adjacent(steps: Vec<Step>) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for s in steps {
        if let Some(last) = out.last_mut() {
            if last.same_target(&s) && last.update().disjoint(s.update()) {
                last.update_mut().merge(s.update());
                continue;
            }
        }
        out.push(s);
    }
    out
}

/// For a kubelet-style update of one container (`container` to `desired`, everything else as in
/// `current`): the pod-cgroup raise that must precede the container write, or `None`.
///
/// A raise is needed when the write would break an invariant: on cgroup v1 a CPU quota above the
/// pod's fails with `EINVAL` (kubernetes/kubernetes#127356), and on any version the containers'
/// sum must stay within the pod limit. The raise keeps the pod's headroom (overhead): the pod
/// limit grows by the container's growth, and at least to the new sum (unlimited when the
/// container becomes unlimited). Shrinks never need a pod write first.
pub fn plan_single(
    current: &PodResources,
    container: &str,
    desired: &Limits,
    opts: &PlanOptions,
) -> Result<Option<Step>, PlanError> {
    let have = current
        .containers
        .get(container)
        .ok_or_else(|| PlanError::UnknownContainer {
            name: container.to_string(),
        })?;
    let mut raise = LimitsUpdate::default();
    for r in Resource::ALL {
        let pod = current.pod.get(r);
        let want = desired.get(r);
        if pod == Limit::Unlimited || want <= have.get(r) {
            continue;
        }
        let others = current
            .containers
            .iter()
            .filter(|(n, _)| n.as_str() != container)
            .fold(Limit::Limited(0), |acc, (_, l)| {
                acc.saturating_add(l.get(r))
            });
        let new_sum = others.saturating_add(want);
        let v1_einval = opts.cgroup_v1 && r == Resource::Cpu && want > pod;
        if new_sum > pod || v1_einval {
            let growth = want.checked_sub(have.get(r));
            let keep_headroom = match (pod, growth) {
                (Limit::Limited(p), Some(g)) => Limit::Limited(p.saturating_add(g)),
                _ => Limit::Unlimited,
            };
            raise.set(r, keep_headroom.max(new_sum).max(want));
        }
    }
    Ok((!raise.is_empty()).then_some(Step::SetPod(raise)))
}

/// Applies `plan` to `current` one step at a time, checking the invariants after every step;
/// returns the final state. The executor can run this before touching any cgroup.
pub fn simulate(
    current: &PodResources,
    plan: &Plan,
    opts: &PlanOptions,
) -> Result<PodResources, PlanError> {
    let mut state = current.clone();
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::SetPod(u) => state.pod.apply(u),
            Step::SetContainer { name, update } => state
                .containers
                .get_mut(name)
                .ok_or_else(|| PlanError::UnknownContainer { name: name.clone() })?
                .apply(update),
        }
        check_invariants(&state, opts).map_err(|violation| PlanError::StepViolates {
            step: i,
            text: step.to_string(),
            violation,
        })?;
    }
    Ok(state)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::too_many_lines,
    reason = "tests fail loudly on unexpected errors; the e2e tables are long by design"
)]
mod tests;
