//! Feeds the [`Trimmer`] the node's containers trimming may concern: from the observer's
//! watched set (which the NRI handler keeps: created, removed, resynchronized), each with its
//! cgroup and its pod's annotations from the model, at every `[trim] interval`. The trimmer
//! does the rest.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cgroup;
use crate::policy::{TRIM_ANNOTATION, TRIM_MAX_STALL_ANNOTATION};
use crate::state::NodeState;
use crate::sync::ReadWriteLocked as _;
use crate::trim::{TrimTarget, Trimmer};

/// The containers trimming may concern, by id, as the trimmer wants them: every watched
/// container when the node trims by default (`[trim] enabled`), else those whose pod has a
/// trimming annotation (an opt-in, an opt-out, a stall target, or a bad value to report). The
/// others are not handed over at all: with trimming off, nothing is kept or done per container
/// (the feeder only looks at the pods' annotations). A container whose cgroup path does not
/// resolve is left out (the observer logs it).
fn targets(state: &NodeState) -> HashMap<String, TrimTarget> {
    let by_default = state.config.read_locked().trim.enabled;
    let pods: HashMap<String, BTreeMap<String, String>> = state.read_model(|m| {
        m.pods()
            .filter(|p| {
                by_default
                    || p.annotations.contains_key(TRIM_ANNOTATION)
                    || p.annotations.contains_key(TRIM_MAX_STALL_ANNOTATION)
            })
            .map(|p| (p.id.clone(), p.annotations.clone()))
            .collect()
    });
    if pods.is_empty() {
        return HashMap::new();
    }
    state.observed(|o| {
        o.targets
            .iter()
            .filter_map(|(id, t)| {
                let annotations = pods.get(&t.pod_id)?;
                let cgroup = cgroup::container_path(&t.cgroups_path).ok()?;
                Some((
                    id.clone(),
                    TrimTarget {
                        labels: t.labels.clone(),
                        cgroup,
                        annotations: annotations.clone(),
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
        // A pod that says nothing of trimming, on a node that does not trim by default: not
        // handed over (nothing kept per container while trimming is off).
        let quiet = Pod {
            id: "p2".into(),
            name: "db".into(),
            namespace: "default".into(),
            ..Pod::default()
        };
        let other = Container {
            id: "c3".into(),
            pod_id: "p2".into(),
            name: "db".into(),
            cgroups_path: "/kubepods/pod2/c3".into(),
            ..Container::default()
        };
        state.write_model(|m| m.upsert_pod(quiet.clone()));
        state.track(&quiet, &other);
        let t = targets(&state);
        assert_eq!(
            t.len(),
            1,
            "the unresolvable path and the quiet pod are left out: {t:?}"
        );
        let c1 = &t["c1"];
        assert_eq!(c1.cgroup, std::path::PathBuf::from("/kubepods/pod1/c1"));
        assert_eq!(c1.labels.container, "app");
        assert_eq!(c1.annotations["trim.nri-resize.io/pod"], "on");
        // Trimming on by default: every container is handed over.
        state.config.write_locked().trim.enabled = true;
        let t = targets(&state);
        assert_eq!(t.len(), 2, "{t:?}");
        assert!(t["c3"].annotations.is_empty());
    }
}
