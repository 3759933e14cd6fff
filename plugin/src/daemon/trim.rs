//! Feeds the [`Trimmer`] the node's containers: the observer's watched set (which the NRI
//! handler keeps: created, removed, resynchronized), each with its cgroup and its pod's
//! annotations from the model, at every `[trim] interval`. The trimmer does the rest.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cgroup;
use crate::state::NodeState;
use crate::sync::ReadWriteLocked as _;
use crate::trim::{TrimTarget, Trimmer};

/// The containers as the trimmer wants them, by id; a container whose cgroup path does not
/// resolve is left out (the observer logs it).
fn targets(state: &NodeState) -> HashMap<String, TrimTarget> {
    let watched: Vec<(String, crate::state::Target)> = state.observed(|o| {
        o.targets
            .iter()
            .map(|(id, t)| (id.clone(), t.clone()))
            .collect()
    });
    state.read_model(|m| {
        watched
            .into_iter()
            .filter_map(|(id, t)| {
                let cgroup = cgroup::container_path(&t.cgroups_path).ok()?;
                let annotations = m
                    .pod(&t.pod_id)
                    .map(|p| p.annotations.clone())
                    .unwrap_or_default();
                Some((
                    id,
                    TrimTarget {
                        labels: t.labels,
                        cgroup,
                        annotations,
                    },
                ))
            })
            .collect()
    })
}

/// Starts the feeding task; it ends with `cancel`.
pub(super) fn feed(
    state: Arc<NodeState>,
    trimmer: Trimmer,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            trimmer.sync(targets(&state));
            let interval = state.config.read_locked().trim.interval;
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = cancel.cancelled() => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Container, Pod};

    #[test]
    fn containers_come_with_their_cgroup_and_their_pods_annotations() {
        let state = NodeState::new(crate::config::Config::default());
        let pod = Pod {
            id: "p1".into(),
            name: "web".into(),
            namespace: "default".into(),
            annotations: [("trim.nri-resize.io/pod".to_owned(), "on".to_owned())].into(),
            ..Pod::default()
        };
        let ctr = Container {
            id: "c1".into(),
            pod_id: "p1".into(),
            name: "app".into(),
            cgroups_path: "/kubepods/pod1/c1".into(),
            ..Container::default()
        };
        let bad = Container {
            id: "c2".into(),
            pod_id: "p1".into(),
            name: "bad".into(),
            cgroups_path: "/kubepods/../etc".into(),
            ..Container::default()
        };
        state.write_model(|m| m.upsert_pod(pod.clone()));
        state.track(&pod, &ctr);
        state.track(&pod, &bad);
        let t = targets(&state);
        assert_eq!(t.len(), 1, "the unresolvable path is left out: {t:?}");
        let c1 = &t["c1"];
        assert_eq!(c1.cgroup, std::path::PathBuf::from("/kubepods/pod1/c1"));
        assert_eq!(c1.labels.container, "app");
        assert_eq!(c1.annotations["trim.nri-resize.io/pod"], "on");
    }
}
