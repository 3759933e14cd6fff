//! Test fixtures of the model's types, shared by the unit tests of the modules above it.

use super::{CpuResources, LinuxResources, MemoryResources};

/// Linux resources with a CFS quota per `period` µs and a memory limit in bytes.
pub fn res(quota: i64, period: u64, mem: i64) -> LinuxResources {
    LinuxResources {
        cpu: Some(CpuResources {
            quota: Some(quota),
            period: Some(period),
            ..CpuResources::default()
        }),
        memory: Some(MemoryResources {
            limit: Some(mem),
            ..MemoryResources::default()
        }),
        ..LinuxResources::default()
    }
}
