//! The kernel side of the observer: resolving the running kernel's layout, loading the eBPF
//! object, attaching programs strategy by strategy, and reading the maps.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use aya::maps::{HashMap, Map, MapData, RingBuf};
use aya::programs::tp_btf::BtfTracePointLinkId;
use aya::programs::trace_point::TracePointLinkId;
use aya::programs::{BtfTracePoint, FEntry, FExit, Program, TracePoint};
use aya::{Ebpf, EbpfLoader};
use aya_log::EbpfLogger;
use nri_resize_ebpf_common::{
    names, CgroupKey, CpuHotplugEvent, CpuhpLayout, MemcgEventsLayout, ObserverConfig, OomCounters,
    ReclaimCounters, ReclaimSlot, ThrottleCounters, NO_FIELD, NO_ITEM, RECLAIM_SLOTS,
    THROTTLE_PENDING_PIDS_PER_SLOT,
};

use super::btf::KernelBtf;
use super::map_memory::{self, MapMemory};
use super::map_sizes::{map_sizes, MapSizes, NodeFacts};
use super::probe::ProbeError;
use super::snapshot::{MapSnapshot, Snapshot};
use super::{
    maps, parse, Fallback, HotplugStrategy, ObjectSource, ObserverError, ObserverSettings,
    OomStrategy, ProgramStats, Reclaim, ReclaimStrategy, Strategies, ThrottleStrategy,
};

/// The object built by `cargo xtask build-ebpf`, when it existed at build time.
#[cfg(nri_resize_ebpf_object)]
#[expect(
    clippy::unnecessary_wraps,
    reason = "same signature as the build without an object"
)]
fn embedded_object() -> Option<&'static [u8]> {
    Some(aya::include_bytes_aligned!(env!("NRI_RESIZE_EBPF_OBJECT")))
}

#[cfg(not(nri_resize_ebpf_object))]
fn embedded_object() -> Option<&'static [u8]> {
    None
}

/// Forwards aya-log records from the kernel programs to `tracing`.
struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "observer::ebpf", "{message}"),
            log::Level::Warn => tracing::warn!(target: "observer::ebpf", "{message}"),
            log::Level::Info => tracing::info!(target: "observer::ebpf", "{message}"),
            log::Level::Debug => tracing::debug!(target: "observer::ebpf", "{message}"),
            log::Level::Trace => tracing::trace!(target: "observer::ebpf", "{message}"),
        }
    }

    fn flush(&self) {}
}

/// Which parts of `ObserverConfig` the running kernel could fill, and why not.
struct Resolved {
    config: ObserverConfig,
    /// task → cgroup chain (needed by every BTF-walking program).
    task_chain: Result<(), ProbeError>,
    /// `task_struct::throttled` (task-based throttling).
    task_throttled: Result<(), ProbeError>,
    /// `cfs_rq::tg`, `task_group::css` and the `unthrottle_cfs_rq` function.
    cfs_rq: Result<(), ProbeError>,
    memcg_events: Result<(), ProbeError>,
    /// `tp_btf/count_memcg_events`: its first argument a `struct mem_cgroup *`, `mem_cgroup::css`.
    memcg_events_btf: Result<(), ProbeError>,
    reclaim_end: Result<(), ProbeError>,
    /// `fexit/try_to_free_mem_cgroup_pages`: the function, its first parameter a
    /// `struct mem_cgroup *`, `mem_cgroup::css`.
    memcg_reclaim_fexit: Result<(), ProbeError>,
    cpuhp: Result<(), ProbeError>,
    /// `oom/mark_victim` passes the victim's `task_struct` (6.8+; before, only its pid).
    mark_victim_task: Result<(), ProbeError>,
}

#[expect(
    clippy::too_many_lines,
    reason = "one linear list of lookups, each with its own fallback"
)]
fn resolve(
    btf: &KernelBtf,
    tracefs: Result<&Path, &ProbeError>,
    cpu_hierarchy: u32,
    memory_hierarchy: u32,
) -> Resolved {
    let mut c = ObserverConfig::UNCONFIGURED;
    c.configured = 1;
    c.cpu_hierarchy = cpu_hierarchy;
    c.memory_hierarchy = memory_hierarchy;

    let task_chain = (|| -> Result<(), ObserverError> {
        c.task_pid = btf.offset("task_struct", "pid")?;
        c.task_tgid = btf.offset("task_struct", "tgid")?;
        c.task_cgroups = btf.offset("task_struct", "cgroups")?;
        c.css_set_subsys = btf.offset("css_set", "subsys")?;
        c.css_cgroup = btf.offset("cgroup_subsys_state", "cgroup")?;
        c.cgroup_kn = btf.offset("cgroup", "kn")?;
        c.kernfs_node_id = btf.offset("kernfs_node", "id")?;
        c.cpu_subsys = btf.enum_value("cgroup_subsys_id", "cpu_cgrp_id")?;
        c.memory_subsys = btf.enum_value("cgroup_subsys_id", "memory_cgrp_id")?;
        Ok(())
    })()
    .map_err(ProbeError::from);

    let task_throttled = btf
        .member("task_struct", "throttled")
        .map(|loc| {
            c.task_throttled = loc.byte_offset();
            c.task_throttled_mask = loc.byte_mask();
        })
        .map_err(|e| ProbeError::NoTaskThrottling {
            lookup: std::sync::Arc::new(e),
        });

    let cfs_rq = (|| -> Result<(), ObserverError> {
        if !btf.has_function("unthrottle_cfs_rq") {
            return Err(ObserverError::BtfLookup(
                "no function unthrottle_cfs_rq".into(),
            ));
        }
        c.cfs_rq_tg = btf.offset("cfs_rq", "tg")?;
        c.task_group_css = btf.offset("task_group", "css")?;
        c.cfs_rq_throttled_clock = btf.offset("cfs_rq", "throttled_clock").unwrap_or(NO_FIELD);
        c.cfs_rq_rq = btf.offset("cfs_rq", "rq").unwrap_or(NO_FIELD);
        c.rq_clock = btf.offset("rq", "clock").unwrap_or(NO_FIELD);
        Ok(())
    })()
    .map_err(ProbeError::from);

    let mut any_item = false;
    for slot in ReclaimSlot::ALL {
        let item = btf
            .enum_value("vm_event_item", slot.kernel_name())
            .unwrap_or(NO_ITEM);
        any_item |= item != NO_ITEM;
        c.reclaim_items[slot as usize] = item;
    }

    let format = |category: &str, event: &str| -> Result<Vec<parse::FormatField>, ProbeError> {
        let root = tracefs.map_err(Clone::clone)?;
        let path = root
            .join("events")
            .join(category)
            .join(event)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|e| ProbeError::TracepointFormat {
            path: path.clone(),
            source: std::sync::Arc::new(e),
        })?;
        Ok(parse::tracefs_format(&text))
    };
    let offset_of =
        |fields: &[parse::FormatField], name: &'static str| -> Result<u32, ProbeError> {
            parse::field(fields, name)
                .map(|f| f.offset)
                .ok_or(ProbeError::NoField { name })
        };

    let memcg_events = format("memcg", "count_memcg_events").and_then(|fields| {
        if !any_item {
            return Err(ProbeError::NoReclaimEvents);
        }
        c.memcg_events = MemcgEventsLayout {
            id: offset_of(&fields, "id")?,
            item: offset_of(&fields, "item")?,
            val: offset_of(&fields, "val")?,
            reserved: 0,
        };
        Ok(())
    });
    let memcg_events_btf = task_chain.clone().and_then(|()| {
        if !any_item {
            return Err(ProbeError::NoReclaimEvents);
        }
        if !btf.tracepoint_param_is_struct_ptr("count_memcg_events", 1, "mem_cgroup")? {
            return Err(ObserverError::BtfLookup(
                "count_memcg_events does not pass a struct mem_cgroup *".into(),
            )
            .into());
        }
        c.memcg_css = btf.offset("mem_cgroup", "css")?;
        Ok(())
    });
    let memcg_reclaim_fexit = task_chain.clone().and_then(|()| {
        const FUNCTION: &str = "try_to_free_mem_cgroup_pages";
        let params = btf.function_params(FUNCTION)?;
        if params.first().and_then(Option::as_deref) != Some("mem_cgroup") {
            return Err(ObserverError::BtfLookup(format!(
                "{FUNCTION} does not take a struct mem_cgroup * first"
            ))
            .into());
        }
        if names::memcg_reclaim_fexit(params.len()).is_none() {
            return Err(ObserverError::BtfLookup(format!(
                "{FUNCTION} takes {} parameters (the programs know 4 to 6)",
                params.len()
            ))
            .into());
        }
        c.memcg_reclaim_params = u32::try_from(params.len()).unwrap_or(u32::MAX);
        c.memcg_css = btf.offset("mem_cgroup", "css")?;
        Ok(())
    });
    let reclaim_end = format("vmscan", "mm_vmscan_memcg_reclaim_end").and_then(|fields| {
        c.reclaim_end_nr_reclaimed = offset_of(&fields, "nr_reclaimed")?;
        Ok(())
    });
    let cpuhp = format("cpuhp", "cpuhp_enter").and_then(|enter| {
        let exit = format("cpuhp", "cpuhp_exit")?;
        c.cpuhp_enter = CpuhpLayout {
            cpu: offset_of(&enter, "cpu")?,
            state: offset_of(&enter, "target")?,
            idx: offset_of(&enter, "idx")?,
            ret: NO_FIELD,
        };
        c.cpuhp_exit = CpuhpLayout {
            cpu: offset_of(&exit, "cpu")?,
            state: offset_of(&exit, "state")?,
            idx: offset_of(&exit, "idx")?,
            ret: offset_of(&exit, "ret")?,
        };
        Ok(())
    });

    let mark_victim_task = match btf.tracepoint_param_is_struct_ptr("mark_victim", 1, "task_struct")
    {
        Ok(true) => Ok(()),
        Ok(false) => Err(ProbeError::MarkVictimPidOnly),
        Err(e) => Err(e.into()),
    };

    Resolved {
        mark_victim_task,
        config: c,
        task_chain,
        task_throttled,
        cfs_rq,
        memcg_events,
        memcg_events_btf,
        reclaim_end,
        memcg_reclaim_fexit,
        cpuhp,
    }
}

/// The tracefs mount: the configured one, or `/sys/kernel/tracing` (mounted if needed), or the
/// debugfs one.
fn tracefs(configured: Option<&Path>) -> Result<PathBuf, ProbeError> {
    if let Some(path) = configured {
        return Ok(path.to_owned());
    }
    let standard = Path::new("/sys/kernel/tracing");
    if standard.join("events").is_dir() {
        return Ok(standard.to_owned());
    }
    let debugfs = Path::new("/sys/kernel/debug/tracing");
    if debugfs.join("events").is_dir() {
        return Ok(debugfs.to_owned());
    }
    nix::mount::mount(
        Some("tracefs"),
        standard,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|source| ProbeError::TracefsMount {
        path: standard.to_owned(),
        source,
    })?;
    tracing::info!(path = %standard.display(), "observer: mounted tracefs");
    Ok(standard.to_owned())
}

/// The loaded object and what the observer reads from it.
pub(super) struct KernelSide {
    ebpf: Ebpf,
    logger: Option<EbpfLogger<TracingLog>>,
    hotplug: Option<RingBuf<MapData>>,
    /// Each map's memory, read once after load (every map is preallocated).
    map_memory: Vec<MapMemory>,
    /// The entries the maps were created with.
    map_sizes: MapSizes,
    /// `/sys/devices/system/cpu/possible`, which per-CPU maps are allocated for.
    possible_cpus: usize,
    /// The reclaim program loaded at start and attached only on demand.
    on_demand: Option<OnDemand>,
    /// `THROTTLE`, `RECLAIM`, `OOM` as read at the start of the observer's pass.
    snapshots: [MapSnapshot; 3],
    /// The kernel refused a batch lookup (before 5.6): per-key lookups only.
    no_batch: bool,
}

/// The shared counter maps a pass snapshots, with their value sizes in u64 words.
const SNAPSHOT_MAPS: [(&str, usize); 3] = [
    (names::THROTTLE_MAP, size_of::<ThrottleCounters>() / 8),
    (names::RECLAIM_MAP, size_of::<ReclaimCounters>() / 8),
    (names::OOM_MAP, size_of::<OomCounters>() / 8),
];

/// The memcg event program: loaded, attached while `link` is set.
struct OnDemand {
    program: &'static str,
    link: Option<OnDemandLink>,
}

enum OnDemandLink {
    Btf(BtfTracePointLinkId),
    Classic(TracePointLinkId),
}

fn fallback(
    fallbacks: &mut Vec<Fallback>,
    program: &'static str,
    reason: &ProbeError,
    next: &dyn std::fmt::Debug,
) {
    let reason = reason.to_string();
    tracing::warn!(program, reason = %reason, fallback = ?next, "observer: program refused, falling back");
    fallbacks.push(Fallback { program, reason });
}

impl Drop for KernelSide {
    /// Detaches the programs side by side: each detach waits for the kernel's RCU grace
    /// periods (tens of ms each, hundreds in a row: the daemon's exit waited for them one by
    /// one), and waits that overlap share grace periods.
    fn drop(&mut self) {
        std::thread::scope(|s| {
            for (name, program) in self.ebpf.programs_mut() {
                s.spawn(move || {
                    // The kinds the observer attaches; any other is left to the drop.
                    let unloaded = match program {
                        Program::TracePoint(p) => p.unload(),
                        Program::BtfTracePoint(p) => p.unload(),
                        Program::FEntry(p) => p.unload(),
                        Program::FExit(p) => p.unload(),
                        _ => Ok(()),
                    };
                    if let Err(e) = unloaded {
                        tracing::debug!(program = name, error = %e, "observer: unload");
                    }
                });
            }
        });
    }
}

impl KernelSide {
    pub(super) fn start(
        settings: &ObserverSettings,
        cpu_hierarchy: u32,
        memory_hierarchy: u32,
        fallbacks: &mut Vec<Fallback>,
    ) -> Result<(Self, Strategies), ObserverError> {
        let owned;
        let bytes: &[u8] = match &settings.object {
            ObjectSource::Embedded => embedded_object().ok_or(ObserverError::ObjectMissing)?,
            ObjectSource::File(path) => {
                owned = std::fs::read(path).map_err(|source| ObserverError::Io {
                    path: path.clone(),
                    source,
                })?;
                &owned
            }
            ObjectSource::None => return Err(ObserverError::ObjectMissing),
        };
        // Each parse of the kernel's BTF takes tens of MiB: the offsets are resolved and that
        // parse dropped before aya parses it again, so that the two are never alive together.
        let phase = Instant::now();
        let btf = KernelBtf::from_file(&settings.btf)?;
        let tracefs = tracefs(settings.tracefs.as_deref());
        let r = resolve(&btf, tracefs.as_deref(), cpu_hierarchy, memory_hierarchy);
        drop(btf);
        let resolve_ms = phase.elapsed().as_millis();
        let phase = Instant::now();
        let aya_btf =
            aya::Btf::parse_file(&settings.btf, aya::Endianness::default()).map_err(|e| {
                ObserverError::Btf {
                    path: settings.btf.clone(),
                    reason: e.to_string(),
                }
            })?;

        let btf_ms = phase.elapsed().as_millis();
        let phase = Instant::now();
        let mut loader = EbpfLoader::new();
        loader
            .btf(Some(&aya_btf))
            .override_global(names::CONFIG_GLOBAL, &r.config, true);
        let (sizes, possible_cpus) = size_maps(&mut loader, settings)?;
        let mut ebpf = loader
            .load(bytes)
            .map_err(|e| ObserverError::Load(format!("{e:#}")))?;
        let map_memory = map_memory::read(
            Path::new("/proc/self/fdinfo"),
            ebpf.maps()
                .map(|(name, map)| (name, map_data(map).fd().as_fd())),
        );
        tracing::info!(
            possible_cpus,
            cgroup_entries = sizes.cgroups,
            task_entries = sizes.tasks,
            map_memory_bytes = map_memory::total(&map_memory),
            maps = map_memory.len(),
            "observer: eBPF maps created"
        );
        let logger = EbpfLogger::init_with_logger(&mut ebpf, TracingLog)
            .map_err(|e| tracing::warn!(error = %e, "observer: no kernel-side logs"))
            .ok();

        let load_ms = phase.elapsed().as_millis();
        let phase = Instant::now();
        let throttle = attach_throttle(&mut ebpf, &r, &aya_btf, settings.force_throttle, fallbacks);
        let (reclaim, on_demand) = attach_reclaim(
            &mut ebpf,
            &r,
            &aya_btf,
            (settings.force_reclaim, settings.cgroups.is_v1()),
            fallbacks,
        );
        let oom = attach_oom(&mut ebpf, &r, &aya_btf, settings.force_oom, fallbacks);
        let (hotplug, ring) = attach_hotplug(&mut ebpf, &r, settings.hotplug, fallbacks);

        // Where a slow start's time goes (seconds in emulated guests, BTF parsing first).
        tracing::debug!(
            resolve_ms,
            btf_ms,
            load_ms,
            attach_ms = phase.elapsed().as_millis(),
            "observer: eBPF programs loaded"
        );
        let strategies = Strategies {
            throttle,
            reclaim,
            oom,
            hotplug,
            // Not eBPF: `Observer::start` decides it.
            pressure: Strategies::POLLING.pressure,
        };
        Ok((
            Self {
                ebpf,
                logger,
                hotplug: ring,
                map_memory,
                map_sizes: sizes,
                possible_cpus,
                snapshots: Default::default(),
                no_batch: false,
                on_demand: on_demand.map(|program| OnDemand {
                    program,
                    link: None,
                }),
            },
            strategies,
        ))
    }

    fn map_fd(&self, name: &'static str) -> Result<BorrowedFd<'_>, ObserverError> {
        counter_map_fd(&self.ebpf, name)
    }

    /// Each map's memory, as read after load.
    pub(super) fn map_memory(&self) -> &[MapMemory] {
        &self.map_memory
    }

    /// The entries the maps were created with.
    pub(super) fn map_sizes(&self) -> MapSizes {
        self.map_sizes
    }

    /// The kernel's possible CPUs.
    pub(super) fn possible_cpus(&self) -> usize {
        self.possible_cpus
    }

    /// Starts a pass over the watched cgroups: each shared counter map is read whole, with a
    /// few batch lookups, and the pass's reads take their values from that copy. A map that
    /// cannot be read so is looked up key by key (a kernel without batch lookups: from then on).
    pub(super) fn begin_pass(&mut self) {
        if self.no_batch {
            return;
        }
        for (i, (map, words)) in SNAPSHOT_MAPS.into_iter().enumerate() {
            let Ok(fd) = counter_map_fd(&self.ebpf, map) else {
                continue;
            };
            if let Err(e) = self.snapshots[i].take(fd, words) {
                if e.kind() == std::io::ErrorKind::Unsupported {
                    tracing::info!(error = %e, "observer: counter maps read key by key");
                    self.no_batch = true;
                    self.end_pass();
                    return;
                }
                tracing::debug!(map, error = %e, "observer: batch read failed; this pass reads key by key");
            }
        }
    }

    /// Ends the pass: reads look keys up themselves again.
    pub(super) fn end_pass(&mut self) {
        for s in &mut self.snapshots {
            s.invalidate();
        }
    }

    /// The value of `key` in the shared counter map `map`, as `sum.len()` u64 words; zeros
    /// when the key is absent. Inside a pass, from its snapshot.
    fn lookup_sum(
        &self,
        map: &'static str,
        key: &CgroupKey,
        buf: &mut Vec<u64>,
        sum: &mut [u64],
    ) -> Result<(), ObserverError> {
        if let Some(i) = SNAPSHOT_MAPS.iter().position(|(m, _)| *m == map) {
            match self.snapshots[i].get(key) {
                Snapshot::NotTaken => {}
                Snapshot::Found(words) if words.len() == sum.len() => {
                    sum.copy_from_slice(words);
                    return Ok(());
                }
                Snapshot::Found(_) | Snapshot::Absent => {
                    sum.fill(0);
                    return Ok(());
                }
            }
        }
        let found = maps::lookup(self.map_fd(map)?, key, buf, sum)
            .map_err(|source| ObserverError::Map { map, source })?;
        if !found {
            sum.fill(0);
        }
        Ok(())
    }

    /// `[throttled_count, throttled_ns]` of a cpu cgroup.
    pub(super) fn throttle(
        &self,
        key: &CgroupKey,
        buf: &mut Vec<u64>,
    ) -> Result<[u64; 2], ObserverError> {
        const WORDS: usize = size_of::<ThrottleCounters>() / 8;
        let mut sum = [0u64; WORDS];
        self.lookup_sum(names::THROTTLE_MAP, key, buf, &mut sum)?;
        Ok(sum)
    }

    /// What the `strategy`'s programs counted for a memcg.
    pub(super) fn reclaim(
        &self,
        key: &CgroupKey,
        strategy: ReclaimStrategy,
        buf: &mut Vec<u64>,
    ) -> Result<Reclaim, ObserverError> {
        const WORDS: usize = size_of::<ReclaimCounters>() / 8;
        let mut sum = [0u64; WORDS];
        self.lookup_sum(names::RECLAIM_MAP, key, buf, &mut sum)?;
        let timing = (
            Some(sum[RECLAIM_SLOTS]),
            Some(sum[RECLAIM_SLOTS + 1]),
            Some(sum[RECLAIM_SLOTS + 2]),
        );
        if strategy == ReclaimStrategy::Fexit {
            // Reclaim aimed at this memcg; kswapd's and the scans are not seen.
            return Ok(Reclaim {
                pgsteal_direct: Some(sum[RECLAIM_SLOTS + 4]),
                direct_reclaim_count: timing.0,
                direct_reclaim_ns: timing.1,
                direct_reclaimed_pages: timing.2,
                ..Reclaim::default()
            });
        }
        let events = &sum[..RECLAIM_SLOTS];
        let slot = |s: ReclaimSlot| Some(events[s as usize]);
        Ok(Reclaim {
            pgscan_kswapd: slot(ReclaimSlot::PgscanKswapd),
            pgscan_direct: slot(ReclaimSlot::PgscanDirect),
            pgsteal_kswapd: slot(ReclaimSlot::PgstealKswapd),
            pgsteal_direct: slot(ReclaimSlot::PgstealDirect),
            pgscan_total: None,
            pgsteal_total: None,
            direct_reclaim_count: timing.0,
            direct_reclaim_ns: timing.1,
            direct_reclaimed_pages: timing.2,
        })
    }

    pub(super) fn on_demand_program(&self) -> Option<&'static str> {
        self.on_demand.as_ref().map(|o| o.program)
    }

    /// Attaches the on-demand program (see [`super::ReclaimWatch`]).
    pub(super) fn attach_on_demand(&mut self) -> Result<(), ObserverError> {
        let Some(od) = &mut self.on_demand else {
            return Err(ObserverError::Program {
                program: names::PROG_MEMCG_EVENTS,
                reason: "not loaded for attaching on demand".into(),
            });
        };
        if od.link.is_some() {
            return Ok(());
        }
        let program = od.program;
        let failed = |e: aya::programs::ProgramError| ObserverError::Program {
            program,
            reason: format!("attach: {e}"),
        };
        od.link = Some(match self.ebpf.program_mut(program) {
            Some(Program::BtfTracePoint(p)) => OnDemandLink::Btf(p.attach().map_err(failed)?),
            Some(Program::TracePoint(p)) => {
                OnDemandLink::Classic(p.attach("memcg", "count_memcg_events").map_err(failed)?)
            }
            _ => {
                return Err(ObserverError::Program {
                    program,
                    reason: "not in the object".into(),
                })
            }
        });
        Ok(())
    }

    /// Detaches the on-demand program; its counts stay in the map.
    pub(super) fn detach_on_demand(&mut self) -> Result<(), ObserverError> {
        let Some(od) = &mut self.on_demand else {
            return Ok(());
        };
        let Some(link) = od.link.take() else {
            return Ok(());
        };
        let program = od.program;
        let detached = match (self.ebpf.program_mut(program), link) {
            (Some(Program::BtfTracePoint(p)), OnDemandLink::Btf(id)) => p.detach(id),
            (Some(Program::TracePoint(p)), OnDemandLink::Classic(id)) => p.detach(id),
            _ => Ok(()),
        };
        detached.map_err(|e| ObserverError::Program {
            program,
            reason: format!("detach: {e}"),
        })
    }

    /// Kills in a memcg and the last victim's tgid.
    pub(super) fn oom(
        &self,
        key: &CgroupKey,
        buf: &mut Vec<u64>,
    ) -> Result<(u64, Option<u32>), ObserverError> {
        const WORDS: usize = size_of::<OomCounters>() / 8;
        let mut value = [0u64; WORDS];
        self.lookup_sum(names::OOM_MAP, key, buf, &mut value)?;
        // Low half of the second word: `last_victim_tgid` (little-endian `u32, u32`).
        let victim = (value[1] & 0xffff_ffff) as u32;
        Ok((value[0], (victim != 0).then_some(victim)))
    }

    pub(super) fn forget(&mut self, cpu_key: CgroupKey, memory_key: CgroupKey) {
        for (map, key) in [
            (names::THROTTLE_MAP, cpu_key),
            (names::RECLAIM_MAP, memory_key),
            (names::OOM_MAP, memory_key),
        ] {
            let Some(m) = self.ebpf.map_mut(map) else {
                continue;
            };
            // The value type only sizes the map check; removal does not read values.
            let removed = match map {
                names::THROTTLE_MAP => HashMap::<_, CgroupKey, ThrottleCounters>::try_from(m)
                    .map(|mut h| h.remove(&key)),
                names::RECLAIM_MAP => HashMap::<_, CgroupKey, ReclaimCounters>::try_from(m)
                    .map(|mut h| h.remove(&key)),
                _ => HashMap::<_, CgroupKey, OomCounters>::try_from(m).map(|mut h| h.remove(&key)),
            };
            if let Ok(Err(e)) | Err(e) = removed {
                tracing::debug!(map, error = %e, "observer: forget");
            }
        }
    }

    /// Run statistics and sizes of the programs that are loaded.
    pub(super) fn program_stats(&self) -> Vec<ProgramStats> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some(ProgramStats {
                    name: name.to_owned(),
                    id: info.id(),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                    translated_instructions: info.size_translated().map_or(0, |b| b / 8),
                    jited_bytes: info.size_jitted(),
                    verified_instructions: info.verified_instruction_count(),
                })
            })
            .collect()
    }

    pub(super) fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    pub(super) fn drain_hotplug(&mut self, out: &mut Vec<CpuHotplugEvent>) {
        let Some(ring) = &mut self.hotplug else {
            return;
        };
        while let Some(item) = ring.next() {
            if let Some(event) = decode_hotplug(&item) {
                out.push(event);
            }
        }
    }

    pub(super) fn hotplug_fd(&self) -> Option<BorrowedFd<'_>> {
        self.hotplug.as_ref().map(AsFd::as_fd)
    }

    /// Hands the hotplug ring buffer over; the programs stay attached while `self` lives.
    pub(super) fn take_hotplug(&mut self) -> Option<RingBuf<MapData>> {
        self.hotplug.take()
    }
}

/// The fd of the shared counter map `name` (an LRU hash).
fn counter_map_fd<'a>(ebpf: &'a Ebpf, name: &'static str) -> Result<BorrowedFd<'a>, ObserverError> {
    match ebpf.map(name) {
        Some(Map::LruHashMap(data)) => Ok(data.fd().as_fd()),
        _ => Err(ObserverError::Map {
            map: name,
            source: std::io::ErrorKind::NotFound.into(),
        }),
    }
}

/// Sets every map's entries from the node (`map_sizes`) before load; returns them and the
/// kernel's possible CPUs.
fn size_maps(
    loader: &mut EbpfLoader<'_>,
    settings: &ObserverSettings,
) -> Result<(MapSizes, usize), ObserverError> {
    let pid_max = read_pid_max(&settings.pid_max);
    if let Some(pids) = pid_max {
        // An object without the map (an older build) simply ignores this.
        loader.map_max_entries(
            names::THROTTLE_PENDING_MAP,
            pids.div_ceil(THROTTLE_PENDING_PIDS_PER_SLOT).max(1),
        );
    }
    let possible_cpus = aya::util::nr_cpus().map_err(|(path, source)| ObserverError::Io {
        path: PathBuf::from(path),
        source,
    })?;
    let sizes = map_sizes(&NodeFacts {
        max_pods: settings.maps.max_pods,
        possible_cpus: u32::try_from(possible_cpus).unwrap_or(u32::MAX),
        pid_max,
        max_tasks: settings.maps.max_tasks,
    });
    for map in [names::THROTTLE_MAP, names::RECLAIM_MAP, names::OOM_MAP] {
        loader.map_max_entries(map, sizes.cgroups);
    }
    for map in [names::THROTTLED_TASKS_MAP, names::RECLAIM_START_MAP] {
        loader.map_max_entries(map, sizes.tasks);
    }
    Ok((sizes, possible_cpus))
}

/// The kernel's `pid_max`, or `None` when it cannot be read (`THROTTLE_PENDING` then keeps the
/// object's size, room for `PID_MAX_LIMIT`, and the task maps their configured size).
fn read_pid_max(pid_max: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pid_max)
        .map_err(|e| tracing::debug!(path = %pid_max.display(), error = %e, "observer: pid_max"))
        .ok()?;
    text.trim().parse().ok()
}

/// The data of any kind of map (aya's `Map` has no accessor of its own).
fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    }
}

fn attach_throttle(
    ebpf: &mut Ebpf,
    r: &Resolved,
    aya_btf: &aya::Btf,
    forced: Option<ThrottleStrategy>,
    fallbacks: &mut Vec<Fallback>,
) -> ThrottleStrategy {
    let mut throttle = forced.unwrap_or(ThrottleStrategy::Fentry);
    if throttle == ThrottleStrategy::Fentry {
        // The pair: the `fentry` counts and notes when the throttle began, the `fexit` adds
        // its duration once the function has updated the runqueue's clock.
        let attached = r.task_chain.clone().and(r.cfs_rq.clone()).and_then(|()| {
            attach_fentry(ebpf, names::PROG_UNTHROTTLE, "unthrottle_cfs_rq", aya_btf)?;
            attach_fexit(
                ebpf,
                names::PROG_UNTHROTTLE_EXIT,
                "unthrottle_cfs_rq",
                aya_btf,
            )
        });
        if let Err(reason) = attached {
            // Not to `tp_btf/sched_switch` unless asked: that program runs on every context
            // switch of the node (docs/observer.md, "Why `tp_btf_sched_switch` is not in the
            // default chain").
            throttle = ThrottleStrategy::CpuStatPolling;
            fallback(fallbacks, names::PROG_UNTHROTTLE, &reason, &throttle);
        }
    }
    if throttle == ThrottleStrategy::TpBtfSchedSwitch {
        let attached = r
            .task_chain
            .clone()
            .and(r.task_throttled.clone())
            .and_then(|()| attach_tp_btf(ebpf, names::PROG_SCHED_SWITCH, "sched_switch", aya_btf));
        if let Err(reason) = attached {
            throttle = ThrottleStrategy::CpuStatPolling;
            fallback(fallbacks, names::PROG_SCHED_SWITCH, &reason, &throttle);
        }
    }
    throttle
}

/// Reclaim: `fexit` on the memcg reclaim entry, then the memcg tracepoints, then memory.stat.
/// Returns the strategy and the program loaded to be attached on demand, if any.
///
/// `fexit` first: it runs once per reclaim call and nowhere else (the tracepoint's program runs
/// on every memcg event of the node, page faults included), and the tracepoint stopped carrying
/// the reclaim events on newer kernels (sid's 7.2 passes page-fault items only: counted nothing,
/// found by the VM tier). The tracepoints serve kernels that refuse trampolines; their event
/// program is only loaded here, attached while nri-resize reclaims ([`super::ReclaimWatch`]),
/// and not even loaded on cgroup v2, whose `memory.stat` has the same counts. The `vmscan`
/// timing tracepoints stay attached: they fire inside memcg reclaim only (once per
/// `try_to_free_mem_cgroup_pages` call), never on a plain fault or charge.
fn attach_reclaim(
    ebpf: &mut Ebpf,
    r: &Resolved,
    aya_btf: &aya::Btf,
    (forced, v1): (Option<ReclaimStrategy>, bool),
    fallbacks: &mut Vec<Fallback>,
) -> (ReclaimStrategy, Option<&'static str>) {
    let mut on_demand = None;
    let mut reclaim = forced.unwrap_or(ReclaimStrategy::Fexit);
    if reclaim == ReclaimStrategy::Fexit {
        // The program for the function's parameter count (`resolve` refused a count none
        // knows; the first program then only names the fallback).
        let program = names::memcg_reclaim_fexit(r.config.memcg_reclaim_params as usize)
            .unwrap_or(names::PROG_MEMCG_RECLAIM_FEXIT[0]);
        let attached = r
            .memcg_reclaim_fexit
            .clone()
            .and_then(|()| attach_fexit(ebpf, program, "try_to_free_mem_cgroup_pages", aya_btf));
        if let Err(reason) = attached {
            reclaim = ReclaimStrategy::MemcgTracepoints;
            fallback(fallbacks, program, &reason, &reclaim);
        }
    }
    if reclaim == ReclaimStrategy::MemcgTracepoints && v1 {
        // The raw tracepoint first (it costs next to nothing on the page faults it sees while
        // attached), the classic one where the kernel's BTF cannot type it. Loaded only.
        let loaded = r
            .memcg_events_btf
            .clone()
            .and_then(|()| {
                load_tp_btf(
                    ebpf,
                    names::PROG_MEMCG_EVENTS_BTF,
                    "count_memcg_events",
                    aya_btf,
                )
                .map(|()| names::PROG_MEMCG_EVENTS_BTF)
            })
            .or_else(|reason| {
                let classic = r
                    .memcg_events
                    .clone()
                    .and_then(|()| load_tracepoint(ebpf, names::PROG_MEMCG_EVENTS))
                    .map(|()| names::PROG_MEMCG_EVENTS);
                if classic.is_ok() {
                    fallback(
                        fallbacks,
                        names::PROG_MEMCG_EVENTS_BTF,
                        &reason,
                        &"tracepoint/memcg/count_memcg_events",
                    );
                }
                classic
            });
        match loaded {
            Ok(program) => on_demand = Some(program),
            Err(reason) => {
                reclaim = ReclaimStrategy::MemoryStatPolling;
                fallback(fallbacks, names::PROG_MEMCG_EVENTS, &reason, &reclaim);
            }
        }
    } else if reclaim == ReclaimStrategy::MemcgTracepoints {
        // cgroup v2: the counts come from memory.stat; only the tracepoint's presence is
        // checked (the timing tracepoints below need the same kernel).
        if let Err(reason) = r.memcg_events.clone() {
            reclaim = ReclaimStrategy::MemoryStatPolling;
            fallback(fallbacks, names::PROG_MEMCG_EVENTS, &reason, &reclaim);
        }
    }
    if reclaim != ReclaimStrategy::MemoryStatPolling {
        // Time in direct reclaim is a bonus: without it the counters still hold.
        let timing = r
            .task_chain
            .clone()
            .and(r.reclaim_end.clone())
            .and_then(|()| {
                attach_tracepoint(
                    ebpf,
                    names::PROG_RECLAIM_BEGIN,
                    "vmscan",
                    "mm_vmscan_memcg_reclaim_begin",
                )?;
                attach_tracepoint(
                    ebpf,
                    names::PROG_RECLAIM_END,
                    "vmscan",
                    "mm_vmscan_memcg_reclaim_end",
                )
            });
        if let Err(reason) = timing {
            fallback(
                fallbacks,
                names::PROG_RECLAIM_BEGIN,
                &reason,
                &"no direct reclaim time",
            );
        }
    }
    (reclaim, on_demand)
}

/// OOM kills: `tp_btf/mark_victim`, then `memory.events`.
fn attach_oom(
    ebpf: &mut Ebpf,
    r: &Resolved,
    aya_btf: &aya::Btf,
    forced: Option<OomStrategy>,
    fallbacks: &mut Vec<Fallback>,
) -> OomStrategy {
    let mut oom = forced.unwrap_or(OomStrategy::MarkVictim);
    if oom == OomStrategy::MarkVictim {
        let attached = r
            .task_chain
            .clone()
            .and(r.mark_victim_task.clone())
            .and_then(|()| attach_tp_btf(ebpf, names::PROG_MARK_VICTIM, "mark_victim", aya_btf));
        if let Err(reason) = attached {
            oom = OomStrategy::MemoryEventsPolling;
            fallback(fallbacks, names::PROG_MARK_VICTIM, &reason, &oom);
        }
    }
    oom
}

/// CPU hotplug: cpuhp tracepoints through a ring buffer, or nothing.
fn attach_hotplug(
    ebpf: &mut Ebpf,
    r: &Resolved,
    wanted: bool,
    fallbacks: &mut Vec<Fallback>,
) -> (HotplugStrategy, Option<RingBuf<MapData>>) {
    let mut hotplug = HotplugStrategy::Unavailable;
    let mut ring = None;
    if wanted {
        let attached = r.cpuhp.clone().and_then(|()| {
            attach_tracepoint(ebpf, names::PROG_CPUHP_ENTER, "cpuhp", "cpuhp_enter")?;
            attach_tracepoint(ebpf, names::PROG_CPUHP_EXIT, "cpuhp", "cpuhp_exit")?;
            let map = ebpf.take_map(names::CPUHP_RING).ok_or(ProbeError::NoMap {
                map: names::CPUHP_RING,
            })?;
            RingBuf::try_from(map).map_err(|e| ProbeError::MapType(std::sync::Arc::new(e)))
        });
        match attached {
            Ok(rb) => {
                ring = Some(rb);
                hotplug = HotplugStrategy::CpuhpTracepoints;
            }
            Err(reason) => fallback(fallbacks, names::PROG_CPUHP_ENTER, &reason, &hotplug),
        }
    }
    (hotplug, ring)
}

pub(super) fn decode_hotplug(bytes: &[u8]) -> Option<CpuHotplugEvent> {
    let u64_at = |o: usize| Some(u64::from_ne_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_ne_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    let i32_at = |o: usize| Some(i32::from_ne_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    Some(CpuHotplugEvent {
        timestamp_ns: u64_at(0)?,
        cpu: u32_at(8)?,
        kind: u32_at(12)?,
        state: i32_at(16)?,
        idx: i32_at(20)?,
        ret: i32_at(24)?,
        reserved: 0,
    })
}

/// Loads and attaches a BTF-typed program (`fentry`, `fexit`, `tp_btf`: each loads against the
/// kernel's BTF by a function or tracepoint name) as its program type `$kind`.
macro_rules! attach_btf_program {
    ($name:ident, $kind:ty) => {
        fn $name(
            ebpf: &mut Ebpf,
            program: &'static str,
            target: &str,
            btf: &aya::Btf,
        ) -> Result<(), ProbeError> {
            let p: &mut $kind = ebpf
                .program_mut(program)
                .ok_or(ProbeError::NoProgram { program })?
                .try_into()
                .map_err(ProbeError::program_type)?;
            p.load(target, btf).map_err(ProbeError::load)?;
            p.attach().map_err(ProbeError::attach)?;
            Ok(())
        }
    };
}
attach_btf_program!(attach_fentry, FEntry);
attach_btf_program!(attach_fexit, FExit);
attach_btf_program!(attach_tp_btf, BtfTracePoint);

/// Loads a `tp_btf` program without attaching it.
fn load_tp_btf(
    ebpf: &mut Ebpf,
    program: &'static str,
    target: &str,
    btf: &aya::Btf,
) -> Result<(), ProbeError> {
    let p: &mut BtfTracePoint = ebpf
        .program_mut(program)
        .ok_or(ProbeError::NoProgram { program })?
        .try_into()
        .map_err(ProbeError::program_type)?;
    p.load(target, btf).map_err(ProbeError::load)
}

/// Loads a classic tracepoint program without attaching it.
fn load_tracepoint(ebpf: &mut Ebpf, program: &'static str) -> Result<(), ProbeError> {
    let p: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or(ProbeError::NoProgram { program })?
        .try_into()
        .map_err(ProbeError::program_type)?;
    p.load().map_err(ProbeError::load)
}

fn attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    name: &str,
) -> Result<(), ProbeError> {
    let p: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or(ProbeError::NoProgram { program })?
        .try_into()
        .map_err(ProbeError::program_type)?;
    p.load().map_err(ProbeError::load)?;
    p.attach(category, name).map_err(ProbeError::attach)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::decode_hotplug;

    #[test]
    fn decodes_a_hotplug_record() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&42u64.to_ne_bytes());
        bytes.extend_from_slice(&1u32.to_ne_bytes());
        bytes.extend_from_slice(&1u32.to_ne_bytes());
        bytes.extend_from_slice(&(-3i32).to_ne_bytes());
        bytes.extend_from_slice(&7i32.to_ne_bytes());
        bytes.extend_from_slice(&0i32.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        let e = decode_hotplug(&bytes).expect("decode");
        assert_eq!(
            (e.timestamp_ns, e.cpu, e.kind, e.state, e.idx),
            (42, 1, 1, -3, 7)
        );
        assert!(decode_hotplug(&bytes[..20]).is_none());
    }
}
