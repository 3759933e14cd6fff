//! Pure resize decisions: resize policy, admission and the ordering plan. Plain functions over
//! plain structs; no I/O, no NRI or generated types, no async.
//!
//! One container update walks: [`parse_effective_policy`] (what the pod and the node allow) →
//! [`admit`] (does it fit: `Fits` / `Deferred` / `Infeasible`) → [`decide`] (in place, restart,
//! reject, nothing) → [`plan`] or [`plan_single`] (in which order to write the pod and container
//! cgroups) → [`simulate`] (prove the plan keeps the [invariants](check_invariants) before
//! writing anything).
//!
//! # Annotation reference
//!
//! Pod annotations let a pod owner make the node's resize policy **stricter**, never looser.
//! (The same reference is in `docs/annotations.md`.)
//!
//! | annotation | value | scope |
//! |---|---|---|
//! | `resize-policy.nri-resize.io/container.<name>` | policy list | container `<name>` |
//! | `resize-policy.nri-resize.io/pod` | policy list | every container of the pod |
//! | `resize-action.nri-resize.io/pod` | `LiveResize`, `LiveResizePreferred` or `Restart` | the pod's resizes |
//!
//! A *policy list* is comma-separated `key=value` entries:
//!
//! - key: `cpu`, `memory` (both directions), or `cpu.increase`, `cpu.decrease`,
//!   `memory.increase`, `memory.decrease`;
//! - value: `NotRequired` (resize the running container) or `RestartContainer` (restart it to
//!   apply the change).
//!
//! Within one annotation a direction-specific key wins over the resource-wide key
//! (`memory=NotRequired,memory.decrease=RestartContainer` restarts only on memory decreases);
//! the same key twice is an error. Spaces around entries, keys and values are ignored; keys and
//! values are case-sensitive.
//!
//! ```text
//! resize-policy.nri-resize.io/container.app: cpu=NotRequired,memory=RestartContainer
//! resize-policy.nri-resize.io/container.db:  memory.decrease=RestartContainer
//! resize-policy.nri-resize.io/pod:           cpu.increase=NotRequired,memory=NotRequired
//! resize-action.nri-resize.io/pod:           LiveResize
//! ```
//!
//! Actions: `LiveResizePreferred` resizes in place when the policy allows, otherwise restarts;
//! `LiveResize` resizes in place only and rejects (`Infeasible`) a resize that would need a
//! restart; `Restart` restarts the container for every resize.
//!
//! ## Precedence
//!
//! For each resource and direction the most specific setting wins: container + direction >
//! container + resource > pod + direction > pod + resource > node default
//! ([`PolicyDefaults`], from the plugin config). The action comes from the action annotation,
//! else the node default.
//!
//! ## Strictness: annotations only tighten
//!
//! - Restart policy: `NotRequired < RestartContainer`.
//! - Action: `LiveResizePreferred < LiveResize < Restart`, ranking how much the plugin may
//!   change a *running* container on the pod's behalf (`LiveResizePreferred` may resize in place
//!   or restart, `LiveResize` only in place, `Restart` never touches a running container's
//!   limits).
//!
//! The effective value is `max(annotation, node default)` in that order. A setting looser than
//! the node default is replaced by the node default and reported as
//! [`AnnotationError::LooserThanNodeDefault`]. With `allow_annotations = false` in the node
//! defaults every annotation is ignored and reported.
//!
//! ## Malformed annotations
//!
//! Values are untrusted: a value longer than 4096 bytes, with a non-ASCII character, empty, with
//! an entry that is not `key=value`, an unknown key or value, or a duplicate key makes the
//! **whole annotation** ignored (the next less specific source applies) and yields an
//! [`AnnotationError`] naming the annotation and the bad token (truncated to 64 characters).
//! Unknown annotations under the `resize-policy.nri-resize.io/` and
//! `resize-action.nri-resize.io/` prefixes (typos) are reported by [`validate_annotations`].
//! Parsing never panics.

mod admission;
mod annotation;
mod decision;
mod deprecated;
mod invariants;
mod kubelet_reserve;
mod limits;
mod memory_decrease;
mod pacer;
mod pacing;
mod planner;
mod pod_level;
mod quantity;
mod resize_policy;
mod share;
mod trim;
mod trim_opt_in;
mod units;
mod validate;
mod verdict;

pub use admission::{
    admit, holds_exclusive_cpus, qos_class, Admission, AdmissionError, Allocated,
    ContainerAllocation, CpuSet, NodeCapacity, PodAllocation, QosClass, MAX_CPU_ID,
};
pub use annotation::{
    AnnotationError, ACTION_ANNOTATION, ANNOTATION_PREFIXES, CONTAINER_DECREASE_PREFIX,
    CONTAINER_POLICY_PREFIX, MAX_ANNOTATION_VALUE_BYTES, POD_DECREASE_ANNOTATION,
    POD_POLICY_ANNOTATION, TRIM_ANNOTATION, TRIM_MAX_STALL_ANNOTATION,
};
pub use decision::{changes, decide, Decision};
pub use deprecated::DeprecatedSpelling;
pub use invariants::{check_invariants, Violation};
pub use kubelet_reserve::{
    compare as compare_reserves, Configured, Effective, EvictionThreshold, KubeletConfigError,
    KubeletReserve, Mismatch, NodeTotals, PodsCgroup, ReserveResource,
};
pub use limits::{Limits, LimitsUpdate, PlanOptions, PodResources};
pub use memory_decrease::{
    below_usage_reason, effective_decrease_strategy, mib, not_page_cache, not_reclaimable_reason,
    parse_decrease_annotation, plan_decrease, pod_step_reason, reclaim_request, safe_limit,
    CacheReclaim, DecreasePlan, MemoryDecreaseStrategy, MemoryUse,
};
pub use pacer::{Harm, PaceChange, Pacer};
pub use pacing::{effective_max_stall, pacing_off_reason, parse_max_stall_annotation};
pub use planner::{plan, plan_single, simulate, Plan, PlanError, Step};
pub use pod_level::{
    admit_pod_level, admit_unchecked_memory, cpu_quantity, effective_enforce, memory_quantity,
    with_overhead, PodMemory, PodModeError, POD_MODE_ANNOTATION,
};
pub use quantity::{
    millis_to_shares, shares_to_millis, ContainerQuantities, Direction, Directions, Limit,
    Quantities, ResizeState, ResizeStatus, Resource, ResourceQuantity, DEFAULT_CFS_PERIOD_US,
    MIN_CPU_SHARES,
};
pub use resize_policy::{
    parse_action_annotation, parse_effective_policy, parse_policy_annotation, DirectionalPolicy,
    EffectivePolicy, PolicyAnnotation, PolicyDefaults, ResizeAction, ResizePolicy, Resolved,
    RestartPolicy,
};
pub use share::Share;
pub use trim::{
    stall_text, working_set_holds, CacheStat, Found, HoldReason, Probe, TrimSettings, TrimStep,
    REFAULT_FLOOR,
};
pub use trim_opt_in::{effective_trim, parse_trim_annotation, parse_trim_max_stall, TrimChoice};
pub use units::{
    bytes_quantity, bytes_text, cpu_quota_text, cpu_text, memory_limit_exact_text,
    memory_limit_text, parse_cpu, parse_memory, QuantityError, UNLIMITED_BYTES,
};
pub use validate::{deprecated_spellings, validate_annotations};
pub use verdict::{
    bounds, judge, limit_changes, CounterSample, LimitChange, Verdict, VerdictThresholds,
    WindowStats,
};
