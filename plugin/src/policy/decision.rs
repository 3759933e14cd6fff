//! What to do with one container update: nothing, resize in place, restart, or refuse.

use std::fmt::Write as _;

use super::quantity::{Direction, Quantities, Resource};
use super::resize_policy::{EffectivePolicy, ResizeAction, RestartPolicy};

/// The outcome for one container update.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use]
pub enum Decision {
    /// Desired equals allocated: nothing to do.
    NoChange,
    /// Apply the new limits to the running container.
    InPlace,
    /// Restart the container to apply the new resources.
    Restart {
        /// Why a restart is needed, for people.
        reason: String,
    },
    /// Refuse the resize (the caller reports it as `Infeasible`).
    Reject {
        /// Why, for people.
        reason: String,
    },
}

/// The `(resource, direction)` pairs that change from `from` to `to`, CPU first, increase first.
/// A resource whose request grows while its limit shrinks appears in both directions.
pub fn changes(from: &Quantities, to: &Quantities) -> Vec<(Resource, Direction)> {
    let mut out = Vec::new();
    for r in Resource::ALL {
        for d in from.get(r).directions_to(to.get(r)).iter() {
            out.push((r, d));
        }
    }
    out
}

/// Decides one container update from its allocated and desired quantities and its policy.
///
/// - Nothing changes: [`Decision::NoChange`].
/// - Action `Restart`: [`Decision::Restart`].
/// - Any changed `(resource, direction)` whose policy is `RestartContainer` needs a restart
///   (restart wins over `NotRequired` when changed resources disagree): action `LiveResize`
///   gives [`Decision::Reject`], `LiveResizePreferred` gives [`Decision::Restart`].
/// - Otherwise [`Decision::InPlace`].
pub fn decide(allocated: &Quantities, desired: &Quantities, policy: &EffectivePolicy) -> Decision {
    let changed = changes(allocated, desired);
    if changed.is_empty() {
        return Decision::NoChange;
    }
    if policy.action == ResizeAction::Restart {
        return Decision::Restart {
            reason: "resize action Restart".to_string(),
        };
    }
    let mut needs_restart = String::new();
    for (r, d) in changed {
        if policy.restart.get(r, d) == RestartPolicy::RestartContainer {
            if !needs_restart.is_empty() {
                needs_restart.push_str(", ");
            }
            let _ = write!(needs_restart, "{r} {d}");
        }
    }
    if needs_restart.is_empty() {
        return Decision::InPlace;
    }
    match policy.action {
        ResizeAction::LiveResize => Decision::Reject {
            reason: format!(
                "resize action LiveResize forbids a restart, but restart policy RestartContainer applies to {needs_restart}"
            ),
        },
        ResizeAction::LiveResizePreferred | ResizeAction::Restart => Decision::Restart {
            reason: format!("restart policy RestartContainer applies to {needs_restart}"),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::policy::quantity::ResourceQuantity;
    use crate::policy::resize_policy::{DirectionalPolicy, ResizePolicy};
    use ResizeAction::{LiveResize as Live, LiveResizePreferred as Pref, Restart as Rst};
    use RestartPolicy::{NotRequired as NR, RestartContainer as RC};

    const MI: u64 = 1 << 20;

    fn q(cpu: u64, mem: u64) -> Quantities {
        Quantities {
            cpu: ResourceQuantity::new(cpu, cpu),
            memory: ResourceQuantity::new(mem * MI, mem * MI),
        }
    }

    fn pol(
        cpu: RestartPolicy,
        mem_inc: RestartPolicy,
        mem_dec: RestartPolicy,
        action: ResizeAction,
    ) -> EffectivePolicy {
        EffectivePolicy {
            restart: ResizePolicy {
                cpu: DirectionalPolicy::both(cpu),
                memory: DirectionalPolicy {
                    increase: mem_inc,
                    decrease: mem_dec,
                },
            },
            action,
        }
    }

    #[derive(Debug, PartialEq)]
    enum Want {
        No,
        In,
        Rs(&'static str),
        Rj(&'static str),
    }

    #[test]
    fn decision_table() {
        use Want::{In, No, Rj, Rs};
        // KEP-1287 "Resize Policy Tests" plus the action matrix.
        let cases = [
            // default policy: in place
            (q(100, 100), q(200, 200), pol(NR, NR, NR, Pref), In),
            (q(100, 100), q(100, 100), pol(RC, RC, RC, Rst), No),
            // cpu NotRequired, memory Restart: cpu only -> in place
            (q(100, 100), q(200, 100), pol(NR, RC, RC, Pref), In),
            // memory only -> restart
            (
                q(100, 100),
                q(100, 200),
                pol(NR, RC, RC, Pref),
                Rs("memory increase"),
            ),
            // cpu & memory -> restart wins
            (
                q(100, 100),
                q(200, 200),
                pol(NR, RC, RC, Pref),
                Rs("memory increase"),
            ),
            // per direction: memory decrease only restarts
            (
                q(100, 200),
                q(100, 100),
                pol(NR, NR, RC, Pref),
                Rs("memory decrease"),
            ),
            (q(100, 100), q(100, 200), pol(NR, NR, RC, Pref), In),
            // LiveResize: in place or reject
            (q(100, 100), q(200, 100), pol(NR, RC, RC, Live), In),
            (
                q(100, 200),
                q(100, 100),
                pol(NR, NR, RC, Live),
                Rj("memory decrease"),
            ),
            (
                q(100, 100),
                q(200, 200),
                pol(RC, RC, RC, Live),
                Rj("cpu increase, memory increase"),
            ),
            // Restart action always restarts
            (
                q(100, 100),
                q(200, 100),
                pol(NR, NR, NR, Rst),
                Rs("resize action Restart"),
            ),
        ];
        for (i, (from, to, p, want)) in cases.into_iter().enumerate() {
            let got = match decide(&from, &to, &p) {
                Decision::NoChange => No,
                Decision::InPlace => In,
                Decision::Restart { reason } => {
                    let Rs(needle) = want else {
                        panic!("case {i}: restart {reason}")
                    };
                    assert!(reason.contains(needle), "case {i}: {reason}");
                    Rs(needle)
                }
                Decision::Reject { reason } => {
                    let Rj(needle) = want else {
                        panic!("case {i}: reject {reason}")
                    };
                    assert!(reason.contains(needle), "case {i}: {reason}");
                    assert!(reason.contains("LiveResize"), "case {i}: {reason}");
                    Rj(needle)
                }
            };
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn request_up_limit_down_counts_both_directions() {
        let from = Quantities {
            cpu: ResourceQuantity::new(100, 400),
            ..Quantities::default()
        };
        let to = Quantities {
            cpu: ResourceQuantity::new(200, 300),
            ..Quantities::default()
        };
        assert_eq!(
            changes(&from, &to),
            [
                (Resource::Cpu, Direction::Increase),
                (Resource::Cpu, Direction::Decrease)
            ]
        );
        let p = EffectivePolicy {
            restart: ResizePolicy {
                cpu: DirectionalPolicy {
                    increase: NR,
                    decrease: RC,
                },
                ..ResizePolicy::default()
            },
            action: Pref,
        };
        assert!(matches!(decide(&from, &to, &p), Decision::Restart { .. }));
    }
}
