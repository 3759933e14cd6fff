//! [`ProbeError`]: why the running kernel cannot carry one of the observer's eBPF programs. It
//! is not fatal: the observer falls back to the next strategy and reports the reason (the
//! message is what `status` shows as the fallback's reason). Cloneable, because one lookup (the
//! task → cgroup chain, say) decides several programs.

use std::path::PathBuf;
use std::sync::Arc;

use super::ObserverError;

/// Why a program cannot be loaded or attached on this kernel.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum ProbeError {
    /// A type, member, enumerator or function the program needs is not in the kernel's BTF.
    #[error(transparent)]
    Btf(Arc<ObserverError>),
    /// `task_struct::throttled` is missing.
    #[error("{lookup} (kernel without task-based CFS throttling, added in 6.18)")]
    NoTaskThrottling { lookup: Arc<ObserverError> },
    /// No tracefs, and mounting one failed.
    #[error("tracefs not mounted and `mount -t tracefs tracefs {path}` failed: {source}")]
    TracefsMount {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    /// A tracepoint's `format` file cannot be read (the tracepoint is not there).
    #[error("read {path}: {source}")]
    TracepointFormat {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A tracepoint's record lacks a field the program reads.
    #[error("no field {name}")]
    NoField { name: &'static str },
    #[error("enum vm_event_item has none of the reclaim events")]
    NoReclaimEvents,
    #[error("oom/mark_victim passes no task_struct on this kernel (a pid only, before 6.8)")]
    MarkVictimPidOnly,
    #[error("no program {program} in the object")]
    NoProgram { program: &'static str },
    /// The object's program is not of the expected type.
    #[error(transparent)]
    ProgramType(Arc<aya::programs::ProgramError>),
    /// The verifier or the kernel refused the program.
    #[error("load: {source:#}")]
    Load {
        #[source]
        source: Arc<aya::programs::ProgramError>,
    },
    #[error("attach: {source:#}")]
    Attach {
        #[source]
        source: Arc<aya::programs::ProgramError>,
    },
    #[error("no map {map}")]
    NoMap { map: &'static str },
    /// The object's map is not of the expected type.
    #[error(transparent)]
    MapType(Arc<aya::maps::MapError>),
}

impl From<ObserverError> for ProbeError {
    fn from(e: ObserverError) -> Self {
        ProbeError::Btf(Arc::new(e))
    }
}

impl ProbeError {
    pub(super) fn load(e: aya::programs::ProgramError) -> Self {
        ProbeError::Load {
            source: Arc::new(e),
        }
    }

    pub(super) fn attach(e: aya::programs::ProgramError) -> Self {
        ProbeError::Attach {
            source: Arc::new(e),
        }
    }

    pub(super) fn program_type(e: aya::programs::ProgramError) -> Self {
        ProbeError::ProgramType(Arc::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_the_kernel_lacks() {
        let lookup = Arc::new(ObserverError::BtfLookup(
            "no member throttled in task_struct".into(),
        ));
        for (e, want) in [
            (
                ProbeError::NoTaskThrottling { lookup },
                "kernel BTF lookup: no member throttled in task_struct (kernel without task-based CFS throttling, added in 6.18)",
            ),
            (
                ProbeError::TracefsMount {
                    path: "/sys/kernel/tracing".into(),
                    source: nix::errno::Errno::EPERM,
                },
                "tracefs not mounted and `mount -t tracefs tracefs /sys/kernel/tracing` failed: EPERM: Operation not permitted",
            ),
            (ProbeError::NoField { name: "nr_reclaimed" }, "no field nr_reclaimed"),
            (
                ProbeError::NoProgram { program: "x" },
                "no program x in the object",
            ),
            (
                ProbeError::from(ObserverError::BtfLookup("no function unthrottle_cfs_rq".into())),
                "kernel BTF lookup: no function unthrottle_cfs_rq",
            ),
        ] {
            assert_eq!(e.to_string(), want);
        }
    }
}
