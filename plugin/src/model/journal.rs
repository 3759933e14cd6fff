//! A bounded journal of the events the plugin saw, for the status API and for people debugging
//! a node ("did the plugin see that update, and with which resources?").

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::LinuxResources;

/// Pod and container lifecycle events, in NRI's numbering (the subscription bit is `1 << (n - 1)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum EventKind {
    RunPodSandbox = 1,
    StopPodSandbox = 2,
    RemovePodSandbox = 3,
    CreateContainer = 4,
    PostCreateContainer = 5,
    StartContainer = 6,
    PostStartContainer = 7,
    UpdateContainer = 8,
    PostUpdateContainer = 9,
    StopContainer = 10,
    RemoveContainer = 11,
    UpdatePodSandbox = 12,
    PostUpdatePodSandbox = 13,
    ValidateContainerAdjustment = 14,
    /// Not an NRI event: the runtime's full state arrived (`Synchronize`).
    Synchronize = 100,
}

impl EventKind {
    /// All subscribable events.
    pub const ALL: [EventKind; 14] = [
        EventKind::RunPodSandbox,
        EventKind::StopPodSandbox,
        EventKind::RemovePodSandbox,
        EventKind::CreateContainer,
        EventKind::PostCreateContainer,
        EventKind::StartContainer,
        EventKind::PostStartContainer,
        EventKind::UpdateContainer,
        EventKind::PostUpdateContainer,
        EventKind::StopContainer,
        EventKind::RemoveContainer,
        EventKind::UpdatePodSandbox,
        EventKind::PostUpdatePodSandbox,
        EventKind::ValidateContainerAdjustment,
    ];

    /// NRI's event number.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The event's NRI number as a kind, if it is one we know.
    pub fn from_number(n: i32) -> Option<EventKind> {
        Self::ALL.into_iter().find(|k| i32::from(k.number()) == n)
    }

    /// `snake_case` name (metric label value, log field).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunPodSandbox => "run_pod_sandbox",
            EventKind::StopPodSandbox => "stop_pod_sandbox",
            EventKind::RemovePodSandbox => "remove_pod_sandbox",
            EventKind::CreateContainer => "create_container",
            EventKind::PostCreateContainer => "post_create_container",
            EventKind::StartContainer => "start_container",
            EventKind::PostStartContainer => "post_start_container",
            EventKind::UpdateContainer => "update_container",
            EventKind::PostUpdateContainer => "post_update_container",
            EventKind::StopContainer => "stop_container",
            EventKind::RemoveContainer => "remove_container",
            EventKind::UpdatePodSandbox => "update_pod_sandbox",
            EventKind::PostUpdatePodSandbox => "post_update_pod_sandbox",
            EventKind::ValidateContainerAdjustment => "validate_container_adjustment",
            EventKind::Synchronize => "synchronize",
        }
    }
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// Monotonic sequence number (never reused while the process lives).
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub event: EventKind,
    pub pod_id: String,
    /// `namespace/name`.
    pub pod: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub container_id: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub container: String,
    /// The resources the event carried: the container's for container events, the requested
    /// ones for `update_container`, the pod's for pod events.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resources: Option<LinuxResources>,
}

/// A ring buffer of the latest events.
#[derive(Debug, Clone)]
pub struct Journal {
    capacity: usize,
    next_seq: u64,
    records: VecDeque<EventRecord>,
}

impl Journal {
    pub fn new(capacity: usize) -> Self {
        Journal {
            capacity: capacity.max(1),
            next_seq: 1,
            records: VecDeque::with_capacity(capacity.clamp(1, 4096)),
        }
    }

    /// Appends a record, assigning its sequence number and time.
    pub fn push(&mut self, mut record: EventRecord) -> u64 {
        record.seq = self.next_seq;
        self.next_seq += 1;
        if record.time_ms == 0 {
            record.time_ms = crate::clock::now_ms();
        }
        if self.records.len() == self.capacity {
            self.records.pop_front();
        }
        self.records.push_back(record);
        self.next_seq - 1
    }

    /// Records with `seq > since`, oldest first.
    pub fn since(&self, since: u64) -> Vec<EventRecord> {
        let start = self.records.partition_point(|r| r.seq <= since);
        self.records.range(start..).cloned().collect()
    }

    /// Keeps at most `capacity` records from now on (the oldest go first).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        while self.records.len() > self.capacity {
            self.records.pop_front();
        }
    }

    /// How many records it keeps at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sequence number of the newest record (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(event: EventKind) -> EventRecord {
        EventRecord {
            seq: 0,
            time_ms: 0,
            event,
            pod_id: "p".into(),
            pod: "ns/p".into(),
            container_id: String::new(),
            container: String::new(),
            resources: None,
        }
    }

    #[test]
    fn capacity_can_shrink_and_grow() {
        let mut j = Journal::new(4);
        for _ in 0..4 {
            j.push(rec(EventKind::CreateContainer));
        }
        j.set_capacity(2);
        assert_eq!(j.since(0).iter().map(|r| r.seq).collect::<Vec<_>>(), [3, 4]);
        j.set_capacity(10);
        j.push(rec(EventKind::CreateContainer));
        assert_eq!(j.since(0).len(), 3);
        assert_eq!(j.capacity(), 10);
    }

    #[test]
    fn keeps_the_latest_and_filters_by_seq() {
        let mut j = Journal::new(3);
        for _ in 0..5 {
            j.push(rec(EventKind::CreateContainer));
        }
        let all: Vec<u64> = j.since(0).iter().map(|r| r.seq).collect();
        assert_eq!(all, [3, 4, 5]);
        let newer: Vec<u64> = j.since(4).iter().map(|r| r.seq).collect();
        assert_eq!(newer, [5]);
        assert_eq!(j.last_seq(), 5);
        assert!(j.since(0)[0].time_ms > 0);
    }

    #[test]
    fn event_numbers_round_trip() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::from_number(i32::from(k.number())), Some(k));
        }
        assert_eq!(EventKind::from_number(0), None);
        assert_eq!(EventKind::from_number(15), None);
    }
}
