//! Which container a person means: a container id, or `namespace/pod/container` as the status
//! table shows it, resolved against the status API's answer.

use super::Status;

/// Why a container reference names no single container.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("no container {reference:?} on this node (see `nri-resize status`)")]
    Unknown { reference: String },
    #[error("{reference:?} names {} containers ({}); give the container id instead", ids.len(), ids.join(", "))]
    Ambiguous { reference: String, ids: Vec<String> },
    #[error("{reference:?} is neither a container id nor namespace/pod/container")]
    Malformed { reference: String },
}

/// The container id `reference` names: `namespace/pod/container` is looked up in `status` (one
/// container must match), anything without a `/` is taken as an id and must be known too.
pub fn resolve_container(status: &Status, reference: &str) -> Result<String, ResolveError> {
    let ids: Vec<String> = match reference.split('/').collect::<Vec<_>>()[..] {
        [id] if !id.is_empty() => status
            .pods
            .iter()
            .flat_map(|p| &p.containers)
            .filter(|c| c.id == id)
            .map(|c| c.id.clone())
            .collect(),
        [namespace, pod, container]
            if !namespace.is_empty() && !pod.is_empty() && !container.is_empty() =>
        {
            status
                .pods
                .iter()
                .filter(|p| p.pod.namespace == namespace && p.pod.name == pod)
                .flat_map(|p| &p.containers)
                .filter(|c| c.name == container)
                .map(|c| c.id.clone())
                .collect()
        }
        _ => {
            return Err(ResolveError::Malformed {
                reference: reference.to_string(),
            })
        }
    };
    match &ids[..] {
        [id] => Ok(id.clone()),
        [] => Err(ResolveError::Unknown {
            reference: reference.to_string(),
        }),
        _ => Err(ResolveError::Ambiguous {
            reference: reference.to_string(),
            ids,
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::api::{ContainerStatus, LinkStatusView, PodStatus};
    use crate::model::{Container, Pod};

    fn pod(id: &str, namespace: &str, name: &str, containers: &[(&str, &str)]) -> PodStatus {
        PodStatus {
            pod: Pod {
                id: id.into(),
                name: name.into(),
                namespace: namespace.into(),
                ..Pod::default()
            },
            containers: containers
                .iter()
                .map(|(cid, cname)| ContainerStatus {
                    container: Container {
                        id: (*cid).into(),
                        pod_id: id.into(),
                        name: (*cname).into(),
                        ..Container::default()
                    },
                    observed: None,
                    trim: None,
                })
                .collect(),
            pod_level: None,
        }
    }

    fn status() -> Status {
        Status {
            runtime: LinkStatusView::up(),
            pods: vec![
                pod("s1", "default", "web", &[("c1", "app"), ("c2", "sidecar")]),
                pod("s2", "shop", "web", &[("c3", "app")]),
                // The same pod twice (an old sandbox still known beside its successor).
                pod("s3", "batch", "job", &[("c4", "worker")]),
                pod("s4", "batch", "job", &[("c5", "worker")]),
            ],
            observer: None,
            metrics_addr: None,
            state_dir: crate::state::StateDirStatus::default(),
            node: None,
            reserve: None,
        }
    }

    #[test]
    fn namespace_pod_container_resolves_to_its_id() {
        let s = status();
        assert_eq!(resolve_container(&s, "default/web/app").unwrap(), "c1");
        assert_eq!(resolve_container(&s, "default/web/sidecar").unwrap(), "c2");
        assert_eq!(resolve_container(&s, "shop/web/app").unwrap(), "c3");
        assert_eq!(resolve_container(&s, "c4").unwrap(), "c4");
    }

    #[test]
    fn unknown_ambiguous_and_malformed_references_say_so() {
        let s = status();
        for unknown in ["default/web/db", "default/api/app", "c9"] {
            let err = resolve_container(&s, unknown).unwrap_err();
            assert!(
                matches!(err, ResolveError::Unknown { .. }),
                "{unknown}: {err}"
            );
            assert!(err.to_string().contains(unknown), "{err}");
        }
        let err = resolve_container(&s, "batch/job/worker").unwrap_err();
        assert_eq!(
            err,
            ResolveError::Ambiguous {
                reference: "batch/job/worker".into(),
                ids: vec!["c4".into(), "c5".into()]
            }
        );
        assert!(err.to_string().contains("c4, c5"), "{err}");
        for bad in ["", "default/web", "a/b/c/d", "default//app", "/web/app"] {
            assert!(
                matches!(
                    resolve_container(&s, bad),
                    Err(ResolveError::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
