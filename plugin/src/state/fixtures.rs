//! Test fixtures: pods, containers and resources for the state's unit tests.

use crate::cgroup::ActualResources;
use crate::model::{Container, Pod};

pub use crate::model::fixtures::res;

pub fn actual(quota: i64, period: u64, mem: i64) -> ActualResources {
    ActualResources {
        cpu_quota: Some(quota),
        cpu_period: Some(period),
        memory_limit: Some(mem),
        ..ActualResources::default()
    }
}

pub fn pod(id: &str) -> Pod {
    Pod {
        id: id.into(),
        namespace: "ns".into(),
        name: format!("pod-{id}"),
        ..Pod::default()
    }
}

pub fn ctr(id: &str, pod: &str, name: &str) -> Container {
    Container {
        id: id.into(),
        pod_id: pod.into(),
        name: name.into(),
        cgroups_path: format!("/test/{pod}/{id}"),
        resources: Some(res(10_000, 100_000, 64 << 20)),
        ..Container::default()
    }
}
