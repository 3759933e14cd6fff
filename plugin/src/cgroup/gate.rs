//! Test builds only: cgroup reads held at a gate until the test opens it — a stuck cgroupfs
//! without a sleep, so a test asserts what is answered while the read is held, never how long
//! anything took. Writes, and everything else, pass straight through.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};

use super::{ActualResources, CgroupError, CgroupIo, CgroupVersion, Cgroups, CpuLimit};
use crate::policy::MemoryUse;
use crate::sync::Locked as _;

/// The gate: closed when made; reads wait at it until [`Gate::open`].
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<(Mutex<GateState>, Condvar)>);

#[derive(Debug, Default)]
struct GateState {
    open: bool,
    /// Reads waiting at the gate now.
    held: usize,
}

impl Gate {
    /// Lets every held read, and every later one, through.
    pub fn open(&self) {
        let (state, cv) = &*self.0;
        state.locked().open = true;
        cv.notify_all();
    }

    /// A guard that opens the gate when dropped: a test that fails while reads are held still
    /// ends (the runtime waits for its blocking threads).
    #[must_use]
    pub fn open_on_drop(&self) -> OpenOnDrop {
        OpenOnDrop(self.clone())
    }

    /// Reads waiting at the gate now.
    pub fn held(&self) -> usize {
        self.0 .0.locked().held
    }

    fn pass(&self) {
        let (state, cv) = &*self.0;
        let mut s = state.locked();
        s.held += 1;
        while !s.open {
            s = cv
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        s.held -= 1;
    }
}

/// See [`Gate::open_on_drop`].
#[derive(Debug)]
pub struct OpenOnDrop(Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// `inner` with its reads of limits and usage held at a [`Gate`].
#[derive(Clone, Debug)]
pub struct Gated {
    inner: Box<Cgroups>,
    gate: Gate,
}

impl PartialEq for Gated {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && Arc::ptr_eq(&self.gate.0, &other.gate.0)
    }
}

impl Eq for Gated {}

impl Gated {
    /// `inner`, its reads held at a new, closed gate.
    pub fn wrap(inner: Cgroups) -> (Cgroups, Gate) {
        let gate = Gate::default();
        let gated = Gated {
            inner: Box::new(inner),
            gate: gate.clone(),
        };
        (Cgroups::Gated(gated), gate)
    }
}

impl CgroupIo for Gated {
    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }

    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError> {
        self.gate.pass();
        self.inner.read_actual(cgroup)
    }

    fn read_limits(&self, cgroup: &Path) -> Result<super::CgroupLimits, CgroupError> {
        self.gate.pass();
        self.inner.read_limits(cgroup)
    }

    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<super::CgroupLimits, CgroupError> {
        self.gate.pass();
        self.inner.read_limits_of(cgroup, cpu, memory)
    }

    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError> {
        self.inner.set_cpu_limit(cgroup, limit)
    }

    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError> {
        self.inner.set_memory_limit(cgroup, limit)
    }

    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError> {
        self.gate.pass();
        self.inner.memory_use(cgroup)
    }

    fn reclaim(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.inner.reclaim(cgroup, bytes)
    }

    fn set_memory_high(&self, cgroup: &Path, high: Option<u64>) -> Result<(), CgroupError> {
        self.inner.set_memory_high(cgroup, high)
    }

    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError> {
        self.inner.memory_high(cgroup)
    }

    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError> {
        self.inner.procs(cgroup)
    }

    fn memory_pressure(&self, cgroup: &Path) -> Result<super::StallTotals, CgroupError> {
        self.inner.memory_pressure(cgroup)
    }

    fn io_pressure(&self, cgroup: &Path) -> Result<super::StallTotals, CgroupError> {
        self.inner.io_pressure(cgroup)
    }

    fn workingset_refaults(&self, cgroup: &Path) -> Result<u64, CgroupError> {
        self.inner.workingset_refaults(cgroup)
    }

    fn cache_stat(&self, cgroup: &Path) -> Result<crate::policy::CacheStat, CgroupError> {
        self.inner.cache_stat(cgroup)
    }

    fn reclaim_page_cache(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.inner.reclaim_page_cache(cgroup, bytes)
    }
}
