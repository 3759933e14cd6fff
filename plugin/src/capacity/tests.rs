//! The watcher against a fixture root: diff → events, metrics, status, pinned containers.

use std::sync::Arc;

use super::snapshot::fixture::Fixture;
use super::*;
use crate::config::Config;
use crate::model::{Container, ContainerState, CpuResources, LinuxResources, Pod};

fn state(reserved_cpu: u64, reserved_memory: u64) -> Arc<NodeState> {
    let mut cfg = Config::default();
    cfg.resize.reserved_cpu_millicores = reserved_cpu;
    cfg.resize.reserved_memory = reserved_memory;
    NodeState::new(cfg)
}

fn trigger(source: Source, scope: Scope) -> Trigger {
    Trigger {
        source,
        scope,
        event_ns: Some(monotonic_ns()),
    }
}

fn metric_line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(prefix))
}

#[test]
fn first_reading_sets_capacity_allocatable_and_status() {
    let f = Fixture::new("0-3", 8);
    let state = state(500, 256 << 20);
    let w = Watcher::new(state.clone(), SysReader::new(f.path())).expect("watcher");
    let text = state.metrics.encode().expect("encode");
    for want in [
        "nri_resize_node_capacity_cpu_cores 4",
        "nri_resize_node_capacity_memory_bytes 1073741824",
        "nri_resize_node_allocatable_cpu_cores 3.5",
        "nri_resize_node_allocatable_memory_bytes 805306368",
        "nri_resize_node_offline_pinned_containers 0",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let st = state
        .capacity
        .read()
        .expect("lock")
        .clone()
        .expect("published");
    assert_eq!(&st, w.status());
    assert_eq!((st.online_cpus.as_str(), st.online_cpu_count), ("0-3", 4));
    assert_eq!(st.allocatable_cpu_millis, 3500);
    assert_eq!(st.memory_blocks_online, 8);
    assert!(st.last_change.is_none());
    let line = node_line(&st, st.updated_ms);
    assert!(
        line.starts_with("node: cpu 4 online (0-3) / 4 present, allocatable 3500m; memory 1Gi"),
        "{line}"
    );
    assert!(line.contains("no change since start"), "{line}");
}

#[test]
fn cpu_offline_then_online_counts_changes_and_measures_latency() {
    let f = Fixture::new("0-3", 2);
    let state = state(0, 0);
    let mut w = Watcher::new(state.clone(), SysReader::new(f.path())).expect("watcher");

    // An event with nothing changed yet (an early cpuhp step): no change, no latency sample.
    assert!(w.observe(&trigger(Source::Cpuhp, Scope::Cpu)).is_empty());

    f.set_cpus("0,2-3", "0-3");
    let changes = w.observe(&trigger(Source::Cpuhp, Scope::Cpu));
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].kind, ChangeKind::OnlineCpus);
    assert_eq!(changes[0].direction(), "down");

    f.set_cpus("0-3", "0-3");
    let changes = w.observe(&trigger(Source::Uevent, Scope::Cpu));
    assert_eq!(changes[0].direction(), "up");

    let text = state.metrics.encode().expect("encode");
    for want in [
        r#"nri_resize_node_capacity_changes_total{direction="down",resource="cpu"} 1"#,
        r#"nri_resize_node_capacity_changes_total{direction="up",resource="cpu"} 1"#,
        r#"nri_resize_node_capacity_detection_seconds_count{source="cpuhp"} 1"#,
        r#"nri_resize_node_capacity_detection_seconds_count{source="uevent"} 1"#,
        r#"nri_resize_node_capacity_events_total{source="cpuhp"} 2"#,
        "nri_resize_node_capacity_cpu_cores 4",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // Latency is measured, and below the 1 s the histogram's `le="1"` bucket holds.
    let bucket = metric_line(
        &text,
        r#"nri_resize_node_capacity_detection_seconds_bucket{source="cpuhp",le="1"}"#,
    )
    .expect("bucket");
    assert!(bucket.ends_with(" 1"), "{bucket}");

    let st = w.status();
    assert_eq!(st.changes, 2);
    let last = st.last_change.as_ref().expect("last change");
    assert_eq!(last.source, "uevent");
    assert!(last.detection_latency_ms.is_some_and(|ms| ms >= 0.0));
    assert_eq!(
        last.changes[0].cpus,
        Some(("0,2-3".to_string(), "0-3".to_string()))
    );
}

#[test]
fn memory_hotplug_add_then_online_and_resync_catches_missed_changes() {
    let f = Fixture::new("0-1", 4);
    let state = state(0, 0);
    let mut w = Watcher::new(state.clone(), SysReader::new(f.path())).expect("watcher");

    // A block added offline: present blocks change, capacity does not.
    f.add_block(4, false);
    let changes = w.observe(&trigger(Source::Uevent, Scope::Memory));
    assert_eq!(
        changes.iter().map(|c| c.kind).collect::<Vec<_>>(),
        [ChangeKind::MemoryBlocksPresent]
    );
    // A CPU-scoped trigger does not look at memory.
    f.set_block(4, true);
    f.set_mem_total_kib(5 * 128 * 1024);
    assert!(w.observe(&trigger(Source::Cpuhp, Scope::Cpu)).is_empty());
    // The resync re-reads everything and catches it (no latency: nothing to measure from).
    let changes = w.observe(&Trigger {
        source: Source::Resync,
        scope: Scope::All,
        event_ns: None,
    });
    assert_eq!(
        changes.iter().map(|c| c.kind).collect::<Vec<_>>(),
        [ChangeKind::MemoryTotal, ChangeKind::MemoryBlocksOnline]
    );
    let text = state.metrics.encode().expect("encode");
    assert!(
        text.contains(
            r#"nri_resize_node_capacity_changes_total{direction="up",resource="memory"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "nri_resize_node_capacity_memory_bytes {}",
            5u64 * 128 * 1024 * 1024
        )),
        "{text}"
    );
    assert!(
        !text.contains("detection_seconds_count{source=\"resync\"}"),
        "{text}"
    );
    assert_eq!(w.status().memory_blocks_present, 5);
    assert_eq!(
        w.status()
            .last_change
            .as_ref()
            .expect("last")
            .detection_latency_ms,
        None
    );
}

#[test]
fn unreadable_node_keeps_the_last_reading_and_says_why() {
    let f = Fixture::new("0-1", 1);
    let state = state(0, 0);
    let mut w = Watcher::new(state.clone(), SysReader::new(f.path())).expect("watcher");
    f.write("sys/devices/system/cpu/online", "garbage\n");
    assert!(w.observe(&trigger(Source::Uevent, Scope::Cpu)).is_empty());
    let st = state
        .capacity
        .read()
        .expect("lock")
        .clone()
        .expect("status");
    assert_eq!(st.online_cpu_count, 2);
    assert!(
        st.read_error
            .as_deref()
            .is_some_and(|e| e.contains("cpu/online")),
        "{st:?}"
    );
    assert!(node_line(&st, 0).contains("READ ERROR"));
    f.set_cpus("0-1", "0-1");
    w.observe(&trigger(Source::Uevent, Scope::Cpu));
    assert_eq!(w.status().read_error, None);
}

#[test]
fn first_reading_of_a_broken_root_is_an_error() {
    let err = Watcher::new(state(0, 0), SysReader::new("/nonexistent-capacity-root"))
        .expect_err("no node");
    assert!(
        err.to_string().contains("/nonexistent-capacity-root"),
        "{err}"
    );
}

fn pinned(id: &str, pod: &str, cpus: &str) -> Container {
    Container {
        id: id.into(),
        pod_id: pod.into(),
        name: format!("ctr-{id}"),
        state: ContainerState::Running,
        resources: Some(LinuxResources {
            cpu: Some(CpuResources {
                cpus: cpus.into(),
                ..CpuResources::default()
            }),
            ..LinuxResources::default()
        }),
        ..Container::default()
    }
}

#[test]
fn containers_pinned_to_offline_cpus_are_reported() {
    let f = Fixture::new("0-3", 1);
    let state = state(0, 0);
    state.write_model(|m| {
        m.upsert_pod(Pod {
            id: "p".into(),
            namespace: "ns".into(),
            name: "web".into(),
            ..Pod::default()
        });
        m.upsert_container(pinned("a", "p", "2-3"));
        m.upsert_container(pinned("b", "p", "0"));
        m.upsert_container(pinned("c", "p", ""));
        let mut stopped = pinned("d", "p", "3");
        stopped.state = ContainerState::Stopped;
        m.upsert_container(stopped);
    });
    let mut w = Watcher::new(state.clone(), SysReader::new(f.path())).expect("watcher");
    assert!(w.status().pinned_to_offline.is_empty());

    f.set_cpus("0-2", "0-3");
    w.observe(&trigger(Source::Uevent, Scope::Cpu));
    let p = &w.status().pinned_to_offline;
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        (
            p[0].container_id.as_str(),
            p[0].namespace.as_str(),
            p[0].pod.as_str(),
            p[0].cpuset.as_str(),
            p[0].offline_cpus.as_str()
        ),
        ("a", "ns", "web", "2-3", "3")
    );
    let text = state.metrics.encode().expect("encode");
    assert!(
        text.contains("nri_resize_node_offline_pinned_containers 1"),
        "{text}"
    );
    assert!(node_line(w.status(), 0).contains("1 container(s) pinned"));

    f.set_cpus("0-3", "0-3");
    w.observe(&trigger(Source::Uevent, Scope::Cpu));
    assert!(w.status().pinned_to_offline.is_empty());
    let text = state.metrics.encode().expect("encode");
    assert!(
        text.contains("nri_resize_node_offline_pinned_containers 0"),
        "{text}"
    );
}

#[test]
fn triggers_merge_to_the_widest_scope_and_earliest_event() {
    let mut a = Trigger {
        source: Source::Resync,
        scope: Scope::Cpu,
        event_ns: None,
    };
    a.merge(&Trigger {
        source: Source::Cpuhp,
        scope: Scope::Cpu,
        event_ns: Some(20),
    });
    assert_eq!(
        (a.source, a.scope, a.event_ns),
        (Source::Cpuhp, Scope::Cpu, Some(20))
    );
    a.merge(&Trigger {
        source: Source::Uevent,
        scope: Scope::Memory,
        event_ns: Some(10),
    });
    assert_eq!(
        (a.source, a.scope, a.event_ns),
        (Source::Cpuhp, Scope::All, Some(10))
    );
}

/// The task end to end on a fixture: no eBPF ring and no uevent socket, so only the resync
/// finds the change (paused time: the 60 s interval passes at once).
#[tokio::test(start_paused = true)]
async fn the_task_resyncs_and_stops_on_cancel() {
    let f = Fixture::new("0-3", 1);
    let state = state(0, 0);
    let w = Watcher::new(state.clone(), SysReader::new(f.path())).expect("watcher");
    let cancel = CancellationToken::new();
    let opts = WatcherOptions {
        root: f.path().to_owned(),
        resync_interval: Duration::from_secs(60),
        settle: Duration::from_millis(50),
        uevents: false,
    };
    let task = tokio::spawn(run(w, None, None, opts, cancel.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let st = state
        .capacity
        .read()
        .expect("lock")
        .clone()
        .expect("status");
    assert_eq!(st.sources, ["resync"]);
    f.set_cpus("0-1", "0-3");
    tokio::time::sleep(Duration::from_secs(61)).await;
    let st = state
        .capacity
        .read()
        .expect("lock")
        .clone()
        .expect("status");
    assert_eq!(st.online_cpu_count, 2, "{st:?}");
    assert_eq!(st.last_change.expect("change").source, "resync");
    cancel.cancel();
    task.await.expect("task ends");
}
