//! Conversions between the generated NRI messages and nri-resize's domain types. The only place
//! (with `service.rs`) that touches generated types.

use std::collections::BTreeMap;

use nri_resize_proto::api as pb;
use protobuf::{EnumOrUnknown, MessageField};

use crate::model::{
    kept, Container, ContainerState, CpuResources, HugepageLimit, LinuxResources, MemoryResources,
    Pod,
};

use super::handler::{ContainerUpdate, Eviction};

fn opt<T, U: Copy>(f: &MessageField<T>, get: impl Fn(&T) -> U) -> Option<U> {
    f.as_ref().map(get)
}

fn sorted(map: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn resources_from_pb(r: &pb::LinuxResources) -> LinuxResources {
    LinuxResources {
        cpu: r.cpu.as_ref().map(|c| CpuResources {
            shares: opt(&c.shares, |v| v.value),
            quota: opt(&c.quota, |v| v.value),
            period: opt(&c.period, |v| v.value),
            realtime_runtime: opt(&c.realtime_runtime, |v| v.value),
            realtime_period: opt(&c.realtime_period, |v| v.value),
            cpus: c.cpus.clone(),
            mems: c.mems.clone(),
        }),
        memory: r.memory.as_ref().map(|m| MemoryResources {
            limit: opt(&m.limit, |v| v.value),
            reservation: opt(&m.reservation, |v| v.value),
            swap: opt(&m.swap, |v| v.value),
            kernel: opt(&m.kernel, |v| v.value),
            kernel_tcp: opt(&m.kernel_tcp, |v| v.value),
            swappiness: opt(&m.swappiness, |v| v.value),
            disable_oom_killer: opt(&m.disable_oom_killer, |v| v.value),
            use_hierarchy: opt(&m.use_hierarchy, |v| v.value),
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        blockio_class: r.blockio_class.as_ref().map(|v| v.value.clone()),
        rdt_class: r.rdt_class.as_ref().map(|v| v.value.clone()),
        unified: sorted(&r.unified),
        pids_limit: r.pids.as_ref().map(|p| p.limit),
    }
}

fn some<T>(v: T) -> MessageField<T> {
    MessageField::some(v)
}

fn i64_field(v: Option<i64>) -> MessageField<pb::OptionalInt64> {
    v.map_or_else(MessageField::none, |value| {
        some(pb::OptionalInt64 {
            value,
            ..Default::default()
        })
    })
}

fn u64_field(v: Option<u64>) -> MessageField<pb::OptionalUInt64> {
    v.map_or_else(MessageField::none, |value| {
        some(pb::OptionalUInt64 {
            value,
            ..Default::default()
        })
    })
}

fn bool_field(v: Option<bool>) -> MessageField<pb::OptionalBool> {
    v.map_or_else(MessageField::none, |value| {
        some(pb::OptionalBool {
            value,
            ..Default::default()
        })
    })
}

pub(crate) fn resources_to_pb(r: &LinuxResources) -> pb::LinuxResources {
    pb::LinuxResources {
        cpu: r.cpu.as_ref().map_or_else(MessageField::none, |c| {
            some(pb::LinuxCPU {
                shares: u64_field(c.shares),
                quota: i64_field(c.quota),
                period: u64_field(c.period),
                realtime_runtime: i64_field(c.realtime_runtime),
                realtime_period: u64_field(c.realtime_period),
                cpus: c.cpus.clone(),
                mems: c.mems.clone(),
                ..Default::default()
            })
        }),
        memory: r.memory.as_ref().map_or_else(MessageField::none, |m| {
            some(pb::LinuxMemory {
                limit: i64_field(m.limit),
                reservation: i64_field(m.reservation),
                swap: i64_field(m.swap),
                kernel: i64_field(m.kernel),
                kernel_tcp: i64_field(m.kernel_tcp),
                swappiness: u64_field(m.swappiness),
                disable_oom_killer: bool_field(m.disable_oom_killer),
                use_hierarchy: bool_field(m.use_hierarchy),
                ..Default::default()
            })
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| pb::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
                ..Default::default()
            })
            .collect(),
        blockio_class: r
            .blockio_class
            .clone()
            .map_or_else(MessageField::none, |value| {
                some(pb::OptionalString {
                    value,
                    ..Default::default()
                })
            }),
        rdt_class: r
            .rdt_class
            .clone()
            .map_or_else(MessageField::none, |value| {
                some(pb::OptionalString {
                    value,
                    ..Default::default()
                })
            }),
        unified: r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        pids: r.pids_limit.map_or_else(MessageField::none, |limit| {
            some(pb::LinuxPids {
                limit,
                ..Default::default()
            })
        }),
        ..Default::default()
    }
}

/// kubelet's labels on every pod sandbox and container (`pkg/kubelet/types/labels.go`).
const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// `value`, or when the runtime left it empty, kubelet's label `key`: CRI-O before cri-o#10117
/// (July 2026) names containers from the label alone, so a create without it came empty.
fn or_label(value: &str, labels: &std::collections::HashMap<String, String>, key: &str) -> String {
    if value.is_empty() {
        labels.get(key).cloned().unwrap_or_default()
    } else {
        value.to_owned()
    }
}

pub(crate) fn pod_from_pb(p: &pb::PodSandbox) -> Pod {
    let linux = p.linux.as_ref();
    Pod {
        id: p.id.clone(),
        name: or_label(&p.name, &p.labels, POD_NAME_LABEL),
        namespace: or_label(&p.namespace, &p.labels, POD_NAMESPACE_LABEL),
        uid: or_label(&p.uid, &p.labels, POD_UID_LABEL),
        labels: kept(&p.labels),
        annotations: kept(&p.annotations),
        runtime_handler: p.runtime_handler.clone(),
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        resources: linux
            .and_then(|l| l.pod_resources.as_ref())
            .map(resources_from_pb),
        overhead: linux
            .and_then(|l| l.pod_overhead.as_ref())
            .map(resources_from_pb),
        ips: p.ips.clone(),
    }
}

fn state_from_pb(s: EnumOrUnknown<pb::ContainerState>) -> ContainerState {
    match s.enum_value() {
        Ok(pb::ContainerState::CONTAINER_CREATED) => ContainerState::Created,
        Ok(pb::ContainerState::CONTAINER_PAUSED) => ContainerState::Paused,
        Ok(pb::ContainerState::CONTAINER_RUNNING) => ContainerState::Running,
        Ok(pb::ContainerState::CONTAINER_STOPPED) => ContainerState::Stopped,
        Ok(pb::ContainerState::CONTAINER_UNKNOWN) | Err(_) => ContainerState::Unknown,
    }
}

pub(crate) fn container_from_pb(c: &pb::Container) -> Container {
    let linux = c.linux.as_ref();
    Container {
        id: c.id.clone(),
        pod_id: c.pod_sandbox_id.clone(),
        name: or_label(&c.name, &c.labels, CONTAINER_NAME_LABEL),
        state: state_from_pb(c.state),
        pid: (c.pid != 0).then_some(c.pid),
        cgroups_path: linux.map(|l| l.cgroups_path.clone()).unwrap_or_default(),
        resources: linux
            .and_then(|l| l.resources.as_ref())
            .map(resources_from_pb),
        labels: kept(&c.labels),
        annotations: kept(&c.annotations),
    }
}

pub(crate) fn update_to_pb(u: &ContainerUpdate) -> pb::ContainerUpdate {
    pb::ContainerUpdate {
        container_id: u.container_id.clone(),
        linux: some(pb::LinuxContainerUpdate {
            resources: some(resources_to_pb(&u.resources)),
            ..Default::default()
        }),
        ignore_failure: u.ignore_failure,
        ..Default::default()
    }
}

pub(crate) fn update_from_pb(u: &pb::ContainerUpdate) -> ContainerUpdate {
    ContainerUpdate {
        container_id: u.container_id.clone(),
        resources: u
            .linux
            .as_ref()
            .and_then(|l| l.resources.as_ref())
            .map(resources_from_pb)
            .unwrap_or_default(),
        ignore_failure: u.ignore_failure,
    }
}

pub(crate) fn eviction_to_pb(e: &Eviction) -> pb::ContainerEviction {
    pb::ContainerEviction {
        container_id: e.container_id.clone(),
        reason: e.reason.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message;

    fn full() -> LinuxResources {
        LinuxResources {
            cpu: Some(CpuResources {
                shares: Some(1024),
                quota: Some(150_000),
                period: Some(100_000),
                realtime_runtime: Some(0),
                realtime_period: None,
                cpus: "0-3".into(),
                mems: "0".into(),
            }),
            memory: Some(MemoryResources {
                limit: Some(512 << 20),
                reservation: None,
                swap: Some(512 << 20),
                kernel: None,
                kernel_tcp: None,
                swappiness: Some(60),
                disable_oom_killer: Some(false),
                use_hierarchy: None,
            }),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 0,
            }],
            blockio_class: Some("slow".into()),
            rdt_class: None,
            unified: [("memory.high".to_string(), "max".to_string())].into(),
            pids_limit: Some(4096),
        }
    }

    #[test]
    fn resources_round_trip_through_the_wire_format() {
        let r = full();
        let bytes = resources_to_pb(&r).write_to_bytes().unwrap();
        let back = resources_from_pb(&pb::LinuxResources::parse_from_bytes(&bytes).unwrap());
        assert_eq!(back, r);
    }

    #[test]
    fn zero_and_unset_stay_distinct() {
        let r = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        };
        let back = resources_from_pb(&resources_to_pb(&r));
        assert_eq!(back.cpu_quota(), Some(0));
        assert_eq!(back.cpu_period(), None);
    }

    #[test]
    fn container_and_pod_fields_are_carried() {
        let mut c = pb::Container::new();
        c.id = "c1".into();
        c.pod_sandbox_id = "p1".into();
        c.name = "app".into();
        c.state = EnumOrUnknown::new(pb::ContainerState::CONTAINER_RUNNING);
        c.pid = 42;
        c.annotations.insert("a".into(), "b".into());
        c.annotations
            .insert("trim.nri-resize.io/pod".into(), "on".into());
        c.linux = some(pb::LinuxContainer {
            cgroups_path: "/kubepods/pod1/c1".into(),
            resources: some(resources_to_pb(&full())),
            ..Default::default()
        });
        let d = container_from_pb(&c);
        assert_eq!(d.state, ContainerState::Running);
        assert_eq!(d.pid, Some(42));
        assert_eq!(d.cgroups_path, "/kubepods/pod1/c1");
        assert_eq!(d.resources, Some(full()));
        assert_eq!(
            d.annotations
                .get("trim.nri-resize.io/pod")
                .map(String::as_str),
            Some("on")
        );
        assert_eq!(
            d.annotations.get("a"),
            None,
            "only nri-resize's keys are kept"
        );

        let mut p = pb::PodSandbox::new();
        p.id = "p1".into();
        p.namespace = "ns".into();
        p.name = "web".into();
        p.linux = some(pb::LinuxPodSandbox {
            cgroup_parent: "/kubepods/pod1".into(),
            pod_resources: some(resources_to_pb(&full())),
            ..Default::default()
        });
        let d = pod_from_pb(&p);
        assert_eq!(d.full_name(), "ns/web");
        assert_eq!(d.cgroup_parent, "/kubepods/pod1");
        assert_eq!(d.resources, Some(full()));
        assert_eq!(d.overhead, None);
    }

    /// CRI-O names a container from kubelet's label; where the runtime leaves a name empty the
    /// label stands in, and a name the runtime gives wins over the label.
    #[test]
    fn empty_names_come_from_kubelets_labels() {
        let mut c = pb::Container::new();
        c.labels.insert(CONTAINER_NAME_LABEL.into(), "app".into());
        assert_eq!(container_from_pb(&c).name, "app");
        c.name = "given".into();
        assert_eq!(container_from_pb(&c).name, "given");
        assert_eq!(container_from_pb(&pb::Container::new()).name, "");

        let mut p = pb::PodSandbox::new();
        for (k, v) in [
            (POD_NAME_LABEL, "web"),
            (POD_NAMESPACE_LABEL, "ns"),
            (POD_UID_LABEL, "u-1"),
        ] {
            p.labels.insert(k.into(), v.into());
        }
        let d = pod_from_pb(&p);
        assert_eq!((d.full_name().as_str(), d.uid.as_str()), ("ns/web", "u-1"));
        p.name = "given".into();
        assert_eq!(pod_from_pb(&p).full_name(), "ns/given");
    }

    #[test]
    fn unknown_container_state_is_unknown() {
        let mut c = pb::Container::new();
        c.state = EnumOrUnknown::from_i32(99);
        assert_eq!(container_from_pb(&c).state, ContainerState::Unknown);
    }
}
