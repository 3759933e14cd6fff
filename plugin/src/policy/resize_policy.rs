//! Resize policy (per container, per resource, per direction) and resize action (per pod), from
//! the node defaults and the pod's annotations. Annotations are untrusted input: they are
//! size-checked, parsed strictly, and may only make the node default *stricter*.
//!
//! See the [module docs](super) for the annotation reference and the strictness order.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::annotation::{
    check_value, sanitize, sanitize_key, AnnotationError, ACTION_ANNOTATION,
    CONTAINER_POLICY_PREFIX, POD_POLICY_ANNOTATION,
};
use super::quantity::{Direction, Resource};

/// Whether changing a resource needs the container restarted (KEP-1287 `restartPolicy`).
///
/// Strictness order: `NotRequired < RestartContainer`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    Serialize,
    schemars::JsonSchema,
)]
pub enum RestartPolicy {
    /// The change can be applied to the running container.
    #[default]
    NotRequired,
    /// The container must be restarted to take the change (e.g. a JVM's `-Xmx`).
    RestartContainer,
}

impl RestartPolicy {
    /// The annotation/Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::NotRequired => "NotRequired",
            RestartPolicy::RestartContainer => "RestartContainer",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "NotRequired" => Some(RestartPolicy::NotRequired),
            "RestartContainer" => Some(RestartPolicy::RestartContainer),
            _ => None,
        }
    }
}

impl fmt::Display for RestartPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to do with one resize request as a whole (the 2017 proposal's `resourceResizeAction`).
///
/// Strictness order: `LiveResizePreferred < LiveResize < Restart`, ranking how much the plugin
/// may change a *running* container on the pod's behalf: `LiveResizePreferred` may resize in
/// place or restart, `LiveResize` only in place (or refuse), `Restart` never writes a running
/// container's limits (it is recreated through the ordinary create path).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    Serialize,
    schemars::JsonSchema,
)]
pub enum ResizeAction {
    /// Resize in place when the policy allows, otherwise restart.
    #[default]
    LiveResizePreferred,
    /// Resize in place only; a resize that would need a restart is rejected.
    LiveResize,
    /// Always restart the container to apply a resize.
    Restart,
}

impl ResizeAction {
    /// The annotation spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ResizeAction::LiveResizePreferred => "LiveResizePreferred",
            ResizeAction::LiveResize => "LiveResize",
            ResizeAction::Restart => "Restart",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "LiveResizePreferred" => Some(ResizeAction::LiveResizePreferred),
            "LiveResize" => Some(ResizeAction::LiveResize),
            "Restart" => Some(ResizeAction::Restart),
            _ => None,
        }
    }
}

impl fmt::Display for ResizeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The restart policy of one resource, per direction.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct DirectionalPolicy {
    /// Policy when the resource grows.
    pub increase: RestartPolicy,
    /// Policy when the resource shrinks.
    pub decrease: RestartPolicy,
}

impl DirectionalPolicy {
    /// The same policy both ways.
    pub fn both(p: RestartPolicy) -> Self {
        Self {
            increase: p,
            decrease: p,
        }
    }

    /// The policy for one direction.
    pub fn get(&self, d: Direction) -> RestartPolicy {
        match d {
            Direction::Increase => self.increase,
            Direction::Decrease => self.decrease,
        }
    }

    fn slot(&mut self, d: Direction) -> &mut RestartPolicy {
        match d {
            Direction::Increase => &mut self.increase,
            Direction::Decrease => &mut self.decrease,
        }
    }
}

/// The restart policy of a container, per resource and direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ResizePolicy {
    /// CPU.
    pub cpu: DirectionalPolicy,
    /// Memory.
    pub memory: DirectionalPolicy,
}

impl ResizePolicy {
    /// The policy for one resource and direction.
    pub fn get(&self, r: Resource, d: Direction) -> RestartPolicy {
        self.of(r).get(d)
    }

    /// The per-direction policy of one resource.
    pub fn of(&self, r: Resource) -> &DirectionalPolicy {
        match r {
            Resource::Cpu => &self.cpu,
            Resource::Memory => &self.memory,
        }
    }

    fn slot(&mut self, r: Resource, d: Direction) -> &mut RestartPolicy {
        match r {
            Resource::Cpu => self.cpu.slot(d),
            Resource::Memory => self.memory.slot(d),
        }
    }
}

/// Node-wide defaults, embeddable in the plugin's TOML config, e.g.
///
/// ```toml
/// action = "LiveResizePreferred"
/// allow_annotations = true
/// [cpu]
/// increase = "NotRequired"
/// decrease = "NotRequired"
/// [memory]
/// decrease = "RestartContainer"
/// ```
///
/// Every field is optional; the default is the KEP's behaviour (everything `NotRequired`,
/// action `LiveResizePreferred`, annotations honoured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyDefaults {
    /// Whether pods may tighten the policy through annotations. When `false` every nri-resize
    /// annotation is ignored and reported.
    pub allow_annotations: bool,
    /// The resize action when the pod does not ask for a stricter one.
    pub action: ResizeAction,
    /// CPU restart policy floor.
    pub cpu: DirectionalPolicy,
    /// Memory restart policy floor.
    pub memory: DirectionalPolicy,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            allow_annotations: true,
            action: ResizeAction::default(),
            cpu: DirectionalPolicy::default(),
            memory: DirectionalPolicy::default(),
        }
    }
}

impl PolicyDefaults {
    /// The default restart policies as a [`ResizePolicy`].
    pub fn restart_policy(&self) -> ResizePolicy {
        ResizePolicy {
            cpu: self.cpu,
            memory: self.memory,
        }
    }
}

/// The policy that applies to one container's resize.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EffectivePolicy {
    /// Restart policy per resource and direction.
    pub restart: ResizePolicy,
    /// What to do with the request as a whole.
    pub action: ResizeAction,
}

/// The settings of one policy annotation: per resource a resource-wide value and per-direction
/// values (the latter win).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolicyAnnotation {
    resource_wide: [Option<RestartPolicy>; 2],
    directional: [[Option<RestartPolicy>; 2]; 2],
}

impl PolicyAnnotation {
    /// The value for `(resource, direction)`, if the annotation sets it.
    pub fn get(&self, r: Resource, d: Direction) -> Option<RestartPolicy> {
        self.directional[r as usize][d as usize].or(self.resource_wide[r as usize])
    }
}

/// The effective policy of one container and the problems found on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Resolved {
    /// The policy to apply.
    pub policy: EffectivePolicy,
    /// Annotations (or parts) that were ignored, and why; the caller reports them.
    pub errors: Vec<AnnotationError>,
}

/// Parses a resize-policy annotation value (`cpu=NotRequired,memory.decrease=RestartContainer`).
/// Any problem rejects the whole annotation.
pub fn parse_policy_annotation(
    annotation: &str,
    value: &str,
) -> Result<PolicyAnnotation, AnnotationError> {
    let v = check_value(annotation, value)?;
    let mut out = PolicyAnnotation::default();
    for item in v.split(',') {
        let item = item.trim();
        let Some((key, val)) = item.split_once('=') else {
            return Err(AnnotationError::Malformed {
                annotation: sanitize_key(annotation),
                token: sanitize(item),
            });
        };
        let (key, val) = (key.trim(), val.trim());
        if key.is_empty() || val.is_empty() {
            return Err(AnnotationError::Malformed {
                annotation: sanitize_key(annotation),
                token: sanitize(item),
            });
        }
        let unknown_key = || AnnotationError::UnknownKey {
            annotation: sanitize_key(annotation),
            token: sanitize(key),
        };
        let (res, dir) = match key.split_once('.') {
            Some((r, d)) => (r, Some(d)),
            None => (key, None),
        };
        let res = match res {
            "cpu" => Resource::Cpu,
            "memory" => Resource::Memory,
            _ => return Err(unknown_key()),
        };
        let dir = match dir {
            None => None,
            Some("increase") => Some(Direction::Increase),
            Some("decrease") => Some(Direction::Decrease),
            Some(_) => return Err(unknown_key()),
        };
        let policy = RestartPolicy::parse(val).ok_or_else(|| AnnotationError::UnknownValue {
            annotation: sanitize_key(annotation),
            token: sanitize(val),
            expected: "NotRequired or RestartContainer",
        })?;
        let slot = match dir {
            None => &mut out.resource_wide[res as usize],
            Some(d) => &mut out.directional[res as usize][d as usize],
        };
        if slot.is_some() {
            return Err(AnnotationError::DuplicateKey {
                annotation: sanitize_key(annotation),
                token: sanitize(key),
            });
        }
        *slot = Some(policy);
    }
    Ok(out)
}

/// Parses a resize-action annotation value (`LiveResize`, `LiveResizePreferred`, `Restart`).
pub fn parse_action_annotation(
    annotation: &str,
    value: &str,
) -> Result<ResizeAction, AnnotationError> {
    let v = check_value(annotation, value)?;
    ResizeAction::parse(v).ok_or_else(|| AnnotationError::UnknownValue {
        annotation: sanitize_key(annotation),
        token: sanitize(v),
        expected: "LiveResize, LiveResizePreferred or Restart",
    })
}

/// The effective policy of container `container` of a pod with `annotations`, on a node with
/// `defaults`; see the [module docs](super) for precedence and strictness. Never fails: a bad
/// annotation is skipped (the next less specific source applies) and reported in
/// [`Resolved::errors`]. Only the annotations that concern this container are examined; use
/// [`validate_annotations`](super::validate_annotations) to check all of a pod's.
pub fn parse_effective_policy(
    annotations: &BTreeMap<String, String>,
    container: &str,
    defaults: &PolicyDefaults,
) -> Resolved {
    let mut errors = Vec::new();
    let container_key = format!("{CONTAINER_POLICY_PREFIX}{container}");
    let node = defaults.restart_policy();
    if !defaults.allow_annotations {
        for key in [
            container_key.as_str(),
            POD_POLICY_ANNOTATION,
            ACTION_ANNOTATION,
        ] {
            if annotations.contains_key(key) {
                errors.push(AnnotationError::Disabled {
                    annotation: sanitize_key(key),
                });
            }
        }
        return Resolved {
            policy: EffectivePolicy {
                restart: node,
                action: defaults.action,
            },
            errors,
        };
    }

    // Most specific source first.
    let mut sources: Vec<(&str, PolicyAnnotation)> = Vec::with_capacity(2);
    for key in [container_key.as_str(), POD_POLICY_ANNOTATION] {
        if let Some(value) = annotations.get(key) {
            match parse_policy_annotation(key, value) {
                Ok(p) => sources.push((key, p)),
                Err(e) => errors.push(e),
            }
        }
    }

    let mut restart = node;
    for r in Resource::ALL {
        for d in Direction::ALL {
            let floor = node.get(r, d);
            let asked = sources
                .iter()
                .find_map(|(key, p)| p.get(r, d).map(|v| (*key, v)));
            if let Some((key, v)) = asked {
                if v < floor {
                    errors.push(AnnotationError::LooserThanNodeDefault {
                        annotation: sanitize_key(key),
                        key: format!("{r}.{d}"),
                        requested: v.as_str(),
                        node_default: floor.as_str(),
                    });
                }
                *restart.slot(r, d) = v.max(floor);
            }
        }
    }

    let mut action = defaults.action;
    if let Some(value) = annotations.get(ACTION_ANNOTATION) {
        match parse_action_annotation(ACTION_ANNOTATION, value) {
            Ok(a) if a < defaults.action => errors.push(AnnotationError::LooserThanNodeDefault {
                annotation: ACTION_ANNOTATION.to_string(),
                key: "action".to_string(),
                requested: a.as_str(),
                node_default: defaults.action.as_str(),
            }),
            Ok(a) => action = a,
            Err(e) => errors.push(e),
        }
    }

    Resolved {
        policy: EffectivePolicy { restart, action },
        errors,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::policy::annotation::test_support::{ann, ckey};
    use RestartPolicy::{NotRequired as NR, RestartContainer as RC};

    fn policy(
        cpu: (RestartPolicy, RestartPolicy),
        mem: (RestartPolicy, RestartPolicy),
    ) -> ResizePolicy {
        ResizePolicy {
            cpu: DirectionalPolicy {
                increase: cpu.0,
                decrease: cpu.1,
            },
            memory: DirectionalPolicy {
                increase: mem.0,
                decrease: mem.1,
            },
        }
    }

    #[test]
    fn parse_policy_table() {
        let ok = [
            (
                "cpu=NotRequired,memory=RestartContainer",
                [(NR, NR), (RC, RC)],
            ),
            (
                "memory.decrease=RestartContainer,cpu.increase=NotRequired",
                [(NR, NR), (NR, RC)],
            ),
            (
                "memory=NotRequired,memory.decrease=RestartContainer",
                [(NR, NR), (NR, RC)],
            ),
            ("  cpu = RestartContainer ", [(RC, RC), (NR, NR)]),
        ];
        for (value, [cpu, mem]) in ok {
            let p = parse_policy_annotation("a", value).unwrap();
            let got = [Resource::Cpu, Resource::Memory].map(|r| {
                (
                    p.get(r, Direction::Increase).unwrap_or(NR),
                    p.get(r, Direction::Decrease).unwrap_or(NR),
                )
            });
            assert_eq!(got, [cpu, mem], "{value}");
        }
    }

    #[test]
    fn parse_policy_errors_name_annotation_and_token() {
        let long = "cpu=NotRequired,".repeat(300);
        let cases: Vec<(&str, &str, &str)> = vec![
            ("", "Empty", "value is empty"),
            ("   ", "Empty", "value is empty"),
            ("cpu", "Malformed", "\"cpu\""),
            ("cpu=NotRequired,,memory=NotRequired", "Malformed", "\"\""),
            ("cpu=", "Malformed", "\"cpu=\""),
            ("gpu=NotRequired", "UnknownKey", "\"gpu\""),
            ("cpu.sideways=NotRequired", "UnknownKey", "\"cpu.sideways\""),
            ("cpu=Sometimes", "UnknownValue", "\"Sometimes\""),
            ("cpu=notrequired", "UnknownValue", "\"notrequired\""),
            (
                "cpu=NotRequired,cpu=RestartContainer",
                "DuplicateKey",
                "\"cpu\"",
            ),
            (
                "cpu.increase=NotRequired,cpu.increase=NotRequired",
                "DuplicateKey",
                "\"cpu.increase\"",
            ),
            ("cpu=NotRequïred", "NonAscii", "byte 11"),
            (&long, "TooLong", "4800 bytes"),
        ];
        for (value, variant, needle) in cases {
            let err = parse_policy_annotation("my-annotation", value).unwrap_err();
            let msg = err.to_string();
            assert!(format!("{err:?}").starts_with(variant), "{value}: {err:?}");
            assert!(msg.contains("my-annotation"), "{msg}");
            assert!(msg.contains(needle), "{value}: {msg}");
        }
    }

    #[test]
    fn error_messages_do_not_echo_huge_or_control_tokens() {
        let value = format!("cpu={}", "X".repeat(4000));
        let msg = parse_policy_annotation("a", &value)
            .unwrap_err()
            .to_string();
        assert!(msg.len() < 200, "{msg}");
        let msg = parse_policy_annotation("a", "cpu=\u{1b}[2J")
            .unwrap_err()
            .to_string();
        assert!(!msg.contains('\u{1b}'), "{msg}");
    }

    #[test]
    fn parse_action_table() {
        for (v, want) in [
            ("LiveResize", ResizeAction::LiveResize),
            ("LiveResizePreferred", ResizeAction::LiveResizePreferred),
            (" Restart ", ResizeAction::Restart),
        ] {
            assert_eq!(parse_action_annotation("a", v), Ok(want));
        }
        for v in ["", "restart", "Live", "Restart,Restart", "Rëstart"] {
            assert!(parse_action_annotation("a", v).is_err(), "{v}");
        }
    }

    #[test]
    fn precedence_most_specific_first() {
        let d = PolicyDefaults::default();
        let a = ann(&[
            (
                &ckey("app"),
                "cpu.increase=RestartContainer,memory=RestartContainer",
            ),
            (
                POD_POLICY_ANNOTATION,
                "cpu=RestartContainer,memory.decrease=NotRequired",
            ),
        ]);
        let r = parse_effective_policy(&a, "app", &d);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        // cpu.increase: container+direction; cpu.decrease: pod+resource;
        // memory.*: container+resource beats pod+direction.
        assert_eq!(r.policy.restart, policy((RC, RC), (RC, RC)));

        let r = parse_effective_policy(&a, "sidecar", &d);
        assert_eq!(r.policy.restart, policy((RC, RC), (NR, NR)));
        assert_eq!(r.policy.action, ResizeAction::LiveResizePreferred);
    }

    #[test]
    fn pod_direction_beats_pod_resource() {
        let a = ann(&[(
            POD_POLICY_ANNOTATION,
            "memory=RestartContainer,memory.increase=NotRequired",
        )]);
        let r = parse_effective_policy(&a, "x", &PolicyDefaults::default());
        assert_eq!(r.policy.restart, policy((NR, NR), (NR, RC)));
    }

    #[test]
    fn annotations_only_tighten_the_node_default() {
        let node = PolicyDefaults {
            action: ResizeAction::LiveResize,
            memory: DirectionalPolicy {
                increase: NR,
                decrease: RC,
            },
            ..PolicyDefaults::default()
        };
        let a = ann(&[
            (
                &ckey("app"),
                "memory=NotRequired,cpu.decrease=RestartContainer",
            ),
            (ACTION_ANNOTATION, "LiveResizePreferred"),
        ]);
        let r = parse_effective_policy(&a, "app", &node);
        assert_eq!(r.policy.restart, policy((NR, RC), (NR, RC)));
        assert_eq!(r.policy.action, ResizeAction::LiveResize);
        let loosened: Vec<_> = r
            .errors
            .iter()
            .map(|e| match e {
                AnnotationError::LooserThanNodeDefault { key, .. } => key.as_str(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(loosened, ["memory.decrease", "action"]);
    }

    #[test]
    fn action_strictness_order() {
        use ResizeAction::{LiveResize, LiveResizePreferred, Restart};
        // (node default, annotation, effective)
        let cases = [
            (LiveResizePreferred, LiveResize, LiveResize),
            (LiveResizePreferred, Restart, Restart),
            (LiveResize, Restart, Restart),
            (LiveResize, LiveResizePreferred, LiveResize),
            (Restart, LiveResize, Restart),
            (Restart, LiveResizePreferred, Restart),
        ];
        for (node, asked, want) in cases {
            let d = PolicyDefaults {
                action: node,
                ..PolicyDefaults::default()
            };
            let r = parse_effective_policy(&ann(&[(ACTION_ANNOTATION, asked.as_str())]), "c", &d);
            assert_eq!(r.policy.action, want, "node {node} asked {asked}");
            assert_eq!(
                r.errors.is_empty(),
                asked >= node,
                "node {node} asked {asked}"
            );
        }
        assert!(NR < RC);
    }

    #[test]
    fn malformed_annotation_falls_back_to_less_specific_source() {
        let a = ann(&[
            (&ckey("app"), "cpu=RestartContainer,bogus=NotRequired"),
            (POD_POLICY_ANNOTATION, "memory=RestartContainer"),
            (ACTION_ANNOTATION, "Sometimes"),
        ]);
        let r = parse_effective_policy(&a, "app", &PolicyDefaults::default());
        // The container annotation is ignored entirely (its valid cpu entry too).
        assert_eq!(r.policy.restart, policy((NR, NR), (RC, RC)));
        assert_eq!(r.policy.action, ResizeAction::LiveResizePreferred);
        assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
        assert!(r.errors[0].to_string().contains("bogus"));
        assert!(r.errors[1].to_string().contains("Sometimes"));
    }

    #[test]
    fn disabled_annotations_are_reported_and_ignored() {
        let d = PolicyDefaults {
            allow_annotations: false,
            ..PolicyDefaults::default()
        };
        let a = ann(&[(POD_POLICY_ANNOTATION, "cpu=RestartContainer")]);
        let r = parse_effective_policy(&a, "c", &d);
        assert_eq!(r.policy.restart, ResizePolicy::default());
        assert!(matches!(r.errors[..], [AnnotationError::Disabled { .. }]));
    }

    #[test]
    fn defaults_from_toml() {
        let d: PolicyDefaults = toml::from_str(
            r#"
            action = "LiveResize"
            [memory]
            decrease = "RestartContainer"
            "#,
        )
        .unwrap();
        assert_eq!(d.action, ResizeAction::LiveResize);
        assert!(d.allow_annotations);
        assert_eq!(d.restart_policy(), policy((NR, NR), (NR, RC)));
        assert_eq!(
            toml::from_str::<PolicyDefaults>("").unwrap(),
            PolicyDefaults::default()
        );
        let err = toml::from_str::<PolicyDefaults>("[cpu]\nincrese = \"NotRequired\"").unwrap_err();
        assert!(err.to_string().contains("increse"), "{err}");
        assert!(toml::from_str::<PolicyDefaults>("actoin = \"Restart\"").is_err());
        assert!(toml::from_str::<PolicyDefaults>("action = \"restart\"").is_err());
    }

    #[test]
    fn never_panics_on_arbitrary_input() {
        // A tiny deterministic fuzz over bytes that matter to the grammar.
        let alphabet: Vec<char> =
            "cpu memory.increase=decrease,NotRequired RestartContainer\u{e9}\0=,."
                .chars()
                .collect();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..5000 {
            let mut s = String::new();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = usize::try_from(seed % 40).unwrap();
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                s.push(alphabet[usize::try_from(seed % alphabet.len() as u64).unwrap()]);
            }
            let _ = parse_policy_annotation("a", &s);
            let _ = parse_action_annotation("a", &s);
        }
    }
}
