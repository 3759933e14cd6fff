//! Pod annotations (untrusted: written by pod owners) through every nri-resize parser: resize
//! policy, resize action, memory-decrease strategy, the effective-policy resolution and the
//! whole-pod validation, the pod-level mode, the reclaim pacing ceiling (`max-stall`). Invariants:
//! never a panic; annotations only tighten the node default; a parsed share is within 0.0..=1.0.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use nri_resize::policy::{
    effective_decrease_strategy, effective_enforce, effective_max_stall, parse_effective_policy,
    parse_max_stall_annotation, validate_annotations, Direction, DirectionalPolicy,
    MemoryDecreaseStrategy, PolicyDefaults, ResizeAction, Resource, RestartPolicy, Share,
};

fuzz_target!(|input: (Vec<(String, String)>, String, u8)| {
    let (pairs, container, node) = input;
    // Keys are steered towards the real ones so the parsers see their values often.
    const KEYS: [&str; 7] = [
        "resize-policy.nri-resize.io/container.",
        "resize-policy.nri-resize.io/pod",
        "resize-action.nri-resize.io/pod",
        "memory-decrease.nri-resize.io/container.",
        "memory-decrease.nri-resize.io/pod",
        "resize-mode.nri-resize.io/pod",
        "memory-decrease.nri-resize.io/max-stall",
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
    // The reclaim pacing ceiling: the parser on the raw container string too, and the effective
    // ceiling never above the node's (a share from the fuzzer's byte, 0.00..=1.00 in steps).
    if let Ok(s) = parse_max_stall_annotation("memory-decrease.nri-resize.io/max-stall", &container) {
        assert!((0.0..=1.0).contains(&s.get()), "{s:?} out of range");
    }
    let node_stall = Share::new(f64::from(node % 101) / 100.0);
    let (stall, _) = effective_max_stall(&annotations, node_stall, defaults.allow_annotations);
    assert!(stall <= node_stall, "max-stall {stall:?} looser than the node's {node_stall:?}");
    assert!((0.0..=1.0).contains(&stall.get()));
    if !defaults.allow_annotations {
        assert_eq!(stall, node_stall, "annotations disabled");
    }
});
