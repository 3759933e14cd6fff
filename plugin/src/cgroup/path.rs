//! Where a container's and its pod's cgroups are, from what the runtime tells us over NRI.
//!
//! - cgroupfs driver: `cgroups_path` is an absolute path below the hierarchy root, e.g.
//!   `/kubepods/burstable/pod<uid>/<id>`, and the pod's `cgroup_parent` is `/kubepods/burstable/pod<uid>`.
//! - systemd driver: `cgroups_path` is `slice:prefix:name`, e.g.
//!   `kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`, which is the directory
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`;
//!   the pod's `cgroup_parent` is the slice name.
//!
//! Results are "absolute within the hierarchy" (`/a/b`): join them to a hierarchy root with
//! [`super::join_root`], which refuses anything that could leave the root.

use std::path::{Component, Path, PathBuf};

use super::CgroupError;

/// A container's cgroup and, when the runtime gave one, its pod's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCgroups {
    pub container: PathBuf,
    pub pod: Option<PathBuf>,
}

/// Resolves the container cgroup from NRI `cgroups_path` and the pod cgroup from the pod's
/// `cgroup_parent` (empty: unknown).
pub fn resolve(cgroups_path: &str, cgroup_parent: &str) -> Result<ContainerCgroups, CgroupError> {
    let container = container_path(cgroups_path)?;
    let pod = if cgroup_parent.is_empty() {
        None
    } else {
        Some(pod_path(cgroup_parent)?)
    };
    Ok(ContainerCgroups { container, pod })
}

/// The container cgroup of a `cgroups_path` (cgroupfs or systemd form).
pub fn container_path(cgroups_path: &str) -> Result<PathBuf, CgroupError> {
    if cgroups_path.is_empty() {
        return Err(CgroupError::EmptyPath);
    }
    if !cgroups_path.starts_with('/') && cgroups_path.matches(':').count() == 2 {
        let mut parts = cgroups_path.splitn(3, ':');
        let (slice, prefix, name) = (
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
            parts.next().unwrap_or_default(),
        );
        if name.is_empty() || name.contains('/') || prefix.contains('/') {
            return Err(CgroupError::BadSystemdPath {
                path: cgroups_path.to_owned(),
            });
        }
        // runc: an empty slice means `system.slice`.
        let slice = if slice.is_empty() {
            "system.slice"
        } else {
            slice
        };
        let mut dir = expand_slice(slice).map_err(|()| CgroupError::BadSystemdPath {
            path: cgroups_path.to_owned(),
        })?;
        let unit = if prefix.is_empty() {
            format!("{name}.scope")
        } else {
            format!("{prefix}-{name}.scope")
        };
        dir.push(unit);
        return validated(&dir.to_string_lossy());
    }
    validated(cgroups_path)
}

/// The pod cgroup of a `cgroup_parent`: a systemd slice name (`*.slice`, no `/`) or a path.
pub fn pod_path(cgroup_parent: &str) -> Result<PathBuf, CgroupError> {
    if cgroup_parent.is_empty() {
        return Err(CgroupError::EmptyPath);
    }
    if !cgroup_parent.contains('/')
        && Path::new(cgroup_parent)
            .extension()
            .is_some_and(|e| e == "slice")
    {
        return expand_slice(cgroup_parent).map_err(|()| CgroupError::BadSystemdPath {
            path: cgroup_parent.to_owned(),
        });
    }
    validated(cgroup_parent)
}

/// systemd's slice nesting: `a-b-c.slice` is `/a.slice/a-b.slice/a-b-c.slice`; `-.slice` is the root.
fn expand_slice(slice: &str) -> Result<PathBuf, ()> {
    let name = slice.strip_suffix(".slice").ok_or(())?;
    if name.contains('/') || name.is_empty() {
        return Err(());
    }
    let mut path = PathBuf::from("/");
    if name == "-" {
        return Ok(path);
    }
    let mut prefix = String::new();
    for part in name.split('-') {
        if part.is_empty() {
            return Err(());
        }
        path.push(format!("{prefix}{part}.slice"));
        prefix.push_str(part);
        prefix.push('-');
    }
    Ok(path)
}

/// An absolute path made only of normal components (no `..`, no `.`), as a `PathBuf`.
pub(super) fn validated(path: &str) -> Result<PathBuf, CgroupError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(CgroupError::RelativePath {
            path: path.to_owned(),
        });
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(part) => out.push(part),
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(CgroupError::Traversal {
                    path: path.to_owned(),
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroupfs_paths_are_taken_as_given() {
        let r = resolve(
            "/nri-resize-test-1-2/pod1234/abcd",
            "/nri-resize-test-1-2/pod1234",
        )
        .expect("resolve");
        assert_eq!(r.container, Path::new("/nri-resize-test-1-2/pod1234/abcd"));
        assert_eq!(
            r.pod.as_deref(),
            Some(Path::new("/nri-resize-test-1-2/pod1234"))
        );
        assert_eq!(resolve("/a/b", "").expect("resolve").pod, None);
    }

    #[test]
    fn systemd_form_expands_the_slice_and_names_the_scope() {
        let r = resolve(
            "kubepods-burstable-pod12.slice:cri-containerd:abc",
            "kubepods-burstable-pod12.slice",
        )
        .expect("resolve");
        assert_eq!(
            r.container,
            Path::new(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-containerd-abc.scope"
            )
        );
        assert_eq!(
            r.pod.as_deref(),
            Some(Path::new(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice"
            ))
        );
        assert_eq!(
            container_path("-.slice::x").expect("root slice"),
            Path::new("/x.scope")
        );
        assert_eq!(
            container_path(":p:x").expect("default slice"),
            Path::new("/system.slice/p-x.scope")
        );
    }

    #[test]
    fn bad_paths_are_errors_not_panics() {
        for (input, want) in [
            ("", "empty"),
            ("relative/path", "not absolute"),
            ("/a/../../etc", ".."),
            ("kubepods--x.slice:p:n", "slice:prefix:name"),
            ("kubepods.slice:p:", "slice:prefix:name"),
            ("kubepods:p:n", "slice:prefix:name"),
            ("a.slice:p:n/../x", "slice:prefix:name"),
        ] {
            let err = container_path(input).expect_err(input);
            assert!(err.to_string().contains(want), "{input:?}: {err}");
        }
        assert!(pod_path("../x").is_err());
        assert!(pod_path("/pod/../../x").is_err());
    }
}
