//! The invariants every intermediate state of an ordering plan must keep.

use super::limits::{PlanOptions, PodResources};
use super::quantity::{Limit, Resource};

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// cgroup v1 only: a container's CPU quota above its pod's (the kernel refuses the write with
    /// `EINVAL`; kubernetes/kubernetes#127356). An unlimited container under a limited pod counts.
    #[error("cgroup v1: container {container} CPU limit {child} is above the pod's {parent}, the kernel would refuse it with EINVAL")]
    ChildCpuAboveParent {
        /// The container.
        container: String,
        /// Its CPU limit (millicores).
        child: Limit,
        /// The pod's CPU limit (millicores).
        parent: Limit,
    },
    /// The containers' limits of one resource add up to more than the pod's limit.
    #[error("the containers' {resource} limits add up to {sum}, above the pod limit {pod}")]
    SumAbovePod {
        /// The resource.
        resource: Resource,
        /// The sum (`unlimited` when a container is).
        sum: Limit,
        /// The pod's limit.
        pod: Limit,
    },
}

/// Checks one state:
///
/// - cgroup v1: no container's CPU limit above the pod's (an unlimited pod allows anything; an
///   unlimited container under a limited pod is a violation);
/// - any cgroup version: for CPU and memory, the sum of the containers' limits is not above the
///   pod's limit when the pod has one (an unlimited container makes the sum unlimited).
///
/// The v1 rule is implied by the sum rule; it is checked first so that the more specific,
/// kernel-facing reason is the one reported.
pub fn check_invariants(state: &PodResources, opts: &PlanOptions) -> Result<(), Violation> {
    if opts.cgroup_v1 {
        if let parent @ Limit::Limited(_) = state.pod.cpu {
            if let Some((name, l)) = state.containers.iter().find(|(_, l)| l.cpu > parent) {
                return Err(Violation::ChildCpuAboveParent {
                    container: name.clone(),
                    child: l.cpu,
                    parent,
                });
            }
        }
    }
    for r in Resource::ALL {
        let pod = state.pod.get(r);
        if pod == Limit::Unlimited {
            continue;
        }
        let sum = state
            .containers
            .values()
            .fold(Limit::Limited(0), |acc, l| acc.saturating_add(l.get(r)));
        if sum > pod {
            return Err(Violation::SumAbovePod {
                resource: r,
                sum,
                pod,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::policy::limits::Limits;

    fn state(pod: (Limit, Limit), cs: &[(Limit, Limit)]) -> PodResources {
        PodResources {
            pod: Limits::new(pod.0, pod.1),
            containers: cs
                .iter()
                .enumerate()
                .map(|(i, (c, m))| (format!("c{i}"), Limits::new(*c, *m)))
                .collect(),
        }
    }

    #[test]
    fn invariant_table() {
        use Limit::{Limited as L, Unlimited as U};
        let v1 = PlanOptions { cgroup_v1: true };
        let v2 = PlanOptions { cgroup_v1: false };
        // (state, v1 ok?, v2 ok?)
        let cases = [
            (
                state((L(2000), L(100)), &[(L(1000), L(50)), (L(1000), L(50))]),
                true,
                true,
            ),
            (state((U, U), &[(U, U), (L(1000), L(50))]), true, true),
            (
                state((L(2000), U), &[(L(1500), U), (L(1000), U)]),
                false,
                false,
            ),
            (
                state((L(2000), L(100)), &[(L(1000), L(60)), (L(1000), L(50))]),
                false,
                false,
            ),
            (state((L(2000), U), &[(U, U)]), false, false),
            (state((L(1000), U), &[(L(1500), U)]), false, false),
            (state((L(0), L(0)), &[]), true, true),
        ];
        for (i, (s, ok1, ok2)) in cases.into_iter().enumerate() {
            assert_eq!(check_invariants(&s, &v1).is_ok(), ok1, "case {i} v1");
            assert_eq!(check_invariants(&s, &v2).is_ok(), ok2, "case {i} v2");
        }
        let s = state((L(1000), U), &[(L(1500), U)]);
        assert!(matches!(
            check_invariants(&s, &v1),
            Err(Violation::ChildCpuAboveParent { .. })
        ));
        assert!(matches!(
            check_invariants(&s, &v2),
            Err(Violation::SumAbovePod { .. })
        ));
        assert!(check_invariants(&s, &v1)
            .unwrap_err()
            .to_string()
            .contains("EINVAL"));
    }
}
