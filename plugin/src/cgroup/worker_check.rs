//! Test builds only: cgroup I/O that notes every call made on the async worker thread, so a
//! unit test fails when an engine path does blocking cgroup I/O on a tokio worker instead of
//! a blocking thread.
//!
//! Run the test on a current-thread runtime (`#[tokio::test]`'s default): its only worker is the
//! test's own thread, which [`OffWorkerOnly::wrap`] takes as the thread to watch; blocking
//! threads (`spawn_blocking`) are others.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use super::{ActualResources, CgroupError, CgroupIo, CgroupVersion, Cgroups, CpuLimit};
use crate::policy::MemoryUse;
use crate::sync::Locked as _;

/// The calls made on the worker thread: `"read_actual /kubepods/pod1"`, in order.
pub type OnWorker = Arc<Mutex<Vec<String>>>;

/// See the module docs.
#[derive(Clone, Debug)]
pub struct OffWorkerOnly {
    inner: Box<Cgroups>,
    worker: ThreadId,
    on_worker: OnWorker,
}

impl PartialEq for OffWorkerOnly {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
            && self.worker == other.worker
            && Arc::ptr_eq(&self.on_worker, &other.on_worker)
    }
}

impl Eq for OffWorkerOnly {}

impl OffWorkerOnly {
    /// `inner`, watched for calls on the current thread (the runtime's worker).
    pub fn wrap(inner: Cgroups) -> (Cgroups, OnWorker) {
        let on_worker = OnWorker::default();
        let checked = OffWorkerOnly {
            inner: Box::new(inner),
            worker: std::thread::current().id(),
            on_worker: Arc::clone(&on_worker),
        };
        (Cgroups::OffWorkerOnly(checked), on_worker)
    }

    fn check(&self, what: &str, cgroup: &Path) {
        if std::thread::current().id() == self.worker {
            self.on_worker
                .locked()
                .push(format!("{what} {}", cgroup.display()));
        }
    }
}

impl CgroupIo for OffWorkerOnly {
    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }

    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError> {
        self.check("read_actual", cgroup);
        self.inner.read_actual(cgroup)
    }

    fn read_limits(&self, cgroup: &Path) -> Result<super::CgroupLimits, CgroupError> {
        self.check("read_limits", cgroup);
        self.inner.read_limits(cgroup)
    }

    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<super::CgroupLimits, CgroupError> {
        self.check("read_limits_of", cgroup);
        self.inner.read_limits_of(cgroup, cpu, memory)
    }

    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError> {
        self.check("set_cpu_limit", cgroup);
        self.inner.set_cpu_limit(cgroup, limit)
    }

    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError> {
        self.check("set_memory_limit", cgroup);
        self.inner.set_memory_limit(cgroup, limit)
    }

    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError> {
        self.check("memory_use", cgroup);
        self.inner.memory_use(cgroup)
    }

    fn reclaim(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.check("reclaim", cgroup);
        self.inner.reclaim(cgroup, bytes)
    }

    fn set_memory_high(&self, cgroup: &Path, high: Option<u64>) -> Result<(), CgroupError> {
        self.check("set_memory_high", cgroup);
        self.inner.set_memory_high(cgroup, high)
    }

    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError> {
        self.check("memory_high", cgroup);
        self.inner.memory_high(cgroup)
    }

    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError> {
        self.check("procs", cgroup);
        self.inner.procs(cgroup)
    }

    fn memory_pressure(&self, cgroup: &Path) -> Result<super::StallTotals, CgroupError> {
        self.check("memory_pressure", cgroup);
        self.inner.memory_pressure(cgroup)
    }

    fn io_pressure(&self, cgroup: &Path) -> Result<super::StallTotals, CgroupError> {
        self.check("io_pressure", cgroup);
        self.inner.io_pressure(cgroup)
    }

    fn workingset_refaults(&self, cgroup: &Path) -> Result<u64, CgroupError> {
        self.check("workingset_refaults", cgroup);
        self.inner.workingset_refaults(cgroup)
    }

    fn cache_stat(&self, cgroup: &Path) -> Result<crate::policy::CacheStat, CgroupError> {
        self.check("cache_stat", cgroup);
        self.inner.cache_stat(cgroup)
    }

    fn reclaim_page_cache(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.check("reclaim_page_cache", cgroup);
        self.inner.reclaim_page_cache(cgroup, bytes)
    }
}
