//! What differs between the kubelet versions whose resize path the tests play.
//!
//! Everything else in the model (write order, request contents, retries, conditions) is the
//! same from 1.33 to 1.37; only the two questions below change.

/// The kubelet whose resize path a test plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletVersion {
    /// 1.33: no usage check; a memory decrease reaches the runtime whatever the usage.
    V1_33,
    /// 1.34 and 1.35: `validateMemoryResizeAction` (kubernetes/kubernetes#133012) reads the
    /// container's usage before lowering its limit, and the pod's before lowering the pod's;
    /// `UpdatePodSandboxResources` follows the pod cgroup write, its error ignored.
    V1_34,
    /// 1.36 and 1.37: as 1.34, and `UpdatePodSandboxResources` precedes each pod cgroup write
    /// (kubernetes/kubernetes#137555, KEP-5419 beta): an error blocks the write, and a failed
    /// write is followed by a second call with the previous resources (the revert).
    V1_36,
}

/// When kubelet tells the runtime about the pod's new resources (CRI
/// `UpdatePodSandboxResources`), relative to its own pod cgroup write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxUpdate {
    /// Not called by the model. Whether 1.33 calls it was not checked against its sources;
    /// the harness's 1.33 path never did, and the suites written against it stay as they are.
    NotCalled,
    /// After the pod cgroup write; an error is logged and ignored (1.34, 1.35).
    AfterWriteIgnored,
    /// Before each pod cgroup write; an error (other than `Unimplemented`) fails the sync, a
    /// failed write is followed by a revert call (1.36+, kubernetes/kubernetes#137555).
    BeforeWriteBlocking,
}

impl KubeletVersion {
    /// Whether kubelet reads usage before lowering a memory limit (≥ 1.34,
    /// `validateMemoryResizeAction` in `pkg/kubelet/kuberuntime/kuberuntime_manager.go`,
    /// kubernetes/kubernetes#133012).
    pub fn checks_usage(self) -> bool {
        self != Self::V1_33
    }

    /// Where `UpdatePodSandboxResources` sits around the pod cgroup write (`doPodResizeAction`
    /// → `setPodCgroupConfig`; kubernetes/kubernetes#137555 moved it before the write in 1.36).
    pub fn sandbox_update(self) -> SandboxUpdate {
        match self {
            Self::V1_33 => SandboxUpdate::NotCalled,
            Self::V1_34 => SandboxUpdate::AfterWriteIgnored,
            Self::V1_36 => SandboxUpdate::BeforeWriteBlocking,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_1_33_skips_the_usage_check() {
        assert!(!KubeletVersion::V1_33.checks_usage());
        assert!(KubeletVersion::V1_34.checks_usage());
        assert!(KubeletVersion::V1_36.checks_usage());
    }

    #[test]
    fn the_sandbox_update_moves_before_the_write_in_1_36() {
        assert_eq!(
            KubeletVersion::V1_34.sandbox_update(),
            SandboxUpdate::AfterWriteIgnored
        );
        assert_eq!(
            KubeletVersion::V1_36.sandbox_update(),
            SandboxUpdate::BeforeWriteBlocking
        );
    }
}
