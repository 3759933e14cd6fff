//! kubelet's systemd cgroup driver, played by the harness: pod cgroups are transient slice
//! units that systemd (PID 1) creates and limits, the way libcontainer's systemd manager does
//! for kubelet (`StartTransientUnit` with `Wants=` the parent slice, `DefaultDependencies=no`,
//! accounting on, then the resources as unit properties; updates through `SetUnitProperties`,
//! followed by the same cgroupfs writes as the cgroupfs driver).
//!
//! Chosen with `NRI_RESIZE_CGROUP_DRIVER=systemd` on a cgroup v2 host whose PID 1 is systemd
//! (the VM tier's systemd guest); containerd then runs runc with `SystemdCgroup = true`, and
//! the container cgroups are `cri-containerd-<id>.scope` units below the pod slice.
//!
//! Calls go through `busctl` (systemd's own D-Bus client): the harness needs no D-Bus crate.

use std::io;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::poll_blocking;

/// The harness's knob: `systemd` or `cgroupfs` (the default).
pub const CGROUP_DRIVER_ENV: &str = "NRI_RESIZE_CGROUP_DRIVER";

/// kubelet's cgroup driver, as the harness plays it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupDriver {
    /// Pod cgroups are directories the harness makes (kubelet's `cgroupfs` driver).
    Cgroupfs,
    /// Pod cgroups are systemd slices (kubelet's `systemd` driver, the kubeadm default).
    Systemd,
}

impl CgroupDriver {
    /// From [`CGROUP_DRIVER_ENV`]; panics on an unknown value, and on `systemd` where systemd
    /// is not PID 1 or cgroup v2 is not the only hierarchy (it would fail in every test).
    pub fn from_env() -> Self {
        match std::env::var(CGROUP_DRIVER_ENV).as_deref() {
            Err(_) | Ok("" | "cgroupfs") => Self::Cgroupfs,
            Ok("systemd") => {
                assert!(
                    Path::new("/run/systemd/system").is_dir(),
                    "{CGROUP_DRIVER_ENV}=systemd needs systemd as PID 1 (no /run/systemd/system)"
                );
                assert!(
                    Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
                    "{CGROUP_DRIVER_ENV}=systemd is played on cgroup v2 only"
                );
                Self::Systemd
            }
            Ok(other) => panic!("{CGROUP_DRIVER_ENV}={other:?}: expected systemd or cgroupfs"),
        }
    }
}

/// A unit property as `busctl` takes it: name, D-Bus signature, value words.
#[derive(Debug, Clone)]
pub(crate) struct Property {
    name: &'static str,
    signature: &'static str,
    words: Vec<String>,
}

impl Property {
    pub(crate) fn boolean(name: &'static str, v: bool) -> Self {
        Self {
            name,
            signature: "b",
            words: vec![v.to_string()],
        }
    }

    pub(crate) fn u64(name: &'static str, v: u64) -> Self {
        Self {
            name,
            signature: "t",
            words: vec![v.to_string()],
        }
    }

    fn string(name: &'static str, v: &str) -> Self {
        Self {
            name,
            signature: "s",
            words: vec![v.to_owned()],
        }
    }

    fn strings(name: &'static str, v: &[&str]) -> Self {
        let mut words = vec![v.len().to_string()];
        words.extend(v.iter().map(|s| (*s).to_owned()));
        Self {
            name,
            signature: "as",
            words,
        }
    }
}

/// systemd's "infinity" for `MemoryMax`, `CPUQuotaPerSecUSec`.
pub(crate) const INFINITY: u64 = u64::MAX;

/// libcontainer's conversion of a CFS quota to `CPUQuotaPerSecUSec`: per second of wall time,
/// rounded up to 10 ms (systemd's granularity).
pub(crate) fn cpu_quota_per_sec_usec(quota_us: Option<i64>, period_us: u64) -> u64 {
    let Some(quota) = quota_us.and_then(|q| u64::try_from(q).ok()) else {
        return INFINITY;
    };
    let per_sec = quota * 1_000_000 / period_us.max(1);
    per_sec.div_ceil(10_000) * 10_000
}

/// Whether `name` (a unit, or a path ending in one) is a slice unit: systemd's unit types are
/// suffixes, compared as written.
pub(crate) fn is_slice(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(_, kind)| kind == "slice")
}

/// The slice that holds `slice` (`a-b-c.slice` → `a-b.slice`; `a.slice` → `-.slice`).
pub(crate) fn parent_slice(slice: &str) -> String {
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    match name.rsplit_once('-') {
        Some((parent, _)) => format!("{parent}.slice"),
        None => "-.slice".to_owned(),
    }
}

/// The cgroup path of a slice unit (`a-b.slice` → `/a.slice/a-b.slice`).
pub(crate) fn slice_path(slice: &str) -> String {
    let name = slice.strip_suffix(".slice").unwrap_or(slice);
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        path.push('/');
        path.push_str(&prefix);
        path.push_str(part);
        path.push_str(".slice");
        prefix.push_str(part);
        prefix.push('-');
    }
    path
}

/// kubelet's escaping of a name inside a slice name (`-` separates slice levels).
pub(crate) fn escape(name: &str) -> String {
    name.replace('-', "_")
}

fn busctl(method: &str, signature: &str, args: &[String]) -> io::Result<String> {
    let out = Command::new("busctl")
        .args([
            "--system",
            // Values may start with `-` (`-.slice`, the root slice).
            "--",
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            method,
            signature,
        ])
        .args(args)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("run busctl (systemd): {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "busctl call {method} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn property_words(props: &[Property]) -> Vec<String> {
    let mut words = vec![props.len().to_string()];
    for p in props {
        words.push(p.name.to_owned());
        words.push(p.signature.to_owned());
        words.extend(p.words.iter().cloned());
    }
    words
}

/// `ActiveState` of `unit`.
fn active_state(unit: &str) -> String {
    Command::new("systemctl")
        .args(["show", "-p", "ActiveState", "--value", unit])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Starts the transient slice `slice` with `resources` (kubelet's pod and `QoS` cgroups), and
/// waits until it is active and its cgroup exists (libcontainer waits for the job, 30 s).
pub(crate) fn start_slice(slice: &str, resources: &[Property]) -> io::Result<()> {
    let parent = parent_slice(slice);
    let mut props = vec![
        Property::string("Description", &format!("nri-resize test slice {slice}")),
        Property::strings("Wants", &[&parent]),
        Property::boolean("DefaultDependencies", false),
        Property::boolean("MemoryAccounting", true),
        Property::boolean("CPUAccounting", true),
        Property::boolean("IOAccounting", true),
        Property::boolean("TasksAccounting", true),
    ];
    props.extend(resources.iter().cloned());
    let mut args = vec![slice.to_owned(), "replace".to_owned()];
    args.extend(property_words(&props));
    args.push("0".to_owned());
    busctl("StartTransientUnit", "ssa(sv)a(sa(sv))", &args)?;
    let dir = Path::new("/sys/fs/cgroup").join(slice_path(slice).trim_start_matches('/'));
    let up = poll_blocking(Duration::from_secs(30), || {
        active_state(slice) == "active" && dir.is_dir()
    });
    if up {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "slice {slice} not active with its cgroup {} after 30 s (ActiveState {})",
            dir.display(),
            active_state(slice)
        )))
    }
}

/// `SetUnitProperties(unit, runtime, props)`: what libcontainer's systemd manager calls before
/// it writes the same limits to the cgroup files.
pub(crate) fn set_properties(unit: &str, props: &[Property]) -> io::Result<()> {
    let mut args = vec![unit.to_owned(), "true".to_owned()];
    args.extend(property_words(props));
    busctl("SetUnitProperties", "sba(sv)", &args).map(drop)
}

/// Stops `unit` (a slice takes everything below it along) and waits until it is gone.
pub(crate) fn stop_unit(unit: &str) -> io::Result<()> {
    match busctl("StopUnit", "ss", &[unit.to_owned(), "replace".to_owned()]) {
        Ok(_) => {}
        // Already gone (a transient unit is unloaded once stopped).
        Err(e) if e.to_string().contains("not loaded") => return Ok(()),
        Err(e) => return Err(e),
    }
    let gone = poll_blocking(Duration::from_secs(30), || {
        matches!(active_state(unit).as_str(), "inactive" | "failed" | "")
    });
    if gone {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "unit {unit} still {} 30 s after StopUnit",
            active_state(unit)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_nest_by_their_dashes() {
        assert_eq!(
            slice_path("kubepods-burstable-pod1_2.slice"),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
        );
        assert_eq!(slice_path("nrt.slice"), "/nrt.slice");
        assert_eq!(
            parent_slice("kubepods-burstable-pod1.slice"),
            "kubepods-burstable.slice"
        );
        assert_eq!(parent_slice("kubepods.slice"), "-.slice");
        assert_eq!(escape("1a-2b"), "1a_2b");
    }

    #[test]
    fn cpu_quota_is_rounded_up_to_ten_milliseconds_per_second() {
        assert_eq!(cpu_quota_per_sec_usec(Some(50_000), 100_000), 500_000);
        assert_eq!(cpu_quota_per_sec_usec(Some(1_234), 100_000), 20_000);
        assert_eq!(cpu_quota_per_sec_usec(None, 100_000), INFINITY);
    }
}
