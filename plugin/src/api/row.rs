//! One line of `nri-resize status`'s table, as the container rows (`table.rs`) and the pod rows
//! (`pod_row.rs`) build it.

/// POD, CONTAINER, DESIRED, ALLOCATED, ACTUAL, STATE, THROTTLED, RECLAIMED, STALL, VERDICT,
/// TRIM, REASON.
pub type Row = [String; 12];
