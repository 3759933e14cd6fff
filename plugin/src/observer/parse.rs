//! Pure parsers for the kernel text files the observer reads: cgroup `cpu.stat`,
//! `memory.stat`, `memory.events` / `memory.oom_control`, tracefs `format` and `/proc/cgroups`.
//! No I/O here: each function takes the file's text.

/// The flat-keyed format is cgroup I/O's too (`memory.stat` breakdowns).
pub use crate::cgroup::flat_keyed;

/// CFS bandwidth statistics from `cpu.stat` (v1 and v2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStat {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    /// v1 `throttled_time` (ns) or v2 `throttled_usec` × 1000.
    pub throttled_ns: u64,
}

/// Parses `cpu.stat`. `None` when the file carries no bandwidth statistics (no
/// `nr_throttled`, e.g. v1 `cpuacct`, or v2 without the cpu controller).
#[must_use]
pub fn cpu_stat(text: &str) -> Option<CpuStat> {
    let nr_throttled = flat_keyed(text, "nr_throttled")?;
    let throttled_ns = flat_keyed(text, "throttled_time")
        .or_else(|| flat_keyed(text, "throttled_usec").map(|us| us.saturating_mul(1000)))
        .unwrap_or(0);
    Some(CpuStat {
        nr_periods: flat_keyed(text, "nr_periods").unwrap_or(0),
        nr_throttled,
        throttled_ns,
    })
}

/// Reclaim-related counters of `memory.stat`, in pages (v1 reports only `pgpgin`/`pgpgout`;
/// v2 also the scan/steal counters). Absent counters are `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStat {
    pub pgscan_kswapd: Option<u64>,
    pub pgscan_direct: Option<u64>,
    pub pgsteal_kswapd: Option<u64>,
    pub pgsteal_direct: Option<u64>,
    pub pgpgin: Option<u64>,
    pub pgpgout: Option<u64>,
    /// The totals, where the kernel gives no kswapd / direct split (5.10's v2; 5.13 split
    /// them); `None` where it does.
    pub pgscan: Option<u64>,
    pub pgsteal: Option<u64>,
}

/// Parses the reclaim counters of `memory.stat` (v1 or v2).
#[must_use]
pub fn memory_stat(text: &str) -> MemoryStat {
    let mut stat = MemoryStat::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        let slot = match key {
            "pgscan_kswapd" => &mut stat.pgscan_kswapd,
            "pgscan_direct" => &mut stat.pgscan_direct,
            "pgsteal_kswapd" => &mut stat.pgsteal_kswapd,
            "pgsteal_direct" => &mut stat.pgsteal_direct,
            "pgpgin" => &mut stat.pgpgin,
            "pgpgout" => &mut stat.pgpgout,
            "pgscan" => &mut stat.pgscan,
            "pgsteal" => &mut stat.pgsteal,
            _ => continue,
        };
        *slot = Some(value);
    }
    // The totals only where the split is missing: with both, the split is what is reported.
    if stat.pgsteal_kswapd.is_some() || stat.pgsteal_direct.is_some() {
        stat.pgsteal = None;
    }
    if stat.pgscan_kswapd.is_some() || stat.pgscan_direct.is_some() {
        stat.pgscan = None;
    }
    stat
}

/// The `oom_kill` count of v2 `memory.events` or v1 `memory.oom_control`.
#[must_use]
pub fn oom_kill_count(text: &str) -> Option<u64> {
    flat_keyed(text, "oom_kill")
}

/// One field of a tracefs event `format` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    pub name: String,
    pub offset: u32,
    pub size: u32,
    pub signed: bool,
}

/// Parses a tracefs `events/<category>/<name>/format` file into its fields (common fields
/// included). Lines that are not field descriptions are ignored.
#[must_use]
pub fn tracefs_format(text: &str) -> Vec<FormatField> {
    text.lines().filter_map(format_field).collect()
}

fn format_field(line: &str) -> Option<FormatField> {
    let mut decl = None;
    let mut offset = None;
    let mut size = None;
    let mut signed = false;
    for part in line.trim().split(';') {
        let Some((key, value)) = part.trim().split_once(':') else {
            continue;
        };
        match key {
            "field" => decl = Some(value.trim()),
            "offset" => offset = value.parse().ok(),
            "size" => size = value.parse().ok(),
            "signed" => signed = value == "1",
            _ => {}
        }
    }
    // The declaration's last word is the name, possibly followed by an array suffix.
    let last = decl?.rsplit(' ').next()?;
    let name = last.split('[').next()?.trim_start_matches('*');
    Some(FormatField {
        name: name.to_owned(),
        offset: offset?,
        size: size?,
        signed,
    })
}

/// The field called `name` in a parsed format.
#[must_use]
pub fn field<'a>(fields: &'a [FormatField], name: &str) -> Option<&'a FormatField> {
    fields.iter().find(|f| f.name == name)
}

/// The hierarchy id of `controller` in `/proc/cgroups` (0 means cgroup v2 or unmounted).
#[must_use]
pub fn hierarchy_id(proc_cgroups: &str, controller: &str) -> Option<u32> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let mut cols = line.split_whitespace();
            (cols.next()? == controller).then(|| cols.next()?.parse().ok())?
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_v1() {
        let text = "nr_periods 120\nnr_throttled 97\nthrottled_time 8512345678\nnr_bursts 0\nburst_time 0\n";
        assert_eq!(
            cpu_stat(text),
            Some(CpuStat {
                nr_periods: 120,
                nr_throttled: 97,
                throttled_ns: 8_512_345_678
            })
        );
    }

    #[test]
    fn cpu_stat_v2_converts_usec() {
        let text = "usage_usec 1000\nuser_usec 900\nsystem_usec 100\nnr_periods 10\nnr_throttled 4\nthrottled_usec 2500\n";
        assert_eq!(
            cpu_stat(text),
            Some(CpuStat {
                nr_periods: 10,
                nr_throttled: 4,
                throttled_ns: 2_500_000
            })
        );
    }

    #[test]
    fn cpu_stat_without_bandwidth_is_none() {
        assert_eq!(cpu_stat("usage_usec 1000\nuser_usec 900\n"), None);
    }

    #[test]
    fn memory_stat_v1_and_v2() {
        let v1 = "cache 4096\nrss 0\npgpgin 76800\npgpgout 51200\ntotal_pgpgin 1\n";
        let s = memory_stat(v1);
        assert_eq!(
            (s.pgpgin, s.pgpgout, s.pgsteal_direct),
            (Some(76_800), Some(51_200), None)
        );
        let v2 = "anon 0\npgscan 10\npgsteal 9\npgscan_kswapd 4\npgscan_direct 6\npgsteal_kswapd 3\npgsteal_direct 6\n";
        // 5.10's v2: the totals only, which are then what is reported.
        let old_v2 = memory_stat("anon 0\npgfault 99\npgscan 12\npgsteal 11\n");
        assert_eq!(
            (old_v2.pgscan, old_v2.pgsteal, old_v2.pgsteal_direct),
            (Some(12), Some(11), None)
        );
        let s = memory_stat(v2);
        assert_eq!(s.pgscan_direct, Some(6));
        assert_eq!(s.pgsteal_kswapd, Some(3));
        assert_eq!(s.pgsteal_direct, Some(6));
        assert_eq!(s.pgpgin, None);
        // With the split, the totals are left out (the split is reported, never both).
        assert_eq!((s.pgscan, s.pgsteal), (None, None));
    }

    #[test]
    fn oom_kill_in_v1_and_v2_files() {
        assert_eq!(
            oom_kill_count("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"),
            Some(2)
        );
        assert_eq!(
            oom_kill_count("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"),
            Some(1)
        );
        assert_eq!(oom_kill_count("low 0\n"), None);
    }

    #[test]
    fn tracefs_format_of_count_memcg_events() {
        let text = "name: count_memcg_events\nID: 700\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
\tfield:u64 id;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:int item;\toffset:16;\tsize:4;\tsigned:1;\n\
\tfield:unsigned long val;\toffset:24;\tsize:8;\tsigned:0;\n\
\tfield:__data_loc char[] comm;\toffset:32;\tsize:4;\tsigned:0;\n\
\tfield:char name[16];\toffset:36;\tsize:16;\tsigned:0;\n\n\
print fmt: \"memcg_id=%llu item=%d val=%lu\", REC->id, REC->item, REC->val\n";
        let fields = tracefs_format(text);
        assert_eq!(fields.len(), 7);
        assert_eq!(
            field(&fields, "id"),
            Some(&FormatField {
                name: "id".into(),
                offset: 8,
                size: 8,
                signed: false
            })
        );
        assert_eq!(
            field(&fields, "item").map(|f| (f.offset, f.signed)),
            Some((16, true))
        );
        assert_eq!(field(&fields, "val").map(|f| f.offset), Some(24));
        assert_eq!(field(&fields, "comm").map(|f| f.offset), Some(32));
        assert_eq!(field(&fields, "name").map(|f| f.size), Some(16));
        assert_eq!(field(&fields, "missing"), None);
    }

    #[test]
    fn proc_cgroups_hierarchy_ids() {
        let text = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\ncpu\t5\t60\t1\ncpuacct\t5\t60\t1\nmemory\t9\t80\t1\n";
        assert_eq!(hierarchy_id(text, "cpu"), Some(5));
        assert_eq!(hierarchy_id(text, "memory"), Some(9));
        assert_eq!(hierarchy_id(text, "io"), None);
        assert_eq!(hierarchy_id("#h\ncpu\t0\t1\t1\n", "cpu"), Some(0));
    }
}
