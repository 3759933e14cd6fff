//! The plugin's own configuration (TOML). It comes from `--config` and, for a plugin the runtime
//! pre-registers, from the text the runtime passes in `Configure`; when both exist, the runtime's
//! text overrides the file key by key. Unknown keys are errors, so a typo never goes unnoticed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::{
    bytes_quantity, cpu_text, MemoryDecreaseStrategy, PolicyDefaults, Share, TrimSettings,
    VerdictThresholds,
};

#[cfg(test)]
pub(crate) mod reference;
pub mod schema;
mod serde_units;

fn ms_text(ms: u64) -> humantime_serde::re::humantime::FormattedDuration {
    humantime_serde::re::humantime::format_duration(Duration::from_millis(ms))
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config from {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("invalid config from {origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// nri-resize configuration. Every key is optional. docs/configuration.md's reference is
/// generated from these structs' doc comments (`config/reference.rs`), and
/// `nri-resize config default` prints the defaults as TOML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Number of recent NRI events kept for `nri-resize events` (`1..=1000000`).
    pub journal_size: usize,
    /// The resize engine: whether it acts, and admission's node reserve.
    pub resize: ResizeConfig,
    /// Node-default resize policy; pods may only tighten it through annotations
    /// (docs/annotations.md).
    pub policy: PolicyDefaults,
    /// Lowering a memory limit below usage (docs/memory-decrease.md).
    pub memory_decrease: MemoryDecreaseConfig,
    /// The node capacity watcher (KEP-3953; docs/capacity.md). Read at start-up only: the
    /// runtime's configuration cannot change it.
    pub capacity: CapacityConfig,
    /// Verdicts on applied resizes: did a resize hurt? (docs/verdicts.md)
    pub verdict: VerdictConfig,
    /// What `/metrics` exports (docs/metrics.md).
    pub metrics: MetricsConfig,
    /// Where admission's reserve is read from kubelet (see "The node reserve" below).
    pub kubelet: KubeletConfig,
    /// Working-set trimming (docs/trimming.md).
    pub trim: TrimConfig,
    /// The observer's eBPF maps (docs/observer.md#map-memory). Read at start-up only: the
    /// runtime's configuration cannot change it.
    pub observer: ObserverConfig,
}

/// `[observer]`: what the observer's eBPF maps are sized for (docs/observer.md#map-memory).
/// The maps are created once, at start-up, and their memory counts against the daemon's
/// memory limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ObserverConfig {
    /// kubelet's `maxPods` on this node (`1..=10000`): the per-cgroup counter maps hold 8
    /// cgroups per pod, 256 of the node's own and 128 per possible CPU of LRU room. Beyond
    /// it the least recently counted cgroups are evicted (their counters restart).
    pub max_pods: u32,
    /// Tasks tracked at once while CFS-throttled or in memcg direct reclaim
    /// (`1024..=4194304`); never more than `kernel.pid_max`. Beyond it a throttled task is
    /// counted without its duration, and a direct reclaim pass is not timed.
    pub max_tasks: u32,
}

impl Default for ObserverConfig {
    fn default() -> Self {
        let limits = crate::observer::MapLimits::default();
        ObserverConfig {
            max_pods: limits.max_pods,
            max_tasks: limits.max_tasks,
        }
    }
}

impl ObserverConfig {
    /// The observer's map limits this section sets.
    pub fn map_limits(&self) -> crate::observer::MapLimits {
        crate::observer::MapLimits {
            max_pods: self.max_pods,
            max_tasks: self.max_tasks,
        }
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=10_000).contains(&self.max_pods) || !(1_024..=4_194_304).contains(&self.max_tasks)
        {
            return Err(format!(
                "observer.max_pods must be within 1..=10000 and observer.max_tasks within 1024..=4194304, got {} and {}",
                self.max_pods, self.max_tasks
            ));
        }
        Ok(())
    }
}

/// `[trim]`: working-set trimming (docs/trimming.md). Read at every trimming interval, so the
/// runtime's overlay takes effect without a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrimConfig {
    /// Trim every container whose pod does not opt out (`trim.nri-resize.io/pod: off`);
    /// `false`: only pods that opt in (`on`).
    pub enabled: bool,
    /// The pause between two steps of a container (`"2s"`; `100ms..=1m`): the stall and
    /// refaults a step caused are measured over it.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "serde_units::duration_schema")]
    pub interval: Duration,
    /// The stall share (the higher of the container's memory and io PSI `some`, since the last
    /// step) at which a probe ends: the working set is found. Pods may lower it
    /// (`trim.nri-resize.io/max-stall`).
    pub max_stall: Share,
    /// After a working set is found, the container is left alone this long before the next
    /// probe (`"5m"`; `1s..=24h`): working sets move.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "serde_units::duration_schema")]
    pub reprobe_after: Duration,
    /// The first step of a probe (`"1Mi"`; at least `4Ki`).
    #[serde(with = "serde_units::memory")]
    #[schemars(schema_with = "serde_units::memory::schema")]
    pub min_step: u64,
    /// The largest step (`"64Mi"`; `min_step..=1Gi`).
    #[serde(with = "serde_units::memory")]
    #[schemars(schema_with = "serde_units::memory::schema")]
    pub max_step: u64,
    /// The most time one pass over the trimmed containers may take (`"250ms"`; `0s..=1m`, and
    /// never more than `interval`): the containers it does not reach keep their turn and go
    /// first in the next pass (at least one turn per pass). Bounds trimming's share of the
    /// daemon's CPU, and of its CPU limit, which the NRI handlers share, to about
    /// `pass_budget / interval`.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "serde_units::duration_schema")]
    pub pass_budget: Duration,
}

impl Default for TrimConfig {
    fn default() -> Self {
        let s = TrimSettings::default();
        TrimConfig {
            enabled: false,
            interval: Duration::from_secs(2),
            max_stall: s.max_stall,
            reprobe_after: Duration::from_secs(300),
            min_step: s.min_step,
            max_step: s.max_step,
            pass_budget: Duration::from_millis(250),
        }
    }
}

impl TrimConfig {
    fn validate(&self) -> Result<(), String> {
        let d = |d: Duration| humantime_serde::re::humantime::format_duration(d).to_string();
        if self.interval < Duration::from_millis(100) || self.interval > Duration::from_secs(60) {
            return Err(format!(
                "trim.interval must be within 100ms..=1m, got {}",
                d(self.interval)
            ));
        }
        if self.reprobe_after < Duration::from_secs(1)
            || self.reprobe_after > Duration::from_secs(86_400)
        {
            return Err(format!(
                "trim.reprobe_after must be within 1s..=24h, got {}",
                d(self.reprobe_after)
            ));
        }
        if self.pass_budget > Duration::from_secs(60) {
            return Err(format!(
                "trim.pass_budget must be within 0s..=1m, got {}",
                d(self.pass_budget)
            ));
        }
        if self.min_step < 4096 || self.min_step > self.max_step || self.max_step > (1 << 30) {
            return Err(format!(
                "trim.min_step must be at least 4Ki and trim.max_step within min_step..=1Gi, got {} and {}",
                bytes_quantity(self.min_step),
                bytes_quantity(self.max_step)
            ));
        }
        Ok(())
    }
}

/// `[kubelet]`: kubelet's own reserve, read instead of `[resize]`'s where it can be
/// (docs/configuration.md#the-node-reserve).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KubeletConfig {
    /// kubelet's configuration file (`KubeletConfiguration`, YAML or JSON) as the daemon sees
    /// it: its `systemReserved`, `kubeReserved` and `evictionHard` become admission's reserve.
    /// `""`: not read, `[resize]`'s reserve is used.
    pub config_file: PathBuf,
    /// kubelet's pods cgroup, which holds the node's allocatable (`enforceNodeAllocatable`);
    /// the reserve in use is checked against it. `""`: `/kubepods.slice` or `/kubepods`,
    /// whichever exists.
    pub pods_cgroup: String,
}

/// `[metrics]`: what `/metrics` exports (docs/metrics.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Export the per-container series that cAdvisor (the kubelet's `/metrics/cadvisor`) also
    /// exports: CFS throttling, OOM kills, pressure stall totals. `false` leaves them out.
    pub cadvisor_duplicates: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            cadvisor_duplicates: true,
        }
    }
}

/// `[verdict]`: the window after a resize compared with the one before, and the thresholds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct VerdictConfig {
    /// Length of each window (`"30s"`; `1s..=1h`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "serde_units::duration_schema")]
    pub window: Duration,
    /// Harmful when the cpu `some` stall share grows by this much.
    pub cpu_stall_increase: Share,
    /// Harmful when the memory `some` stall share grows by this much.
    pub memory_stall_increase: Share,
    /// Harmful when throttled seconds per second grow by this much.
    pub throttle_increase: Share,
    /// Harmful at this many OOM kills in the window after the resize (`0`: never).
    pub oom_kills: u64,
}

impl Default for VerdictConfig {
    fn default() -> Self {
        let t = VerdictThresholds::default();
        VerdictConfig {
            window: Duration::from_secs(30),
            cpu_stall_increase: t.cpu_stall_increase,
            memory_stall_increase: t.memory_stall_increase,
            throttle_increase: t.throttle_increase,
            oom_kills: t.oom_kills,
        }
    }
}

impl VerdictConfig {
    pub fn thresholds(&self) -> VerdictThresholds {
        VerdictThresholds {
            cpu_stall_increase: self.cpu_stall_increase,
            memory_stall_increase: self.memory_stall_increase,
            throttle_increase: self.throttle_increase,
            oom_kills: self.oom_kills,
        }
    }
}

/// `[memory_decrease]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryDecreaseConfig {
    /// The node default strategy (pods may only choose a stricter one with
    /// `memory-decrease.nri-resize.io/pod` or `.../container.<name>`).
    pub strategy: MemoryDecreaseStrategy,
    /// Reclaim gives up after this long and keeps a safe limit (`1s..=1h`).
    #[serde(rename = "timeout", with = "serde_units::millis")]
    #[schemars(schema_with = "serde_units::millis::schema")]
    pub timeout_ms: u64,
    /// Memory above usage the interim limit keeps while reclaiming (at most `64Gi`).
    #[serde(with = "serde_units::memory")]
    #[schemars(schema_with = "serde_units::memory::schema")]
    pub headroom: u64,
    /// First pause between reclaim passes; it doubles up to one second (`1ms..=10s`).
    #[serde(rename = "step_interval", with = "serde_units::millis")]
    #[schemars(schema_with = "serde_units::millis::schema")]
    pub step_interval_ms: u64,
    /// When what must go is page cache, a reclaim runs inside the update itself, bounded by
    /// time: it stops at half of what is left of the runtime's deadline (about 750 ms of
    /// containerd's default 2 s), and the decrease continues staged. This caps the bytes it
    /// reclaims there (a larger decrease reclaims this much inline, the rest staged); `"0"`
    /// turns it off. At most `4Gi`.
    #[serde(with = "serde_units::memory")]
    #[schemars(schema_with = "serde_units::memory::schema")]
    pub inline_max: u64,
    /// Staged reclaim's ceiling on the container's stall share (the higher of its memory and io
    /// PSI `some`, cgroup v2): above it the reclaim holds until the stall is under half of it.
    /// Pods may lower it (`memory-decrease.nri-resize.io/max-stall`); `1.0` turns pacing off.
    pub max_stall: Share,
}

impl Default for MemoryDecreaseConfig {
    fn default() -> Self {
        MemoryDecreaseConfig {
            strategy: MemoryDecreaseStrategy::Reclaim,
            timeout_ms: 60_000,
            headroom: 16 << 20,
            step_interval_ms: 100,
            inline_max: 1 << 30,
            max_stall: Share::new(0.05),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            journal_size: 1024,
            resize: ResizeConfig::default(),
            policy: PolicyDefaults::default(),
            memory_decrease: MemoryDecreaseConfig::default(),
            capacity: CapacityConfig::default(),
            verdict: VerdictConfig::default(),
            metrics: MetricsConfig::default(),
            kubelet: KubeletConfig::default(),
            trim: TrimConfig::default(),
            observer: ObserverConfig::default(),
        }
    }
}

/// Whether the engine acts on its decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "PascalCase")]
pub enum Mode {
    /// Refuse updates the policy or admission refuses, evict for restart, order writes.
    #[default]
    Enforce,
    /// Decide and report (status, logs) but let every update through unchanged.
    Observe,
}

/// `[resize]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ResizeConfig {
    /// Whether the engine acts on its decisions (the chart sets it from its `mode` value).
    pub mode: Mode,
    /// Node memory admission keeps back for the system and kubelet (`allocatable` = `MemTotal`
    /// minus this). Ignored, and reported where it differs, while `[kubelet] config_file` is
    /// set.
    #[serde(with = "serde_units::memory")]
    #[schemars(schema_with = "serde_units::memory::schema")]
    pub reserved_memory: u64,
    /// CPU admission keeps back for the system and kubelet (`allocatable` = online CPUs minus
    /// this). Ignored, and reported where it differs, while `[kubelet] config_file` is set.
    #[serde(rename = "reserved_cpu", with = "serde_units::cpu")]
    #[schemars(schema_with = "serde_units::cpu::schema")]
    pub reserved_cpu_millicores: u64,
    /// Pause between the steps of a whole-pod resize (`"0s"`: none; at most `60s`).
    #[serde(rename = "step_pause", with = "serde_units::millis")]
    #[schemars(schema_with = "serde_units::millis::schema")]
    pub step_pause_ms: u64,
    /// Attempts of a whole-pod resize (with backoff) before it is reported as an Error
    /// (`1..=100`).
    pub max_attempts: u32,
}

impl Default for ResizeConfig {
    fn default() -> Self {
        ResizeConfig {
            mode: Mode::Enforce,
            reserved_memory: 0,
            reserved_cpu_millicores: 0,
            step_pause_ms: 0,
            max_attempts: 5,
        }
    }
}

/// `[capacity]`: the node capacity watcher (the `capacity` module reads it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CapacityConfig {
    /// Follow CPU and memory capacity changes (cpuhp eBPF events, kernel uevents, resync).
    pub enabled: bool,
    /// Full re-read of sysfs and `/proc/meminfo` behind the events, catching anything missed
    /// (`"60s"`, `"5m"`; `1s..=1h`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "serde_units::duration_schema")]
    pub resync_interval: Duration,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            enabled: true,
            resync_interval: Duration::from_secs(60),
        }
    }
}

/// The default configuration as TOML, every key written out (`nri-resize config default`):
/// a starting file that `config check` and `run --config` accept as it is.
pub fn default_toml() -> String {
    let body =
        toml::to_string(&Config::default()).expect("the default configuration is written as TOML");
    format!(
        "# nri-resize configuration: every key at its default (`nri-resize config default`).\n\
         # Every key is optional; docs/configuration.md explains each.\n\n{body}"
    )
}

/// Merges `overlay` into `base` key by key: tables merge recursively, anything else replaces.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (k, v) in overlay {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

impl Config {
    /// The keys a configuration may have at the top (`journal_size` and the tables), derived
    /// from the configuration itself so that a new section is known the day it is added.
    pub fn top_level_keys() -> Vec<String> {
        toml::Table::try_from(Config::default())
            .expect("the default configuration is a TOML table")
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    /// Parses TOML text; `origin` names where it came from, for the error message.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Self::default().overlay(text, origin)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Applies the keys present in `text` on top of `self`.
    pub fn overlay(&self, text: &str, origin: &str) -> Result<Config, ConfigError> {
        let parse_err = |e: &dyn std::fmt::Display| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string().trim().to_string(),
        };
        let overlay: toml::Table = toml::from_str(text).map_err(|e| parse_err(&e))?;
        let mut base = toml::Table::try_from(self).map_err(|e| parse_err(&e))?;
        merge(&mut base, overlay);
        let cfg: Config = base
            .try_into()
            .map_err(|e: toml::de::Error| parse_err(&e))?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// The runtime's configuration (NRI `Configure`) on top of this one, key by key. Keys that
    /// cannot change once the daemon runs (`[capacity]`: the watcher starts with the daemon;
    /// `[observer]`: the eBPF maps are created at start-up) are
    /// left as they are and returned, to be reported as ignored.
    pub fn runtime_overlay(
        &self,
        text: &str,
        origin: &str,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let mut overlay: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string().trim().to_string(),
        })?;
        let mut ignored = Vec::new();
        for section in ["capacity", "observer"] {
            if let Some(v) = overlay.remove(section) {
                match v {
                    toml::Value::Table(t) => {
                        ignored.extend(t.keys().map(|k| format!("{section}.{k}")));
                    }
                    _ => ignored.push(section.to_string()),
                }
            }
        }
        let text = toml::to_string(&overlay).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        Ok((self.overlay(&text, origin)?, ignored))
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        if !(1..=100).contains(&self.resize.max_attempts) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "resize.max_attempts must be within 1..=100, got {}",
                    self.resize.max_attempts
                ),
            });
        }
        if self.resize.step_pause_ms > 60_000 {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "resize.step_pause must be at most 60s, got {}",
                    ms_text(self.resize.step_pause_ms)
                ),
            });
        }
        let md = &self.memory_decrease;
        if !(1_000..=3_600_000).contains(&md.timeout_ms) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "memory_decrease.timeout must be within 1s..=1h, got {}",
                    ms_text(md.timeout_ms)
                ),
            });
        }
        if md.inline_max > (4 << 30) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "memory_decrease.inline_max must be at most 4Gi (reclaim inside the runtime's deadline), got {}",
                    bytes_quantity(md.inline_max)
                ),
            });
        }
        if !(1..=10_000).contains(&md.step_interval_ms) || md.headroom > (64 << 30) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "memory_decrease.step_interval must be within 1ms..=10s and headroom at most 64Gi, got {} and {}",
                    ms_text(md.step_interval_ms),
                    bytes_quantity(md.headroom)
                ),
            });
        }
        let resync = self.capacity.resync_interval;
        if resync < Duration::from_secs(1) || resync > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "capacity.resync_interval must be within 1s..=1h, got {}",
                    humantime_serde::re::humantime::format_duration(resync)
                ),
            });
        }
        let window = self.verdict.window;
        if window < Duration::from_secs(1) || window > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "verdict.window must be within 1s..=1h, got {}",
                    humantime_serde::re::humantime::format_duration(window)
                ),
            });
        }
        if self.resize.reserved_cpu_millicores > 100_000_000 {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "resize.reserved_cpu must be at most 100k (cores), got {}",
                    cpu_text(self.resize.reserved_cpu_millicores)
                ),
            });
        }
        self.observer
            .validate()
            .map_err(|message| ConfigError::Invalid {
                origin: origin.to_string(),
                message,
            })?;
        self.trim
            .validate()
            .map_err(|message| ConfigError::Invalid {
                origin: origin.to_string(),
                message,
            })?;
        if !(1..=1_000_000).contains(&self.journal_size) {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "journal_size must be within 1..=1000000, got {}",
                    self.journal_size
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_section_reads_paths() {
        let cfg = Config::parse(
            "[kubelet]\nconfig_file = \"/var/lib/kubelet/config.yaml\"\npods_cgroup = \"/kubepods.slice\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            cfg.kubelet.config_file,
            PathBuf::from("/var/lib/kubelet/config.yaml")
        );
        assert_eq!(cfg.kubelet.pods_cgroup, "/kubepods.slice");
        assert_eq!(Config::default().kubelet.config_file, PathBuf::new());
        let e = Config::parse("[kubelet]\nconfig = \"x\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("unknown field `config`"), "{e}");
    }

    #[test]
    fn the_top_level_keys_are_the_fields_of_the_configuration() {
        // Exhaustive: a new field does not compile until it is named here.
        let Config {
            journal_size: _,
            resize: _,
            policy: _,
            memory_decrease: _,
            capacity: _,
            verdict: _,
            metrics: _,
            kubelet: _,
            trim: _,
            observer: _,
        } = Config::default();
        let mut fields = [
            "journal_size",
            "resize",
            "policy",
            "memory_decrease",
            "capacity",
            "verdict",
            "metrics",
            "kubelet",
            "trim",
            "observer",
        ];
        fields.sort_unstable();
        let mut keys = Config::top_level_keys();
        keys.sort();
        assert_eq!(keys, fields);
        for key in &keys {
            let text = if key == "journal_size" {
                format!("{key} = 1")
            } else {
                format!("[{key}]")
            };
            assert!(Config::parse(&text, "test").is_ok(), "{text}");
        }
        assert!(Config::parse("[verdicts]", "test").is_err());
    }

    #[test]
    fn observer_map_limits_are_bounded_and_start_up_only() {
        let cfg = Config::parse("[observer]\nmax_pods = 250\nmax_tasks = 65536\n", "t").unwrap();
        assert_eq!(
            cfg.observer.map_limits(),
            crate::observer::MapLimits {
                max_pods: 250,
                max_tasks: 65_536,
            }
        );
        for bad in ["max_pods = 0", "max_pods = 10001", "max_tasks = 1000"] {
            let e = Config::parse(&format!("[observer]\n{bad}\n"), "t").unwrap_err();
            assert!(
                e.to_string().contains("observer.max_pods must be"),
                "{bad}: {e}"
            );
        }
        // The runtime cannot resize maps that exist: its `[observer]` is reported as ignored.
        let (cfg, ignored) = Config::default()
            .runtime_overlay("[observer]\nmax_pods = 500\n", "runtime")
            .unwrap();
        assert_eq!(cfg.observer, ObserverConfig::default());
        assert_eq!(ignored, ["observer.max_pods"]);
    }

    #[test]
    fn the_default_file_reads_back_as_the_default() {
        let text = default_toml();
        assert_eq!(Config::parse(&text, "default").unwrap(), Config::default());
        for section in [
            "[resize]",
            "[memory_decrease]",
            "[metrics]",
            "[trim]",
            "[kubelet]",
        ] {
            assert!(text.contains(section), "{section} in {text}");
        }
    }

    #[test]
    fn empty_text_gives_defaults() {
        assert_eq!(Config::parse("", "test").unwrap(), Config::default());
    }

    #[test]
    fn written_back_it_parses_to_the_same_configuration() {
        for text in [
            "",
            "journal_size = 7\n[resize]\nmode = \"Observe\"\nreserved_memory = \"1.5Gi\"\nreserved_cpu = \"250m\"\nstep_pause = \"500ms\"\n[memory_decrease]\nstrategy = \"Reject\"\ntimeout = \"5s\"\nheadroom = \"512Ki\"\nstep_interval = \"1s 500ms\"\ninline_max = \"0\"\n[capacity]\nresync_interval = \"5m\"\n",
        ] {
            let cfg = Config::parse(text, "test").unwrap();
            let written = toml::to_string(&cfg).unwrap();
            assert_eq!(Config::parse(&written, "again").unwrap(), cfg, "{written}");
        }
    }

    #[test]
    fn overlay_merges_tables_key_by_key() {
        let file = Config::parse(
            "[resize]\nreserved_memory = \"1Gi\"\nmax_attempts = 7\n",
            "file",
        )
        .unwrap();
        let (cfg, ignored) = file
            .runtime_overlay("[resize]\nmode = \"Observe\"\n", "runtime")
            .unwrap();
        assert_eq!(cfg.resize.mode, Mode::Observe);
        assert_eq!(
            (cfg.resize.reserved_memory, cfg.resize.max_attempts),
            (1 << 30, 7),
            "the file's other [resize] keys stay"
        );
        assert!(ignored.is_empty());
    }

    #[test]
    fn runtime_keys_that_cannot_take_effect_are_reported() {
        let file = Config::default();
        let (cfg, ignored) = file
            .runtime_overlay(
                "journal_size = 9\n[capacity]\nenabled = false\nresync_interval = \"5s\"\n",
                "runtime",
            )
            .unwrap();
        assert_eq!(cfg.journal_size, 9);
        assert_eq!(cfg.capacity, file.capacity, "capacity stays as started");
        assert_eq!(ignored, ["capacity.enabled", "capacity.resync_interval"]);
        assert!(file.runtime_overlay("jurnal = 1", "runtime").is_err());
    }

    #[test]
    fn overlay_replaces_only_given_keys() {
        let base = Config::parse("journal_size = 10", "file").unwrap();
        assert_eq!(base.journal_size, 10);
        assert_eq!(base.overlay("", "runtime").unwrap().journal_size, 10);
        assert_eq!(
            base.overlay("journal_size = 20", "runtime")
                .unwrap()
                .journal_size,
            20
        );
    }

    #[test]
    fn bad_input_names_origin_and_problem() {
        let typo = Config::parse("jurnal_size = 3", "runtime")
            .unwrap_err()
            .to_string();
        assert!(
            typo.contains("runtime") && typo.contains("jurnal_size"),
            "{typo}"
        );
        let syntax = Config::parse("journal_size = ", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(syntax.contains("f.toml"), "{syntax}");
        let ty = Config::parse("journal_size = \"big\"", "x")
            .unwrap_err()
            .to_string();
        assert!(
            ty.contains("journal_size") || ty.contains("invalid type"),
            "{ty}"
        );
        let range = Config::parse("journal_size = 0", "x")
            .unwrap_err()
            .to_string();
        assert!(range.contains("1..=1000000"), "{range}");
    }

    #[test]
    fn resize_and_policy_tables_parse() {
        let cfg = Config::parse(
            "[resize]\nmode = \"Observe\"\nreserved_memory = \"1Ki\"\n[policy]\naction = \"LiveResize\"\nmemory = { decrease = \"RestartContainer\" }\n",
            "t",
        )
        .unwrap();
        assert_eq!(cfg.resize.mode, Mode::Observe);
        assert_eq!(cfg.resize.reserved_memory, 1024);
        assert_eq!(cfg.policy.action, crate::policy::ResizeAction::LiveResize);
        assert_eq!(
            cfg.policy.memory.decrease,
            crate::policy::RestartPolicy::RestartContainer
        );
        let bad = Config::parse("[resize]\nmode = \"maybe\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("maybe") || bad.contains("mode"), "{bad}");
        let bad = Config::parse("[policy]\naction = \"Sometimes\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("Sometimes") || bad.contains("action"), "{bad}");
    }

    #[test]
    fn memory_decrease_table_parses_and_is_validated() {
        let cfg = Config::parse(
            "[memory_decrease]\nstrategy = \"Reject\"\ntimeout = \"5s\"\nheadroom = \"0\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(cfg.memory_decrease.strategy, MemoryDecreaseStrategy::Reject);
        assert_eq!(cfg.memory_decrease.timeout_ms, 5000);
        assert_eq!(cfg.memory_decrease.step_interval_ms, 100);
        let bad = Config::parse("[memory_decrease]\ntimeout = \"10ms\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("memory_decrease.timeout"), "{bad}");
        let bad = Config::parse("[memory_decrease]\nstrategy = \"oom\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("oom") || bad.contains("strategy"), "{bad}");
    }

    #[test]
    fn capacity_table_parses_and_is_validated() {
        let cfg = Config::parse(
            "[capacity]\nresync_interval = \"5m\"\n[resize]\nreserved_cpu = \"500m\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(cfg.capacity.resync_interval, Duration::from_secs(300));
        let v = Config::parse(
            "[verdict]\nwindow = \"5s\"\ncpu_stall_increase = 0.2\noom_kills = 0\n",
            "test",
        )
        .expect("verdict config");
        assert_eq!(v.verdict.window, Duration::from_secs(5));
        assert_eq!(v.verdict.thresholds().cpu_stall_increase, Share::new(0.2));
        assert_eq!(v.verdict.thresholds().oom_kills, 0);
        for bad in [
            "[verdict]\nwindow = \"10ms\"\n",
            "[verdict]\ncpu_stall_increase = 1.5\n",
        ] {
            assert!(Config::parse(bad, "test").is_err(), "{bad}");
        }
        assert!(cfg.capacity.enabled);
        assert_eq!(cfg.resize.reserved_cpu_millicores, 500);
        // Survives the overlay round trip (serialized back to TOML and re-read).
        let again = cfg.overlay("journal_size = 7", "runtime").unwrap();
        assert_eq!(again.capacity.resync_interval, Duration::from_secs(300));
        for (text, want) in [
            ("[capacity]\nresync_interval = \"10ms\"\n", "1s..=1h"),
            ("[capacity]\nresync_interval = \"2h\"\n", "1s..=1h"),
            (
                "[capacity]\nresync_interval = \"soon\"\n",
                "resync_interval",
            ),
            ("[capacity]\nresync = \"1s\"\n", "resync"),
            ("[resize]\nreserved_cpu = \"-1\"\n", "negative"),
        ] {
            let err = Config::parse(text, "t").unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn sizes_are_quantities_and_times_are_durations() {
        let cfg = Config::parse(
            "[resize]\nreserved_memory = \"1.5Gi\"\nreserved_cpu = \"1.5\"\nstep_pause = \"2s\"\n[memory_decrease]\ntimeout = \"1m 30s\"\nheadroom = \"32Mi\"\nstep_interval = \"250ms\"\ninline_max = \"512Mi\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(cfg.resize.reserved_memory, (1 << 30) + (1 << 29));
        assert_eq!(cfg.resize.reserved_cpu_millicores, 1500);
        assert_eq!(cfg.resize.step_pause_ms, 2000);
        let md = &cfg.memory_decrease;
        assert_eq!(
            (
                md.timeout_ms,
                md.headroom,
                md.step_interval_ms,
                md.inline_max
            ),
            (90_000, 32 << 20, 250, 512 << 20)
        );
        // A bare integer is bytes / cores, as in a pod spec.
        let bare =
            Config::parse("[resize]\nreserved_memory = 1024\nreserved_cpu = 2\n", "t").unwrap();
        assert_eq!(
            (
                bare.resize.reserved_memory,
                bare.resize.reserved_cpu_millicores
            ),
            (1024, 2000)
        );
        // Written back, a person reads quantities and durations.
        let written = toml::to_string(&cfg).unwrap();
        for want in [
            "reserved_memory = \"1536Mi\"",
            "reserved_cpu = \"1500m\"",
            "timeout = \"1m 30s\"",
            "step_interval = \"250ms\"",
        ] {
            assert!(written.contains(want), "{want} in {written}");
        }
        // One duration form: the old millisecond keys and bare numbers of milliseconds are errors.
        for (text, want) in [
            ("[memory_decrease]\ntimeout_ms = 5000\n", "timeout_ms"),
            (
                "[memory_decrease]\nstep_interval_ms = 100\n",
                "step_interval_ms",
            ),
            ("[resize]\nstep_pause_ms = 0\n", "step_pause_ms"),
            (
                "[resize]\nreserved_cpu_millicores = 500\n",
                "reserved_cpu_millicores",
            ),
            ("[memory_decrease]\ntimeout = 5000\n", "timeout"),
            ("[memory_decrease]\nheadroom = \"16MB\"\n", "16MB"),
            ("[resize]\nreserved_cpu = \"lots\"\n", "lots"),
            ("[resize]\nstep_pause = \"1500us\"\n", "millisecond"),
            ("[resize]\nstep_pause = \"2m\"\n", "at most 60s"),
        ] {
            let err = Config::parse(text, "t").unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn trim_table_parses_and_is_validated() {
        let cfg = Config::parse(
            "[trim]\nenabled = true\ninterval = \"500ms\"\nmax_stall = 0.001\nreprobe_after = \"10m\"\nmin_step = \"512Ki\"\nmax_step = \"32Mi\"\n",
            "t",
        )
        .unwrap();
        let t = &cfg.trim;
        assert!(t.enabled);
        assert_eq!(
            (t.interval, t.reprobe_after, t.min_step, t.max_step),
            (
                Duration::from_millis(500),
                Duration::from_secs(600),
                512 << 10,
                32 << 20
            )
        );
        assert_eq!(t.max_stall, Share::new(0.001));
        assert!(!Config::default().trim.enabled, "ships off");
        let written = toml::to_string(&cfg).unwrap();
        assert_eq!(Config::parse(&written, "again").unwrap(), cfg, "{written}");
        for (text, want) in [
            ("[trim]\ninterval = \"10ms\"\n", "trim.interval"),
            ("[trim]\nreprobe_after = \"2d\"\n", "trim.reprobe_after"),
            ("[trim]\nmin_step = \"128Mi\"\n", "trim.min_step"),
            ("[trim]\npass_budget = \"2m\"\n", "trim.pass_budget"),
            ("[trim]\nmax_step = \"2Gi\"\n", "trim.max_step"),
            ("[trim]\nmax_stall = 2.0\n", "max_stall"),
            ("[trim]\nenable = true\n", "enable"),
        ] {
            let err = Config::parse(text, "t").unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let err = Config::load(Path::new("/nonexistent/nri-resize.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }
}
