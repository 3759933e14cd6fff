//! Values the daemon accepts but that cannot be meant: `config check` warns on them (exit 0).
//! Each warning names its key; where in the file is added by the caller, as for errors.

use crate::config::Config;
use crate::policy::{bytes_quantity, cpu_text, parse_memory};

/// The keys that are memory quantities (kept equal to the generated reference's, tested there).
pub const MEMORY_KEYS: [&str; 5] = [
    "resize.reserved_memory",
    "memory_decrease.headroom",
    "memory_decrease.inline_max",
    "trim.min_step",
    "trim.max_step",
];

/// More memory than any machine has (`64Ti`): a reserve this large refuses every increase.
const ABSURD_MEMORY: u64 = 64 << 40;
/// More CPUs than any machine has.
const ABSURD_CPU_MILLIS: u64 = 4096 * 1000;
/// One page: a non-zero memory value below it is a forgotten suffix.
const PAGE: u64 = 4096;

/// The machine `config check` runs on, where it can be read: for a file checked on its node
/// (`kubectl exec` into the pod), the node's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Machine {
    /// `MemTotal`, bytes.
    pub memory: Option<u64>,
    /// Online CPUs, millicores.
    pub cpu_millis: Option<u64>,
}

impl Machine {
    /// This machine's memory and CPUs, each `None` when unreadable.
    pub fn this() -> Machine {
        use procfs::Current as _;
        Machine {
            memory: procfs::Meminfo::current().ok().map(|m| m.mem_total),
            cpu_millis: std::thread::available_parallelism()
                .ok()
                .and_then(|n| u64::try_from(n.get()).ok())
                .map(|n| n * 1000),
        }
    }
}

/// A value that cannot be meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The dotted key (`resize.reserved_memory`).
    pub key: String,
    pub message: String,
}

/// What the file writes for `key` in `raw` (the file as read, before defaults): a string as
/// it is, a bare number as written.
fn raw_text(raw: &toml::Table, key: &str) -> Option<String> {
    let mut parts = key.split('.');
    let mut table = raw;
    let mut last = parts.next()?;
    for next in parts {
        table = table.get(last)?.as_table()?;
        last = next;
    }
    match table.get(last)? {
        toml::Value::String(s) => Some(s.trim().to_string()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

fn memory_of(cfg: &Config, key: &str) -> u64 {
    match key {
        "resize.reserved_memory" => cfg.resize.reserved_memory,
        "memory_decrease.headroom" => cfg.memory_decrease.headroom,
        "memory_decrease.inline_max" => cfg.memory_decrease.inline_max,
        "trim.min_step" => cfg.trim.min_step,
        "trim.max_step" => cfg.trim.max_step,
        _ => 0,
    }
}

/// The warnings on `cfg`, read from `raw` (the keys the file sets) on `machine`.
pub fn warnings(cfg: &Config, raw: &toml::Table, machine: Machine) -> Vec<Warning> {
    let mut out = Vec::new();
    let mut warn = |key: &str, message: String| {
        out.push(Warning {
            key: key.to_string(),
            message,
        });
    };
    memory_units(cfg, raw, &mut warn);
    reserves(cfg, machine, &mut warn);
    unused_settings(cfg, &mut warn);
    out
}

/// Memory quantities in a unit nobody means: milli-bytes, or bytes below one page.
fn memory_units(cfg: &Config, raw: &toml::Table, warn: &mut impl FnMut(&str, String)) {
    for key in MEMORY_KEYS {
        let Some(text) = raw_text(raw, key) else {
            continue;
        };
        let text = text.as_str();
        // `512m` is 512 milli-bytes in Kubernetes' grammar, as `500m` is half a CPU.
        if let Some(number) = text.strip_suffix('m') {
            let bytes = parse_memory(text).unwrap_or_default();
            warn(
                key,
                format!(
                    "{text:?} is {number} milli-bytes ({} bytes, rounded up to {bytes}): `m` is milli; did you mean \"{number}Mi\" (mebibytes) or \"{number}M\" (megabytes)?",
                    number.parse::<f64>().map_or_else(|_| "?".to_string(), |n| (n / 1000.0).to_string())
                ),
            );
            continue;
        }
        let bytes = memory_of(cfg, key);
        if bytes > 0 && bytes < PAGE {
            warn(
                key,
                format!("{text:?} is {bytes} bytes, less than one page: a unit forgotten (\"{text}Mi\")?"),
            );
        }
    }
}

/// A reserve no node has, or at least this machine's.
fn reserves(cfg: &Config, machine: Machine, warn: &mut impl FnMut(&str, String)) {
    let reserved = cfg.resize.reserved_memory;
    if reserved >= ABSURD_MEMORY {
        warn(
            "resize.reserved_memory",
            format!(
                "{} is more memory than any node has: admission would refuse every resize that grows",
                bytes_quantity(reserved)
            ),
        );
    } else if let Some(total) = machine.memory.filter(|t| reserved >= *t) {
        warn(
            "resize.reserved_memory",
            format!(
                "{} is at least this machine's memory (MemTotal {}): admission would refuse every resize that grows (checked on another machine than the node? its MemTotal is what counts)",
                bytes_quantity(reserved),
                bytes_quantity(total)
            ),
        );
    }
    let cpu = cfg.resize.reserved_cpu_millicores;
    if cpu >= ABSURD_CPU_MILLIS {
        warn(
            "resize.reserved_cpu",
            format!(
                "{} ({} cores) is more CPUs than any node has: admission would refuse every CPU increase",
                cpu_text(cpu),
                cpu / 1000
            ),
        );
    } else if let Some(online) = machine.cpu_millis.filter(|o| cpu >= *o) {
        warn(
            "resize.reserved_cpu",
            format!(
                "{} is at least this machine's CPUs ({}): admission would refuse every CPU increase (checked on another machine than the node? its CPUs are what count)",
                cpu_text(cpu),
                cpu_text(online)
            ),
        );
    }
}

/// Settings that take no effect as combined, or a path read from where nobody expects.
fn unused_settings(cfg: &Config, warn: &mut impl FnMut(&str, String)) {
    if !cfg.kubelet.config_file.as_os_str().is_empty() {
        for (key, set) in [
            ("resize.reserved_memory", cfg.resize.reserved_memory > 0),
            (
                "resize.reserved_cpu",
                cfg.resize.reserved_cpu_millicores > 0,
            ),
        ] {
            if set {
                warn(
                    key,
                    format!(
                        "not used while [kubelet] config_file is set: admission keeps back kubelet's reserve from {} and reports this one where it differs",
                        cfg.kubelet.config_file.display()
                    ),
                );
            }
        }
        if cfg.kubelet.config_file.is_relative() {
            warn(
                "kubelet.config_file",
                format!(
                    "{} is a relative path: the daemon resolves it from its working directory; give the path the daemon sees, e.g. /var/lib/kubelet/config.yaml",
                    cfg.kubelet.config_file.display()
                ),
            );
        }
    }
    let md = &cfg.memory_decrease;
    if md.step_interval_ms > md.timeout_ms {
        warn(
            "memory_decrease.step_interval",
            format!(
                "{}ms is longer than memory_decrease.timeout ({}ms): a reclaim gives up before its second pass",
                md.step_interval_ms, md.timeout_ms
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, machine: Machine) -> Vec<Warning> {
        let cfg = Config::parse(text, "t").expect("valid");
        let raw: toml::Table = toml::from_str(text).expect("toml");
        warnings(&cfg, &raw, machine)
    }

    fn keys(w: &[Warning]) -> Vec<&str> {
        w.iter().map(|w| w.key.as_str()).collect()
    }

    /// The memory keys inspected for a lowercase `m` are the generated reference's memory
    /// quantities: a new one is not forgotten.
    #[test]
    fn the_memory_keys_are_the_references_memory_quantities() {
        let mut memory: Vec<String> = crate::config::reference::sections()
            .iter()
            .flat_map(|s| {
                s.keys
                    .iter()
                    .filter(|k| k.kind.starts_with("memory quantity"))
                    .map(|k| format!("{}.{}", s.name, k.path))
                    .collect::<Vec<_>>()
            })
            .collect();
        memory.sort();
        let mut known: Vec<String> = MEMORY_KEYS.iter().map(ToString::to_string).collect();
        known.sort();
        assert_eq!(known, memory);
        assert_eq!(known.len(), 5);
    }

    #[test]
    fn the_defaults_warn_of_nothing() {
        let big = Machine {
            memory: Some(64 << 30),
            cpu_millis: Some(16_000),
        };
        assert_eq!(check("", big), []);
        let text = toml::to_string(&Config::default()).expect("toml");
        assert_eq!(check(&text, big), []);
        assert_eq!(check("[resize]\nreserved_memory = \"1Gi\"\n", big), []);
    }

    #[test]
    fn a_lowercase_m_on_bytes_is_milli_bytes() {
        let w = check(
            "[resize]\nreserved_memory = \"512m\"\n[memory_decrease]\nheadroom = \"16m\"\n",
            Machine::default(),
        );
        assert_eq!(
            keys(&w),
            ["resize.reserved_memory", "memory_decrease.headroom"]
        );
        assert!(
            w[0].message.contains("0.512 bytes") && w[0].message.contains("\"512Mi\""),
            "{w:?}"
        );
        // `512M` (megabytes) and `512Mi` are what a person means.
        assert_eq!(
            check("[resize]\nreserved_memory = \"512M\"\n", Machine::default()),
            []
        );
    }

    #[test]
    fn a_reserve_no_node_has_is_absurd() {
        let w = check("[resize]\nreserved_memory = \"1Ei\"\n", Machine::default());
        assert_eq!(keys(&w), ["resize.reserved_memory"]);
        assert!(w[0].message.contains("1Ei"), "{w:?}");
        let small = Machine {
            memory: Some(8 << 30),
            cpu_millis: Some(4000),
        };
        let w = check(
            "[resize]\nreserved_memory = \"8Gi\"\nreserved_cpu = \"4\"\n",
            small,
        );
        assert_eq!(keys(&w), ["resize.reserved_memory", "resize.reserved_cpu"]);
        assert!(w[0].message.contains("MemTotal 8Gi"), "{w:?}");
        let w = check("[resize]\nreserved_cpu = \"5000\"\n", Machine::default());
        assert_eq!(keys(&w), ["resize.reserved_cpu"]);
    }

    #[test]
    fn a_forgotten_unit_and_settings_that_do_nothing() {
        let w = check("[resize]\nreserved_memory = 512\n", Machine::default());
        assert_eq!(keys(&w), ["resize.reserved_memory"]);
        let w = check(
            "[resize]\nreserved_memory = \"1Gi\"\n[kubelet]\nconfig_file = \"kubelet.yaml\"\n",
            Machine::default(),
        );
        assert_eq!(keys(&w), ["resize.reserved_memory", "kubelet.config_file"]);
        let w = check(
            "[memory_decrease]\ntimeout = \"1s\"\nstep_interval = \"5s\"\n",
            Machine::default(),
        );
        assert_eq!(keys(&w), ["memory_decrease.step_interval"]);
    }
}
