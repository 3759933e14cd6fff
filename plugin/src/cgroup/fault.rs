//! Test builds only (cargo feature `fault-injection`, which release builds and the image never
//! enable): cgroup I/O made slow on purpose, to prove that a stuck cgroupfs cannot hold an NRI
//! handler past the runtime's deadline.
//!
//! `NRI_RESIZE_FAULT_SLOW_CGROUP=<ms>:<flag file>`: while the flag file exists, every cgroup
//! read and write of the resize engine and the confirmation on the cgroup the file names (its
//! content, e.g. `/kubepods/pod1234`; empty: every cgroup) sleeps `<ms>` first. A test creates
//! the file to make one update slow and removes it to prove the next one is handled normally.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ActualResources, CgroupError, CgroupIo, CgroupVersion, Cgroups, CpuLimit};
use crate::policy::MemoryUse;

/// The environment variable (see the module docs).
pub const ENV: &str = "NRI_RESIZE_FAULT_SLOW_CGROUP";

/// See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slow {
    inner: Box<Cgroups>,
    delay: Duration,
    flag: PathBuf,
}

impl Slow {
    fn pause(&self, cgroup: &Path) {
        let Ok(only) = std::fs::read_to_string(&self.flag) else {
            return;
        };
        let only = only.trim();
        if only.is_empty() || Path::new(only) == cgroup {
            tracing::warn!(delay_ms = self.delay.as_millis(), cgroup = %cgroup.display(), "fault injection: cgroup I/O held back");
            std::thread::sleep(self.delay);
        }
    }
}

/// A malformed [`ENV`] value.
#[derive(Debug, thiserror::Error)]
pub enum FaultSpecError {
    #[error("{}={spec:?}: expected <ms>:<flag file>", ENV)]
    Format { spec: String },
    #[error("{}={spec:?}: delay: {source}", ENV)]
    Delay {
        spec: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

/// `cgroups`, slowed when [`ENV`] asks for it; a malformed value is an error (a test that set
/// it wants it).
pub fn from_env(cgroups: Cgroups) -> Result<Cgroups, FaultSpecError> {
    let Ok(spec) = std::env::var(ENV) else {
        return Ok(cgroups);
    };
    let Some((ms, flag)) = spec.split_once(':') else {
        return Err(FaultSpecError::Format { spec });
    };
    let ms: u64 = ms.parse().map_err(|source| FaultSpecError::Delay {
        spec: spec.clone(),
        source,
    })?;
    tracing::warn!(delay_ms = ms, flag = %flag, "fault injection active: cgroup I/O slowed while the flag file exists");
    Ok(Cgroups::Slow(Slow {
        inner: Box::new(cgroups),
        delay: Duration::from_millis(ms),
        flag: PathBuf::from(flag),
    }))
}

impl CgroupIo for Slow {
    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }

    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError> {
        self.pause(cgroup);
        self.inner.read_actual(cgroup)
    }

    fn read_limits(&self, cgroup: &Path) -> Result<super::CgroupLimits, CgroupError> {
        self.pause(cgroup);
        self.inner.read_limits(cgroup)
    }

    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<super::CgroupLimits, CgroupError> {
        self.pause(cgroup);
        self.inner.read_limits_of(cgroup, cpu, memory)
    }

    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError> {
        self.pause(cgroup);
        self.inner.set_cpu_limit(cgroup, limit)
    }

    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError> {
        self.pause(cgroup);
        self.inner.set_memory_limit(cgroup, limit)
    }

    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError> {
        self.pause(cgroup);
        self.inner.memory_use(cgroup)
    }

    fn reclaim(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.pause(cgroup);
        self.inner.reclaim(cgroup, bytes)
    }

    fn set_memory_high(&self, cgroup: &Path, high: Option<u64>) -> Result<(), CgroupError> {
        self.pause(cgroup);
        self.inner.set_memory_high(cgroup, high)
    }

    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError> {
        self.pause(cgroup);
        self.inner.memory_high(cgroup)
    }

    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError> {
        self.pause(cgroup);
        self.inner.procs(cgroup)
    }

    fn memory_pressure(&self, cgroup: &Path) -> Result<super::StallTotals, CgroupError> {
        self.pause(cgroup);
        self.inner.memory_pressure(cgroup)
    }

    fn io_pressure(&self, cgroup: &Path) -> Result<super::StallTotals, CgroupError> {
        self.pause(cgroup);
        self.inner.io_pressure(cgroup)
    }

    fn workingset_refaults(&self, cgroup: &Path) -> Result<u64, CgroupError> {
        self.pause(cgroup);
        self.inner.workingset_refaults(cgroup)
    }

    fn cache_stat(&self, cgroup: &Path) -> Result<crate::policy::CacheStat, CgroupError> {
        self.pause(cgroup);
        self.inner.cache_stat(cgroup)
    }

    fn reclaim_page_cache(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.pause(cgroup);
        self.inner.reclaim_page_cache(cgroup, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_spec_names_the_variable_and_the_problem() {
        let spec = "soon:/tmp/flag".to_string();
        let source = "soon".parse::<u64>().unwrap_err();
        assert_eq!(
            FaultSpecError::Delay { spec, source }.to_string(),
            "NRI_RESIZE_FAULT_SLOW_CGROUP=\"soon:/tmp/flag\": delay: invalid digit found in string"
        );
        assert_eq!(
            FaultSpecError::Format { spec: "500".into() }.to_string(),
            "NRI_RESIZE_FAULT_SLOW_CGROUP=\"500\": expected <ms>:<flag file>"
        );
    }
}
