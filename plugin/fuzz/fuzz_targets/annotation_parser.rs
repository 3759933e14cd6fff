//! Pod annotations (untrusted: written by pod owners) through every nri-resize parser: resize
//! policy, resize action, memory-decrease strategy, the effective-policy resolution and the
//! whole-pod validation, the pod-level mode. Invariants: never a panic; annotations only tighten the node default.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use nri_resize::policy::{
    effective_decrease_strategy, effective_enforce, parse_effective_policy, validate_annotations, Direction,
    DirectionalPolicy, MemoryDecreaseStrategy, PolicyDefaults, ResizeAction, Resource,
    RestartPolicy,
};

fuzz_target!(|input: (Vec<(String, String)>, String, u8)| {
    let (pairs, container, node) = input;
    // Keys are steered towards the real ones so the parsers see their values often.
    const KEYS: [&str; 6] = [
        "resize-policy.nri-resize.io/container.",
        "resize-policy.nri-resize.io/pod",
        "resize-action.nri-resize.io/pod",
        "memory-decrease.nri-resize.io/container.",
        "memory-decrease.nri-resize.io/pod",
        "resize-mode.nri-resize.io/pod",
    ];
    let annotations: BTreeMap<String, String> = pairs
        .into_iter()
        .enumerate()
        .map(|(i, (k, v))| {
            let prefix = KEYS[i % KEYS.len()];
            let key = if prefix.ends_with('.') { format!("{prefix}{k}") } else if k.is_empty() { prefix.to_string() } else { k };
            (key, v)
        })
        .collect();
    let _ = validate_annotations(&annotations);
    // Node defaults from the fuzzer's byte: every floor an operator could set.
    let rp = |bit: u8| if node & bit != 0 { RestartPolicy::RestartContainer } else { RestartPolicy::NotRequired };
    let defaults = PolicyDefaults {
        allow_annotations: node & 0x80 == 0,
        action: match (node >> 5) % 3 {
            0 => ResizeAction::LiveResizePreferred,
            1 => ResizeAction::LiveResize,
            _ => ResizeAction::Restart,
        },
        cpu: DirectionalPolicy { increase: rp(1), decrease: rp(2) },
        memory: DirectionalPolicy { increase: rp(4), decrease: rp(8) },
    };
    let resolved = parse_effective_policy(&annotations, &container, &defaults);
    for r in Resource::ALL {
        for d in Direction::ALL {
            assert!(resolved.policy.restart.get(r, d) >= defaults.restart_policy().get(r, d));
        }
    }
    assert!(resolved.policy.action >= defaults.action);
    let node_default = match (node >> 4) % 3 {
        0 => MemoryDecreaseStrategy::Reclaim,
        1 => MemoryDecreaseStrategy::Restart,
        _ => MemoryDecreaseStrategy::Reject,
    };
    let (s, _) = effective_decrease_strategy(&annotations, &container, node_default, defaults.allow_annotations);
    assert!(s >= node_default, "{s:?} looser than {node_default:?}");
    // The pod-level mode: an enforcing node is never loosened to observe.
    let node_enforces = node & 0x40 != 0;
    let (enforce, _) = effective_enforce(node_enforces, &annotations);
    assert!(enforce || !node_enforces, "observe on an enforcing node");
});
